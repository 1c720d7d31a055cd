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
taken 205, 197 and 65 us), the whole model 0.949x the time. Each new op carries an ONNX function body, so the planned model stays a
model onnxruntime runs: the hint's body settles nothing, the host op's body is the ONNX op.
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, FunctionProto, ModelProto, NodeProto, helper, numpy_helper

from oxla.graph import canonical_domain, model_opsets

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
    """The hint that settles nothing: [[-1]]."""
    none = helper.make_node("Constant", [], ["hint"],
                            value=numpy_helper.from_array(np.full((1, 1), -1, np.int64), "hint"))
    return helper.make_function(DOMAIN, "NonMaxSuppressionRanked", _INPUTS, ["hint"], [none],
                                [helper.make_opsetid("", opset)], attributes=["center_point_box"])


def _select_body(opset: int) -> FunctionProto:
    """The ONNX op itself, the hint unread."""
    core = helper.make_node("NonMaxSuppression", _INPUTS, ["selected"])
    core.attribute.append(helper.make_attribute_ref("center_point_box", AttributeProto.INT))
    return helper.make_function(DOMAIN, "NonMaxSuppression", ["hint", *_INPUTS], ["selected"], [core],
                                [helper.make_opsetid("", opset)], attributes=["center_point_box"])
