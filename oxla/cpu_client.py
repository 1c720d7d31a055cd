"""oxla's own CPU client: computations run in the calling thread, as onnxruntime's do.

JAX's default CPU client hands every computation above ~1000 flops to a worker thread (its
async dispatch), and copies an input that is not 64-byte aligned on a worker too; the caller then
waits. On a multi-core machine each hand-off costs 20-60 us (FACTS.md): a 3-layer MLP at batch 1
took 75-85 us a call that way and 10 us inline. JAX's switch for this
(`jax_cpu_enable_async_dispatch`) is global and read once, when JAX creates its client; oxla
must not change it. So the executor compiles for, and runs on, a second CPU client of its own,
made with `asynchronous=False`; the user's JAX keeps its client and settings untouched. Work
inside one computation still uses that client's intra-op thread pool.

Arrays from the user's devices are accepted as feeds (XLA copies them over, memory to memory).

A third client, made on demand, has an intra-op pool of one thread: a model whose kernels are
all small runs faster there than on the pooled client when the process has several cores (see
`prefers_one_thread`).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import jax

from oxla.host import has_avx512

# XLA:CPU's YNNPACK fusions (all kinds on by default in jax 0.12) are chosen per segment:
# - on where a recurrent loop runs or integer arithmetic is done: a bi-GRU 1.10 -> 3.14x
#   onnxruntime without them (the per-step matrix-vector product in the scan), int8 ResNet-50
#   (QDQ) 3.1 -> 13x (XLA's own integer dot is slow);
# - convolutions only (YNNPACK's convolution, XLA's dots and loops), where a segment convolves:
#   at default threads (2 cores, both orders in one process, averaged) the DBNet-style segmenter
#   54.5 -> 52.2 ms, ResNet-50, EfficientNet-B0, MobileNetV3-small and ShuffleNetV2 equal
#   within 1%; all kinds were slower for ShuffleNetV2 and MobileNetV3;
# - all kinds for other segments when the process may use more than one core (BERT-base 114.7 ->
#   98.4 ms at default threads, ViT-S equal: YNNPACK splits BERT's dots across threads better),
#   none on one core or on the one-thread client (BERT-base 1.09 -> 0.99x onnxruntime without
#   them on one core).
# Timed in one process, the session that runs right after onnxruntime's calls is up to 16%
# slower whatever its options (the cores take two calls to settle): compare in both orders.
# OXLA_YNN_FUSIONS=1 keeps all on everywhere, =0 all off everywhere (for measuring).
YNN_FUSIONS = os.environ.get("OXLA_YNN_FUSIONS", "")
KEEP_YNN = frozenset({"RNN", "GRU", "LSTM", "Scan", "Loop", "ConvInteger", "MatMulInteger"})
KEEP_YNN_PREFIXES = ("QLinear", "DynamicQuantize", "QGemm", "QAttention", "MatMulNBits",
                     "QOrdered")

_LOCK = threading.Lock()
_DEVICE: list[Any] = []
_SINGLE: list[Any] = []


def inline_device() -> Any:
    """The CPU device of oxla's synchronous client, made on first use; JAX's own first CPU
    device when that client cannot be made."""
    if not _DEVICE:
        with _LOCK:
            if not _DEVICE:
                _DEVICE.append(_make())
    return _DEVICE[0]


def single_thread_device() -> Any | None:
    """The CPU device of a synchronous client whose intra-op pool has one thread, made on first
    use; None when it cannot be made."""
    if not _SINGLE:
        with _LOCK:
            if not _SINGLE:
                _SINGLE.append(_make(threads=1))
    device = _SINGLE[0]
    return None if device is None or device == inline_device() else device


def is_single_thread(device: Any) -> bool:
    """Whether `device` is the one-thread client's (never making that client)."""
    return bool(_SINGLE) and _SINGLE[0] is not None and device == _SINGLE[0]


def _make(threads: int | None = None) -> Any:
    try:
        from jax._src.lib import xla_client

        if threads is None:
            client: Any = xla_client.make_cpu_client(asynchronous=False)
        else:
            # XLA sizes a client's intra-op pool from NPROC (else the cores it may run on), read
            # once, when the client is made: the user's own clients are unaffected
            saved = os.environ.get("NPROC")
            os.environ["NPROC"] = str(threads)
            try:
                client = xla_client.make_cpu_client(asynchronous=False)
            finally:
                if saved is None:
                    del os.environ["NPROC"]
                else:
                    os.environ["NPROC"] = saved
        return client.local_devices()[0]
    except Exception:  # a jaxlib without the private constructor: JAX's device still works
        return jax.devices("cpu")[0] if threads is None else None


# XLA:CPU hands a loop fusion whose output passes 512 KB (or whose cost model says it computes
# enough) to its intra-op pool in two halves, and a dot or convolution its library splits; the
# pool's idle thread sleeps in the kernel between such kernels. On this 2-core VM waking it costs
# 25-40 us (a futex round trip between the cores: 50-84 us when the other core was idle, 8 us when
# it was busy), which a small kernel does not win back: with the pool, MobileNetV3-small took
# 2.60 ms against 2.31 ms on a one-thread client, the 64x64 ResNet of the quantized benchmark
# 0.573 -> 0.437 ms (QDQ 0.387 -> 0.292, QOperator 0.414 -> 0.296), where EfficientNet-B0 (11.2
# against 12.7 ms), the detector (4.38 against 6.13 ms), ResNet-50 and the GRU gain from the pool
# (flops per ONNX node, from XLA's cost analysis: MobileNetV3-small 0.69 M, the 64x64 ResNet
# 0.03-0.09 M, ShuffleNetV2 0.69 M (equal either way), EfficientNet-B0 2.5 M, the GRU 3.0 M, the
# detector 6.8 M, ResNet-50 42 M). Both orders in one process, oxla alone, medians. The bytes
# bound keeps a segment that moves much memory with few flops (a large transpose or gather, whose
# copy XLA splits) on the pool; XLA's bytes accessed per node before fusion: MobileNetV3-small
# 2.6 MB, ShuffleNetV2 0.8 MB, the 64x64 ResNet 0.1 MB, EfficientNet-B0 6.3 MB, the detector 12 MB.
SMALL_KERNELS = (1.5e6, 4e6)  # XLA flops and bytes accessed per ONNX node of a segment
# oxla's kernels run on that client too: past its one thread they split their work with spinning
# helpers of their own (oxla/native/kernels.cc), and a model of small kernels has its 1x1 and
# depthwise convolutions on them (native_gemm.small_kernels). The rule that kept a segment whose
# flops were mostly oxla's kernels' on the pooled client (the shipped resnet_small at batch 4:
# 0.811 ms on the one-thread client, 0.609 ms pooled, when its kernels ran on one thread there) is
# gone with them: one process, onnxruntime's blocks interleaved, without / with it resnet_small
# 0.248 / 0.270 ms at batch 1, 0.576 / 0.556 ms at batch 4, mobilenet_small 0.366 / 0.457 and
# 0.941 / 0.923 ms.


def prefers_one_thread(nodes: int, cost: Callable[[], tuple[float, float]]) -> bool:
    """Whether a segment of `nodes` ONNX nodes for which XLA counts `cost()` (flops, with those of
    oxla's custom calls, which the executor adds since XLA does not count them: BERT-base with
    its MatMuls on the kernel, as tried, moved to the one-thread client without them, 159
    against 92 ms; and bytes accessed) should run on the one-thread client: its
    kernels are too small to win back a wake of the pool's other thread. On one core it never
    should (and `cost` is not asked)."""
    if cores() <= 1 or nodes <= 0:
        return False
    flops, accessed = cost()
    return flops / nodes < SMALL_KERNELS[0] and accessed / nodes < SMALL_KERNELS[1]


CONV_ONLY = "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"
# A segment with Winograd convolutions (oxla.winograd::Conv: 16 batched products per layer) also
# gets YNNPACK's dots: at two threads Eigen's batched dot (16 x 49x256 by 256x256) ran slower than
# at one (1.06 -> 1.65 ms) where YNNPACK's gains (1.16 -> 0.95 ms). Default threads, both orders in
# one process: the DBNet-style segmenter 53.2 -> 49.8 and 52.8 -> 49.3 ms, ResNet-50 45.0 -> 43.5
# and 43.0 -> 41.9 ms; in segments without them YNNPACK's dots were slower (EfficientNet-B0
# 10.09 -> 10.89 ms, MobileNetV3-small 2.65 -> 2.89 ms). Not on one core: there ResNet-50 ran
# 63.0 -> 74.6 and 64.8 -> 75.3 ms with them (both orders).
CONV_AND_DOTS = CONV_ONLY + ",LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"
WINOGRAD_CONV = "oxla.winograd::Conv"
NATIVE_GEMM = "oxla.native::Gemm"
NATIVE_CONV = "oxla.native::Conv"
CONVOLUTIONS = frozenset({"Conv", "ConvTranspose"})
# A segment whose products outnumber its convolutions (a vision transformer: one patch-embedding
# Conv, ~100 MatMuls) is compiled as a segment without convolutions: with every YNNPACK fusion on a
# pooled client. ViT-S/16 at default threads, both orders in one process: 53.7 -> 43.7 and
# 55.1 -> 44.3 ms (YNNPACK's dots alone: 46.9 and 48.4 ms).
PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum", "FusedMatMul", "FusedGemm", "Attention",
                      "MultiHeadAttention", "GroupQueryAttention"})


def compiler_options(device: Any, op_types: Iterable[str]) -> dict[str, Any]:
    """XLA options for compiling a segment of these ops on `device` (see YNN_FUSIONS and
    PRODUCTS); op_types holds each node's op type (repeated per node), and "domain::op" as well
    for oxla's own domains.

    On a CPU with AVX-512, loops are vectorized 512 bits wide (XLA:CPU prefers 256): at one
    thread MobileNetV3-small 2.55 -> 2.35 ms, EfficientNet-B0 13.6 -> 13.1 ms, ResNet-50 65 -> 62
    ms, ShuffleNetV2 4.5 -> 4.3 ms; BERT/ViT/GRU unchanged."""
    if device.platform != "cpu":
        return {}
    options: dict[str, Any] = {"xla_cpu_prefer_vector_width": 512} if has_avx512() else {}
    counts = Counter(op_types)
    if YNN_FUSIONS == "0":
        return {**options, "xla_cpu_experimental_ynn_fusion_type": ""}
    if YNN_FUSIONS == "1" or any(op in KEEP_YNN or op.startswith(KEEP_YNN_PREFIXES) for op in counts):
        return options
    pooled = cores() > 1 and not is_single_thread(device)
    # oxla.native::Gemm* and Conv* nodes are not XLA's products or convolutions (the plain ones'
    # op types are "Gemm" and "Conv"; Depthwise* is no op type XLA's counts know)
    convolutions = sum(counts[op] for op in CONVOLUTIONS) - counts[NATIVE_CONV]
    products = sum(counts[op] for op in PRODUCTS) - counts[NATIVE_GEMM]
    if convolutions and (not pooled or convolutions >= products):
        kinds = CONV_AND_DOTS if WINOGRAD_CONV in counts and pooled else CONV_ONLY
        return {**options, "xla_cpu_experimental_ynn_fusion_type": kinds}
    if pooled:
        return options
    return {**options, "xla_cpu_experimental_ynn_fusion_type": ""}


def cores() -> int:
    """How many cores this process may run on (XLA:CPU's intra-op pool spreads over them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
