"""The plan: everything decided about a model before any trace, immutable afterwards.

`make_plan` runs the graph passes (op dispatch, constants to initializers, weight layout), then
derives which initializers are compile-time constants, the liveness tables the executor splits
graphs with, and what each input must look like.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from onnx import ModelProto, NodeProto, TypeProto

from oxla.dtypes import is_float
from oxla.graph import initializer_values, last_uses, model_opsets, node_reads, producers
from oxla.lowering.context import Options
from oxla.native import available as native_available
from oxla.passes import native_gemm, nms_split
from oxla.passes.batch_norm_fold import fold_batch_norms
from oxla.passes.channels_last import convs_to_channels_last
from oxla.passes.classify import DispatchTable, check_supported
from oxla.passes.constants import (
    constant_fills_to_initializers,
    initializer_aliases,
    large_constants_to_initializers,
    listed_initializers_to_constants,
)
from oxla.passes.dequantize_constants import dequantize_constants
from oxla.passes.native_gemm import (
    convs_to_native,
    depthwise_to_native,
    matmuls_to_native,
    small_kernels,
    stems_to_native,
)
from oxla.passes.nms_split import split_non_max_suppression, trim_nms_rows
from oxla.passes.ort_fused import unfuse_ort_ops
from oxla.passes.pad_ahead import pad_ahead
from oxla.passes.qdq_conv import qdq_adds_to_qlinear, qdq_conv_to_integer, quantized_max_pools
from oxla.passes.qlinear_conv import qlinear_conv_centered
from oxla.passes.sibling_convs import merge_sibling_convs
from oxla.passes.static_inputs import required_static
from oxla.passes.weight_layout import (
    conv_weights_to_hwio,
    gemm_weights_to_kn,
    recurrent_weights_per_direction,
)
from oxla.passes.winograd import convs_to_winograd

# Integer and bool initializers up to this size are compile-time constants by default: they are
# almost always shapes, axes or indices that rules need static.
SMALL_CONSTANT = 1024
# InferenceSession on a CPU compiles a model's initializers in as constants when its float ones
# (but those a feed may override) total at most this many bytes (`Options.constant_weights`):
# a small model's call then passes no parameter buffers, and XLA lays its weights out once, at
# compile time, where its library calls (YNNPACK's dot) otherwise transpose and pack them on every
# call. The VAD model (0.4 MB; sessions with and without in one process, onnxruntime's blocks
# interleaved): 98.5 -> 87.4 us a call (onnxruntime 76.1). Their values can then no longer be
# replaced (CompiledModel.set_parameters refuses them); oxla.compile keeps them parameters.
SMALL_WEIGHTS = 1 << 20


@dataclass(frozen=True, eq=False)
class Plan:
    """A prepared model: dispatch, constants and liveness, decided once."""

    model: ModelProto
    options: Options
    dispatch: DispatchTable
    opsets: Mapping[str, int]
    nodes: tuple[NodeProto, ...]
    reads: tuple[frozenset[str], ...]           # per node: inputs and subgraph free names
    producer: Mapping[str, int]                 # value -> index of the node computing it
    last_use: Mapping[str, int]                 # value -> index of its last reader (outputs: n)
    input_names: tuple[str, ...]                # feeds (graph inputs that are not initializers)
    output_names: tuple[str, ...]
    input_types: Mapping[str, TypeProto]        # declared type of every graph input
    overridable: frozenset[str]                 # initializers that are also graph inputs
    constants: Mapping[str, np.ndarray]         # initializers known at trace time
    parameters: Mapping[str, np.ndarray]        # initializers passed to the computation
    required_static: frozenset[str]             # constants because a rule needs them static
    one_thread: bool = False                    # runs on the one-thread client (small_kernels)

    def live_in(self, pos: int) -> tuple[str, ...]:
        """Values read at or after node `pos` that come from before it (no initializers)."""
        return tuple(sorted(
            n for n, last in self.last_use.items()
            if last >= pos and self.producer.get(n, -1) < pos
            and n not in self.constants and n not in self.parameters))

    def live_after(self, stop: int) -> frozenset[str]:
        """Values read by node `stop` or later, plus the graph outputs."""
        return frozenset(n for n, last in self.last_use.items() if last >= stop)


def prepare(model: ModelProto, options: Options) -> tuple[DispatchTable, bool]:
    """The graph passes, in order; rewrites `model` in place and returns its dispatch table, and
    whether it is a model of small kernels (`small_kernels`: to run on the one-thread client)."""
    listed_initializers_to_constants(model)  # IR < 4: as onnxruntime holds them
    table = check_supported(model)
    small = False
    if not options.bake_weights:
        large_constants_to_initializers(model)
        constant_fills_to_initializers(model, options.memory_limit)
        initializer_aliases(model)  # torch's shared weights: the passes find the initializer
        if options.layout_weights:
            unfuse_ort_ops(model)  # onnxruntime's FusedConv / FusedGemm: the passes see Conv, Gemm
            fold_batch_norms(model)  # Conv -> BatchNormalization as one Conv
            # read before the other passes rewrite the graph (shape inference knows standard ops)
            small = bool(options.native_threads and options.channels_last) and small_kernels(model)
            qdq_conv_to_integer(model)
            quantized_max_pools(model)
            qdq_adds_to_qlinear(model)
            qlinear_conv_centered(model)
            dequantize_constants(model, options.memory_limit)
            merge_sibling_convs(model)
            conv_weights_to_hwio(model)
            gemm_weights_to_kn(model)
            recurrent_weights_per_direction(model)
            if options.native_matmul or small:
                matmuls_to_native(model, small, pooled=options.native_threads > 1)
            if options.channels_last:
                convs_to_channels_last(model)
                if options.native_stems:
                    stems_to_native(model)  # reads the image before its transpose
                if options.native_threads or (options.native_convs
                                                and native_gemm.ONE_CORE_DEPTHWISE):
                    # before PadAheadPass: it pads in the kernel
                    depthwise_to_native(model, small, pooled=options.native_threads > 1)
                native_later = bool(options.native_threads or options.native_convs)
                pad_ahead(model, keep=native_gemm.takes_grouped(model) if native_later else set())
                convs_to_winograd(model, native=bool(options.native_threads
                                                     or options.native_convs))
                if options.native_threads:
                    convs_to_native(model, small=small)
                elif options.native_convs:  # one core: the kernels on one thread
                    convs_to_native(model, beside_depthwise=False)
    if split_non_max_suppression(model) and options.native_nms and nms_split.NATIVE_NMS \
            and nms_split.TRIM_ROWS and native_available():
        trim_nms_rows(model, nms_split.NATIVE_ROWS)  # the kernel's hints always settle
    return table, small


def make_plan(model: ModelProto, options: Options | None = None, *,
              dynamic: frozenset[str] = frozenset()) -> Plan:
    """Plan `model` (rewritten in place by the passes).

    Args:
        model: a loaded model, owned by the plan from now on.
        options: compile options.
        dynamic: initializers that must stay parameters even when small (state a trainer
            updates), unless a rule needs them static.

    Raises:
        UnsupportedOpError: one error listing every op oxla cannot run.
    """
    options = options or Options()
    table, small = prepare(model, options)
    graph = model.graph
    nodes = tuple(graph.node)
    reads = tuple(frozenset(node_reads(n)) for n in nodes)
    inits = initializer_values(graph)
    outputs = tuple(o.name for o in graph.output)
    feeds = tuple(i.name for i in graph.input if i.name not in inits)
    opsets = model_opsets(model.opset_import)
    needed = required_static(nodes, opsets, table, set(inits), set(feeds))
    overridable = frozenset(i.name for i in graph.input if i.name in inits)
    kept = {n: v for n, v in inits.items() if n not in dynamic and n not in overridable}
    light = 0 < sum(v.nbytes for v in kept.values() if is_float(v.dtype)) <= options.constant_weights
    constants, parameters = {}, {}
    for name, value in inits.items():
        if name in needed or (name not in dynamic and _starts_static(value, options)) \
                or (light and name in kept):
            constants[name] = value
        else:
            parameters[name] = value
    return Plan(
        model=model, options=options, dispatch=table, opsets=MappingProxyType(opsets), nodes=nodes,
        reads=reads, producer=MappingProxyType(producers(nodes)),
        last_use=MappingProxyType(last_uses(reads, outputs)), input_names=feeds,
        output_names=outputs, input_types=MappingProxyType({i.name: i.type for i in graph.input}),
        overridable=overridable,
        constants=MappingProxyType(constants), parameters=MappingProxyType(parameters),
        required_static=needed, one_thread=small)


def _starts_static(value: np.ndarray, options: Options) -> bool:
    if options.bake_weights or value.dtype == object:
        return True
    return not is_float(value.dtype) and value.dtype.kind != "c" and value.size <= SMALL_CONSTANT
