"""ChannelsLastPass: 2-D conv nets computed channels last (NHWC), transposes only at the edges.

XLA:CPU computes convolutions channels last. Given an NCHW graph it lays most values out
channels last itself, but every fused loop written in channels-first index space (oxla's
depthwise forms, pools) then reads and writes across the layout: the depthwise loops of
MobileNet-small ran 3-10x slower inside the model than alone. This pass rewrites the graph:

- every 2-D Conv becomes `oxla.channels_last::Conv` (X and Y channels last, W unchanged), and
  so does a 2-D ConvTranspose whose kernel equals its stride (one dot, then depth to space);
- a 2-D group-1 ConvInteger without zero points (what QDQConvToIntegerPass and
  QLinearConvCenteringPass write) becomes `oxla.channels_last::ConvInteger` with W stored as
  (kH, kW, C, M): YNNPACK's int8 convolution, channels last, where the channels-first form
  builds im2col columns (a QDQ ResNet-50's 3x3 at 56x56: 0.27 against 0.82 ms);
- Pad and per-tensor or per-channel QuantizeLinear/DequantizeLinear on channels-last inputs
  stay standard ops, with pads reordered and the channel axis renumbered;
- MaxPool (without Indices), AveragePool, GlobalAveragePool, GlobalMaxPool and inference
  BatchNormalization on a channels-last input become their channels-last twins;
- elementwise ops, Concat and spatial ReduceMean/Max/Min/Sum on channels-last inputs stay
  standard ONNX ops, with per-channel constants re-laid out and axes renumbered;
- anything else (Reshape, Flatten, Transpose, Shape, Gather, a graph output, a subgraph) reads
  the NCHW value, which one Transpose node makes from the channels-last one where needed.

Renamed values end in `__oxla_nhwc`; the rewritten graph computes the same outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    helper,
    numpy_helper,
)

from oxla.graph import add_initializer, canonical_domain, constant_values, model_opsets, node_reads
from oxla.passes.qlinear_conv import DOMAIN as REQUANTIZE

DOMAIN = "oxla.channels_last"
SUFFIX = "__oxla_nhwc"
# Switch for measuring the pass on its own (benchmarks/conv.py --channels-last off); plans made
# while it is False keep the model's layout.
ENABLED = True

TO_LAST = (0, 2, 3, 1)    # NCHW -> NHWC
TO_FIRST = (0, 3, 1, 2)   # NHWC -> NCHW
NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}  # where each NCHW axis sits in NHWC

# data input 0, any other inputs left as they are (Clip's min/max are scalars)
UNARY = frozenset({
    "Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu",
    "Celu", "Softplus", "Softsign", "Mish", "Gelu", "ThresholdedRelu", "Identity", "Neg", "Abs",
    "Exp", "Log", "Sqrt", "Reciprocal", "Erf", "Floor", "Ceil", "Round", "Sign", "Cast"})
# every input broadcast against the others
BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu",
                       "Where"})
REDUCE = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum"})
# the opset from which each reduce takes axes as an input instead of an attribute
REDUCE_AXES_INPUT = {"ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18, "ReduceSum": 13}
# AveragePool channels last sums strided slices (Window.sum): a channels-last reduce_window made
# light densenet121's transition pools (2x2, stride 2) come out wrong inside the model (0.441 off
# at the output, every compile) although the same reduce_window alone is exact; exact with
# XLA:CPU's YNNPACK fusions off (XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=), so a YNNPACK
# fusion is suspect (FACTS.md). Larger windows take the channels-first rule between transposes.
POOLS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"})
QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})
CONVS = frozenset({"Conv", "ConvInteger"})
HWIO = (2, 3, 1, 0)       # (M, C, kH, kW) -> (kH, kW, C, M)
# A ConvInteger over fewer input channels (a stem) stays channels first, where its im2col columns
# are cheaper to build: a QDQ ResNet-50's 7x7 over 3 channels, 1.8 against 2.2 ms
INT8_STEM_CHANNELS = 16


@dataclass
class _Rewrite:
    """The state of one pass over a graph."""

    graph: GraphProto
    opset: int
    consts: Callable[[str], np.ndarray | None]
    ranks: dict[str, int]
    last: dict[str, str] = field(default_factory=dict)      # NCHW name -> its NHWC value
    produced: set[str] = field(default_factory=set)         # names only computed channels last
    nodes: list[NodeProto] = field(default_factory=list)
    relaid: dict[str, str] = field(default_factory=dict)    # constant name -> NHWC initializer
    shuffles: dict[str, tuple[NodeProto, NodeProto]] = field(default_factory=dict)
    skip: set[str] = field(default_factory=set)             # outputs of nodes already rewritten
    converted: int = 0

    # --- values --------------------------------------------------------------------------------

    def to_last(self, name: str) -> str:
        """The NHWC value of a 4-D NCHW value, adding one Transpose the first time."""
        if name not in self.last:
            self.last[name] = name + SUFFIX
            self.nodes.append(helper.make_node("Transpose", [name], [name + SUFFIX],
                                               name=name + "_to_nhwc", perm=list(TO_LAST)))
        return self.last[name]

    def to_first(self, name: str) -> None:
        """Make the NCHW `name` exist (a Transpose of its NHWC value) if only that was computed."""
        if name in self.produced:
            self.produced.discard(name)
            self.nodes.append(helper.make_node("Transpose", [self.last[name]], [name],
                                               name=name + "_to_nchw", perm=list(TO_FIRST)))

    def operand(self, name: str, *, make: bool = True) -> str | None:
        """An elementwise operand in NHWC terms, or None when it cannot be had.

        With make=False only says whether it can be had, adding nothing to the graph.
        """
        if not name or name in self.last:
            return self.last.get(name, name)
        value = self.consts(name)
        if value is not None:
            if value.ndim > 4:
                return None
            if value.size == 1 or not make:
                return name
            if name not in self.relaid:
                full = value.reshape((1,) * (4 - value.ndim) + value.shape)
                relaid = np.ascontiguousarray(full.transpose(TO_LAST))
                self.relaid[name] = name + SUFFIX
                add_initializer(self.graph, name + SUFFIX, relaid)
            return self.relaid[name]
        rank = self.ranks.get(name)
        if rank == 0 or (rank is not None and not make and rank <= 4):
            return name
        if rank == 4:
            return self.to_last(name)
        if rank is not None and rank < 4:  # e.g. a (C, 1, 1) scale computed from constants
            if name not in self.relaid:
                self.relaid[name] = name + "_b" + SUFFIX
                self.nodes.append(helper.make_node("ToLast", [name], [self.relaid[name]],
                                                   name=name + "_to_nhwc", domain=DOMAIN))
            return self.relaid[name]
        return None

    def emit(self, node: NodeProto, inputs: Sequence[str], *, domain: str | None = None,
             last_outputs: int = 1, attrs: dict | None = None) -> None:
        """`node` with new inputs and its first `last_outputs` outputs computed channels last."""
        new = NodeProto()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(inputs)
        if domain is not None:
            new.domain = domain
        for i in range(last_outputs):
            out = node.output[i]
            if out:
                new.output[i] = out + SUFFIX
                self.last[out] = out + SUFFIX
                self.produced.add(out)
        for name, value in (attrs or {}).items():
            for a in new.attribute:
                if a.name == name:
                    new.attribute.remove(a)
                    break
            new.attribute.append(helper.make_attribute(name, value))
        self.nodes.append(new)
        self.converted += 1

    # --- nodes ---------------------------------------------------------------------------------

    def visit(self, node: NodeProto) -> None:
        if node.output and node.output[0] in self.skip:
            return
        if node.output and node.output[0] in self.shuffles and node.input[0] in self.last:
            self._shuffle(node)
            return
        if canonical_domain(node.domain) == "" and not _attr(node, "broadcast") and self._convert(node):
            return
        if node.domain in ("com.microsoft", REQUANTIZE) and self._contrib(node):
            return
        for name in sorted(node_reads(node)):
            self.to_first(name)
        self.nodes.append(node)

    def _convert(self, node: NodeProto) -> bool:
        op = node.op_type
        x = node.input[0] if node.input else ""
        if op == "Conv":
            if len(node.input) < 2 or self.ranks.get(node.input[1]) != 4:
                return False
            self.emit(node, [self.last[x] if x in self.last else self.to_last(x), *node.input[1:]],
                      domain=DOMAIN)
            return True
        if op == "ConvInteger":
            return self._conv_integer(node)
        if op == "ConvTranspose" and self._dot_transpose(node):
            self.emit(node, [self.last[x] if x in self.last else self.to_last(x), *node.input[1:]],
                      domain=DOMAIN)
            return True
        if x not in self.last:
            return False
        if op in UNARY or op == "Dropout":  # Dropout's mask is elementwise too
            self.emit(node, [self.last[x], *node.input[1:]], last_outputs=len(node.output))
            return True
        if op in BROADCAST or op == "Concat":
            return self._broadcast(node)
        if op in POOLS and (len(node.output) == 1 or not node.output[1]):
            self.emit(node, [self.last[x]], domain=DOMAIN)
            return True
        if op == "BatchNormalization" and self.opset >= 9 and len(node.output) == 1 \
                and not _attr(node, "training_mode"):
            self.emit(node, [self.last[x], *node.input[1:]], domain=DOMAIN)
            return True
        if op in REDUCE:
            return self._reduce(node)
        if op == "Split":
            axis = _attr(node, "axis", 0)
            if not -4 <= axis < 4:
                return False
            self.emit(node, [self.last[x], *node.input[1:]], last_outputs=len(node.output),
                      attrs={"axis": NHWC_AXIS[axis % 4]})
            return True
        if op == "Slice" and self.opset >= 10:
            return self._slice(node)
        if op == "Pad":
            return self._pad(node)
        if op in QDQ:
            return self._qdq(node)
        if op == "Resize" and self.opset >= 11:
            return self._resize(node)
        return False

    def _contrib(self, node: NodeProto) -> bool:
        """onnxruntime's QLinearAdd/QLinearMul with per-tensor parameters (elementwise on A and
        B) and QLinearGlobalAveragePool (its channels_last attribute set) on channels-last
        inputs: QOperator models' residual adds and pool, which stay com.microsoft ops; and
        oxla.quantized::Requantize (elementwise, its multiplier re-laid out)."""
        op, ins = node.op_type, list(node.input)
        if node.domain == REQUANTIZE:  # oxla.quantized::Requantize(acc, multiplier, zero point)
            if op != "Requantize" or ins[0] not in self.last or self.operand(ins[1], make=False) is None:
                return False
            self.emit(node, [self.last[ins[0]], self.operand(ins[1]) or "", ins[2]])
            return True
        if op == "QLinearGlobalAveragePool" and ins and ins[0] in self.last \
                and not _attr(node, "channels_last"):
            self.emit(node, [self.last[ins[0]], *ins[1:]], attrs={"channels_last": 1})
            return True
        if op not in ("QLinearAdd", "QLinearMul") or len(ins) < 7:
            return False
        params = [n for i, n in enumerate(ins) if i not in (0, 3) and n]
        if not (ins[0] in self.last or ins[3] in self.last) \
                or any(self.operand(n, make=False) is None for n in (ins[0], ins[3])) \
                or any((v := self.consts(n)) is None or v.size != 1 for n in params):
            return False
        ins[0], ins[3] = self.operand(ins[0]) or "", self.operand(ins[3]) or ""
        self.emit(node, ins)
        return True

    def _conv_integer(self, node: NodeProto) -> bool:
        """ConvInteger, 2-D, group 1, no zero points, not a stem (INT8_STEM_CHANNELS): X channels
        last, W as (kH, kW, C, M) (a re-laid-out initializer when W is constant, else a
        Transpose node)."""
        w_name = node.input[1] if len(node.input) > 1 else ""
        if self.ranks.get(w_name) != 4 or any(node.input[2:]) or _attr(node, "group", 1) != 1:
            return False
        w = self.consts(w_name)
        if w is not None and w.shape[1] < INT8_STEM_CHANNELS:
            return False
        hwio = (node.output[0] or node.name) + "_w" + SUFFIX
        if w is not None:
            self.graph.initializer.append(numpy_helper.from_array(
                np.ascontiguousarray(w.transpose(HWIO)), hwio))
        else:
            self.nodes.append(helper.make_node("Transpose", [w_name], [hwio], name=hwio, perm=list(HWIO)))
        x = node.input[0]
        self.emit(node, [self.last[x] if x in self.last else self.to_last(x), hwio], domain=DOMAIN)
        return True

    def _pad(self, node: NodeProto) -> bool:
        """Pad of a 4-D value by constant pads (an attribute before v11), no axes: pads reordered."""
        if self.opset < 11:
            pads = _ints(node, "pads")
            if pads is None or len(pads) != 8:
                return False
            self.emit(node, [self.last[node.input[0]]], attrs={"pads": _pads_last(pads)})
            return True
        ins = list(node.input)
        pads_value = self.consts(ins[1]) if len(ins) > 1 and ins[1] else None
        if pads_value is None or pads_value.size != 8 or (len(ins) > 3 and ins[3]):
            return False
        ins[1] = self._constant_input(node, 1, "_pads",
                                      np.asarray(_pads_last([int(v) for v in pads_value.reshape(-1)]), np.int64))
        self.emit(node, [self.last[ins[0]], *ins[1:]])
        return True

    def _qdq(self, node: NodeProto) -> bool:
        """QuantizeLinear/DequantizeLinear with a scalar scale and zero point (elementwise), or
        per channel along a 1-D axis (renumbered); no blocks."""
        if _attr(node, "block_size", 0):
            return False
        params = [self.consts(n) if n else np.zeros(1) for n in node.input[1:3]]
        if any(p is None for p in params):
            return False
        sizes = {p.size for p in params if p is not None}
        if sizes == {1}:
            self.emit(node, [self.last[node.input[0]], *node.input[1:]])
            return True
        if any(p is not None and p.ndim != 1 and p.size != 1 for p in params):
            return False
        axis = _attr(node, "axis", 1)
        if not -4 <= axis < 4:
            return False
        self.emit(node, [self.last[node.input[0]], *node.input[1:]], attrs={"axis": NHWC_AXIS[axis % 4]})
        return True

    def _dot_transpose(self, node: NodeProto) -> bool:
        """Whether a ConvTranspose is 2-D with kernel == stride and no dilation: one dot and a
        depth-to-space channels last (conv_forms.transposed_dot), where the channels-first one
        transposes single elements."""
        w = self.consts(node.input[1]) if len(node.input) > 1 else None
        if w is None or w.ndim != 4:
            return False
        kernel = list(w.shape[2:])
        return (_ints(node, "strides") or [1, 1]) == kernel and (_ints(node, "dilations") or [1, 1]) == [1, 1]

    def _constant_input(self, node: NodeProto, i: int, suffix: str, value: np.ndarray) -> str:
        """A new initializer for input `i` of `node`: its channels-last `value`."""
        name = (node.output[0] or node.name) + suffix + SUFFIX
        add_initializer(self.graph, name, value)
        return name

    def _slice(self, node: NodeProto) -> bool:
        """Slice (v10+) with constant axes (or none: the first len(starts) axes), renumbered."""
        ins = list(node.input) + [""] * (5 - len(node.input))
        starts = self.consts(ins[1])
        given = self.consts(ins[3]) if ins[3] else None if starts is None else np.arange(starts.size)
        if given is None:
            return False
        if any(not -4 <= int(a) < 4 for a in given.reshape(-1)):
            return False
        moved = np.asarray([NHWC_AXIS[int(a) % 4] for a in given.reshape(-1)], np.int64)
        ins[3] = self._constant_input(node, 3, "_axes", moved)
        self.emit(node, [self.last[ins[0]], *ins[1:3], ins[3], ins[4]][:max(4, len(node.input))])
        return True

    def _resize(self, node: NodeProto) -> bool:
        """Resize (v11+) by constant 4-D scales or sizes, no roi and no axes: both re-laid out."""
        ins = list(node.input) + [""] * (4 - len(node.input))
        roi = self.consts(ins[1]) if ins[1] else np.zeros(0)
        if roi is None or roi.size or any(a.name == "axes" for a in node.attribute) \
                or any(a.name == "keep_aspect_ratio_policy" for a in node.attribute):
            return False
        for i, suffix in ((2, "_scales"), (3, "_sizes")):
            value = self.consts(ins[i]) if ins[i] else np.zeros(0)
            if value is None or value.size not in (0, 4):
                return False
            if value.size:
                ins[i] = self._constant_input(node, i, suffix,
                                              np.ascontiguousarray(value.reshape(4)[list(TO_LAST)]))
        self.emit(node, [self.last[ins[0]], *ins[1:]][:len(node.input)])
        return True

    def _broadcast(self, node: NodeProto) -> bool:
        if any(self.operand(n, make=False) is None for n in node.input):
            return False
        attrs = None
        if node.op_type == "Concat":
            axis = _attr(node, "axis", 1)
            if not -4 <= axis < 4 or any(n not in self.last for n in node.input):
                return False
            attrs = {"axis": NHWC_AXIS[axis % 4]}
        self.emit(node, [self.operand(n) or "" for n in node.input], attrs=attrs)
        return True

    def _shuffle(self, first: NodeProto) -> None:
        """ShuffleNet's channel shuffle, Reshape (N, g, C/g, H, W) -> Transpose (0, 2, 1, 3, 4)
        -> Reshape (N, C, H, W), done channels last: (N, H, W, g, C/g) swapping the last two."""
        transpose, second = self.shuffles[first.output[0]]
        s1 = [int(v) for v in self.consts(first.input[1]).reshape(-1)]  # type: ignore[union-attr]
        s2 = [int(v) for v in self.consts(second.input[1]).reshape(-1)]  # type: ignore[union-attr]
        steps = [(first, [s1[0], s1[3], s1[4], s1[1], s1[2]]), (second, [s2[0], s2[2], s2[3], s2[1]])]
        names = [self.last[first.input[0]]]
        for node, shape in steps:
            init = node.output[0] + "_shape" + SUFFIX
            self.graph.initializer.append(numpy_helper.from_array(np.asarray(shape, np.int64), init))
            names.append(node.output[0] + SUFFIX)
            self.nodes.append(helper.make_node("Reshape", [names[-2], init], [names[-1]],
                                               name=(node.name or node.output[0]) + SUFFIX))
            if node is first:
                names.append(transpose.output[0] + SUFFIX)
                self.nodes.append(helper.make_node("Transpose", [names[-2]], [names[-1]],
                                                   perm=[0, 1, 2, 4, 3],
                                                   name=(transpose.name or names[-1]) + SUFFIX))
        out = second.output[0]
        self.last[out] = names[-1]
        self.produced.add(out)
        self.skip.update({transpose.output[0], out})
        self.converted += 3

    def _reduce(self, node: NodeProto) -> bool:
        from_input = self.opset >= REDUCE_AXES_INPUT[node.op_type]
        if from_input:
            given = self.consts(node.input[1]) if len(node.input) > 1 and node.input[1] else None
            axes = None if given is None else [int(a) for a in given.reshape(-1)]
        else:
            axes = _ints(node, "axes")
        if not axes or any(not -4 <= a < 4 for a in axes):
            return False
        moved = sorted(NHWC_AXIS[a % 4] for a in axes)
        keep = [a for a in range(4) if a % 4 not in {b % 4 for b in axes}]
        keepdims = _attr(node, "keepdims", 1)
        if not keepdims and keep != sorted(keep, key=lambda a: NHWC_AXIS[a]):
            return False  # the kept axes would come out in another order
        inputs = [self.last[node.input[0]]]
        attrs = None
        if from_input:
            name = node.output[0] + "_axes" + SUFFIX
            self.graph.initializer.append(numpy_helper.from_array(np.asarray(moved, np.int64), name))
            inputs.append(name)
        else:
            attrs = {"axes": moved}
        # without keepdims the reduced value is the same in both layouts
        self.emit(node, inputs, last_outputs=1 if keepdims else 0, attrs=attrs)
        return True


def _pads_last(pads: Sequence[int]) -> list[int]:
    """NCHW pads (begins, then ends) in NHWC order."""
    begins, ends = list(pads[:4]), list(pads[4:])
    return [begins[a] for a in TO_LAST] + [ends[a] for a in TO_LAST]


def _attr(node: NodeProto, name: str, default: int = 0) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), default)


def _ints(node: NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def _shuffles(graph: GraphProto, consts: Callable[[str], np.ndarray | None]
              ) -> dict[str, tuple[NodeProto, NodeProto]]:
    """Channel shuffles (Reshape to 5-D, Transpose (0, 2, 1, 3, 4), Reshape to 4-D, constant
    shapes, nothing else reading the intermediate values), by the first Reshape's output."""
    readers: dict[str, list[NodeProto]] = {}
    for node in graph.node:
        for name in node_reads(node):
            readers.setdefault(name, []).append(node)
    for out in graph.output:
        readers.setdefault(out.name, []).append(NodeProto())

    def only_reader(name: str, op: str) -> NodeProto | None:
        found = readers.get(name, [])
        ok = len(found) == 1 and found[0].op_type == op and canonical_domain(found[0].domain) == ""
        return found[0] if ok else None

    def shape(node: NodeProto, rank: int) -> bool:
        value = consts(node.input[1]) if len(node.input) == 2 else None
        # a 0 copies the input's dimension at that index, which moves: only the batch's may be 0
        return value is not None and value.shape == (rank,) and 0 not in value[1:] \
            and not _attr(node, "allowzero")

    found = {}
    for node in graph.node:
        if node.op_type != "Reshape" or canonical_domain(node.domain) != "" or not shape(node, 5):
            continue
        transpose = only_reader(node.output[0], "Transpose")
        if transpose is None or _ints(transpose, "perm") != [0, 2, 1, 3, 4]:
            continue
        second = only_reader(transpose.output[0], "Reshape")
        if second is not None and second.input[0] == transpose.output[0] and shape(second, 4):
            found[node.output[0]] = (transpose, second)
    return found


SAME_RANK = UNARY | POOLS | QDQ | {"Dropout", "BatchNormalization", "Transpose", "LRN", "Softmax",
                                   "Pad"}


def _ranks(graph: GraphProto) -> dict[str, int]:
    """The ranks the graph states or that follow from them through simple ops."""
    ranks = {t.name: len(t.dims) for t in graph.initializer}
    lengths = {t.name: int(t.dims[0]) for t in graph.initializer if len(t.dims) == 1}
    for info in [*graph.input, *graph.value_info]:
        if info.type.tensor_type.HasField("shape"):
            ranks[info.name] = len(info.type.tensor_type.shape.dim)
    for node in graph.node:
        rank = _rank_of(node, ranks, lengths)
        if rank is not None and node.output and node.output[0]:
            ranks[node.output[0]] = rank
    return ranks


def _rank_of(node: NodeProto, ranks: dict[str, int], lengths: dict[str, int]) -> int | None:
    """The rank of a node's first output, when its op and its inputs' ranks decide it."""
    op, ins = node.op_type, list(node.input)
    first = ranks.get(ins[0]) if ins else None
    if node.domain == REQUANTIZE and op == "Requantize":
        return first
    if node.domain == "com.microsoft" and op in ("QLinearAdd", "QLinearMul") and len(ins) > 3:
        pair = [ranks.get(ins[0]), ranks.get(ins[3])]
        return None if None in pair else max(r for r in pair if r is not None)
    if canonical_domain(node.domain) != "":
        return None
    if op == "Constant" and node.attribute and node.attribute[0].name == "value":
        return len(node.attribute[0].t.dims)
    if op in ("ConstantOfShape", "Reshape") and ins and ins[-1] in lengths:
        return lengths[ins[-1]]
    if op in SAME_RANK:
        return first
    if op in BROADCAST:
        known = [ranks.get(n) for n in ins if n]
        return None if None in known or not known else max(k for k in known if k is not None)
    if op in CONVS and len(ins) > 1:
        return ranks.get(ins[1])
    if op in ("Unsqueeze", "Squeeze") and first is not None:
        axes = _ints(node, "axes")
        count = len(axes) if axes is not None else lengths.get(ins[1]) if len(ins) > 1 else None
        if count is None:
            return None
        return first + count if op == "Unsqueeze" else first - count
    return None


def convs_to_channels_last(model: ModelProto) -> int:
    """Rewrite `model`'s main graph channels last between its 2-D convolutions.

    Returns:
        How many nodes now compute channels last (0: the model is left unchanged).
    """
    if not ENABLED:
        return 0
    graph = model.graph
    opset = model_opsets(model.opset_import).get("", 0)
    if not any(n.op_type in CONVS and canonical_domain(n.domain) == "" for n in graph.node):
        return 0
    consts = constant_values(graph)
    rw = _Rewrite(graph, opset, consts, _ranks(graph), shuffles=_shuffles(graph, consts))
    for node in graph.node:
        rw.visit(node)
    for out in graph.output:
        rw.to_first(out.name)
    if not rw.converted:
        return 0
    del graph.node[:]
    graph.node.extend(rw.nodes)
    if DOMAIN not in model_opsets(model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    _add_bodies(model, rw.nodes, opset)
    return rw.converted


# Each channels-last op as an ONNX function of standard ops (transpose, the op, transpose back):
# the planned model (what a session writes as its optimized model after a graph break) stays a
# valid model that onnxruntime runs. oxla itself runs the native rules: the dispatch table was
# built before this pass, so it does not see these functions.
# op -> (inputs, {input index: the Transpose perm that gives the ONNX op its layout})
_X: dict[int, tuple[int, ...]] = {0: TO_FIRST}
_BODY_INPUTS: dict[str, tuple[list[str], dict[int, tuple[int, ...]]]] = {
    "Conv": (["X", "W", "B"], _X), "ConvTranspose": (["X", "W", "B"], _X),
    "ConvInteger": (["X", "W"], {0: TO_FIRST, 1: (3, 2, 0, 1)}),  # W: (kH, kW, C, M) -> (M, C, kH, kW)
    "MaxPool": (["X"], _X),
    "AveragePool": (["X"], _X),
    "GlobalAveragePool": (["X"], _X),
    "GlobalMaxPool": (["X"], _X),
    "BatchNormalization": (["X", "scale", "B", "mean", "var"], _X)}


def _add_bodies(model: ModelProto, nodes: Sequence[NodeProto], opset: int) -> None:
    """Add (once) a model-local function body for every channels-last op `nodes` use."""
    attrs: dict[str, dict[str, int]] = {}
    for node in nodes:
        if node.domain == DOMAIN:
            used = attrs.setdefault(node.op_type, {})
            used.update({a.name: a.type for a in node.attribute})
    have = {(f.domain, f.name) for f in model.functions}
    for op, used in sorted(attrs.items()):
        if (DOMAIN, op) not in have:
            model.functions.append(_body(op, used, opset))
    if attrs:
        model.ir_version = max(model.ir_version, 8)  # model-local functions


def _body(op: str, used: dict[str, int], opset: int) -> FunctionProto:
    imports = [helper.make_opsetid("", opset)]
    if op == "ToLast":  # leading 1s up to rank 4 (Expand broadcasts), then NCHW -> NHWC
        ones = helper.make_node("Constant", [], ["ones"], value=numpy_helper.from_array(
            np.ones(4, np.int64), "ones"))
        nodes = [ones, helper.make_node("Expand", ["X", "ones"], ["full"]),
                 helper.make_node("Transpose", ["full"], ["Y"], perm=list(TO_LAST))]
        return helper.make_function(DOMAIN, op, ["X"], ["Y"], nodes, imports)
    inputs, moved = _BODY_INPUTS[op]
    args = [f"{n}_first" if i in moved else n for i, n in enumerate(inputs)]
    nodes = [helper.make_node("Transpose", [inputs[i]], [args[i]], perm=list(perm))
             for i, perm in moved.items()]
    core = helper.make_node(op, args, ["Y_first"])
    core.attribute.extend(helper.make_attribute_ref(name, AttributeProto.AttributeType.ValueType(kind))
                          for name, kind in sorted(used.items()))
    nodes += [core, helper.make_node("Transpose", ["Y_first"], ["Y"], perm=list(TO_LAST))]
    return helper.make_function(DOMAIN, op, inputs, ["Y"], nodes, imports,
                                attributes=sorted(used))
