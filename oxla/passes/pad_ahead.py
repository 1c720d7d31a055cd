"""PadAheadPass: a strided channels-last Conv's zero padding made by its producer Conv instead.

Inside a channels-last MobileNet-style block (stride-1 Conv, activation, strided depthwise
Conv), XLA:CPU writes the activation padded, one pass over the block's largest tensor that
fuses with neither the dot before it nor the taps after it. Growing the producer's own pads
instead (its input's pad fuses into whatever made that input) makes its output padded already:
the output's border is then zeroed by `oxla.pad_ahead::ZeroBorder` (a select on the pixel's position),
which XLA fuses with the activation into the strided Conv's loop, and the strided Conv runs
without pads. Suite detector (three such blocks at 160, 80 and 40 pixels), one thread: 6.96 -> 6.38
ms (interleaved A/B); MobileNetV3-small and ShuffleNetV2 unchanged.

Rewritten: stride-1 `oxla.channels_last::Conv` P -> [one unary activation A, or SiLU as
P * Sigmoid(P)] -> strided grouped `oxla.channels_last::Conv` D with explicit pads, where P's and
A's outputs have no other reader (P's none but the SiLU's two nodes).
"""

from __future__ import annotations

import numpy as np
from onnx import AttributeProto, FunctionProto, ModelProto, NodeProto, helper

from oxla.graph import is_onnx_op, model_opsets, node_reads
from oxla.passes.channels_last import DOMAIN as LAST

DOMAIN = "oxla.pad_ahead"
SUFFIX = "__oxla_pad_ahead"
# Activations cheap enough to recompute per tap (the strided Conv's loop evaluates them for every
# window that reads an element), and that keep a finite input (the border's bias) finite. With
# HardSwish before MobileNetV3-small's 5x5 depthwise convs, and with larger kernels, it was slower.
ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu"})
MAX_TAPS = 9


def pad_ahead(model: ModelProto, keep: set[str] | frozenset[str] = frozenset()) -> int:
    """Move the pads of depthwise channels-last Convs ahead into their producer Convs; returns
    how many Convs lost their pads. Not those of the Convs whose outputs are in `keep` (the
    grouped ones NativeGemmPass will put on the convolution kernel, which pads in the kernel: the
    producer would stay XLA's as a padded 1x1 convolution, ResNeXt-50's strided blocks)."""
    graph = model.graph
    readers: dict[str, int] = {o.name: 1 for o in graph.output}
    for node in graph.node:
        for name in node_reads(node):
            readers[name] = readers.get(name, 0) + 1
    made = {o: node for node in graph.node for o in node.output}
    after: dict[int, NodeProto] = {}   # id(node) -> the ZeroBorder to insert after it
    for conv in graph.node:
        pads = _consumer_pads(conv)
        if pads is None or conv.output[0] in keep:
            continue
        act = made.get(conv.input[0])
        src, uses = act, 1
        if act is not None and act.domain in ("", "ai.onnx") and act.op_type in ACTIVATIONS:
            src = made.get(act.input[0]) if readers.get(act.output[0]) == 1 else None
        elif act is not None and (x := _silu_input(act, made, readers)) is not None:
            src, uses = made.get(x), 2
        else:
            act = None
        grown = None if src is None or readers.get(src.output[0]) != uses else _grown_pads(src, pads)
        if src is None or grown is None:
            continue
        _set_pads(src, grown)
        k = len(pads) // 2
        full = [0, *pads[:k], 0, 0, *pads[k:], 0]  # NHWC: no pads on N and C
        base = f"{conv.output[0]}{SUFFIX}"
        last = act if act is not None else src
        after[id(last)] = helper.make_node("ZeroBorder", [last.output[0]], [f"{base}_zeroed"],
                                           domain=DOMAIN, name=f"{base}_zero", pads=full)
        conv.input[0] = f"{base}_zeroed"
        _set_pads(conv, [0] * len(pads))
    if not after:
        return 0
    nodes = []
    for node in graph.node:
        nodes += [node, after[id(node)]] if id(node) in after else [node]
    del graph.node[:]
    graph.node.extend(nodes)
    if DOMAIN not in model_opsets(model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    if not any(f.domain == DOMAIN for f in model.functions):
        # Pad's pads as an input (11), Constant's value_ints (12)
        model.functions.append(_body(max(model_opsets(model.opset_import).get("", 0), 12)))
    model.ir_version = max(model.ir_version, 8)  # model-local functions
    return len(after)


def _silu_input(mul: NodeProto, made: dict[str, NodeProto], readers: dict[str, int]) -> str | None:
    """x of x * Sigmoid(x) (SiLU as torch exports it) when `mul` is that product, read once,
    and its Sigmoid is read by `mul` alone. oxla stores a float32 product (qmath.mul32), so the
    strided Conv's loop reads the stored SiLU and recomputes only the border's select."""
    if not is_onnx_op(mul, "Mul") or len(mul.input) != 2 or readers.get(mul.output[0]) != 1:
        return None
    for x, y in (mul.input, reversed(mul.input)):
        sig = made.get(y)
        if is_onnx_op(sig, "Sigmoid") and sig is not None and sig.input[0] == x \
                and readers.get(sig.output[0]) == 1:
            return x
    return None


def _set_pads(node: NodeProto, pads: list[int]) -> None:
    for attr in node.attribute:
        if attr.name == "pads":
            attr.ints[:] = pads
            return
    node.attribute.append(helper.make_attribute("pads", pads))


def _grown_pads(node: NodeProto, extra: list[int]) -> list[int] | None:
    """A 2-D channels-last Conv's pads grown so that its output gains `extra` pixels (begins,
    ends) around the same values: strides times `extra`. None when it is not such a Conv."""
    if node.domain != LAST or node.op_type != "Conv":
        return None
    a = _attrs(node)
    strides, pads = a.get("strides", [1, 1]), a.get("pads", [0, 0, 0, 0])
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or not isinstance(strides, list) \
            or not isinstance(pads, list) or len(strides) != 2 or len(pads) != 4:
        return None
    if max(strides) > 1:  # measured with stride-1 producers only (any stride would be exact)
        return None
    return [p + s * e for p, s, e in zip(pads, strides * 2, extra)]


def _attrs(node: NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _consumer_pads(node: NodeProto) -> list[int] | None:
    """A grouped 2-D channels-last Conv's explicit, non-negative pads when it is strided and
    padded (its taps fuse the border's select; XLA's own dense convolution would not). The
    detector's stride-1 depthwise Conv after its stem gained nothing (5.88 -> 5.91 ms)."""
    if node.domain != LAST or node.op_type != "Conv":
        return None
    a = _attrs(node)
    group, kernel = a.get("group", 1), a.get("kernel_shape")
    if not isinstance(group, int) or group < 2 or not isinstance(kernel, list) \
            or int(np.prod(kernel)) > MAX_TAPS:
        return None
    pads, strides = a.get("pads"), a.get("strides")
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or not isinstance(pads, list) \
            or len(pads) != 4 or not isinstance(strides, list) or max(strides) < 2:
        return None
    return pads if min(pads) >= 0 and max(pads) > 0 else None


def _body(opset: int) -> FunctionProto:
    """ZeroBorder as ONNX: crop the border (negative pads), then pad it back with zeros."""
    pads = helper.make_node("Constant", [], ["pads"])
    pads.attribute.append(helper.make_attribute_ref("value_ints", AttributeProto.INTS))
    pads.attribute[0].ref_attr_name = "pads"
    nodes = [pads, helper.make_node("Neg", ["pads"], ["crop"]),
             helper.make_node("Pad", ["X", "crop"], ["inner"]),
             helper.make_node("Pad", ["inner", "pads"], ["Y"])]
    return helper.make_function(DOMAIN, "ZeroBorder", ["X"], ["Y"], nodes,
                                [helper.make_opsetid("", opset)], attributes=["pads"])
