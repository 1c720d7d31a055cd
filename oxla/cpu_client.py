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

import threading
from typing import Any

import jax

ENABLED = True   # False: the executor uses JAX's default device (benchmarks compare the two)

_LOCK = threading.Lock()
_DEVICE: list[Any] = []


def inline_device() -> Any:
    """The CPU device of oxla's synchronous client, made on first use; JAX's own first CPU
    device when that client cannot be made (or ENABLED is False)."""
    if not ENABLED:
        return jax.devices("cpu")[0]
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
