"""Data parallelism: the batch is sharded over devices, state replicated; XLA's SPMD partitioner
inserts the all-reduce the loss's mean over the batch implies. The devices may span processes
(JAX's distributed runtime, `join`): each process then feeds its own rows of every batch."""

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
    processes: int = 1

    @property
    def process(self) -> int:
        """This process's index among `processes` (0 without the distributed runtime)."""
        return jax.process_index() if self.processes > 1 else 0

    def replicate(self, value: Any) -> jax.Array:
        if self.mesh is None:
            return jax.device_put(value)
        sharding = NamedSharding(self.mesh, PartitionSpec())
        if self.processes > 1:  # every process holds the same value; none can place another's
            return jax.make_array_from_process_local_data(sharding, np.asarray(value))
        return jax.device_put(value, sharding)

    def to_host(self, value: Any) -> np.ndarray:
        """A replicated value as numpy (across processes only the local copy is addressable)."""
        if self.processes > 1 and not value.is_fully_addressable:
            return np.asarray(value.addressable_data(0))
        return np.asarray(value)

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
        local = self.count // self.processes
        for name, value in feeds.items():
            if value.ndim == 0:
                out[name] = self.replicate(value)
                continue
            if value.shape[0] % local:
                raise TrainingError(
                    f"feed '{name}' has leading dimension {value.shape[0]}, which does not split "
                    f"over {local} devices; use a batch size divisible by {local}")
            sharding = NamedSharding(self.mesh, PartitionSpec(AXIS))
            if self.processes > 1:  # this process's rows: the global batch is their concatenation
                out[name] = jax.make_array_from_process_local_data(sharding, value)
            else:
                out[name] = jax.device_put(value, sharding)
        return out


def placement(devices: int | None) -> Placement:
    """A Placement over the first `devices` JAX devices (None or 1: no mesh). After `join`, the
    devices of every process (None: all of them), each process feeding its own rows.

    Raises:
        TrainingError: fewer devices than asked for.
    """
    processes = jax.process_count()
    if processes > 1:
        every = jax.devices()
        count = len(every) if devices is None else devices
        if count != len(every):
            raise TrainingError(f"with {processes} processes the mesh spans every device: devices "
                                f"must be {len(every)} (or None), got {devices}")
        return Placement(count, Mesh(np.array(every), (AXIS,)), processes)
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


def join(coordinator: str | None = None, num_processes: int | None = None,
         process_id: int | None = None) -> None:
    """Join JAX's distributed runtime (once per process, before any JAX computation): training
    sessions created afterwards shard each batch over the devices of every process.

    It changes process-wide JAX state, which oxla otherwise never does: only on request. On CPU
    the cross-process collectives are gloo's. Arguments left None are found by
    `jax.distributed.initialize`: the coordinator from JAX_COORDINATOR_ADDRESS, and all three
    from the environment of a Slurm job step or an Open MPI launch. Joining again with the same
    (or no) numbers is a no-op.

    Args:
        coordinator: HOST:PORT of process 0, where it serves the coordinator (any free port).
        num_processes: processes in the run.
        process_id: this process, 0..num_processes-1.

    Raises:
        TrainingError: a process id out of range, a second join with other numbers, or a
            runtime that cannot start.
    """
    if num_processes is not None and process_id is not None and (
            num_processes < 1 or not 0 <= process_id < num_processes):
        raise TrainingError(f"process id {process_id} is out of range for {num_processes} processes")
    if jax.distributed.is_initialized():
        if num_processes in (None, jax.process_count()) and process_id in (None, jax.process_index()):
            return
        raise TrainingError(f"this process already joined as process {jax.process_index()} of "
                            f"{jax.process_count()}; it cannot join again as {process_id} of {num_processes}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)
    except (RuntimeError, ValueError) as e:
        where = coordinator or "the coordinator the environment names"
        raise TrainingError(f"cannot join the distributed runtime at {where}: {e}") from None
