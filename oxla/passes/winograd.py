"""WinogradPass: wide channels-last 3x3 convolutions with constant kernels run as Winograd F(2x2, 3x3).

After ChannelsLastPass, an `oxla.channels_last::Conv` with a constant float32 3x3 kernel, stride
1, dilation 1, group 1, padding 1 on every side, and at least MIN_CHANNELS input and output
channels becomes `oxla.winograd::Conv`, reading the kernel's Winograd transform U = G g G^T
(4, 4, C, M), made here once (the rule: oxla/lowering/ops/winograd.py). The kernel itself is
dropped where nothing else reads it. Narrower layers stay XLA's convolution: at 64 channels and
56x56 the two took the same time, and each Winograd layer adds compile time (ResNet-50's first
call 1.28 -> 1.55 s with the 10 layers of 128 channels or more, 1.8 s with the 13 of 64 or more).
Layers whose output shape inference finds small (at most MAX_SMALL_TILES tiles) stay too.
Where the plan runs oxla's native kernels (`native`), layers from NATIVE_MIN_CHANNELS channels
are taken: NativeGemmPass then makes them `oxla.native::Wino*`, oxla's Winograd kernel, which
does not add XLA kernels (one custom call a layer) and wins at 64 channels too.

The planned model stays a valid ONNX model: the op has a model-local function body that turns
U back into the kernel (g = P U P^T, P G = I) and runs the standard Conv between transposes.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import FunctionProto, ModelProto, NodeProto, helper, numpy_helper

from oxla import native as oxla_native
from oxla.graph import add_initializer, drop_initializers, inferred_types, model_opsets, node_reads
from oxla.lowering.ops.winograd import DOMAIN, P, kernel_transform
from oxla.passes.channels_last import DOMAIN as LAST
from oxla.passes.channels_last import TO_FIRST, TO_LAST
from oxla.passes.weight_layout import conv_hwio, plain_conv_attributes

SUFFIX = "__oxla_winograd"
MIN_CHANNELS = 128
# With oxla's native kernels (NativeGemmPass makes these layers `oxla.native::Wino*`, its Winograd
# kernel) from this many input and output channels: the kernel against its implicit-GEMM
# convolution, two threads, 24 -> 40 channels at 9x9 0.88x the time, 64 at 56x56 and 80x80
# 0.65-0.68x, 3 -> 17 at 5x5 1.10x.
NATIVE_MIN_CHANNELS = 16
# A layer whose output is known (from shape inference) to be at most this many 2x2 tiles stays
# XLA's convolution: at 7x7 (16 tiles) the transformed kernels (16 x C x M, 16.8 MB at 512
# channels) are read for 16 tiles only, and XLA's convolution was faster. ResNet-50 (two such
# layers), both orders in one process: one thread 56.6 -> 55.0 and 58.4 -> 55.8 ms, default
# threads equal (40.5 / 40.8, 41.2 / 41.1); its load 0.95 -> 0.68 s, first call 1.64 -> 1.57 s.
# The DBNet-style segmenter's 512-channel layers at 10x10 (25 tiles) keep Winograd: without it
# they ran slower at default threads (46.9 -> 48.5 and 47.8 -> 51.2 ms), equal at one thread.
MAX_SMALL_TILES = 16


def _eligible(node: NodeProto) -> bool:
    attrs = plain_conv_attributes(node, [3, 3])
    if attrs is None:
        return False
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return True  # 3x3 at stride 1: one on each side
    return auto_pad in ("NOTSET", "") and list(attrs.get("pads", [0, 0, 0, 0])) == [1, 1, 1, 1]


def _small_outputs(model: ModelProto) -> set[str]:
    """Names of values that shape inference finds to be channels-last images of at most
    MAX_SMALL_TILES 2x2 tiles in all (over the batch when it is known, else for one image);
    none when inference fails (every layer is then eligible)."""
    try:
        graph = inferred_types(model)
    except Exception:  # the pass only loses a hint, never the model
        return set()
    small = set()
    for value in [*graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        if len(dims) != 4 or not all(d.HasField("dim_value") for d in dims[1:3]):
            continue
        batch = dims[0].dim_value if dims[0].HasField("dim_value") else 1
        if batch * math.ceil(dims[1].dim_value / 2) * math.ceil(dims[2].dim_value / 2) <= MAX_SMALL_TILES:
            small.add(value.name)
    return small


def convs_to_winograd(model: ModelProto, native: bool = False) -> int:
    """Rewrite the eligible channels-last Convs of the main graph; returns how many. With
    `native` (the plan runs oxla's kernels, which take these layers over), layers from
    NATIVE_MIN_CHANNELS channels."""
    least = NATIVE_MIN_CHANNELS if native and oxla_native.available() else MIN_CHANNELS
    graph = model.graph
    fed = {i.name for i in graph.input}
    inits = {t.name: t for t in graph.initializer if t.name not in fed}
    producers = {o: n for n in graph.node for o in n.output}
    readers: dict[str, int] = {}
    for n in graph.node:
        for name in node_reads(n):
            readers[name] = readers.get(name, 0) + 1
    outputs = {o.name for o in graph.output}
    count = 0
    small: set[str] | None = None  # inferred only when a layer is otherwise eligible
    for node in graph.node:
        if node.op_type != "Conv" or node.domain != LAST or len(node.input) < 2 or not _eligible(node):
            continue
        found = conv_hwio(node, producers, inits)
        if found is None:
            continue
        hwio, names = found
        if hwio.dtype != np.float32 or hwio.shape[:2] != (3, 3) \
                or min(hwio.shape[2], hwio.shape[3]) < least \
                or any(readers.get(n, 0) != 1 or n in outputs for n in names):
            continue
        if small is None:
            small = _small_outputs(model)
        if node.output[0] in small:
            continue
        u_name = names[-1] + SUFFIX
        add_initializer(graph, u_name, kernel_transform(hwio))
        node.input[1] = u_name
        node.domain = DOMAIN
        del node.attribute[:]
        count += 1
        for n in names:
            readers[n] = 0
    if not count:
        return 0
    dead = {n for n, k in readers.items() if k == 0}
    kept = [n for n in graph.node if not (n.op_type == "Transpose" and n.output[0] in dead)]
    del graph.node[:]
    graph.node.extend(kept)
    drop_initializers(graph, lambda name: name in dead)
    opsets = model_opsets(model.opset_import)
    if DOMAIN not in opsets:
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    if (DOMAIN, "Conv") not in {(f.domain, f.name) for f in model.functions}:
        model.functions.append(_body(max(opsets.get("", 11), 11)))  # Slice's bounds as inputs
        model.ir_version = max(model.ir_version, 8)
    return count


def _body(opset: int) -> FunctionProto:
    """The op as standard ONNX: g = P U P^T, OIHW, then Conv between transposes."""
    p = numpy_helper.from_array(P.astype(np.float32), "P")
    pt = numpy_helper.from_array(np.ascontiguousarray(P.T.astype(np.float32)), "PT")
    nodes = [
        helper.make_node("Constant", [], ["P"], value=p),
        helper.make_node("Constant", [], ["PT"], value=pt),
        helper.make_node("Transpose", ["U"], ["U_cm"], perm=[2, 3, 0, 1]),    # (C, M, 4, 4)
        helper.make_node("MatMul", ["P", "U_cm"], ["left"]),                   # (C, M, 3, 4)
        helper.make_node("MatMul", ["left", "PT"], ["g_cm"]),                  # (C, M, 3, 3)
        helper.make_node("Transpose", ["g_cm"], ["W"], perm=[1, 0, 2, 3]),     # OIHW
        helper.make_node("Transpose", ["X"], ["X_first"], perm=list(TO_FIRST)),
        helper.make_node("Conv", ["X_first", "W", "B"], ["Y_first"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["Y_first"], ["Y"], perm=list(TO_LAST)),
    ]
    return helper.make_function(DOMAIN, "Conv", ["X", "U", "B"], ["Y"], nodes,
                                [helper.make_opsetid("", opset)])
