"""Data parallelism: the batch is sharded over local devices, state replicated; XLA's SPMD
partitioner inserts the all-reduce the loss's mean over the batch implies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from oxla.errors import TrainingError

AXIS = "batch"


@dataclass(frozen=True)
class Placement:
    """Where state and feeds live: one device, or a 1-D mesh of `count` devices."""

    count: int
    mesh: Mesh | None

    def replicate(self, value: Any) -> jax.Array:
        if self.mesh is None:
            return jax.device_put(value)
        return jax.device_put(value, NamedSharding(self.mesh, PartitionSpec()))

    def constrain(self, value: Any) -> Any:
        """Inside jit: keep `value` replicated (new state must not stay sharded)."""
        if self.mesh is None:
            return value
        return jax.lax.with_sharding_constraint(value, NamedSharding(self.mesh, PartitionSpec()))

    def feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """Shard every feed with a leading dimension along it; scalars are replicated."""
        if self.mesh is None:
            return {k: jax.device_put(v) for k, v in feeds.items()}
        out = {}
        for name, value in feeds.items():
            if value.ndim == 0:
                out[name] = self.replicate(value)
                continue
            if value.shape[0] % self.count:
                raise TrainingError(
                    f"feed '{name}' has leading dimension {value.shape[0]}, which does not split "
                    f"over {self.count} devices; use a batch size divisible by {self.count}")
            out[name] = jax.device_put(value, NamedSharding(self.mesh, PartitionSpec(AXIS)))
        return out


def placement(devices: int | None) -> Placement:
    """A Placement over the first `devices` local JAX devices (None or 1: no mesh).

    Raises:
        TrainingError: fewer local devices than asked for.
    """
    if devices is None or devices == 1:
        return Placement(1, None)
    if devices < 1:
        raise TrainingError(f"devices must be >= 1, got {devices}")
    local = jax.local_devices()
    if len(local) < devices:
        raise TrainingError(
            f"asked for {devices} devices but JAX sees {len(local)} ({local[0].platform}); on CPU "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={devices} before starting")
    return Placement(devices, Mesh(np.array(local[:devices]), (AXIS,)))
