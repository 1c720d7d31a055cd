"""The onnxruntime names user code touches: SessionOptions, RunOptions, providers, model metadata.

They exist so that code written for onnxruntime runs unchanged on oxla. What XLA cannot honour
(thread counts after JAX started, memory-arena switches) is accepted, and a setting that would
change behaviour gets one warning saying what oxla does instead.
"""

from __future__ import annotations

import enum
import warnings
from dataclasses import dataclass, field
from typing import Any

import jax
from onnx import ModelProto

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TPU = "TPUExecutionProvider"  # not an onnxruntime name: how oxla reports a TPU
_PLATFORM_PROVIDER = {"cpu": CPU, "gpu": CUDA, "cuda": CUDA, "rocm": "ROCMExecutionProvider", "tpu": TPU}
_PROVIDER_PLATFORM = {CPU: "cpu", CUDA: "gpu", "ROCMExecutionProvider": "gpu", TPU: "tpu"}


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's levels; XLA always optimizes the whole graph, so each runs the same."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


@dataclass
class SessionOptions:
    """onnxruntime.SessionOptions: the fields user code sets, and session config entries."""

    graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    execution_mode: ExecutionMode = ExecutionMode.ORT_SEQUENTIAL
    log_severity_level: int = 2
    log_verbosity_level: int = 0
    logid: str = ""
    enable_profiling: bool = False
    profile_file_prefix: str = "oxla_profile"
    optimized_model_filepath: str = ""
    enable_cpu_mem_arena: bool = True
    enable_mem_pattern: bool = True
    enable_mem_reuse: bool = True
    use_deterministic_compute: bool = False
    use_per_session_threads: bool = True
    _config: dict[str, str] = field(default_factory=dict, repr=False)

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"SessionOptions has no config entry '{key}'") from None


@dataclass
class RunOptions:
    """onnxruntime.RunOptions; `device_outputs=True` (oxla's) returns outputs as jax Arrays."""

    log_severity_level: int = 2
    log_verbosity_level: int = 0
    logid: str = ""
    terminate: bool = False
    only_execute_path_to_fetches: bool = False
    device_outputs: bool = False
    _config: dict[str, str] = field(default_factory=dict, repr=False)

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        try:
            return self._config[key]
        except KeyError:
            raise RuntimeError(f"RunOptions has no config entry '{key}'") from None


@dataclass(frozen=True)
class ModelMetadata:
    """What onnxruntime's get_modelmeta() returns."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


def model_metadata(model: ModelProto) -> ModelMetadata:
    # onnxruntime reports INT64_MAX when the file sets no model_version
    version = model.model_version if model.HasField("model_version") else 2**63 - 1
    return ModelMetadata(model.producer_name, model.graph.name, model.domain, model.doc_string,
                         model.graph.doc_string, version,
                         {p.key: p.value for p in model.metadata_props})


def get_available_providers() -> list[str]:
    """Provider names for the JAX platforms present (CPU always)."""
    names = [CPU]
    for backend in ("gpu", "tpu"):
        try:
            if jax.devices(backend):
                names.insert(0, _PLATFORM_PROVIDER[jax.devices(backend)[0].platform])
        except RuntimeError:
            pass
    return names


def get_device() -> str:
    """'GPU' when JAX's default device is a GPU, 'TPU' for a TPU, else 'CPU'."""
    platform = jax.devices()[0].platform
    return {"gpu": "GPU", "cuda": "GPU", "rocm": "GPU", "tpu": "TPU"}.get(platform, "CPU")


def provider_for(device: Any) -> str:
    """onnxruntime's provider name for a JAX device."""
    return _PLATFORM_PROVIDER.get(device.platform, CPU)


def provider_name(item: Any) -> str:
    """A providers-list entry ('Name' or ('Name', {options})) as its name."""
    return str(item[0] if isinstance(item, tuple | list) else item)


def choose_device(providers: Any) -> tuple[Any, str]:
    """The JAX device for an onnxruntime providers list, and the provider it stands for.

    The first provider whose platform JAX has wins; unknown or absent ones get onnxruntime's
    warning and are skipped; CPU is the fallback.
    """
    available = get_available_providers()
    for item in providers or []:
        name = provider_name(item)
        if name not in available:
            warnings.warn(f"Specified provider '{name}' is not in available provider names. "
                          f"Available providers: '{', '.join(available)}'", stacklevel=3)
            continue
        platform = _PROVIDER_PLATFORM[name]
        return jax.devices(platform)[0], name
    return jax.devices("cpu")[0], CPU


def check_options(options: SessionOptions | None) -> None:
    """One warning for each setting oxla cannot apply as asked."""
    if options is None:
        return
    if options.intra_op_num_threads not in (0, 1) or options.inter_op_num_threads:
        warnings.warn("oxla: intra_op_num_threads other than 0 (all cores) and 1 (oxla's one-thread "
                      "client), and inter_op_num_threads, cannot change XLA's thread pool once JAX "
                      "has started; pin the process with taskset (or set NPROC before importing "
                      "oxla) to limit threads", stacklevel=3)
