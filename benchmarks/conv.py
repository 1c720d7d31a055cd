"""Convolution forms against onnxruntime's Conv, per shape class: the measurements behind conv_forms.choose.

    python -m benchmarks.conv [--threads 0,1] [--rounds 7] [--only depthwise] [--write docs/benchmarks.md]
        [--models models/mobilenet_small.onnx,light:squeezenet --batches 1,8]

Whole models (--models; `light:NAME` is onnx's shipped light model zoo file) run onnxruntime and
three oxla builds interleaved: XLA's native conv channels first, conv_forms channels first
(ChannelsLastPass off) and channels last (the default).

For each shape: XLA's native convolution, each candidate form of conv_forms (jax.jit on the CPU
client a session of that thread setting runs on: oxla's synchronous one-thread client at
--threads 1, its synchronous default-pool client otherwise; the
channels-first forms with W an OIHW argument, the channels-last `*_last` forms with X as
(N, H, W, C) and W stored HWIO, as sessions leave them inside a conv net; `native_dw_last`, oxla's
own depthwise kernel, which sessions choose on AVX-512 above native_gemm.POOLED_DEPTHWISE_MIN_FLOPS
on several cores, above DEPTHWISE_MIN_FLOPS on one (ONE_CORE_DEPTHWISE)), oxla's
InferenceSession on a one-node model (ChannelsLastPass puts a transpose on each side of a lone
Conv) and onnxruntime on the same model. Each thread setting runs
in its own process: threads 0 is both runtimes' default; threads 1 is onnxruntime with
intra_op_num_threads=1 and XLA with --xla_cpu_multi_thread_eigen=false, both pinned to one core
with taskset. Within a process the candidates are timed in interleaved blocks (~3 ms of calls
each, each started once the other threads of the process sleep, its first two calls not counted)
over --rounds rounds; a time is the median over rounds of the per-call mean of a block, and a
ratio to onnxruntime the median over rounds of a block's time over that of an onnxruntime block
timed just before it (`_interleaved`'s pairs).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from benchmarks.run import SETTLE, wait_idle, write_results
from oxla import native

FORMS = ("native", "taps", "taps_flat", "dot", "split", "native_last", "taps_last", "dot_last",
         "stem_taps_last", "native_dw_last", "native_grouped_last")
# ConvTranspose rows: XLA's lhs-dilated convolution (what conv.py does unless kernel == stride) and
# conv_forms.transposed_dot channels first and last
TRANSPOSED_FORMS = ("dilated", "transposed_dot", "transposed_dot_last")
MAX_TAPS_TERMS = 150  # beyond this the fused sum compiles for minutes and runs slowly: not tried


@dataclass(frozen=True)
class Shape:
    """One Conv: X (1, c, size, size), W (m, c/group, k, k), pads k//2 (same), stride; kind
    "transposed": one ConvTranspose, W (c, m/group, k, k), no pads."""

    name: str
    kind: str
    c: int
    size: int
    m: int
    group: int
    k: int
    stride: int = 1


SHAPES = (
    Shape("MobileNetV2 dw 3x3 s1 96@56", "depthwise", 96, 56, 96, 96, 3),
    Shape("MobileNetV2 dw 3x3 s2 96@56", "depthwise", 96, 56, 96, 96, 3, 2),
    Shape("MobileNetV2 dw 3x3 s1 32@112", "depthwise", 32, 112, 32, 32, 3),
    Shape("MobileNetV2 dw 3x3 s1 144@28", "depthwise", 144, 28, 144, 144, 3),
    Shape("MobileNetV2 dw 3x3 s1 576@14", "depthwise", 576, 14, 576, 576, 3),
    Shape("MobileNetV2 dw 3x3 s1 960@7", "depthwise", 960, 7, 960, 960, 3),
    Shape("MnasNet dw 5x5 s1 144@28", "depthwise", 144, 28, 144, 144, 5),
    Shape("MnasNet dw 5x5 s2 144@56", "depthwise", 144, 56, 144, 144, 5, 2),
    Shape("EfficientNet dw 5x5 s1 240@14", "depthwise", 240, 14, 240, 240, 5),
    Shape("EfficientNet dw 5x5 s1 960@7", "depthwise", 960, 7, 960, 960, 5),
    Shape("dw multiplier 2, 3x3 s1 32@56", "depthwise", 32, 56, 64, 32, 3),
    Shape("ResNeXt 3x3 g32 128@56 (4/group)", "grouped", 128, 56, 128, 32, 3),
    Shape("ResNeXt 3x3 g32 256@28 (8/group)", "grouped", 256, 28, 256, 32, 3),
    Shape("ResNeXt 3x3 s2 g32 256@56 (8/group)", "grouped", 256, 56, 256, 32, 3, 2),
    Shape("ResNeXt 3x3 g32 512@14 (16/group)", "grouped", 512, 14, 512, 32, 3),
    Shape("RegNet 3x3 g8 96@28 (12/group)", "grouped", 96, 28, 96, 8, 3),
    Shape("RegNet 3x3 g8 64@56 (8/group)", "grouped", 64, 56, 64, 8, 3),
    Shape("ShuffleNet 1x1 g3 240->60@28", "grouped", 240, 28, 60, 3, 1),
    Shape("AlexNet 3x3 g2 96->256@27", "grouped", 96, 27, 256, 2, 3),
    Shape("dense 3x3 64@56", "dense", 64, 56, 64, 1, 3),
    Shape("dense 1x1 96->24@56", "dense", 96, 56, 24, 1, 1),
    Shape("dense 1x1 16->64@32", "dense", 16, 32, 64, 1, 1),
    Shape("dense 1x1 256->1024@14", "dense", 256, 14, 1024, 1, 1),
    Shape("dense 1x1 s2 256->512@56", "dense", 256, 56, 512, 1, 1, 2),
    Shape("stem 3x3 s2 3->16@64", "dense", 3, 64, 16, 1, 3, 2),
    # ResNet-50 (torchvision v1.5, 224): its stem, every 3x3 and the 1x1 convs of each stage
    Shape("ResNet-50 stem 7x7 s2 3->64@224", "dense", 3, 224, 64, 1, 7, 2),
    Shape("ResNet-50 3x3 64@56", "dense", 64, 56, 64, 1, 3),
    Shape("ResNet-50 3x3 s2 128@56", "dense", 128, 56, 128, 1, 3, 2),
    Shape("ResNet-50 3x3 128@28", "dense", 128, 28, 128, 1, 3),
    Shape("ResNet-50 3x3 s2 256@28", "dense", 256, 28, 256, 1, 3, 2),
    Shape("ResNet-50 3x3 256@14", "dense", 256, 14, 256, 1, 3),
    Shape("ResNet-50 3x3 s2 512@14", "dense", 512, 14, 512, 1, 3, 2),
    Shape("ResNet-50 3x3 512@7", "dense", 512, 7, 512, 1, 3),
    Shape("ResNet-50 1x1 256->64@56", "dense", 256, 56, 64, 1, 1),
    Shape("ResNet-50 1x1 64->256@56", "dense", 64, 56, 256, 1, 1),
    Shape("ResNet-50 1x1 512->128@28", "dense", 512, 28, 128, 1, 1),
    Shape("ResNet-50 1x1 128->512@28", "dense", 128, 28, 512, 1, 1),
    Shape("ResNet-50 1x1 1024->256@14", "dense", 1024, 14, 256, 1, 1),
    Shape("ResNet-50 1x1 2048->512@7", "dense", 2048, 7, 512, 1, 1),
    Shape("ResNet-50 1x1 512->2048@7", "dense", 512, 7, 2048, 1, 1),
    Shape("ResNet-50 1x1 s2 1024->2048@14", "dense", 1024, 14, 2048, 1, 1, 2),
    Shape("DBNet ConvTranspose 2x2 s2 64->64@80", "transposed", 64, 80, 64, 1, 2, 2),
    Shape("DBNet ConvTranspose 2x2 s2 64->1@160", "transposed", 64, 160, 1, 1, 2, 2),
    Shape("ConvTranspose 4x4 s4 32->16@40", "transposed", 32, 40, 16, 1, 4, 4),
)


@dataclass
class Row:
    shape: str
    kind: str
    threads: int
    ort_ms: float
    oxla_ms: float
    chosen: str
    chosen_last: str
    oxla_floor_ms: float
    ort_floor_ms: float
    forms_ms: dict[str, float] = field(default_factory=dict)
    # each candidate's paired ratio (`_interleaved`): the median over rounds of its block's time
    # over the onnxruntime block timed just before it
    ratios: dict[str, float] = field(default_factory=dict)

    def ratio(self, name: str) -> float:
        """`name`'s paired ratio to onnxruntime (the ratio of medians for rows without one)."""
        if name in self.ratios:
            return self.ratios[name]
        return (self.oxla_ms if name == "oxla" else self.forms_ms[name]) / self.ort_ms


def _pads(s: Shape) -> int:
    return 0 if s.kind == "transposed" else s.k // 2


def one_node(x: np.ndarray, w: np.ndarray, s: Shape) -> bytes:
    """A one-node Conv (or ConvTranspose) model with W as an initializer."""
    op = "ConvTranspose" if s.kind == "transposed" else "Conv"
    node = helper.make_node(op, ["x", "w"], ["y"], group=s.group, strides=[s.stride] * 2,
                            pads=[_pads(s)] * 4)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_empty_tensor_value_info("y")], [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def relu_node(x: np.ndarray) -> bytes:
    """A one-node Relu on X: what a session call costs beyond the convolution."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_empty_tensor_value_info("y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _forms(s: Shape) -> list[str]:
    from oxla.lowering.ops import conv_forms as F

    if s.kind == "transposed":
        return list(TRANSPOSED_FORMS)

    terms = s.c // s.group * s.k * s.k
    pads, k, st = [(s.k // 2,) * 2] * 2, (s.k,) * 2, (s.stride,) * 2
    out = ["native"]
    if s.group > 1 or terms <= 30:
        out += ["taps"] if terms <= MAX_TAPS_TERMS else []
        out += ["taps_flat"] if terms <= MAX_TAPS_TERMS and F.flat_fits((s.size,) * 2, pads, k, st, (1, 1)) else []
    if s.group > 1 or s.k == 1:
        out += ["dot"]
    if s.group > 1:
        out += ["split"]
    out += ["native_last"]
    if s.c == s.group and s.k * s.k <= F.GRID_TAPS_TERMS:
        out += ["taps_last"]
    if s.k == 1 or (s.group == 1 and s.k <= 3):
        out += ["dot_last"]
    if s.group == 1 and s.c <= F.STEM_CHANNELS and s.c * s.k * s.k <= F.STEM_TAPS_TERMS:
        out += ["stem_taps_last"]
    if s.c == s.group and s.m % s.c == 0 and native.available():  # a channel multiplier too
        out += ["native_dw_last"]
    if 1 < s.group < s.c and native.available():
        out += ["native_grouped_last"]
    return out


def _native_dw_last(s: Shape, threads: int) -> Callable[..., Any]:
    """oxla's native depthwise kernel (oxla/native/kernels.cc) on channels-last X and W stored
    HWIO, on the cores a session gives it: all at default threads, one at --threads 1."""
    import jax

    from oxla.cpu_client import cores
    from oxla.lowering.ops import conv_forms as F
    from oxla.lowering.ops import native as rule

    k, p = s.k, s.k // 2
    out = F.out_sizes((s.size,) * 2, [(p, p)] * 2, (k, k), (s.stride,) * 2, (1, 1))
    zeros = np.zeros(s.m, np.float32)

    def form(x: Any, h: Any) -> Any:
        return rule.depthwise(x, h.reshape((k, k, s.m)), zeros, tuple(out), (s.stride,) * 2,
                              (p, p), (1, 1), 1 if threads == 1 else cores())

    return jax.jit(form)


def _native_grouped_last(s: Shape, w: np.ndarray, threads: int) -> Callable[..., Any] | None:
    """oxla's convolution kernel on a grouped convolution as sessions run it (its groups packed by
    native_gemm.grouped_kernel from W (M, C / group, K, K)), on channels-last X; None where
    sessions leave the shape to XLA."""
    import jax

    from oxla.cpu_client import cores
    from oxla.lowering.ops import conv_forms as F
    from oxla.passes import native_gemm

    kernel = native_gemm.grouped_kernel(w.transpose(2, 3, 1, 0), s.group)
    if kernel is None or not native_gemm.GROUPED:
        return None
    k, p = s.k, s.k // 2
    oh, ow = F.out_sizes((s.size,) * 2, [(p, p)] * 2, (k, k), (s.stride,) * 2, (1, 1))
    packed = native.pack(kernel)
    packed = packed.reshape((-1, *packed.shape[2:]))
    out = jax.ShapeDtypeStruct((1, oh, ow, s.m), np.float32)
    i64 = np.int64

    def form(x: Any, wp: Any) -> Any:
        return jax.ffi.ffi_call(native.CONV_TARGET, out)(
            x, wp, np.zeros(s.m, np.float32), np.zeros((0,), np.float32),
            threads=i64(1 if threads == 1 else cores()), act=i64(0), lo=np.float32(0),
            hi=np.float32(0), kh=i64(k), kw=i64(k), sh=i64(s.stride), sw=i64(s.stride), dh=i64(1),
            dw=i64(1), pt=i64(p), pl=i64(p), groups=i64(kernel.shape[0]))

    f = jax.jit(form)
    return lambda x: f(x, packed)


# wall: time.perf_counter; cpu: this process's CPU time (all its threads), which other processes
# on a shared machine disturb far less: with --threads 1 it is the latency without their load
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def _block(fn: Callable[[], Any], calls: int) -> float:
    start = _clock()
    for _ in range(calls):
        fn()
    return (_clock() - start) / calls * 1e3


def _interleaved(calls: dict[str, Callable[[], Any]], rounds: int, block_ms: float,
                 paired: bool = False) -> tuple[dict[str, float], dict[str, float]]:
    """Median over rounds of each call's per-call time in a block of ~block_ms, blocks interleaved;
    with `paired`, also each call's paired ratio to calls["ort"]: every round times an "ort"
    block just before each other call's block, and the ratio is the median over rounds of the
    two blocks' quotient (the "ort" time is then the median of all its blocks). The host's speed
    moves in phases of seconds: of 9 rounds of MobileNetV2's 960@7 layer, the kernel's blocks took
    35-77 us and onnxruntime's 38-78 us, each following the other; the ratio of the medians was
    1.42x, the median of the paired quotients 1.02x. A round of all the forms of a shape lasts
    seconds, so an unpaired "ort" block can come from another phase.
    As in the suite, every block starts once the process's other threads sleep (onnxruntime's
    pool spins 40-55 ms after its last call: a block of oxla's two-thread kernels right after it
    found the second core taken, the 144@28 depthwise layer 1.82x onnxruntime's time where alone
    it takes 0.4x) and its first SETTLE calls are not counted."""
    per_block = {name: max(1, int(block_ms / max(_block(fn, 3), 1e-3))) for name, fn in calls.items()}
    times: dict[str, list[float]] = {name: [] for name in calls}
    quotients: dict[str, list[float]] = {name: [] for name in calls if name != "ort"}

    def block(name: str) -> float:
        fn = calls[name]
        wait_idle()
        for _ in range(SETTLE):
            fn()
        t = _block(fn, per_block[name])
        times[name].append(t)
        return t

    for _ in range(rounds):
        for name in calls:
            if not paired:
                block(name)
            elif name != "ort":
                ort = block("ort")
                quotients[name].append(block(name) / ort)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return medians, ({name: statistics.median(q) for name, q in quotients.items()} if paired else {})


def _session_device(threads: int) -> Any:
    """The CPU device an InferenceSession with intra_op_num_threads `threads` runs on."""
    from oxla.cpu_client import inline_device, single_thread_device

    return (single_thread_device() if threads == 1 else None) or inline_device()


def _candidates(s: Shape, x: np.ndarray, w: np.ndarray, threads: int) -> dict[str, Callable[[], Any]]:
    """onnxruntime, the oxla session, both session floors, and each form jitted on its own."""
    import jax
    import onnxruntime as ort

    import oxla
    from oxla.lowering.ops import conv_forms as F

    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    sessions = {"ort": ort.InferenceSession(one_node(x, w, s), opts, providers=["CPUExecutionProvider"]),
                "oxla": oxla.InferenceSession(one_node(x, w, s)),
                "ort_floor": ort.InferenceSession(relu_node(x), opts, providers=["CPUExecutionProvider"]),
                "oxla_floor": oxla.InferenceSession(relu_node(x))}
    calls: dict[str, Callable[[], Any]] = {
        name: lambda sess=sess: sess.run(None, {"x": x})[0] for name, sess in sessions.items()}
    # on the client a session runs on (oxla's synchronous ones: one thread, or the default
    # pool), where JAX's own hands each call to a thread of its pool: 20-70 us more a call on one
    # core of this noisy machine, the size of a small layer
    dev = _session_device(threads)
    xj, wj = jax.device_put(x, dev), jax.device_put(w, dev)
    # channels-last forms: X as (N, H, W, C) and W stored HWIO, as a session's ChannelsLastPass
    # and WeightLayoutPass leave them
    xl = jax.device_put(np.ascontiguousarray(np.moveaxis(x, 1, -1)), dev)
    wh = jax.device_put(np.ascontiguousarray(w.transpose(2, 3, 1, 0)), dev)
    for name in _forms(s):
        if name == "native_dw_last":
            f = _native_dw_last(s, threads)
            calls[name] = lambda f=f: f(xl, wh).block_until_ready()
            continue
        if name == "native_grouped_last":
            g = _native_grouped_last(s, w, threads)
            if g is not None:
                calls[name] = lambda g=g: g(xl).block_until_ready()
            continue
        form = _transposed_form(name, s) if s.kind == "transposed" else functools.partial(
            getattr(F, name), strides=(s.stride,) * 2, padding=[(s.k // 2,) * 2] * 2,
            dilations=(1, 1), group=s.group)
        if name.endswith("_last"):
            f = jax.jit(lambda x, h, form=form: form(x, jax.numpy.transpose(h, (3, 2, 0, 1))))
            calls[name] = lambda f=f: f(xl, wh).block_until_ready()
        else:
            f = jax.jit(form)
            calls[name] = lambda f=f: f(xj, wj).block_until_ready()
    return calls


def _transposed_form(name: str, s: Shape) -> Callable[..., Any]:
    """A ConvTranspose (no pads) as jax: XLA's lhs-dilated convolution or transposed_dot."""
    import jax

    from oxla.lowering.ops import conv_forms as F

    if name != "dilated":
        return functools.partial(F.transposed_dot, group=s.group, last=name.endswith("_last"))

    def dilated(x: Any, w: Any) -> Any:
        # conv.py's general lowering: the stride-dilated X with the flipped, I/O-swapped kernel
        g, k = s.group, s.k
        wt = w.reshape((g, s.c // g, s.m // g, k, k)).swapaxes(1, 2).reshape((s.m, s.c // g, k, k))
        return jax.lax.conv_general_dilated(
            x, wt[:, :, ::-1, ::-1], (1, 1), [(k - 1, k - 1)] * 2, lhs_dilation=(s.stride,) * 2,
            dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=g)

    return dilated


def _chosen(s: Shape, w_shape: tuple[int, ...], threads: int) -> tuple[str, str]:
    """The forms Conv (channels first, channels last) takes for this shape: channels last, a
    session runs a depthwise convolution on the native kernel where its instruction set is in
    DEPTHWISE_ISAS (oxla.passes.native_gemm.depthwise_to_native): on several cores from
    POOLED_DEPTHWISE_MIN_FLOPS, on one core (where ONE_CORE_DEPTHWISE says so) from
    DEPTHWISE_MIN_FLOPS. (In a model of small kernels, `small_kernels`, from
    SMALL_DEPTHWISE_MIN_FLOPS on any instruction set.) Grouped convolutions the convolution
    kernel takes (native_gemm.grouped_kernel) run there at any thread setting."""
    from oxla.cpu_client import cores
    from oxla.lowering.ops import conv_forms as F
    from oxla.passes import native_gemm

    if s.kind == "transposed":
        fits = F.transposed_fits((s.k,) * 2, (s.stride,) * 2, (1, 1), [(0, 0)] * 2)
        return ("transposed_dot", "transposed_dot_last") if fits else ("dilated", "dilated")
    geometry = ((s.size,) * 2, w_shape, (s.stride,) * 2, [(s.k // 2,) * 2] * 2, (1, 1), s.group)
    out = F.out_sizes(*geometry[:1], geometry[3], (s.k,) * 2, geometry[2], (1, 1))
    flops = 2 * s.m * math.prod(out) * s.k * s.k
    several = threads != 1 and cores() > 1
    if s.c == s.group and s.m % s.c == 0 and (several or native_gemm.ONE_CORE_DEPTHWISE) \
            and native.available() \
            and native.isa() in native_gemm.DEPTHWISE_ISAS and flops >= (
                native_gemm.POOLED_DEPTHWISE_MIN_FLOPS if several else native_gemm.DEPTHWISE_MIN_FLOPS):
        return F.choose(*geometry).__name__, "native_dw_last"
    if 1 < s.group < s.c and native.available() and native_gemm.GROUPED \
            and native_gemm.grouped_kernel(np.zeros((s.k, s.k, *w_shape[1::-1]), np.float32),
                                           s.group) is not None:
        return F.choose(*geometry).__name__, "native_grouped_last"
    return F.choose(*geometry).__name__, F.choose_last(*geometry).__name__


def measure(s: Shape, threads: int, rounds: int) -> Row:
    """Time every candidate of one shape in this process, interleaved, after checking its values."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, s.c, s.size, s.size)).astype(np.float32)
    w_shape = (s.c, s.m // s.group) if s.kind == "transposed" else (s.m, s.c // s.group)
    w = rng.standard_normal((*w_shape, s.k, s.k)).astype(np.float32)
    calls = _candidates(s, x, w, threads)
    want = calls["ort"]()
    for name, fn in calls.items():
        if not name.endswith("_floor"):
            got = np.asarray(fn())
            got = np.moveaxis(got, -1, 1) if name.endswith("_last") else got
            np.testing.assert_allclose(got, want, rtol=1e-3,
                                       atol=1e-3 * float(np.abs(want).max()), err_msg=f"{s.name}: {name}")
    med, ratios = _interleaved(calls, rounds, 3.0, paired=True)
    return Row(s.name, s.kind, threads, med.pop("ort"), med.pop("oxla"), *_chosen(s, w.shape, threads),
               med.pop("oxla_floor"), med.pop("ort_floor"), med, ratios)


@dataclass
class ModelRow:
    model: str
    batch: int
    threads: int
    ort_ms: float
    before_ms: float
    first_ms: float
    last_ms: float
    max_diff: float


def _native_only(*_: Any) -> Callable[..., Any]:
    from oxla.lowering.ops import conv_forms

    return conv_forms.native


def _session(path: str, feeds: dict[str, np.ndarray], *, channels_last: bool,
             native: bool = False) -> Any:
    """An oxla session compiled (by a first run) with ChannelsLastPass on or off, and with
    conv_forms.choose patched to XLA's native conv if asked."""
    import oxla
    from oxla.lowering.ops import conv_forms
    from oxla.passes import channels_last as pass_module

    chosen = conv_forms.choose
    pass_module.ENABLED = channels_last
    if native:
        conv_forms.choose = _native_only  # type: ignore[assignment]  # "before": what Conv did
    try:
        sess = oxla.InferenceSession(path)
        sess.run(None, feeds)  # compiles now, while the settings hold
    finally:
        conv_forms.choose = chosen  # type: ignore[assignment]
        pass_module.ENABLED = True
    return sess


def _feeds(path: str, batch: int) -> dict[str, np.ndarray]:
    """Random feeds for a one-input image model: its declared shape with batch as dimension 0."""
    import onnx

    graph = onnx.load(path, load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    x = next(i for i in graph.input if i.name not in inits)
    shape = [batch] + [d.dim_value for d in x.type.tensor_type.shape.dim[1:]]
    return {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def measure_model(path: str, batch: int, rounds: int, threads: int) -> ModelRow:
    """A whole model: onnxruntime; oxla with XLA's native conv everywhere (before conv_forms);
    with conv_forms, channels first (ChannelsLastPass off); and channels last (the default)."""
    import onnxruntime as ort

    feeds = _feeds(path, batch)
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    ort_sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    want = ort_sess.run(None, feeds)[0]
    sessions = {"before": _session(path, feeds, channels_last=False, native=True),
                "first": _session(path, feeds, channels_last=False),
                "last": _session(path, feeds, channels_last=True)}
    scale = max(float(np.max(np.abs(want))), 1e-30)
    diff = max(float(np.max(np.abs(np.asarray(s.run(None, feeds)[0]) - want))) / scale
               for s in sessions.values())
    calls = {"ort": lambda: ort_sess.run(None, feeds),
             **{k: lambda s=s: s.run(None, feeds) for k, s in sessions.items()}}
    med, _ = _interleaved(calls, rounds, 20.0)
    return ModelRow(Path(path).stem, batch, threads, med["ort"], med["before"], med["first"],
                    med["last"], diff)


def model_table(rows: list[ModelRow]) -> str:
    lines = ["| model | batch | threads | onnxruntime ms | native conv, channels first / ort | conv_forms, "
             "channels first / ort | channels last (default) / ort | channels last / first | "
             "max diff / max abs |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.batch} | {r.threads or 'default'} | {r.ort_ms:.3f} | {r.before_ms / r.ort_ms:.2f}x | "
                     f"{r.first_ms / r.ort_ms:.2f}x | {r.last_ms / r.ort_ms:.2f}x | "
                     f"{r.last_ms / r.first_ms:.2f} | {r.max_diff:.1e} |")
    return "\n".join(lines)


def _run_child(args: list[str], threads: int) -> list[str]:
    """Run `python -m benchmarks.conv ARGS` in a process set up for `threads`; its stdout lines.

    threads 1: XLA without its multi-threaded Eigen kernels, pinned to one core with taskset
    (onnxruntime gets intra_op_num_threads=1 inside).
    """
    cmd = [sys.executable, "-m", "benchmarks.conv", *args]
    env = dict(os.environ)
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                          cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.splitlines()


def _child(threads: int, rounds: int, only: str, clock: str) -> list[Row]:
    lines = _run_child(["--one", str(threads), "--rounds", str(rounds), "--only", only,
                        "--clock", clock], threads)
    return [Row(**json.loads(line)) for line in lines if line.startswith("{")]


def _model_path(name: str) -> str:
    """A model path; `light:NAME` is onnx's shipped backend/test/data/light/light_NAME.onnx."""
    if not name.startswith("light:"):
        return name
    import onnx

    return str(Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
               / f"light_{name[len('light:'):]}.onnx")


def _model_child(path: str, batch: int, rounds: int, threads: int, clock: str) -> ModelRow:
    lines = _run_child(["--one-model", path, str(batch), "--rounds", str(rounds), "--clock", clock,
                        "--threads", str(threads)], threads)
    return ModelRow(**json.loads(lines[-1]))


def table(rows: list[Row], forms: tuple[str, ...] = FORMS) -> str:
    """Markdown: per shape and thread setting, each form's time as a ratio to onnxruntime's."""
    lines = ["| shape | threads | onnxruntime ms | oxla session ms | oxla / ort | session floor "
             "oxla / ort ms | chosen form (first / last) | "
             + " | ".join(f"{f} / ort" for f in forms) + " | fastest form |",
             "|---|---|---|---|---|---|---|" + "---|" * len(forms) + "---|"]
    for r in rows:
        cells = [f"{r.ratio(f):.2f}x" if f in r.forms_ms else "" for f in forms]
        best = min(r.forms_ms, key=r.forms_ms.__getitem__)
        lines.append(f"| {r.shape} | {r.threads or 'default'} | {r.ort_ms:.3f} | {r.oxla_ms:.3f} | "
                     f"{r.ratio('oxla'):.2f}x | {r.oxla_floor_ms:.3f} / {r.ort_floor_ms:.3f} | "
                     f"{r.chosen} / {r.chosen_last} | " + " | ".join(cells) + f" | {best} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="0,1", help="thread settings: 0 = default, 1 = one thread")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--only", default="", help="only shapes whose name or kind contains this")
    parser.add_argument("--write", help="write the table as a section of this markdown file")
    parser.add_argument("--models", default="", help="also whole models, e.g. models/mobilenet_small.onnx,...")
    parser.add_argument("--batches", default="1,8", help="batch sizes for --models")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a loaded machine)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--one-model", nargs=2, metavar=("PATH", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    shapes = [s for s in SHAPES if args.only in s.name or args.only == s.kind]
    if args.one_model:
        print(json.dumps(asdict(measure_model(args.one_model[0], int(args.one_model[1]), args.rounds,
                                              int(args.threads)))))
        return 0
    if args.one is not None:  # a child: one thread setting, a JSON line per shape
        for s in shapes:
            print(json.dumps(asdict(measure(s, args.one, args.rounds))), flush=True)
        return 0
    load = os.getloadavg()[0]
    threads = [int(t) for t in args.threads.split(",") if t]
    models = [_model_child(_model_path(p), int(b), args.rounds, t, args.clock)
              for p in args.models.split(",") if p for b in args.batches.split(",") for t in threads]
    rows = [r for t in threads for r in _child(t, args.rounds, args.only, args.clock)]
    rows.sort(key=lambda r: ([s.name for s in SHAPES].index(r.shape), r.threads))
    convs = [r for r in rows if r.kind != "transposed"]
    transposed = [r for r in rows if r.kind == "transposed"]
    text = "\n\n".join(part for part in (table(convs) if convs else "",
                                         table(transposed, TRANSPOSED_FORMS) if transposed else "",
                                         "Whole models:\n\n"
                                         + model_table(models) if models else "") if part)
    print(text)
    if args.write:
        write_results(args.write, "Convolutions", "conv", argv,
                      f"Times ({args.clock} clock) are medians of {args.rounds} interleaved blocks, "
                      "ratios medians of each block's time over that of an onnxruntime block "
                      "timed just before it; "
                      "form columns are raw "
                      "`jax.jit` of each conv_forms form; 'oxla session' is `oxla.InferenceSession` "
                      f"on the one-node model. Load average (1 min) {load:.1f} at the start, "
                      f"{os.getloadavg()[0]:.1f} at the end.", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
