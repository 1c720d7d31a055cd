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
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
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
#   none on one core (BERT-base 1.09 -> 0.99x onnxruntime without them).
# Timed in one process, the session that runs right after onnxruntime's calls is up to 16%
# slower whatever its options (the cores take two calls to settle): compare in both orders.
# OXLA_YNN_FUSIONS=1 keeps all on everywhere, =0 all off everywhere (for measuring).
YNN_FUSIONS = os.environ.get("OXLA_YNN_FUSIONS", "")
KEEP_YNN = frozenset({"RNN", "GRU", "LSTM", "Scan", "Loop", "ConvInteger", "MatMulInteger"})
KEEP_YNN_PREFIXES = ("QLinear", "DynamicQuantize", "QGemm", "QAttention", "MatMulNBits",
                     "QOrdered")

_LOCK = threading.Lock()
_DEVICE: list[Any] = []


def inline_device() -> Any:
    """The CPU device of oxla's synchronous client, made on first use; JAX's own first CPU
    device when that client cannot be made."""
    if not _DEVICE:
        with _LOCK:
            if not _DEVICE:
                _DEVICE.append(_make())
    return _DEVICE[0]


def _make() -> Any:
    try:
        from jax._src.lib import xla_client

        client: Any = xla_client.make_cpu_client(asynchronous=False)
        return client.local_devices()[0]
    except Exception:  # a jaxlib without the private constructor: JAX's device still works
        return jax.devices("cpu")[0]


CONV_ONLY = "LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"
CONVOLUTIONS = frozenset({"Conv", "ConvTranspose"})


def compiler_options(device: Any, op_types: Iterable[str]) -> dict[str, Any]:
    """XLA options for compiling a segment of these ops on `device` (see YNN_FUSIONS).

    On a CPU with AVX-512, loops are vectorized 512 bits wide (XLA:CPU prefers 256): at one
    thread MobileNetV3-small 2.55 -> 2.35 ms, EfficientNet-B0 13.6 -> 13.1 ms, ResNet-50 65 -> 62
    ms, ShuffleNetV2 4.5 -> 4.3 ms; BERT/ViT/GRU unchanged."""
    if device.platform != "cpu":
        return {}
    options: dict[str, Any] = {"xla_cpu_prefer_vector_width": 512} if has_avx512() else {}
    ops = set(op_types)
    if YNN_FUSIONS == "0":
        return {**options, "xla_cpu_experimental_ynn_fusion_type": ""}
    if YNN_FUSIONS == "1" or any(op in KEEP_YNN or op.startswith(KEEP_YNN_PREFIXES) for op in ops):
        return options
    if ops & CONVOLUTIONS:
        return {**options, "xla_cpu_experimental_ynn_fusion_type": CONV_ONLY}
    if _cores() > 1:
        return options
    return {**options, "xla_cpu_experimental_ynn_fusion_type": ""}


def _cores() -> int:
    """How many cores this process may run on (XLA:CPU's intra-op pool spreads over them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
