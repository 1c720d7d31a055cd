"""NmsSplitPass: NonMaxSuppression as a compiled ranking and greedy pass, then a host selection.

NonMaxSuppression's output has a data-dependent length, so it ends a compiled segment and runs
on the host. With its limit and thresholds constant, almost all of its work has static shapes:
each (batch, class)'s best-scored prefix of boxes, their overlaps and the greedy pass over them.
This pass splits such a node in two:

- `oxla.nms::NonMaxSuppressionRanked` (compiled): per (batch, class), whether its prefix settles
  the selection, and the box indices kept in it, in order;
- `oxla.nms::NonMaxSuppression` (host): the same inputs as the ONNX op after that hint; it lays
  the hint out as rows [batch, class, box], or runs the whole NMS where the hint did not settle.

Suite detector (8 classes, 1200 boxes, limit 50), one thread: the host step 1.05 -> 0.1 ms; the
compiled part ~0.17 ms. In a CPU session (`Options.native_nms`) the hint comes from oxla's kernel
(`oxla_snms`: the exact greedy pass over every candidate, so it always settles): the detector's
hint 587 -> ~80-130 us at default threads (top_k, the overlap matrix and the fixed point had
taken 205, 197 and 65 us), the whole model 0.949x the time.

Where the hint always settles, `trim_nms_rows` also removes the host step: what reads the
selection one row per selected row (the detector's Gather of the kept boxes) runs on the hint's
padded rows (`oxla.nms::HintRows`) in the same compiled segment, and the graph outputs among
them are cut to the selection's length on the host (`oxla.nms::TakeRows`, which the executor
applies to the segment's results: `Executor._trims`). The detector in one segment: 0.875x the
time at default threads (4.04 -> 3.53 ms), 0.962x at one thread; its first call 1.09 -> 0.51 s.

Each new op carries an ONNX function body, so the planned model stays a model onnxruntime runs:
the hint's body is the ONNX op's rows padded behind a settled head (before opset 12 it settles
nothing), the host op's body is the ONNX op, HintRows and TakeRows are Slices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import (
    AttributeProto,
    FunctionProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
    helper,
    numpy_helper,
)

from oxla.errors import LoweringError
from oxla.graph import canonical_domain, constant_values, inferred_types, model_opsets, node_reads

DOMAIN = "oxla.nms"
HINT_SUFFIX = "__oxla_nms_hint"
_INPUTS = ["boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold"]


def split_non_max_suppression(model: ModelProto) -> int:
    """Split every NonMaxSuppression of the main graph whose limit and thresholds are constants.

    Returns:
        How many nodes were split (0: the model is left unchanged).
    """
    graph = model.graph
    fed = {i.name for i in graph.input}
    constant = {t.name for t in graph.initializer if t.name not in fed}
    constant |= {n.output[0] for n in graph.node
                 if n.op_type == "Constant" and canonical_domain(n.domain) == "" and n.output}
    nodes: list[NodeProto] = []
    split = 0
    for node in graph.node:
        ins = list(node.input)
        # the limit and IoU threshold given (an absent limit selects nothing), the score threshold
        # constant or absent
        if (node.op_type != "NonMaxSuppression" or canonical_domain(node.domain) != ""
                or len(ins) < 4 or not all(ins[:4]) or not {n for n in ins[2:] if n} <= constant):
            nodes.append(node)
            continue
        ins += [""] * (5 - len(ins))
        hint = f"{node.output[0]}{HINT_SUFFIX}"
        ranked = helper.make_node("NonMaxSuppressionRanked", ins, [hint], name=f"{node.name}/ranked",
                                  domain=DOMAIN)
        select = helper.make_node("NonMaxSuppression", [hint, *ins], list(node.output), name=node.name,
                                  domain=DOMAIN)
        for new in (ranked, select):
            new.attribute.extend(node.attribute)
        nodes += [ranked, select]
        split += 1
    if not split:
        return 0
    del graph.node[:]
    graph.node.extend(nodes)
    if DOMAIN not in model_opsets(model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    opset = model_opsets(model.opset_import).get("", 0)
    have = {(f.domain, f.name) for f in model.functions}
    for body in (_ranked_body(opset), _select_body(opset)):
        if (body.domain, body.name) not in have:
            model.functions.append(body)
    model.ir_version = max(model.ir_version, 8)  # model-local functions
    return split


def _ranked_body(opset: int) -> FunctionProto:
    """The settled hint: [1, count, 0], then the ONNX op's rows, zero padded to batches * classes *
    limit rows (limit: max_output_boxes_per_class clipped to [0, boxes]); before opset 12 (Min and
    Max of int64), the hint that settles nothing: [[-1]]."""
    if opset < 12:
        return helper.make_function(DOMAIN, "NonMaxSuppressionRanked", _INPUTS, ["hint"],
                                    [_const("hint", [[-1]])], [helper.make_opsetid("", opset)],
                                    attributes=["center_point_box"])
    core = helper.make_node("NonMaxSuppression", _INPUTS, ["rows"])
    core.attribute.append(helper.make_attribute_ref("center_point_box", AttributeProto.INT))
    nodes = [
        core, _const("zero", [0]), _const("one", [1]), _const("two", [2]), _const("three", [3]),
        _const("head_shape", [1, 3]),
        helper.make_node("Shape", ["scores"], ["dims"]),
        helper.make_node("Slice", ["dims", "zero", "two"], ["batch_class"]),
        helper.make_node("ReduceProd", ["batch_class"], ["groups"], keepdims=1),
        helper.make_node("Slice", ["dims", "two", "three"], ["boxes_n"]),
        helper.make_node("Reshape", ["max_output_boxes_per_class", "one"], ["wanted"]),
        helper.make_node("Min", ["wanted", "boxes_n"], ["capped"]),
        helper.make_node("Max", ["capped", "zero"], ["limit"]),
        helper.make_node("Mul", ["groups", "limit"], ["total"]),
        helper.make_node("Shape", ["rows"], ["rows_shape"]),
        helper.make_node("Slice", ["rows_shape", "zero", "one"], ["count"]),
        helper.make_node("Sub", ["total", "count"], ["short"]),
        helper.make_node("Concat", ["zero", "zero", "short", "zero"], ["pads"], axis=0),
        helper.make_node("Pad", ["rows", "pads"], ["padded"]),
        helper.make_node("Concat", ["one", "count", "zero"], ["head_flat"], axis=0),
        helper.make_node("Reshape", ["head_flat", "head_shape"], ["head"]),
        helper.make_node("Concat", ["head", "padded"], ["hint"], axis=0),
    ]
    return helper.make_function(DOMAIN, "NonMaxSuppressionRanked", _INPUTS, ["hint"], nodes,
                                [helper.make_opsetid("", opset)], attributes=["center_point_box"])


def _select_body(opset: int) -> FunctionProto:
    """The ONNX op itself, the hint unread."""
    core = helper.make_node("NonMaxSuppression", _INPUTS, ["selected"])
    core.attribute.append(helper.make_attribute_ref("center_point_box", AttributeProto.INT))
    return helper.make_function(DOMAIN, "NonMaxSuppression", ["hint", *_INPUTS], ["selected"], [core],
                                [helper.make_opsetid("", opset)], attributes=["center_point_box"])


# --- the rows trimmed once, after the compiled segment ------------------------------------------

# In CPU sessions (`Options.native_nms`) NonMaxSuppressionRanked's hint comes from oxla's kernel
# (`oxla_snms`, always settled) when its boxes and scores are float32 and it has at most
# NATIVE_ROWS rows (1 + batches * classes * limit: 96 MiB at most); NATIVE_NMS False: the
# compiled ranked pass instead, and no rows trimmed after the segment (for measuring).
NATIVE_NMS = True
NATIVE_ROWS = 1 << 22
TRIM_ROWS = True  # False: what reads the selection runs after the host step (for measuring)
ROWS_SUFFIX = "__oxla_rows"
HINT_ROWS = "HintRows"   # oxla.nms::HintRows(hint) -> the hint's rows after its head (compiled)
TAKE_ROWS = "TakeRows"   # oxla.nms::TakeRows(rows, hint) -> rows[:count] (host)
_ROW_WISE = frozenset({"Gather", "Squeeze", "Unsqueeze", "Cast", "Identity"})
Constants = Callable[[str], np.ndarray | None]  # graph.constant_values


def trim_nms_rows(model: ModelProto, max_rows: int) -> int:
    """Where a split NonMaxSuppression's hint always settles (its boxes and scores float32 with
    declared shapes, at most `max_rows` rows: oxla's kernel computes it), compute what reads the
    selected rows on the hint's padded rows inside the compiled segment, and cut the graph outputs
    among them to the selection's length at the end (`oxla.nms::TakeRows`, which the executor
    applies to the segment's results). Only what keeps one row per selected row follows the
    padded rows (Gather of a column, Gather by the rows as indices on axis 0, Squeeze and Unsqueeze
    off axis 0, Cast, Identity); a node that reads them otherwise leaves that NMS as it was.

    Returns:
        How many NMS nodes' readers now run on their padded rows.
    """
    graph = model.graph
    opset = model_opsets(model.opset_import).get("", 0)
    if not any(n.domain == DOMAIN and n.op_type == "NonMaxSuppression" for n in graph.node):
        return 0
    try:  # the ranks of what the rows index (shape inference, through oxla's ops' bodies)
        typed = inferred_types(model)
    except Exception:  # the pass only loses ranks (the declared types remain), never the model
        typed = graph
    types = {v.name: v.type for v in [*typed.input, *typed.value_info, *typed.output,
                                      *graph.input, *graph.value_info, *graph.output]}
    consts = constant_values(graph)
    outputs = {o.name for o in graph.output}
    readers: dict[str, list[NodeProto]] = {}
    for node in graph.node:
        for name in node_reads(node):
            readers.setdefault(name, []).append(node)
    renamed: dict[str, str] = {}
    ends: list[NodeProto] = []
    done = 0
    for node in list(graph.node):
        if node.domain != DOMAIN or node.op_type != "NonMaxSuppression" or len(node.input) < 4:
            continue
        hint, boxes, scores, wanted = node.input[:4]
        box_dims, score_dims = _float_dims(types.get(boxes)), _float_dims(types.get(scores))
        limit = consts(wanted)
        if box_dims is None or score_dims is None or limit is None or limit.size != 1 \
                or len(score_dims) != 3:
            continue
        groups, n = score_dims[0] * score_dims[1], score_dims[2]
        limit_rows = min(max(int(limit.reshape(-1)[0]), 0), n)
        if groups * limit_rows == 0 or groups * limit_rows > max_rows or not node.output[0]:
            continue
        padded = _row_wise(node.output[0], readers, consts, types, opset)
        if padded is None:
            continue
        for name in padded:
            renamed[name] = f"{name}{ROWS_SUFFIX}"
        node.op_type = HINT_ROWS
        del node.input[:]
        node.input.append(hint)
        del node.attribute[:]
        ends += [helper.make_node(TAKE_ROWS, [renamed[name], hint], [name], domain=DOMAIN,
                                  name=f"{node.name}/take/{name}") for name in padded if name in outputs]
        done += 1
    if not done:
        return 0
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
    graph.node.extend(ends)
    have = {(f.domain, f.name) for f in model.functions}
    for body in (_hint_rows_body(opset), _take_rows_body(opset)):
        if (body.domain, body.name) not in have:
            model.functions.append(body)
    return done


def take_rows(rows: Any, hint: Any) -> np.ndarray:
    """TakeRows: `rows` cut to the length a settled hint gives (a view, as numpy)."""
    head = np.asarray(hint)
    rows = np.asarray(rows)
    if head.ndim != 2 or head.shape[0] < 1 or head.shape[1] != 3 or head[0, 0] != 1 \
            or not 0 <= head[0, 1] <= (rows.shape[0] if rows.ndim else 0):
        raise LoweringError("NonMaxSuppression's hint did not settle its rows, which the graph "
                            "reads padded (oxla.nms::TakeRows); this is a bug in oxla: please "
                            "report the model")
    return rows[:int(head[0, 1])]


def _float_dims(value: TypeProto | None) -> tuple[int, ...] | None:
    """A float32 tensor type's dims when every one is a number, else None."""
    if value is None or value.tensor_type.elem_type != TensorProto.FLOAT \
            or not value.tensor_type.HasField("shape"):
        return None
    dims = value.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims) if all(d.HasField("dim_value") for d in dims) else None


def _rank(name: str, types: dict[str, TypeProto], consts: Constants) -> int | None:
    value = consts(name)
    if value is not None:
        return value.ndim
    typed = types.get(name)
    if typed is None or not typed.tensor_type.HasField("shape"):
        return None
    return len(typed.tensor_type.shape.dim)


def _axes(node: NodeProto, consts: Constants, opset: int) -> list[int] | None:
    if opset >= 13:
        given = consts(node.input[1]) if len(node.input) > 1 else None
        return None if given is None else [int(a) for a in given.reshape(-1)]
    for a in node.attribute:
        if a.name == "axes":
            return list(a.ints)
    return None


def _row_wise(selected: str, readers: dict[str, list[NodeProto]], consts: Constants,
              types: dict[str, TypeProto], opset: int) -> list[str] | None:
    """The values that hold one row per selected row (the selection's first), each read only by
    nodes that keep that; None when some node reads one otherwise."""
    ranks: dict[str, int] = {selected: 2}
    queue = [selected]
    while queue:
        name = queue.pop()
        for node in readers.get(name, []):
            if node.output and all(o in ranks for o in node.output if o):
                continue  # reached already (it reads several padded values)
            if canonical_domain(node.domain) != "" or node.op_type not in _ROW_WISE \
                    or name not in node.input:  # read inside a subgraph
                return None
            made = _rows_after(node, ranks, consts, types, opset)
            if made is None:
                return None
            ranks[node.output[0]] = made
            queue.append(node.output[0])
    return list(ranks)


def _rows_after(node: NodeProto, ranks: dict[str, int], consts: Constants,
                types: dict[str, TypeProto], opset: int) -> int | None:
    """The rank of `node`'s output if it keeps the rows of its padded input (its rank known),
    else None."""
    op, ins = node.op_type, list(node.input)
    if len(node.output) != 1 or not node.output[0]:
        return None
    attrs = {a.name: a for a in node.attribute}
    if op in ("Cast", "Identity"):
        return ranks[ins[0]]
    if op == "Gather":
        axis = attrs["axis"].i if "axis" in attrs else 0
        data, index = ins[0], ins[1]
        if data in ranks and index not in ranks:  # columns of the rows
            rank, index_rank = ranks[data], _rank(index, types, consts)
            if index_rank is None or (axis % rank if -rank <= axis < rank else 0) == 0:
                return None
            return rank - 1 + index_rank
        if index in ranks and data not in ranks and axis == 0:  # the rows as indices
            rank, data_rank = ranks[index], _rank(data, types, consts)
            return None if data_rank is None else rank + data_rank - 1
        return None
    if op in ("Squeeze", "Unsqueeze") and ins[0] in ranks and all(i not in ranks for i in ins[1:]):
        axes, rank = _axes(node, consts, opset), ranks[ins[0]]
        if not axes:
            return None
        out = rank - len(axes) if op == "Squeeze" else rank + len(axes)
        within = rank if op == "Squeeze" else out
        if any(not -within <= a < within or a % within == 0 for a in axes):
            return None
        return out
    return None


def _const(name: str, value: Any) -> NodeProto:
    """A Constant node of an int64 tensor."""
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.array(value, np.int64), name))


def _hint_rows_body(opset: int) -> FunctionProto:
    """hint[1:]."""
    nodes = [_const("one", [1]), _const("end", [np.iinfo(np.int64).max]), _const("zero", [0]),
             helper.make_node("Slice", ["hint", "one", "end", "zero"], ["rows"])]
    return helper.make_function(DOMAIN, HINT_ROWS, ["hint"], ["rows"], nodes,
                                [helper.make_opsetid("", opset)])


def _take_rows_body(opset: int) -> FunctionProto:
    """rows[:hint[0, 1]]."""
    nodes = [_const("zero", [0]), _const("one", [1]), _const("at", [0, 1]), _const("next", [1, 2]),
             _const("both", [0, 1]),
             helper.make_node("Slice", ["hint", "at", "next", "both"], ["cell"]),
             helper.make_node("Reshape", ["cell", "one"], ["count"]),
             helper.make_node("Slice", ["rows", "zero", "count", "zero"], ["taken"])]
    return helper.make_function(DOMAIN, TAKE_ROWS, ["rows", "hint"], ["taken"], nodes,
                                [helper.make_opsetid("", opset)])
