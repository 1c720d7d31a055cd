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

# XLA:CPU's YNNPACK fusions (on by default in jax 0.12) are off for oxla's float compiles, and on
# where a recurrent loop runs or integer arithmetic is done. Measured at one thread, oxla over
# onnxruntime, fusions on -> off: ResNet-50 1.57 -> 1.23x, BERT-base 1.09 -> 0.99x, ViT-S 1.14 ->
# 1.04x, ShuffleNetV2 1.42 -> 1.23x, the other CNNs equal; but a bi-GRU 1.10 -> 3.14x (the
# per-step matrix-vector product in the scan), and at default threads int8 ResNet-50 (QDQ)
# 3.1 -> 13x (XLA's own integer dot is slow). OXLA_YNN_FUSIONS=1 keeps them on everywhere, =0
# off everywhere (for measuring).
YNN_FUSIONS = os.environ.get("OXLA_YNN_FUSIONS", "")
KEEP_YNN = frozenset({"RNN", "GRU", "LSTM", "Scan", "Loop", "ConvInteger", "MatMulInteger"})
KEEP_YNN_PREFIXES = ("QLinear", "DynamicQuantize", "MatMulInteger", "QGemm", "QAttention",
                     "MatMulNBits", "QOrdered")

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


def compiler_options(device: Any, op_types: Iterable[str]) -> dict[str, Any]:
    """XLA options for compiling a segment of these ops on `device` (see YNN_FUSIONS).

    On a CPU with AVX-512, loops are vectorized 512 bits wide (XLA:CPU prefers 256): at one
    thread MobileNetV3-small 2.55 -> 2.35 ms, EfficientNet-B0 13.6 -> 13.1 ms, ResNet-50 65 -> 62
    ms, ShuffleNetV2 4.5 -> 4.3 ms; BERT/ViT/GRU unchanged."""
    if device.platform != "cpu":
        return {}
    options: dict[str, Any] = {"xla_cpu_prefer_vector_width": 512} if has_avx512() else {}
    if YNN_FUSIONS == "1" or (YNN_FUSIONS != "0" and any(
            op in KEEP_YNN or op.startswith(KEEP_YNN_PREFIXES) for op in op_types)):
        return options
    return {**options, "xla_cpu_experimental_ynn_fusion_type": ""}

