"""NativeGemmPass: channels-last convolutions run on oxla's own GEMM and convolution kernels.

After ChannelsLastPass, an `oxla.channels_last::Conv` with a constant float32 1x1 kernel, stride
1, dilation 1, group 1 and no padding is a product of X (N, H, W, C) with W (C, M). Unless it is
on a squeeze-excitation branch or known (from shape inference) to be under MIN_FLOPS, it becomes
an `oxla.native::Gemm*` node (the rule: oxla/lowering/ops/native.py) reading W packed once here
into the kernel's panels of 32 columns and a bias (zeros where the model had none). What reads
the product alone is folded into the kernel's epilogue, applied to each tile while it is in L1:
- a residual Add (of a tensor of the product's shape in the kernel; another shape, which the
  rule sees at trace time, is broadcast and added by XLA), then
- an activation: Relu, Clip with constant bounds, SiLU (Sigmoid(Y) * Y) or HardSwish (the op, or
  Y * HardSigmoid(Y) of alpha 1/6 and beta 1/2, its function body).
The op type names what was folded: Gemm, GemmRelu, GemmAdd, GemmAddRelu, GemmSilu, ...

Other 2-D group-1 convolutions with a constant float32 kernel and explicit (or VALID) pads become
`oxla.native::Conv*` nodes the same way (W as (KH KW C, M), packed alike; the node keeps the
window as attributes): the kernel computes them as an implicit GEMM, each block of output pixels'
im2col rows made in a thread-local buffer. Two kinds stay XLA's, where its loops win in the
models: image stems that `conv_forms.choose_last` runs as fused taps (at most STEM_CHANNELS input
channels and STEM_TAPS_TERMS terms: they fuse the input's transpose and the next layer's pad), and
on instruction sets not in STEM_ISAS every image stem (AVX2: XLA's convolution wins); and
padded 1x1 convolutions (PadAheadPass's producers, whose border XLA fuses into the next loop).
Grouped convolutions with more than one input channel per group become Conv* nodes with a
`group` attribute (`grouped_kernel`): each of the kernel's groups reads its own channels of X
(in place at every tap where a group's outputs fit one panel) and W's panels of its own; groups
of 4 inputs and 4 outputs stay their own (QUADS: the kernel takes 4 to a vector of 16), other
groups narrower than 16 outputs are taken 16 / width at a time with W block-diagonal, up to
GROUPED_MAX_WASTE times the flops (ResNeXt-50: 1.53x -> 1.00x onnxruntime at default threads,
1.75x -> 1.02-1.11x at one thread, docs/benchmarks.md twenty-fourth round; 0.94-0.97x after the
twenty-eighth round's in-place reads and QUADS).
Winograd layers (WinogradPass's `oxla.winograd::Conv`, before this pass) become
`oxla.native::Wino*` nodes (WINOGRAD), their epilogue folded the same way: the kernel's Winograd
F(2x2, 3x3) reads U packed here as 16 products' W, (16, panels, C, 32), and runs the input
transform, the 16 products (the GEMM's micro-tiles) and the output transform with bias, residual
and activation per block of tiles, in cache. With oxla's kernels, WinogradPass takes layers from
16 channels (`winograd.NATIVE_MIN_CHANNELS`). Against XLA's Winograd form (its transforms and a
batched dot) and the implicit-GEMM kernel for the narrower layers, sessions in one process with
onnxruntime's blocks interleaved: default threads, ResNet-50 0.947x the time (1.08x onnxruntime),
the DBNet-style segmenter 0.755x (0.83x onnxruntime); one thread 0.923x and 0.717x; the detector
(one layer) 0.92x (docs/benchmarks.md, eighteenth round).

`stems_to_native`, which the planner runs first, makes image stems (a Conv over at most
STEM_CHANNELS channels whose X is ChannelsLastPass's transpose of the model's channels-first
image) `oxla.native::Stem*` nodes that read the image itself and write channels last, their
activation folded: XLA ran them as a transpose of the image (an innermost axis of 3 floats) and
a loop of multiply-adds at 7-8 GFLOP/s. They run for every CPU session (`Options.native_stems`).

`depthwise_to_native`, which the planner runs before PadAheadPass, makes depthwise convolutions
(group = channels, one output channel each, constant float32 kernel, 2-D, explicit pads) of at
least DEPTHWISE_MIN_FLOPS (one core; POOLED_DEPTHWISE_MIN_FLOPS on several)
`oxla.native::Depthwise*` nodes, the activation after them folded: the
kernel reads X unpadded and reuses each loaded pixel across a kernel row's taps, on the caller and
the pool's threads, where XLA's fused taps loop gains nothing from the second core. Where X is
Relu, Clip or HardSwish of a small 1x1 convolution's product (XLA's dot), read by the depthwise
convolution alone, the kernel applies that convolution's bias and activation to each element it
loads ([pre]Depthwise[activation] ops, e.g. HardSwishDepthwiseHardSwish): XLA had fused them into
its taps loop, and would otherwise write the activated product in a pass of its own. Likewise an
explicit zero Pad of the height and width before it becomes the kernel's own pads, and Mul and Add
by per-channel constants after it (tf2onnx's batch norm) are folded into W and B.

Why (docs/benchmarks.md, ninth and tenth rounds): the kernels split each layer into parts that
the caller and the intra-op pool's threads claim, where XLA:CPU's dots gain little from the
second core and its depthwise taps loop nothing, and the epilogue saves a pass over the output.
Products by constant matrices in transformers (MatMul, Gemm) were measured too and are left to
XLA: 5-22% faster alone, but BERT-base and ViT-S/16 ran 7-10% slower with them, beside
YNNPACK's fusions.

The other passes run only when the plan asks for them (`Options.native_threads`, set by InferenceSession
for CPU sessions that may use several cores; on one core `Options.native_convs` takes the
convolutions that no depthwise convolution made or reads) and the kernel builds and loads here
(`oxla.native.available()`). The planned model stays a valid ONNX model: each op type has a
model-local function body (unpack W, MatMul, Add, the residual, the activation; for Conv*, the
standard Conv between two transposes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import (
    AttributeProto,
    FunctionProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    helper,
    numpy_helper,
)

from oxla import native
from oxla.cpu_client import CONVOLUTIONS
from oxla.graph import (
    add_initializer,
    attribute_value,
    constant_values,
    drop_initializers,
    inferred_types,
    model_opsets,
    node_reads,
    tensor_value,
)
from oxla.lowering.ops.conv_forms import STEM_CHANNELS, STEM_TAPS_TERMS
from oxla.lowering.ops.native import (
    ACTIVATIONS,
    DOMAIN,
    PRE_ACTIVATIONS,
    depthwise_op_type,
    op_type,
)
from oxla.lowering.ops.winograd import DOMAIN as WINOGRAD_DOMAIN
from oxla.lowering.ops.winograd import P as WINOGRAD_P
from oxla.passes.channels_last import DOMAIN as LAST
from oxla.passes.channels_last import TO_FIRST, TO_LAST
from oxla.passes.weight_layout import conv_hwio, plain_conv_attributes

SUFFIX = "__oxla_packed"
BIAS_SUFFIX = "__oxla_bias"
PRE_BIAS_SUFFIX = "__oxla_pre_bias"
# The passes take models from opset 7 (Add and Mul broadcast as numpy does); the function bodies
# import the default domain at BODY_OPSET at least, where Slice and Clip read their bounds as
# inputs. Before, models under opset 11 (the ONNX model zoo's classic CNNs are opset 7-9) had no
# native kernel: the light zoo's ResNet-50 1.50x onnxruntime's time, DenseNet-121 1.75x. oxla
# runs a body with its own imports; onnxruntime inlines bodies at the model's opset, so a planned
# model under opset 11 is oxla's alone.
MIN_OPSET = 7
BODY_OPSET = 11
# Products known to be smaller (2 M K N flops, M from shape inference, a symbolic dim counted as
# 1) stay XLA's dot. At one thread the kernel is no faster than XLA's on the suite's 1x1 shapes,
# and its gain from the pool's second thread (and from the fused epilogue) must pay ~2.5 us per
# FFI call: MobileNetV3-small at default threads, both orders in one process, 1.88 / 1.66 ms
# with every 1x1 convolution native against 1.77 / 1.61 ms without; with this bound 1.64 / 1.63
# against 1.64 / 1.63; EfficientNet-B0 keeps most of its gain (7.53 / 7.44 against 7.87 / 7.79).
MIN_FLOPS = 2e7
# In a model without depthwise convolutions 1x1 convolutions go to the kernel from this many
# flops: light squeezenet's fire modules (1x1 layers of 3e6 to 1.3e7 flops between kernels and
# concatenations) 0.83-0.88x the time in four runs (each in one process against MIN_FLOPS); of
# the other models it changes, inception v1 0.92-1.00x and the suite's ResNet-50 (one layer)
# 0.99x. Not in mobile nets: at 3e6 ShuffleNetV2 took 1.066x and MobileNetV3-small 1.031x the
# time (MobileNetV2, EfficientNet-B0 0.97x).
PLAIN_MIN_FLOPS = 1e6
# In a model of small kernels (`small_kernels`) 1x1 and depthwise convolutions go to the kernel
# from 1e5 flops (~2-3 us of work; an FFI call costs ~2.5 us): at 0, the tf2onnx CNN's 1x1 over 4
# channels at 8x8 ran 1.17x and the Paddle SE CNN's 8-channel depthwise at 8x8 ~2x the time
# (0.145 against 0.073 ms); MobileNetV3-small and the shipped mobilenet_small gain 1-6% at 0.
SMALL_MIN_FLOPS = 1e5
# Convolutions other than 1x1 go to the kernel at any size: XLA's forms of a small one are worse
# than an FFI call. Its own convolution ran the shipped resnet_small 1.35-1.61x slower than the
# im2col dot (`dot_last`: ~10 kernels a convolution, windows, their concatenation and the dot),
# and the kernel took 0.52-0.75x the dot's time: sessions with and without, onnxruntime's blocks
# interleaved, batch 1 / 4 at default threads 0.517 / 0.718, batch 4 at one thread 0.751; the
# tf2onnx CNN (8x8 images) 0.897, the Paddle CNN with squeeze-excitation 0.982. At 1e5 flops
# (smaller ones XLA's) 0.645, 0.953, 0.977. In the suite only one of the DBNet-style segmenter's
# convolutions is under 2e7 flops (1.006, noise).
CONV_MIN_FLOPS = 0.0
# matmuls_to_native: K and N at least this. One core, the kernel against XLA's (Eigen's) dot:
# BERT-base's 128x768x3072, 128x3072x768, 128x768x768 0.89-0.93x the time, ViT-S/16's
# 197x384x1536, 197x1536x384 1.00-1.03x; in the models BERT-base 0.81x, ViT-S/16 1.07x with
# every MatMul native (docs/benchmarks.md, thirteenth round).
MATMUL_MIN_DIM = 512
# ... in sessions on several cores, where XLA's dots are YNNPACK's and repack their weights every
# call, and the kernel splits its parts in rounds (oxla/native/kernels.cc: Part, gemm_split).
# Default threads (2 cores, Intel AVX-512), sessions in one process, onnxruntime's blocks
# interleaved: BERT-base 0.80-0.84x the time (1.10-1.16x onnxruntime's -> 0.88-0.97x), ViT-S/16
# 0.89x at 384 (its 384x384 and 1536x384 products too; 0.94-0.95x in two earlier runs) against
# 0.97-1.00x at 512 (docs/benchmarks.md, twenty-second round).
POOLED_MATMUL_MIN_DIM = 384
# The instruction sets where sessions on several cores take these products (models of small
# kernels take their classifiers on any): measured on AVX-512 only; on AVX2 (AMD EPYC) the kernel
# had lost beside YNNPACK's fusions before its split (tenth round), not measured since.
POOLED_MATMUL_ISAS = frozenset({"avx512"})
# ... and wide products (N at least WIDE_RATIO K, K at least WIDE_MIN_K) of any size: Eigen's dot
# blocks them badly. One core, the kernel alone against XLA's dot: 197x384x1536 (ViT-S/16's
# MLP) 0.77x the time (60 -> 78 GFLOP/s), 128x768x3072 0.53x (44 -> 84), where 197x384x1152 (3x)
# 1.02x and the square or narrow ones 0.97-1.04x; ViT-S/16 at one thread (sessions with and
# without in one process, onnxruntime's blocks interleaved) 0.931x the time, against 0.980x
# with every MatMul from 384 (docs/benchmarks.md, nineteenth round).
WIDE_RATIO = 4
WIDE_MIN_K = 256
# Convolutions other than 1x1 (group 1, 2-D) run on the kernel's implicit-GEMM form too (False:
# XLA's, for measuring).
CONVS = True
# Grouped convolutions of at least GROUPED_MIN_CHANNELS output channels per group and more than
# one input channel per group run on the convolution kernel (`_grouped_product`, `grouped_kernel`):
# each of the kernel's groups its own panels of W, several narrow groups block-diagonal in one.
# XLA ran them as fused taps or one convolution per group, between two transposes to channels
# first: ResNeXt-50 32x4d (torch, 224) 1.53x onnxruntime at default threads and 1.75x at one
# thread, 41 of its 144 ms of kernel time in those loops.
GROUPED = True
GROUPED_MIN_CHANNELS = 4
GROUPED_WIDTH = 16  # the kernel's lanes a row of one of its groups' output fills (AVX-512)
GROUPED_MAX_WASTE = 4.0
# Groups of 4 input and 4 output channels (ResNeXt-50 32x4d's first stage) stay groups of their
# own: the kernel takes them 4 to a block of 16 outputs (kernels.cc tile_quads), each row's 16
# inputs permuted within lanes, where packed 4 at a time their W is block-diagonal, 4 times the
# multiply-adds.
QUADS = True
# WinogradPass's layers (`oxla.winograd::Conv`) run on the kernel's Winograd F(2x2, 3x3) (False:
# XLA's transforms and batched dot, for measuring): see the module's docstring.
WINOGRAD = True
WINDOW = ("kernel_shape", "strides", "pads", "dilations")  # a Conv* node's attributes
# Depthwise convolutions known to be smaller stay XLA's (2 x output pixels x channels x taps):
# an FFI call costs ~2.5 us. Both orders in one process, default threads, against none native:
# EfficientNet-B0 (15 layers) 7.14 -> 6.83 and 7.12 -> 6.74 ms, the detector (4) 3.30 -> 3.20 and
# 3.40 -> 3.26, MobileNetV3-small (8) 1.62 -> 1.63 and 1.60 -> 1.64; with 3e6 the detector's 3
# largest alone ran slower (3.31 -> 3.43), EfficientNet-B0's 8 gained less. Now the bound of
# one-core sessions (ONE_CORE_DEPTHWISE). 8e5 against 1e6, one core, each in two positions of one
# process, onnxruntime interleaved (docs/benchmarks.md, twenty-fourth round): MobileNetV2 (15
# layers against 12) 1.006x and 1.016x the time against 1.000x and 1.127x, EfficientNet-B0 (16
# against 15) 1.033x and 1.134x against 1.000x and 1.122x, MobileNetV3-small (10 against 8)
# 1.001x and 0.999x against 1.000x, ShuffleNetV2 (1 against 0) 1.006x and 1.007x against 1.012x:
# no loss, where the micro-benchmark's 960@7 3x3 (0.85e6 flops) took 0.6-0.9x onnxruntime on the
# kernel and 1.9-2.3x as XLA's taps (whose time there depends on what the process compiled before
# it). (A run of the twenty-third round had 8e5, 5e5 and 2e5 at 1.00-1.08x, unrepeated.)
DEPTHWISE_MIN_FLOPS = 8e5
SMALL_DEPTHWISE_MIN_FLOPS = 1e5  # in a model of small kernels (see SMALL_MIN_FLOPS)
# In a session on several cores of a model of larger kernels (the pooled client). Where 1e6 was
# measured, the models now take the one-thread client (small_kernels); planned as for larger
# kernels, both bounds in one process, default threads, onnxruntime interleaved: EfficientNet-B0
# 0.994x the time with 1e5, MobileNetV3-small 0.987x, the detector 1.007x; the depthwise
# micro-benchmark's 960@7 3x3 (0.85e6 flops) 1.29x onnxruntime's time on the kernel against
# 3.65x as XLA's taps, whose loop the pool splits in two.
POOLED_DEPTHWISE_MIN_FLOPS = 1e5
DEPTHWISE = True  # False: depthwise convolutions stay XLA's (for measuring)
# One-core sessions (Options.native_convs) take the depthwise kernel too, by the same rule
# (DEPTHWISE_ISAS, DEPTHWISE_MIN_FLOPS), and the 1x1 convolutions beside those become native as
# any other (only a depthwise convolution that stays XLA's keeps its neighbours XLA's). Intel
# Xeon (AVX-512), one core, onnxruntime interleaved, against XLA's taps with their neighbours
# XLA's: EfficientNet-B0 0.898x and 0.977x the time, MobileNetV3-small 0.912x and 0.984x, the
# detector 0.998x and 1.007x, ShuffleNetV2 1.030x and 1.000x; the depthwise micro-benchmark's
# single layers 0.43-0.78x onnxruntime's time where XLA's taps took 0.75-1.87x. With the 1x1
# convolutions beside them left XLA's, the detector ran 2.0x the time: its 13 MB temporary
# buffer came from a fresh mmap each call (3221 page faults a call; glibc maps a large
# posix_memalign anew when the heap's top cannot hold it).
ONE_CORE_DEPTHWISE = True
# The instruction sets whose depthwise kernel beats XLA's taps inside a model on the pooled client
# (a model of small kernels, `small_kernels`, takes it on any). On AVX2 it loses:
# AMD EPYC (Zen 3), default threads, against XLA's taps, short blocks in rotation:
# MobileNetV3-small +13%, EfficientNet-B0 +6%, +7-11% without pre-activations, the detector
# +15%. At one thread the kernel recomputes a pre-activation for each kernel row that loads a
# pixel where XLA writes it once, and its loads wait on memory (13 against XLA's 21-26 GFLOP/s at
# 32 channels, 160x160; docs/benchmarks.md, twelfth round).
DEPTHWISE_ISAS = frozenset({"avx512"})
# The instruction sets on which image stems (at most STEM_CHANNELS input channels) of more than
# STEM_TAPS_TERMS terms, such as ResNet's 7x7 over RGB, become native convolutions. On AVX2 XLA's
# own (YNNPACK's) convolution ran ResNet-50 5.2% and 8.8% faster (both orders; DBNet-style's
# ResNet-18 stem equal): the kernel's im2col rows gather 3 floats per tap.
STEM_ISAS = frozenset({"avx512"})
# Image stems (a Conv over at most STEM_CHANNELS channels of the model's channels-first image, which
# ChannelsLastPass moved channels last in a transpose of its own) run on the stem kernel, reading
# the image itself (False: XLA's taps or convolution, for measuring). AMD EPYC (Zen 3), one core:
# the stem alone (transpose, convolution, activation) took 1603 us in jax.jit for 3 -> 16 channels
# 3x3 stride 2 at 224x224, 2874 us for 3 -> 32, 5580 us at 320x320; the kernel 223-257, 321 and
# 910 us. Inside models less moves (XLA fused the image's transpose and the next layer's pad into
# its loop): sessions with and without it in one process, default threads / one thread, ResNet-50
# 0.966 / 0.920, the detector 0.946 / 0.977, EfficientNet-B0 0.993 / 0.981, MobileNetV3-small and
# ShuffleNetV2 0.98-1.03 (noise), DBNet-style 1.00 (docs/benchmarks.md, fourteenth round). For
# every CPU session (`Options.native_stems`), one core included.
STEMS = True
STEM_MIN_FLOPS = 1e6  # smaller stems stay XLA's: an FFI call costs ~2.5 us
# A depthwise convolution applies its producer's bias and activation (PRE_ACTIVATIONS) as it loads
# X (False: it reads the activated product, for measuring). MobileNetV3-small (8 layers), default
# threads, both orders twice, against reading the activated product: 1.646 / 1.690 / 1.640 /
# 1.662 ms against 1.711 / 1.680 / 1.679 / 1.667 (-1.4%).
PRE_ACTIVATION = True
# A squeeze-excitation branch (1x1 convolutions on a globally pooled image: one row per image)
# stays XLA's whatever shape inference finds: matrix-vector products, which XLA fuses with their
# neighbours, where an FFI call alone costs ~2.5 us (XLA's small dot and its activation: 0.5 us).
GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool"})
PER_ROW = frozenset({"Relu", "Sigmoid", "HardSigmoid", "HardSwish", "Clip", "LeakyRelu"})


def _known_rows(model: ModelProto, exact: bool = False) -> dict[str, int]:
    """Rows (all dims but the last; a symbolic dim counts as 1, and so does an unknown one or,
    with `exact`, one that is not the graph inputs' (shape inference names those it cannot
    compute unk__N), which leaves the value out) of the values whose rank shape inference knows:
    name -> rows."""
    try:
        graph = inferred_types(model)
    except Exception:  # the pass only loses a hint, never the model
        return {}
    declared = {d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim
                if d.HasField("dim_param")}
    rows = {}
    for v in [*graph.input, *graph.value_info]:
        t = v.type.tensor_type
        if t.HasField("shape") and len(t.shape.dim) >= 2 and not (
                exact and not all(d.HasField("dim_value") or d.dim_param in declared
                                  for d in t.shape.dim[:-1])):
            rows[v.name] = math.prod(d.dim_value if d.HasField("dim_value") else 1
                                     for d in t.shape.dim[:-1])
    return rows


def _reaches(rows: dict[str, int], name: str, size: int, bound: float,
             producers: Mapping[str, NodeProto]) -> bool:
    """Whether a product of `size` weights writing value `name` reaches `bound` flops. A value
    of unknown rows takes those of its nearest ancestor (through first inputs) whose rows are
    known (`_rows_through`; in a model of small kernels `rows` are exact): ShuffleNetV2's
    shuffles (a Reshape to a computed shape) leave dims unknown, and counted as 1 row, 16 of its
    36 1x1 convolutions stayed XLA's (1.15x the time); in an opset-9 model shape inference types
    nothing after the first Winograd layer, whose function body imports opset 11, and the light
    zoo ResNet-50's 33 1x1 convolutions stayed XLA's."""
    return 2 * _rows_through(rows, name, producers) * size >= bound


def _rows_through(rows: dict[str, int], name: str, producers: Mapping[str, NodeProto]) -> int:
    """The rows of `name`, or where shape inference left them unknown those of its nearest
    ancestor through first inputs whose rows it knows (1 where none is): onnx's inference types
    nothing after a com.microsoft op, and onnxruntime's transformer optimizer writes them
    (Attention, SkipLayerNormalization, Gelu, FusedMatMul) between a model's products, with its
    Gemms between Reshapes. Counted as one row, BERT-base's products from such a file stayed
    XLA's: 1.08-1.11x onnxruntime's time, 0.99x native. An estimate (a Transpose of the last two
    dims changes the rows), as the bound it is compared with."""
    seen = {name}
    while (known := rows.get(name)) is None and (p := producers.get(name)) is not None \
            and p.input and p.input[0] not in seen:
        name = p.input[0]
        seen.add(name)
    return known or 1


def _pooled_values(nodes: Sequence[NodeProto]) -> set[str]:
    """Values computed from a global pooling through 1x1 convolutions and unary activations
    alone (a squeeze-excitation branch: one row per image, whatever shape inference knows)."""
    pooled: set[str] = set()
    for node in nodes:  # topological order: a producer comes before its readers
        if node.op_type in GLOBAL_POOLS or (
                node.input and node.input[0] in pooled
                and (node.op_type in PER_ROW or (node.op_type == "Conv" and _pointwise(node)))) \
                or (node.op_type == "Mul" and all(i in pooled for i in node.input)):
            pooled.update(node.output)
    return pooled


def _pointwise_min(small: bool) -> float:
    """The flops from which a 1x1 convolution goes to the kernel (`small_kernels`)."""
    return SMALL_MIN_FLOPS if small else MIN_FLOPS


COUNTED = CONVOLUTIONS | {"MatMul", "Gemm"}  # the products `small_kernels` counts
# A convolutional model doing fewer flops per node than this in its convolutions and products
# runs on the one-thread client, its 1x1 and depthwise convolutions on oxla's kernels
# (`small_kernels`). Counted so, MobileNetV3-small 0.9 M, ShuffleNetV2 0.4 M, EfficientNet-B0
# 3.2 M, the detector 8.2 M, ResNet-50 67 M, the DBNet-style segmenter 166 M. Sessions with and
# without, onnxruntime's blocks interleaved, default threads (2 cores): EfficientNet-B0 0.908,
# the detector 0.757, ResNet-50 1.051, the DBNet-style segmenter 1.146 the time.
SMALL_FLOPS = 1e7


def small_kernels(model: ModelProto) -> bool:
    """Whether the main graph has convolutions (all of float32 initializer weights) and inputs of
    fixed sizes but their batch, and its convolutions and products by constant weights (read before any pass rewrites them) do
    fewer than SMALL_FLOPS flops per node: a
    model the executor runs on its one-thread client, where oxla's kernels split their work with
    spinning helpers of their own (oxla/native/kernels.cc) and gain from the second core where
    XLA's loops, and its pool's sleeping threads, do not. Such a model has every 1x1
    convolution (but squeeze-excitation branches), every depthwise one and its classifier on
    the kernels. Counted as XLA counts: 2 x output elements x weights / output channels, a
    symbolic dim as 1."""
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    convs = [n for n in graph.node if n.op_type in CONVOLUTIONS and n.domain in ("", "ai.onnx")]
    # weights that are not float initializers (a quantized model's DequantizeLinear) count nothing
    if not convs or any(len(n.input) < 2 or n.input[1] not in inits
                        or inits[n.input[1]].data_type != TensorProto.FLOAT for n in convs):
        return False
    # an image size left to run time (a symbolic dim past the batch's) cannot be counted here:
    # XLA's cost analysis of the first segment, on the shapes fed, decides
    if any(not d.HasField("dim_value") for i in graph.input if i.name not in inits
           for d in i.type.tensor_type.shape.dim[1:]):
        return False
    try:
        values = {v.name: v for v in inferred_types(model).value_info}
    except Exception:  # the pass only loses a hint, never the model
        return False
    flops = 0.0
    for node in graph.node:
        if node.op_type not in COUNTED or len(node.input) < 2 or node.input[1] not in inits \
                or node.output[0] not in values:
            continue
        shape = values[node.output[0]].type.tensor_type.shape
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in shape.dim]
        channels = dims[1 if node.op_type.startswith("Conv") else -1] if len(dims) >= 2 else 0
        if channels > 0:
            flops += 2.0 * math.prod(dims) * math.prod(inits[node.input[1]].dims) / channels
    return flops / len(graph.node) < SMALL_FLOPS


def _pointwise(node: NodeProto) -> bool:
    attrs = plain_conv_attributes(node, [1, 1])
    return attrs is not None \
        and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER") \
        and not any(attrs.get("pads", [0, 0, 0, 0]))


@dataclass
class _Fold:
    """What the epilogue takes over from the product's readers."""

    residual: str = ""
    activation: str = ""
    bounds: tuple[str, str] | None = None  # Clip's min and max (initializers or Constant nodes)
    absorbed: tuple[NodeProto, ...] = ()
    output: str = ""


class _Graph:
    """Readers, producers, shapes and constants of the main graph, for the fold."""

    def __init__(self, model: ModelProto, inits: dict[str, TensorProto]) -> None:
        graph = model.graph
        self.inits = inits
        self.outputs = {o.name for o in graph.output}
        self.readers: dict[str, list[NodeProto]] = {}
        for n in graph.node:
            for name in node_reads(n):
                self.readers.setdefault(name, []).append(n)
        # initializers and Constant nodes: torch exports ReLU6 as Clip(x, min, max) with each
        # bound a Constant node
        self.constant = constant_values(graph)
        self.taken: set[int] = set()  # nodes already folded into a product

    def only_reader(self, name: str) -> NodeProto | None:
        found = self.readers.get(name, [])
        if name in self.outputs or len(found) != 1 or id(found[0]) in self.taken:
            return None
        return found[0] if found[0].domain in ("", "ai.onnx") else None

    def scalar(self, name: str) -> float | None:
        """The value of a float32 scalar initializer or Constant node."""
        value = self.constant(name)
        return float(value) if value is not None and value.size == 1 \
            and value.dtype == np.float32 else None


def _activation(g: _Graph, name: str, fold: _Fold) -> None:
    """Fold the activation that alone reads `name`, if it is one the kernel has."""
    readers = g.readers.get(name, [])
    if len(readers) == 2 and not any(id(r) in g.taken for r in readers):
        for r in readers:
            if r.domain not in ("", "ai.onnx"):
                continue
            if r.op_type == "Sigmoid":
                _gated(g, name, r, fold, "Silu")
            elif r.op_type == "HardSigmoid" and _is_hard_swish_gate(r):
                _gated(g, name, r, fold, "HardSwish")
        return
    node = g.only_reader(name)
    if node is None:
        return
    if node.op_type == "Relu":
        fold.activation, fold.absorbed, fold.output = "Relu", (*fold.absorbed, node), node.output[0]
    elif node.op_type == "HardSwish":
        fold.activation, fold.absorbed = "HardSwish", (*fold.absorbed, node)
        fold.output = node.output[0]
    elif node.op_type == "Clip" and not node.attribute and len(node.input) == 3 \
            and g.scalar(node.input[1]) is not None and g.scalar(node.input[2]) is not None:
        fold.activation, fold.bounds = "Clip", (node.input[1], node.input[2])
        fold.absorbed, fold.output = (*fold.absorbed, node), node.output[0]


def _is_hard_swish_gate(node: NodeProto) -> bool:
    """HardSigmoid(alpha 1/6, beta 1/2): HardSwish's gate (HardSwish's function body; torch
    writes HardSwish so before opset 14, and onnxruntime's optimizer saves the body inlined)."""
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    return len(node.input) == 1 and set(attrs) <= {"alpha", "beta"} \
        and abs(attrs.get("alpha", 0.2) - 1 / 6) < 1e-6 and abs(attrs.get("beta", 0.5) - 0.5) < 1e-6


def _gated(g: _Graph, name: str, gate: NodeProto, fold: _Fold, activation: str) -> None:
    """Y read by `gate` and by Mul(Y, gate(Y)) alone: SiLU (a Sigmoid gate) or HardSwish (its
    HardSigmoid gate)."""
    readers = g.readers.get(name, [])
    if len(readers) != 2 or name in g.outputs:
        return
    mul = next((r for r in readers if r is not gate), None)
    s = gate.output[0]
    if mul is None or mul.op_type != "Mul" or mul.domain not in ("", "ai.onnx") \
            or sorted(mul.input) != sorted([name, s]) or g.only_reader(s) is not mul:
        return
    fold.activation, fold.absorbed = activation, (*fold.absorbed, gate, mul)
    fold.output = mul.output[0]


def _fold(g: _Graph, y: str) -> _Fold:
    """The residual Add and activation the product `y` can take over."""
    fold = _Fold(output=y)
    if y in g.outputs:
        return fold
    add = g.only_reader(y)
    if add is not None and add.op_type == "Add" and len(add.input) == 2 and add.input[0] != add.input[1]:
        other = add.input[1] if add.input[0] == y else add.input[0]
        if other:  # of another shape (broadcast), the rule adds it with XLA instead
            fold.residual, fold.absorbed, fold.output = other, (add,), add.output[0]
    _activation(g, fold.output, fold)
    return fold


def _window(node: NodeProto, kernel: tuple[int, ...], group: int = 1
            ) -> dict[str, list[int]] | None:
    """The 2-D window of a Conv of this group with explicit (or VALID) pads, as the Conv* op's
    attributes, or None."""
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    if len(kernel) != 2 or attrs.get("group", 1) != group \
            or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID") \
            or list(attrs.get("kernel_shape", kernel)) != list(kernel):
        return None
    pads = [0, 0, 0, 0] if attrs.get("auto_pad") == "VALID" else list(attrs.get("pads", [0] * 4))
    window = {"kernel_shape": list(kernel), "strides": list(attrs.get("strides", [1, 1])),
              "pads": pads, "dilations": list(attrs.get("dilations", [1, 1]))}
    if [len(v) for v in window.values()] != [2, 2, 4, 2] or min(pads) < 0 \
            or min(window["strides"] + window["dilations"]) < 1:
        return None
    return window


def _product(node: NodeProto, producers: dict[str, NodeProto], inits: dict[str, TensorProto]
             ) -> tuple[np.ndarray, list[str], np.ndarray | None, dict[str, list[int]] | None
                        ] | None:
    """(W as (K, N) float32, the names it came from, the (N,) float32 bias or None, the window
    of a convolution other than 1x1 or None) of a channels-last Conv the kernels can run, or
    None."""
    if not (node.op_type == "Conv" and node.domain == LAST and len(node.input) >= 2):
        return None
    found = conv_hwio(node, producers, inits)
    if found is None or found[0].ndim != 4 or found[0].dtype != np.float32:
        return None
    hwio, names = found
    window = None
    if not (_pointwise(node) and hwio.shape[:2] == (1, 1)):
        window = _window(node, hwio.shape[:2])
        if window is None or not CONVS or (hwio.shape[:2] == (1, 1) and any(window["pads"])) \
                or (hwio.shape[2] <= STEM_CHANNELS
                    and (hwio[..., 0].size <= STEM_TAPS_TERMS or native.isa() not in STEM_ISAS)):
            return None
    plain, b = _bias(node, inits, hwio.shape[3])
    if not plain:
        return None
    return hwio.reshape((-1, hwio.shape[3])), names, b, window


def _grouped_product(node: NodeProto, producers: dict[str, NodeProto],
                     inits: dict[str, TensorProto]
                     ) -> tuple[np.ndarray, list[str], np.ndarray | None, dict[str, list[int]]
                                ] | None:
    """(W as (S, K, M / S) float32, the names it came from, the bias or None, the window with its
    `group` S) of a channels-last grouped Conv (GROUPED) the convolution kernel can run
    (`grouped_kernel`), or None."""
    if not (GROUPED and node.op_type == "Conv" and node.domain == LAST and len(node.input) >= 2):
        return None
    group = next((int(a.i) for a in node.attribute if a.name == "group"), 1)
    found = conv_hwio(node, producers, inits)
    if group < 2 or found is None or found[0].ndim != 4 or found[0].dtype != np.float32:
        return None
    hwio, names = found
    kernel = grouped_kernel(hwio, group)
    window = _window(node, hwio.shape[:2], group)
    plain, b = _bias(node, inits, hwio.shape[3])
    if kernel is None or window is None or not plain:
        return None
    return kernel, names, b, {**window, "group": kernel.shape[0]}


def takes_grouped(model: ModelProto) -> set[str]:
    """The outputs of the main graph's grouped Convs that convs_to_native would put on the
    convolution kernel (`_grouped_product`), whatever their flops."""
    _, inits, producers = _tables(model)
    return {n.output[0] for n in model.graph.node
            if _grouped_product(n, producers, inits) is not None}


def grouped_kernel(hwio: np.ndarray, group: int) -> np.ndarray | None:
    """A grouped convolution's HWIO W (KH, KW, C / group, M) as the convolution kernel's groups,
    (S, KH KW C / S, M / S) (`native.pack` each), or None where the kernel does not take it:
    one input channel per group (the depthwise kernel's), fewer than GROUPED_MIN_CHANNELS
    outputs a group, or more than GROUPED_MAX_WASTE times the flops. Groups of fewer than 16
    outputs (a vector on AVX-512) are taken 16 / width at a time where that divides, W
    block-diagonal (fewer at a time where their count does not divide), except groups of 4 inputs
    and 4 outputs (QUADS), one each."""
    kh, kw, cg, m = hwio.shape
    mg = m // group
    if cg < 2 or mg * group != m or mg < GROUPED_MIN_CHANNELS:
        return None
    quads = QUADS and mg == cg == 4 and m % 16 == 0  # the kernel's tile_quads: no zeros
    per = GROUPED_WIDTH // mg if mg < GROUPED_WIDTH and GROUPED_WIDTH % mg == 0 and not quads else 1
    while group % per:  # RegNetY-400MF's 13 and 55 groups of 8: fewer a kernel group, as many flops
        per //= 2
    width = per * mg
    waste = 1.0 if quads else per * -(-width // GROUPED_WIDTH) * GROUPED_WIDTH / width
    if group % per or waste > GROUPED_MAX_WASTE:
        return None
    groups = group // per
    dense = np.zeros((groups, kh, kw, per * cg, width), np.float32)
    for g in range(group):
        s, i = divmod(g, per)
        dense[s, :, :, i * cg:(i + 1) * cg, i * mg:(i + 1) * mg] = hwio[..., g * mg:(g + 1) * mg]
    return dense.reshape((groups, -1, width))


def _rewriting(model: ModelProto, inits: dict[str, TensorProto]
               ) -> tuple[_Graph, set[int], dict[int, NodeProto], dict[str, str]]:
    """What a rewrite of the main graph starts from: the graph's view for the folds, and the
    removed nodes, moved nodes and packed weights it collects (for _rewrite, _finish, _weights)."""
    return _Graph(model, inits), set(), {}, {}


def _tables(model: ModelProto) -> tuple[dict[str, int], dict[str, TensorProto],
                                        dict[str, NodeProto]]:
    """The model's opsets, its constant initializers (not overridable by an input) and each
    value's producer in the main graph."""
    graph = model.graph
    fed = {i.name for i in graph.input}
    return (model_opsets(model.opset_import),
            {t.name: t for t in graph.initializer if t.name not in fed},
            {o: n for n in graph.node for o in n.output})


# The ops a value passes through (one input each) between a convolution and a depthwise one that
# reads or made it: its activation (SiLU's Sigmoid and Mul too), a Pad put ahead by PadAheadPass.
BETWEEN = PER_ROW | {"Pad", "Mul"}


def _grouped(node: NodeProto | None, native_groups: frozenset[int] | set[int] = frozenset()
             ) -> bool:
    return node is not None and node.op_type == "Conv" and node.domain in ("", LAST) \
        and id(node) not in native_groups and any(
            a.name == "group" and a.i > 1 for a in node.attribute)


def _beside_depthwise(node: NodeProto, producers: dict[str, NodeProto],
                      readers: dict[str, list[NodeProto]],
                      native_groups: frozenset[int] | set[int] = frozenset()) -> bool:
    """Whether a grouped Conv left to XLA (not in `native_groups`, ids of those going native)
    made this convolution's X or reads its Y, through BETWEEN ops."""
    seen: set[str] = set()
    todo = [node.input[0]]
    while todo:  # upstream, through first inputs
        name = todo.pop()
        p = producers.get(name)
        if p is None or name in seen:
            continue
        seen.add(name)
        if _grouped(p, native_groups):
            return True
        if p.op_type in BETWEEN and p.input:
            todo.append(p.input[0])
    todo = list(node.output)
    while todo:  # downstream
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for r in readers.get(name, ()):
            if _grouped(r, native_groups):
                return True
            if r.op_type in BETWEEN:
                todo.extend(r.output)
    return False


def _winograd(node: NodeProto, inits: dict[str, TensorProto]
              ) -> tuple[np.ndarray, str, np.ndarray | None] | None:
    """(U (4, 4, C, M) float32, its initializer's name, the (M,) bias or None) of a
    WinogradPass layer the kernel can run, or None."""
    if not (WINOGRAD and node.op_type == "Conv" and node.domain == WINOGRAD_DOMAIN
            and len(node.input) >= 2 and node.input[1] in inits):
        return None
    name = node.input[1]
    u = tensor_value(name, lambda: numpy_helper.to_array(inits[name]))
    if u.dtype != np.float32 or u.ndim != 4 or u.shape[:2] != (4, 4) or min(u.shape[2:]) < 1:
        return None
    plain, b = _bias(node, inits, u.shape[3])
    return (u, name, b) if plain else None


def convs_to_native(model: ModelProto, beside_depthwise: bool = True, small: bool = False) -> int:
    """Rewrite the eligible convolutions (Gemm* for 1x1, Wino* for WinogradPass's layers, Conv*
    for the others) of the main graph; returns how many. With beside_depthwise False (sessions on one core), a convolution whose X a
    depthwise convolution made or whose Y one reads stays XLA's, which fuses the two loops'
    activation, pad and layout work (one core, the suite's models with every eligible convolution
    native: ResNet-50 0.88x the time in three runs, the DBNet-style segmenter 0.93x and 0.98x,
    EfficientNet-B0 1.06-1.08x, the detector 1.01-1.04x)."""
    opsets, inits, producers = _tables(model)
    if opsets.get("", 1) < MIN_OPSET:
        return 0
    graph = model.graph
    candidates = [(node, *found) for node in graph.node
                  if (found := _product(node, producers, inits)) is not None]
    winograd = [(node, *taken) for node in graph.node
                if (taken := _winograd(node, inits)) is not None]
    # grouped ones (W as (S, K, M / S), their window's `group` S) among them
    candidates += [(node, *split) for node in graph.node
                   if (split := _grouped_product(node, producers, inits)) is not None]
    if not candidates and not winograd:
        return 0
    if candidates:
        rows = _known_rows(model, exact=small)
        pointwise = _pointwise_min(small)
        if not small and not any(_depthwise_shaped(n, producers, inits) for n in graph.node):
            pointwise = min(pointwise, PLAIN_MIN_FLOPS)
        candidates = [c for c in candidates if _reaches(
            rows, c[0].output[0] if c[0].output[0] in rows else c[0].input[0], c[1].size,
            pointwise if c[4] is None else CONV_MIN_FLOPS, producers)]
    # (node, op base, W as (..., K, N), its initializer, bias or None, the window's attributes)
    jobs: list[tuple[NodeProto, str, np.ndarray, str, np.ndarray | None, dict[str, Any]]] = [
        (node, "Wino", u.reshape(16, *u.shape[2:]), name, b, {}) for node, u, name, b in winograd]
    jobs += [(node, "Gemm" if window is None else "Conv", kernel, names[-1], b,
              {"group": 1, **window} if window else {})
             for node, kernel, names, b, window in candidates]
    pooled = _pooled_values(graph.node)
    jobs = [j for j in jobs if j[0].input[0] not in pooled]
    # packed: an OIHW initializer read by several convolutions is packed once
    g, removed, moved, packed = _rewriting(model, inits)
    if not beside_depthwise:
        native_groups = {id(j[0]) for j in jobs if j[5].get("group", 1) > 1}
        jobs = [j for j in jobs
                if not _beside_depthwise(j[0], producers, g.readers, native_groups)]
    if not jobs or not native.available():  # built (first use) only for a model that needs it
        return 0
    for node, base, kernel, name, b, window in jobs:
        grouped = window.get("group", 1) > 1  # kernel (S, K, M / S)
        n = kernel.shape[0] * kernel.shape[-1] if grouped else kernel.shape[-1]
        bias = np.zeros(n, np.float32) if b is None else b
        fold = _fold(g, node.output[0])
        inputs = [node.input[0], *_weights(graph, packed, name, kernel, node, bias, grouped)]
        if fold.residual:
            inputs.append(fold.residual)
        if fold.bounds:
            inputs.extend(fold.bounds)
        _rewrite(g, node, op_type(bool(fold.residual), fold.activation, base), inputs, window, fold,
                 removed, moved)
    _finish(model, opsets, removed, moved)
    return len(jobs)


def _stem(node: NodeProto, producers: dict[str, NodeProto], inits: dict[str, TensorProto]
          ) -> tuple[np.ndarray, list[str], np.ndarray | None, dict[str, list[int]], str] | None:
    """(W as (K, M) float32, the names it came from, the bias or None, the window, the
    channels-first image) of a channels-last Conv over at most STEM_CHANNELS channels whose X is
    ChannelsLastPass's transpose of a channels-first image, or None."""
    if not (node.op_type == "Conv" and node.domain == LAST and len(node.input) >= 2):
        return None
    move = producers.get(node.input[0])
    if move is None or move.op_type != "Transpose" or move.domain not in ("", "ai.onnx") \
            or [list(a.ints) for a in move.attribute if a.name == "perm"] != [[0, 2, 3, 1]]:
        return None
    found = conv_hwio(node, producers, inits)
    if found is None or found[0].ndim != 4 or found[0].dtype != np.float32 \
            or found[0].shape[2] > STEM_CHANNELS:
        return None
    hwio, names = found
    window = _window(node, hwio.shape[:2])
    plain, b = _bias(node, inits, hwio.shape[3])
    if window is None or not plain:
        return None
    return hwio.reshape((-1, hwio.shape[3])), names, b, window, move.input[0]


def stems_to_native(model: ModelProto) -> int:
    """Rewrite the image stems of the main graph (`STEMS`: a channels-last Conv over at most
    STEM_CHANNELS channels of the model's channels-first image) as `oxla.native::Stem*` nodes
    that read the image itself, their activation folded; returns how many."""
    if not STEMS:
        return 0
    opsets, inits, producers = _tables(model)
    if opsets.get("", 1) < MIN_OPSET:
        return 0
    graph = model.graph
    rows = _known_rows(model)
    candidates = [(node, *found) for node in graph.node
                  if (found := _stem(node, producers, inits)) is not None
                  and 2 * rows.get(node.output[0], 1) * found[0].size >= STEM_MIN_FLOPS]
    if not candidates or not native.available():
        return 0
    g, removed, moved, packed = _rewriting(model, inits)
    for node, kernel, names, b, window, image in candidates:
        bias = np.zeros(kernel.shape[1], np.float32) if b is None else b
        fold = _Fold(output=node.output[0])
        _activation(g, fold.output, fold)
        inputs = [image, *_weights(graph, packed, names[-1], kernel, node, bias),
                  *(fold.bounds or ())]
        _rewrite(g, node, op_type(False, fold.activation, "Stem"), inputs,
                 {**window, "out_pads": _take_pads(g, fold.output, fold.activation == "Relu")},
                 fold, removed, moved)
    _finish(model, opsets, removed, moved)
    return len(candidates)


# A ReLU stem's zero border also serves the MaxPool that alone reads it (ResNet's, ShuffleNet's
# 3x3/2 pool after the stem): past a ReLU every window's maximum is at least 0, so zeros pad as
# -inf does, and the pool reads the border instead of padding a copy of the stem's output.
STEM_POOL_PADS = True


def _take_pads(g: _Graph, y: str, nonnegative: bool = False) -> list[int]:
    """The zero border a stem writes around its output `y` (ONNX Pad's pads of (N, H, W, C)):
    the explicit pads of the channels-last Conv that alone reads y, which then reads it unpadded
    (XLA had fused that pad into the stem's loop; after the kernel it is a pass of its own), or,
    where y is `nonnegative`, of the channels-last MaxPool that alone reads it (one output,
    floor mode, no dilation; its windows all hold a value of y: pads below the kernel)."""
    none = [0] * 8
    readers = g.readers.get(y, [])
    reader = readers[0] if len(readers) == 1 and y not in g.outputs else None
    if reader is None or reader.domain != LAST or reader.input[0] != y:
        return none
    attrs = {a.name: attribute_value(a) for a in reader.attribute}
    pads = [int(v) for v in attrs.get("pads", ())]
    if reader.op_type == "MaxPool":
        kernel = [int(v) for v in attrs.get("kernel_shape", ())]
        if not (STEM_POOL_PADS and nonnegative) or (len(reader.output) > 1 and reader.output[1]) \
                or attrs.get("ceil_mode", 0) or any(int(d) != 1 for d in attrs.get("dilations", ())) \
                or attrs.get("storage_order", 0) or len(kernel) != 2 or len(pads) != 4 \
                or any(p >= kernel[i % 2] for i, p in enumerate(pads)):
            return none
    elif reader.op_type != "Conv":
        return none
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "") or len(pads) != 4 \
            or min(pads) < 0 or max(pads) == 0:
        return none
    for a in reader.attribute:
        if a.name == "pads":
            del a.ints[:]
            a.ints.extend([0, 0, 0, 0])
    return [0, pads[0], pads[1], 0, 0, pads[2], pads[3], 0]


def _weights(graph: GraphProto, packed: dict[str, str], name: str, kernel: np.ndarray,
             node: NodeProto, bias: np.ndarray, grouped: bool = False) -> tuple[str, str]:
    """The initializers a Gemm*/Conv*/Wino* node reads: `kernel` ((K, N), Wino*'s 16 products
    (16, K, N), or a grouped Conv*'s groups (S, K, N / S), their panels one after another; from
    initializer `name`) packed, once for every node reading it (`packed`: name -> packed name),
    and the node's bias."""
    if name not in packed:
        packed[name] = name + SUFFIX
        value = native.pack(kernel)
        if grouped:
            value = value.reshape((-1, *value.shape[2:]))
        add_initializer(graph, packed[name], value)
    bias_name = f"{node.output[0]}{BIAS_SUFFIX}"
    add_initializer(graph, bias_name, bias)
    return packed[name], bias_name


def _constant_matrix(name: str, inits: dict[str, TensorProto]
                     ) -> tuple[np.ndarray, str] | None:
    """A constant float32 (K, N) matrix read as `name` (an initializer: torch's Identity of a
    shared one is the initializer itself since `constants.initializer_aliases`) and the
    initializer's name, or None."""
    if name not in inits:
        return None
    value = tensor_value(name, lambda: numpy_helper.to_array(inits[name]))
    return (value, name) if value.ndim == 2 and value.dtype == np.float32 else None


def matmuls_to_native(model: ModelProto, small: bool = False, pooled: bool = False) -> int:
    """MatMul (or plain Gemm, its constant C the bias) by a constant float32 (K, N) matrix of at
    least MIN_FLOPS (rows through `_rows_through`; K and N from MATMUL_MIN_DIM,
    POOLED_MATMUL_MIN_DIM in a session on several cores (`pooled`, on POOLED_MATMUL_ISAS only),
    or N from WIDE_RATIO K) becomes an
    `oxla.native::Gemm*` node, the Add of a constant (N,) bias after it its bias and an
    activation after that its epilogue; returns how many. For sessions on one core, where XLA
    runs these products as Eigen's dots (docs/benchmarks.md, thirteenth round), on several
    (YNNPACK's dots, twenty-second round), and for models of
    small kernels (`small`: any flops), where the kernel splits a classifier's matrix-vector
    products with its helpers."""
    if pooled and not small and native.isa() not in POOLED_MATMUL_ISAS:
        return 0
    min_dim = POOLED_MATMUL_MIN_DIM if pooled and native.isa() in POOLED_MATMUL_ISAS \
        else MATMUL_MIN_DIM
    opsets, inits, producers = _tables(model)
    if opsets.get("", 1) < MIN_OPSET:
        return 0
    graph = model.graph
    rows = _known_rows(model)
    candidates = []
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not (
                (node.op_type == "MatMul" and len(node.input) == 2)
                or (node.op_type == "Gemm" and _plain_gemm(node))):
            continue
        found = _constant_matrix(node.input[1], inits)
        if found is not None and (min(found[0].shape) >= min_dim or (
                found[0].shape[1] >= WIDE_RATIO * found[0].shape[0] >= WIDE_RATIO * WIDE_MIN_K)) \
                and (small or 2 * _rows_through(rows, node.input[0], producers) * found[0].size
                     >= MIN_FLOPS):
            c = None
            if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
                c = _constant_vector(node.input[2], inits, found[0].shape[1])
                if c is None:
                    continue
            candidates.append((node, *found, c))
    if not candidates or not native.available():
        return 0
    g, removed, moved, packed = _rewriting(model, inits)
    for node, kernel, name, c in candidates:
        n = kernel.shape[1]
        fold, bias = _Fold(output=node.output[0]), np.zeros(n, np.float32) if c is None else c
        add = None if node.output[0] in g.outputs or c is not None \
            else g.only_reader(node.output[0])
        if add is not None and add.op_type == "Add" and len(add.input) == 2:
            other = add.input[1] if add.input[0] == node.output[0] else add.input[0]
            if other in inits:
                b = tensor_value(other, lambda o=other: numpy_helper.to_array(inits[o]))
                if b.dtype == np.float32 and b.shape == (n,):
                    bias, fold.absorbed, fold.output = b, (add,), add.output[0]
        _activation(g, fold.output, fold)
        inputs = [node.input[0], *_weights(graph, packed, name, kernel, node, bias),
                  *(fold.bounds or ())]
        _rewrite(g, node, op_type(False, fold.activation), inputs, {}, fold, removed, moved)
    _finish(model, opsets, removed, moved)
    return len(candidates)


def _plain_gemm(node: NodeProto) -> bool:
    """A Gemm computing A B + C: alpha and beta 1, neither input transposed."""
    values = {a.name: attribute_value(a) for a in node.attribute}
    return len(node.input) >= 2 and values.get("alpha", 1.0) == 1.0 \
        and values.get("beta", 1.0) == 1.0 and values.get("transA", 0) == 0 \
        and values.get("transB", 0) == 0


def _constant_vector(name: str, inits: dict[str, TensorProto], n: int) -> np.ndarray | None:
    """A constant float32 initializer of n values ((n,) or (1, n)) as (n,), or None."""
    if name not in inits:
        return None
    value = tensor_value(name, lambda: numpy_helper.to_array(inits[name]))
    if value.dtype != np.float32 or value.shape not in ((n,), (1, n)):
        return None
    return value.reshape(n)


def _bias(node: NodeProto, inits: dict[str, TensorProto], n: int) -> tuple[bool, np.ndarray | None]:
    """Whether a Conv's bias is absent or a constant (n,) float32 one, and that bias (None where
    there is none)."""
    name = node.input[2] if len(node.input) > 2 else ""
    if not name:
        return True, None
    if name not in inits:
        return False, None
    b = tensor_value(name, lambda: numpy_helper.to_array(inits[name]))
    return b.dtype == np.float32 and b.shape == (n,), b


def _depthwise(node: NodeProto, producers: dict[str, NodeProto], inits: dict[str, TensorProto]
               ) -> tuple[np.ndarray, np.ndarray | None, dict[str, list[int]], int] | None:
    """(W as (KH, KW, C) float32, the (C,) bias or None, the window, the group) of a
    channels-last depthwise Conv (one input channel per group, of at least two: C / group output
    channels each input channel's) the kernel can run."""
    if not (node.op_type == "Conv" and node.domain == LAST and len(node.input) >= 2):
        return None
    found = conv_hwio(node, producers, inits)
    if found is None or found[0].ndim != 4 or found[0].dtype != np.float32:
        return None
    kh, kw, one, c = found[0].shape
    group = next((int(attribute_value(a)) for a in node.attribute if a.name == "group"), 1)
    window = _window(node, (kh, kw), group=group) \
        if one == 1 and 1 < group <= c and c % group == 0 else None
    plain, b = _bias(node, inits, c)
    if window is None or not plain:
        return None
    del window["kernel_shape"]  # W's shape
    return np.ascontiguousarray(found[0][:, :, 0, :]), b, window, group


def _depthwise_shaped(node: NodeProto, producers: dict[str, NodeProto],
                      inits: dict[str, TensorProto]) -> bool:
    """Whether `node` is a depthwise layer: oxla's Depthwise*, or a channels-last Conv of groups of
    one input channel each (its W's dims alone: no weight is read)."""
    if node.domain == DOMAIN:
        return "Depthwise" in node.op_type
    if node.op_type != "Conv" or node.domain != LAST or len(node.input) < 2 \
            or next((int(attribute_value(a)) for a in node.attribute if a.name == "group"), 1) < 2:
        return False
    name, axis = node.input[1], 1  # OIHW
    producer = producers.get(name)
    if name not in inits and producer is not None and producer.op_type == "Transpose":
        name, axis = producer.input[0], 2  # conv_weights_to_hwio's HWIO
    dims = inits[name].dims if name in inits else ()
    return len(dims) == 4 and dims[axis] == 1


def depthwise_to_native(model: ModelProto, small: bool = False, pooled: bool = False) -> int:
    """Rewrite the eligible depthwise convolutions of the main graph (`DEPTHWISE`); returns how
    many. `small`: the model runs on the one-thread client (`small_kernels`): its depthwise
    convolutions of SMALL_DEPTHWISE_MIN_FLOPS go to the kernel whatever the instruction set.
    `pooled`: the session may use several cores: the bound is POOLED_DEPTHWISE_MIN_FLOPS, on one
    core DEPTHWISE_MIN_FLOPS. Sessions on several cores and, with ONE_CORE_DEPTHWISE, on one core
    run it."""
    if not DEPTHWISE or (native.isa() not in DEPTHWISE_ISAS and not small):
        return 0
    opsets, inits, producers = _tables(model)
    if opsets.get("", 1) < MIN_OPSET:
        return 0
    graph = model.graph
    candidates = [(node, *found) for node in graph.node
                  if (found := _depthwise(node, producers, inits)) is not None]
    if not candidates:
        return 0
    rows = _known_rows(model, exact=small)
    candidates = [c for c in candidates if _reaches(
        rows, c[0].output[0], c[1].size,
        SMALL_DEPTHWISE_MIN_FLOPS if small else POOLED_DEPTHWISE_MIN_FLOPS if pooled
        else DEPTHWISE_MIN_FLOPS, producers)]
    if not candidates or not native.available():
        return 0
    g, removed, moved, _ = _rewriting(model, inits)
    for node, kernel, b, window, group in candidates:
        pre = _pre_activation(g, node, producers, rows, small) if PRE_ACTIVATION else None
        padded = None if pre is not None else _zero_pad(g, node, producers)
        if padded is not None:  # an explicit Pad before (tf2onnx's): the kernel's own pads
            pad, extra = padded
            window["pads"] = [p + e for p, e in zip(window["pads"], extra)]
            node.input[0] = pad.input[0]
            removed.add(id(pad))
            g.taken.add(id(pad))
        bias = np.zeros(kernel.shape[2], np.float32) if b is None else b
        scale, shift, affine, y = _affine(g, node.output[0], kernel.shape[2])
        if affine:  # per-channel Mul/Add after (tf2onnx's batch norm): into W and B
            kernel, bias = kernel * scale, bias * scale + shift
        fold = _Fold(output=y, absorbed=affine)
        _activation(g, y, fold)
        w_name, bias_name = f"{node.output[0]}{SUFFIX}", f"{node.output[0]}{BIAS_SUFFIX}"
        add_initializer(graph, w_name, kernel.astype(np.float32))
        add_initializer(graph, bias_name, bias.astype(np.float32))
        inputs = [node.input[0], w_name, bias_name]
        if pre is not None:  # read the product itself, its bias and activation applied per load
            product, _, pre_fold, pre_value = pre
            pre_bias = f"{node.output[0]}{PRE_BIAS_SUFFIX}"
            add_initializer(graph, pre_bias, pre_value)
            del product.input[2:]
            inputs = [product.output[0], w_name, bias_name, pre_bias, *(pre_fold.bounds or ())]
            removed.update(id(n) for n in pre_fold.absorbed)  # the activation (HardSwish's two)
            g.taken.update(id(n) for n in pre_fold.absorbed)
        inputs.extend(fold.bounds or ())
        _rewrite(g, node, depthwise_op_type(pre[2].activation if pre else None, fold.activation),
                 inputs, {**window, "group": group}, fold, removed, moved)
    _finish(model, opsets, removed, moved)
    return len(candidates)


def _affine(g: _Graph, y: str, c: int) -> tuple[np.ndarray, np.ndarray, tuple[NodeProto, ...], str]:
    """(scale, shift, the nodes, their output) of the chain of Mul and Add by constant float32
    per-channel vectors (c values on the last axis, or one) that alone read `y` one after the
    other: what follows is scale * y + shift."""
    scale, shift = np.ones(c, np.float64), np.zeros(c, np.float64)
    nodes: tuple[NodeProto, ...] = ()
    while (node := g.only_reader(y)) is not None and node.op_type in ("Mul", "Add") \
            and len(node.input) == 2 and node.input[0] != node.input[1]:
        other = node.input[1] if node.input[0] == y else node.input[0]
        if other not in g.inits:
            break
        value = tensor_value(other, lambda o=other: numpy_helper.to_array(g.inits[o]))
        if value.dtype != np.float32 or value.size not in (1, c) or value.ndim > 4 \
                or (value.size == c and c > 1 and value.shape[-1] != c):
            break
        v = value.reshape(-1).astype(np.float64)
        if node.op_type == "Mul":
            scale, shift = scale * v, shift * v
        else:
            shift = shift + v
        nodes, y = (*nodes, node), node.output[0]
    return scale, shift, nodes, y


def _zero_pad(g: _Graph, node: NodeProto, producers: dict[str, NodeProto]
              ) -> tuple[NodeProto, list[int]] | None:
    """(the Pad, its spatial pads as [top, left, bottom, right]) when X is a constant-zero Pad of
    the height and width of a channels-last value, read by the depthwise `node` alone."""
    pad = producers.get(node.input[0])
    if pad is None or pad.op_type != "Pad" or pad.domain not in ("", "ai.onnx") \
            or pad.output[0] in g.outputs \
            or [id(r) for r in g.readers.get(pad.output[0], [])] != [id(node)] \
            or any(a.name != "mode" or a.s not in (b"", b"constant") for a in pad.attribute) \
            or len(pad.input) < 2 or len(pad.input) > 3 or pad.input[1] not in g.inits:
        return None
    if len(pad.input) == 3 and pad.input[2]:
        if pad.input[2] not in g.inits:
            return None
        fill = numpy_helper.to_array(g.inits[pad.input[2]])
        if fill.size != 1 or fill.item() != 0:
            return None
    pads = [int(v) for v in numpy_helper.to_array(g.inits[pad.input[1]]).reshape(-1)]
    if len(pads) != 8 or pads[0] or pads[3] or pads[4] or pads[7] or min(pads) < 0:
        return None
    return pad, [pads[1], pads[2], pads[5], pads[6]]


def _pre_activation(g: _Graph, node: NodeProto, producers: dict[str, NodeProto],
                    rows: dict[str, int], small: bool
                    ) -> tuple[NodeProto, NodeProto, _Fold, np.ndarray] | None:
    """(P, A, A as a fold, P's bias) when the depthwise `node` alone reads A = Relu, Clip or HardSwish of
    P, a 1x1 channels-last Conv with a constant bias whose product (under `_pointwise_min`: XLA's dot)
    A alone reads: the depthwise kernel then applies P's bias and A per load (XLA had fused them
    into its taps loop; a pass of their own wrote the activated product)."""
    act = producers.get(node.input[0])
    if act is None or act.domain not in ("", "ai.onnx") or act.output[0] in g.outputs \
            or [id(r) for r in g.readers.get(act.output[0], [])] != [id(node)]:
        return None
    source = act.input[0]
    if act.op_type == "Mul" and len(act.input) == 2:  # HardSwish as its gate and a Mul
        gate = producers.get(act.input[0])
        source = act.input[1] if gate is not None and gate.op_type == "HardSigmoid" else source
    fold = _Fold()
    _activation(g, source, fold)
    product = producers.get(source)
    if not fold.absorbed or fold.absorbed[-1] is not act or fold.activation not in PRE_ACTIVATIONS \
            or product is None \
            or product.op_type != "Conv" or product.domain != LAST or len(product.input) != 3 \
            or not _pointwise(product) or product.input[2] not in g.inits:
        return None
    found = conv_hwio(product, producers, g.inits)
    if found is None or found[0].shape[:2] != (1, 1) or found[0].dtype != np.float32 \
            or _reaches(rows, product.output[0], found[0].size, _pointwise_min(small), producers):
        return None
    plain, bias = _bias(product, g.inits, found[0].shape[3])
    return (product, act, fold, bias) if plain and bias is not None else None


def _rewrite(g: _Graph, node: NodeProto, op: str, inputs: list[str],
             attributes: Mapping[str, list[int] | int], fold: _Fold, removed: set[int],
             moved: dict[int, NodeProto]) -> None:
    """`node` becomes the native op `op` on these inputs and attributes, producing what `fold`
    absorbed; it runs where the last node it absorbs ran."""
    del node.input[:]
    node.input.extend(inputs)
    node.output[0] = fold.output
    node.domain, node.op_type = DOMAIN, op
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attributes.items())
    if fold.absorbed:
        removed.update(id(n) for n in fold.absorbed)
        g.taken.update(id(n) for n in fold.absorbed)
        moved[id(fold.absorbed[-1])] = node
        removed.add(id(node))


def _finish(model: ModelProto, opsets: dict[str, int], removed: set[int],
            moved: dict[int, NodeProto]) -> None:
    """Nodes that absorbed their readers move to the last one's place; then the unread
    initializers go, and the domain and the ops' function bodies are declared."""
    graph = model.graph
    kept = []
    for n in graph.node:
        if id(n) in moved:
            kept.append(moved[id(n)])
        elif id(n) not in removed:
            kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    _drop_unread(model)
    if DOMAIN not in opsets:
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
        opsets[DOMAIN] = 1
    have = {(f.domain, f.name) for f in model.functions}
    for t in sorted({n.op_type for n in graph.node if n.domain == DOMAIN}):
        if (DOMAIN, t) not in have:
            model.functions.append(_body(t, max(opsets[""], BODY_OPSET)))
    model.ir_version = max(model.ir_version, 8)


def _drop_unread(model: ModelProto) -> None:
    """Remove the kernels' old Transposes (and Identities: torch's shared weights) and the
    initializers that nothing reads any more."""
    graph = model.graph
    while True:
        read = {name for n in graph.node for name in node_reads(n)} | {o.name for o in graph.output}
        dead = [n for n in graph.node if n.op_type in ("Transpose", "Identity")
                and n.domain in ("", "ai.onnx") and n.output[0] not in read]
        if not dead:
            break
        kept = [n for n in graph.node if n not in dead]
        del graph.node[:]
        graph.node.extend(kept)
    fed = {i.name for i in graph.input}
    drop_initializers(graph, lambda name: name not in read and name not in fed)


def _body(name: str, opset: int) -> FunctionProto:
    """The op as standard ONNX: W unpacked to (K, N), N being B's length, then MatMul and Add
    (Gemm*) or, X and Y moved channels first around it, Conv with the node's window (Conv*), then
    what the op type names."""
    if "Depthwise" in name:
        return _depthwise_body(name, opset)
    if name.startswith("Wino"):
        return _winograd_body(name, opset)
    base = name[:4]
    residual = name[4:].startswith("Add")
    activation = name[len(base) + (3 if residual else 0):]
    if base not in ("Gemm", "Conv", "Stem") or activation not in ACTIVATIONS \
            or (base == "Stem" and residual):
        raise ValueError(f"no body for oxla.native::{name}")
    inputs: Sequence[str] = ["X", "W", "B", *(["R"] if residual else []),
                             *(["lo", "hi"] if activation == "Clip" else [])]
    ints = TensorProto.INT64
    nodes = [
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", ints, [1], [0])),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", ints, [1], [1])),
        helper.make_node("Constant", [], ["flat"], value=helper.make_tensor("flat", ints, [2], [0, -1])),
        helper.make_node("Transpose", ["W"], ["W_k"], perm=[1, 0, 2]),          # (K, P, 32)
        helper.make_node("Shape", ["B"], ["n"]),
    ]
    if base == "Conv":  # P = group PP: each group's columns past N / group dropped
        group = helper.make_node("Constant", [], ["g"])
        group.attribute.append(helper.make_attribute_ref("value_int", AttributeProto.INT))
        group.attribute[0].ref_attr_name = "group"
        nodes += [
            group,
            helper.make_node("Reshape", ["g", "one"], ["g1"]),
            helper.make_node("Constant", [], ["last"], value=helper.make_tensor("last", ints, [1], [-1])),
            helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", ints, [1], [2])),
            helper.make_node("Concat", ["zero", "g1", "last"], ["k_g"], axis=0),
            helper.make_node("Reshape", ["W_k", "k_g"], ["W_g"]),               # (K, group, 32 PP)
            helper.make_node("Div", ["n", "g1"], ["n_g"]),
            helper.make_node("Slice", ["W_g", "zero", "n_g", "two"], ["W_gn"]),  # (K, group, N / group)
            helper.make_node("Reshape", ["W_gn", "flat"], ["W_kn"]),           # (K, N)
        ]
    else:
        nodes += [helper.make_node("Reshape", ["W_k", "flat"], ["W_padded"]),  # (K, 32 P)
                  helper.make_node("Slice", ["W_padded", "zero", "n", "one"], ["W_kn"])]  # (K, N)
    sum_ = "Z" if residual else "A"
    attributes: list[str] = []
    if base == "Gemm":
        nodes += [helper.make_node("MatMul", ["X", "W_kn"], ["XW"]),
                  helper.make_node("Add", ["XW", "B"], [sum_])]
    else:
        attributes = list(WINDOW)
        hw = helper.make_node("Constant", [], ["hw"])
        hw.attribute.append(helper.make_attribute_ref("value_ints", AttributeProto.INTS))
        hw.attribute[0].ref_attr_name = "kernel_shape"
        conv = _ref(helper.make_node("Conv", ["X_first", "W_oihw", "B"], ["Y_first"]),
                    *attributes)
        if base == "Conv":  # W (KH, KW, C / group, N)
            attributes.append("group")
            conv.attribute.append(helper.make_attribute_ref("group", AttributeProto.INT))
            conv.attribute[-1].ref_attr_name = "group"
        nodes += [
            hw,
            helper.make_node("Constant", [], ["rest"],
                             value=helper.make_tensor("rest", ints, [1], [-1])),
            helper.make_node("Concat", ["hw", "rest", "n"], ["hwcn"], axis=0),
            helper.make_node("Reshape", ["W_kn", "hwcn"], ["W_hwio"]),           # (KH, KW, C, N)
            helper.make_node("Transpose", ["W_hwio"], ["W_oihw"], perm=[3, 2, 0, 1]),
            # Stem*'s X is channels first already
            helper.make_node("Transpose", ["X"], ["X_first"], perm=[0, 3, 1, 2]) if base == "Conv"
            else helper.make_node("Identity", ["X"], ["X_first"]),
            conv,
            helper.make_node("Transpose", ["Y_first"], [sum_], perm=[0, 2, 3, 1]),
        ]
    if residual:
        nodes.append(helper.make_node("Add", ["Z", "R"], ["A"]))
    if base == "Stem":  # Y zero padded by out_pads (the next Conv's padding)
        attributes.append("out_pads")
        out_pads = helper.make_node("Constant", [], ["out_pads"])
        out_pads.attribute.append(helper.make_attribute_ref("value_ints", AttributeProto.INTS))
        out_pads.attribute[0].ref_attr_name = "out_pads"
        nodes += [*_activation_nodes(activation, opset, y="Y_inner"), out_pads,
                  helper.make_node("Pad", ["Y_inner", "out_pads"], ["Y"])]
    else:
        nodes += _activation_nodes(activation, opset)
    return helper.make_function(DOMAIN, name, list(inputs), ["Y"], nodes,
                                [helper.make_opsetid("", opset)], attributes=attributes)


def _activation_nodes(activation: str, opset: int, a: str = "A", y: str = "Y", lo: str = "lo",
                      hi: str = "hi", s: str = "S") -> list[NodeProto]:
    """y = activation(a); lo and hi are Clip's bounds, s a temporary."""
    if activation == "":
        return [helper.make_node("Identity", [a], [y])]
    if activation == "Silu":
        return [helper.make_node("Sigmoid", [a], [s]), helper.make_node("Mul", [a, s], [y])]
    if activation == "Clip":
        return [helper.make_node("Clip", [a, lo, hi], [y])]
    if activation == "HardSwish" and opset < 14:
        return [helper.make_node("HardSigmoid", [a], [s], alpha=1 / 6, beta=0.5),
                helper.make_node("Mul", [a, s], [y])]
    return [helper.make_node(activation, [a], [y])]


def _ref(node: NodeProto, *names: str) -> NodeProto:
    """`node` with INTS attributes that take the function's attributes of the same names."""
    for a in names:
        node.attribute.append(helper.make_attribute_ref(a, AttributeProto.INTS))
        node.attribute[-1].ref_attr_name = a
    return node


def _depthwise_body(name: str, opset: int) -> FunctionProto:
    """[pre]Depthwise[activation]: X + PB through the pre-activation (when there is one); W
    (KH, KW, C) as (C, 1, KH, KW), X and Y moved channels first around the standard Conv with the
    node's window and group, then the activation."""
    pre, _, activation = name.partition("Depthwise")
    if activation not in ACTIVATIONS or (pre and pre not in PRE_ACTIVATIONS):
        raise ValueError(f"no body for oxla.native::{name}")
    conv = _ref(helper.make_node("Conv", ["X_first", "W_oihw", "B"], ["Y_first"]),
                "strides", "pads", "dilations")
    conv.attribute.append(helper.make_attribute_ref("group", AttributeProto.INT))
    conv.attribute[-1].ref_attr_name = "group"
    nodes = []
    if pre:
        nodes += [helper.make_node("Add", ["X", "PB"], ["X_biased"]),
                  *_activation_nodes(pre, opset, "X_biased", "X_read", "pre_lo", "pre_hi",
                                     "X_gate")]
    nodes += [
        helper.make_node("Constant", [], ["hw1c"],
                         value=helper.make_tensor("hw1c", TensorProto.INT64, [4], [0, 0, 1, -1])),
        helper.make_node("Reshape", ["W", "hw1c"], ["W_hwio"]),                  # (KH, KW, 1, C)
        helper.make_node("Transpose", ["W_hwio"], ["W_oihw"], perm=[3, 2, 0, 1]),
        helper.make_node("Transpose", ["X_read" if pre else "X"], ["X_first"], perm=[0, 3, 1, 2]),
        conv,
        helper.make_node("Transpose", ["Y_first"], ["A"], perm=[0, 2, 3, 1]),
        *_activation_nodes(activation, opset),
    ]
    inputs = ["X", "W", "B", *(["PB"] if pre else []),
              *(["pre_lo", "pre_hi"] if pre == "Clip" else []),
              *(["lo", "hi"] if activation == "Clip" else [])]
    return helper.make_function(DOMAIN, name, inputs, ["Y"], nodes,
                                [helper.make_opsetid("", opset)],
                                attributes=["strides", "pads", "dilations", "group"])


def _winograd_body(name: str, opset: int) -> FunctionProto:
    """Wino[Add][activation] as standard ONNX: U (4, 4, C, N) unpacked from its 16 packed
    products, the kernel g = P U P^T, then Conv (padding 1) between transposes, the residual and
    the activation."""
    residual = name[4:].startswith("Add")
    activation = name[4 + (3 if residual else 0):]
    if activation not in ACTIVATIONS:
        raise ValueError(f"no body for oxla.native::{name}")
    inputs = ["X", "W", "B", *(["R"] if residual else []),
              *(["lo", "hi"] if activation == "Clip" else [])]
    ints = TensorProto.INT64
    p = numpy_helper.from_array(WINOGRAD_P.astype(np.float32), "P")
    pt = numpy_helper.from_array(np.ascontiguousarray(WINOGRAD_P.T.astype(np.float32)), "PT")
    sum_ = "Z" if residual else "A"
    nodes = [
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", ints, [1], [0])),
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", ints, [1], [1])),
        helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", ints, [1], [2])),
        helper.make_node("Constant", [], ["flat"],
                         value=helper.make_tensor("flat", ints, [3], [0, 0, -1])),
        helper.make_node("Constant", [], ["grid"],
                         value=helper.make_tensor("grid", ints, [3], [4, 4, -1])),
        helper.make_node("Constant", [], ["P"], value=p),
        helper.make_node("Constant", [], ["PT"], value=pt),
        helper.make_node("Transpose", ["W"], ["W_k"], perm=[0, 2, 1, 3]),       # (16, C, P, 32)
        helper.make_node("Reshape", ["W_k", "flat"], ["W_padded"]),             # (16, C, 32 P)
        helper.make_node("Shape", ["B"], ["n"]),
        helper.make_node("Slice", ["W_padded", "zero", "n", "two", "one"], ["U_flat"]),
        helper.make_node("Concat", ["grid", "n"], ["shape"], axis=0),
        helper.make_node("Reshape", ["U_flat", "shape"], ["U"]),                # (4, 4, C, N)
        helper.make_node("Transpose", ["U"], ["U_cm"], perm=[2, 3, 0, 1]),      # (C, N, 4, 4)
        helper.make_node("MatMul", ["P", "U_cm"], ["left"]),                    # (C, N, 3, 4)
        helper.make_node("MatMul", ["left", "PT"], ["g_cm"]),                   # (C, N, 3, 3)
        helper.make_node("Transpose", ["g_cm"], ["W_oihw"], perm=[1, 0, 2, 3]),
        helper.make_node("Transpose", ["X"], ["X_first"], perm=list(TO_FIRST)),
        helper.make_node("Conv", ["X_first", "W_oihw", "B"], ["Y_first"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["Y_first"], [sum_], perm=list(TO_LAST)),
    ]
    if residual:
        nodes.append(helper.make_node("Add", ["Z", "R"], ["A"]))
    nodes += _activation_nodes(activation, opset)
    return helper.make_function(DOMAIN, name, inputs, ["Y"], nodes,
                                [helper.make_opsetid("", opset)])
