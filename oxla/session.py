"""onnxruntime-style InferenceSession over oxla.compile: swap one for the other."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from onnx import ModelProto, TypeProto, ValueInfoProto

from oxla import ort
from oxla.compile import CompiledModel
from oxla.cpu_client import cores, single_thread_device
from oxla.dtypes import to_numpy_dtype, type_name
from oxla.errors import InputError, OxlaError
from oxla.executor import DEFAULT_CACHE_SIZE
from oxla.load import load_model
from oxla.lowering.context import Options
from oxla.lowering.values import to_host
from oxla.plan import SMALL_WEIGHTS
from oxla.training.checkpoint import atomic_write

NATIVE_MATMUL = True  # False: CPU sessions keep XLA's dots (for measuring)

_ORT_TYPE_NAMES = {
    "float32": "float", "float64": "double", "object": "string", "bool": "bool",
}


@dataclass(frozen=True)
class NodeArg:
    """An input or output of the model: name, shape (ints, dim names or None) and type."""

    name: str
    shape: list[int | str | None]
    type: str


def _type_string(tp: TypeProto) -> str:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        name = type_name(tp.tensor_type.elem_type)
        return f"tensor({_ORT_TYPE_NAMES.get(name, name)})"
    if kind == "sequence_type":
        return f"seq({_type_string(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_string(tp.optional_type.elem_type)})"
    if kind == "map_type":
        return f"map({type_name(tp.map_type.key_type)},{_type_string(tp.map_type.value_type)})"
    return "unknown"


def _shape_of(tp: TypeProto) -> list[int | str | None]:
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tp.tensor_type.shape.dim]


def _node_arg(info: ValueInfoProto) -> NodeArg:
    return NodeArg(info.name, _shape_of(info.type), _type_string(info.type))


class InferenceSession:
    """Load, compile and run an ONNX model with the calls of onnxruntime.InferenceSession.

    Args:
        path_or_bytes: a .onnx path, serialized bytes, or a ModelProto.
        sess_options: an `oxla.SessionOptions` (or onnxruntime's): profiling, the optimized
            model path and config entries are honoured; thread counts XLA cannot change warn.
        providers: onnxruntime provider names in order of preference; the first one JAX has a
            device for is used (CUDAExecutionProvider: a GPU), unknown ones warn and are skipped.
        provider_options: per-provider option dicts, kept for `get_provider_options()`.
        bake_weights: compile initializers as constants rather than parameters.
        cache_size: how many compiled segments (one per input signature, more with graph
            breaks) to keep; the least recently used go first.
        memory_limit: the most bytes one value may take; a node whose output would need more
            is refused (ResourceError) before anything allocates it. Default: the machine's memory.
    """

    def __init__(self, path_or_bytes: str | os.PathLike[str] | bytes | ModelProto,
                 sess_options: Any = None, providers: Any = None, provider_options: Any = None,
                 *, bake_weights: bool = False, cache_size: int = DEFAULT_CACHE_SIZE,
                 memory_limit: int | None = None, **_: Any) -> None:
        ort.check_options(sess_options)
        self._options = sess_options if sess_options is not None else ort.SessionOptions()
        self._model = load_model(path_or_bytes)
        self._profile: str | None = None
        self._build_options = (bake_weights, cache_size, memory_limit)
        self._place(providers, provider_options)
        if getattr(self._options, "enable_profiling", False):
            prefix = getattr(self._options, "profile_file_prefix", "") or "oxla_profile"
            self._profile = f"{prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
            jax.profiler.start_trace(self._profile)
        path = getattr(self._options, "optimized_model_filepath", "")
        if path:
            self._write_optimized(path)

    def _write_optimized(self, path: str) -> None:
        """onnxruntime writes its optimized graph there; oxla writes its compiled artifact
        (`oxla export`'s format, loaded by oxla.load_exported), or, for a model with a graph
        break, the model after oxla's graph passes, with a warning."""
        from oxla.export import ExportError, export_model

        try:
            data = export_model(self._model).data
        except ExportError as e:
            warnings.warn(f"oxla: optimized_model_filepath gets the planned ONNX model, not a "
                          f"compiled artifact: {e}", stacklevel=3)
            data = self._compiled.model.SerializeToString()
        atomic_write(path, data)

    def _place(self, providers: Any, provider_options: Any) -> None:
        """Compile for the device the providers ask for."""
        if providers:
            device, name = ort.choose_device(providers)
        else:
            device = jax.devices()[0]
            name = ort.provider_for(device)
        self._providers = [name] if name == ort.CPU else [name, ort.CPU]
        given = list(provider_options or [])
        self._provider_options = {p: dict(given[i]) if i < len(given) else {}
                                  for i, p in enumerate(self._providers)}
        threads = int(getattr(self._options, "intra_op_num_threads", 0) or 0)
        if device.platform == "cpu" and threads == 1:
            device = single_thread_device() or device  # a CPU client whose pool has one thread
        self._device = None if device == jax.devices()[0] else device
        bake_weights, cache_size, memory_limit = self._build_options
        # on one core (native_convs) the kernels run on the calling thread: the depthwise
        # convolutions (on AVX-512) and the convolutions beside no depthwise one left to XLA
        usable = (threads if threads > 0 else cores()) if device.platform == "cpu" else 0
        native = usable if usable > 1 else 0
        # the GRU/LSTM loops also run on one core (for batches: rnn.py's _native_loop), and so do
        # MatMuls by constant matrices on the GEMM kernel (matmuls_to_native)
        options = Options(bake_weights=bake_weights, layout_weights=True, memory_limit=memory_limit,
                          constant_weights=SMALL_WEIGHTS if device.platform == "cpu" else 0,
                          native_threads=native, native_recurrent=usable,
                          native_matmul=NATIVE_MATMUL and usable > 0,
                          native_stems=usable > 0, native_convs=usable == 1,
                          native_nms=usable > 0)
        with self._on_device():
            model = ModelProto()
            model.CopyFrom(self._model)
            self._compiled = CompiledModel(model, options, copy=False, cache_size=cache_size)
        graph = self._compiled.model.graph
        inputs = {i.name: i for i in graph.input}
        self._inputs = [inputs[name] for name in self._compiled.input_names]
        self._overridable = [i for i in graph.input if i.name in self._compiled.plan.overridable]
        self._outputs = list(graph.output)
        self._output_index = {name: i for i, name in enumerate(self._compiled.output_names)}
        self._fast = tuple(_fast_check(i) for i in self._inputs)
        # every input's shape fixed: a numpy feed matches on (dtype, shape) alone
        self._static = tuple((name, dtype, tuple(d for _, d in dims)) for name, dtype, rank, dims
                             in self._fast) if all(len(f[3]) == f[2] for f in self._fast) else None
        # (_static, the executor's host runner) once compiled (_run_lean); False: none to be had
        self._runner: Any = None

    def _on_device(self) -> Any:
        return contextlib.nullcontext() if self._device is None else jax.default_device(self._device)

    @property
    def compiled(self) -> CompiledModel:
        return self._compiled

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(i) for i in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(o) for o in self._outputs]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers that are also graph inputs: a feed of that name replaces the value."""
        return [_node_arg(i) for i in self._overridable]

    def get_modelmeta(self) -> ort.ModelMetadata:
        return ort.model_metadata(self._model)

    def get_providers(self) -> list[str]:
        """onnxruntime's names for the device this session runs on (then the CPU fallback)."""
        return list(self._providers)

    def get_provider_options(self) -> dict[str, dict[str, Any]]:
        return {k: dict(v) for k, v in self._provider_options.items()}

    def set_providers(self, providers: Any = None, provider_options: Any = None) -> None:
        """Move the session to the device the providers ask for (recompiles there)."""
        self._place(providers, provider_options)

    def get_session_options(self) -> Any:
        return self._options

    def end_profiling(self) -> str:
        """Stop the profiler trace that `enable_profiling` started; returns the trace folder."""
        if self._profile is None:
            return ""
        jax.profiler.stop_trace()
        path, self._profile = self._profile, None
        return path

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Callable[[Any, Any, str], None], user_data: Any = None,
                  run_options: Any = None) -> None:
        """Run on another thread, then call callback(outputs, user_data, error message)."""
        def work() -> None:
            try:
                outputs = self.run(output_names, input_feed, run_options)
            except Exception as e:  # handed to the callback, as onnxruntime does
                callback(None, user_data, str(e))
                return
            callback(outputs, user_data, "")

        threading.Thread(target=work, daemon=True).start()

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[Any]:
        """Run the model; output_names None (or empty) means every output.

        Raises:
            InputError: an unknown or missing input, or a feed whose dtype or shape does not match
                the model's declaration.
        """
        runner = self._runner
        if runner and run_options is None and type(input_feed) is dict \
                and len(input_feed) == len(runner[0]):
            outs = _run_lean(runner, input_feed)
            if outs is not None:
                return outs if not output_names else [outs[self._index(n)] for n in output_names]
        if self._device is not None:
            with self._on_device():
                return self._run(output_names, input_feed, run_options)
        return self._run(output_names, input_feed, run_options)

    def _run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
             run_options: Any = None) -> list[Any]:
        host = to_host if not getattr(run_options, "device_outputs", False) else _keep
        values = self._fast_feeds(input_feed)
        if values is not None and host is to_host:
            outs = self._compiled.run_fast(values, host=True)
            if outs is not None:
                if self._runner is None and self._static is not None:
                    self._runner = self._lean_runner() or False  # False: not to be asked again
                if not output_names:
                    return [v if type(v) is np.ndarray else np.asarray(v) if isinstance(v, jax.Array)
                            else to_host(v) for v in outs]
                return [to_host(outs[self._index(n)]) for n in output_names]
        # plain feeds that matched their declarations exactly need no second check
        feeds = self._check_feeds(input_feed) if values is None else \
            dict(zip(self._compiled.input_names, values))
        wanted = list(output_names) if output_names else self._compiled.output_names
        for name in wanted:
            self._index(name)
        results = self._compiled(feeds, host=host is to_host)
        return [host(results[n]) for n in wanted]

    def _lean_runner(self) -> tuple[tuple[tuple[str, np.dtype, tuple[int, ...]], ...],
                                    Callable[[Sequence[np.ndarray]], list[Any] | None]] | None:
        """The static feeds' checks and the executor's host runner for them, once compiled."""
        assert self._static is not None
        run = self._compiled.host_runner([(shape, dtype) for _, dtype, shape in self._static])
        return None if run is None else (self._static, run)

    def _index(self, name: str) -> int:
        try:
            return self._output_index[name]
        except (KeyError, TypeError):
            raise InputError(f"unknown output name {name!r}; the model's outputs are "
                             f"{self._compiled.output_names}") from None

    def _fast_feeds(self, feed: Any) -> list[Any] | None:
        """The feeds in input order when each is an array matching its declaration exactly."""
        if not isinstance(feed, dict) or len(feed) != len(self._fast):
            return None
        if self._static is not None:  # the common case in one pass; anything else: the loop below
            arrays: list[Any] = []
            for name, dtype, shape in self._static:
                value = feed.get(name)
                if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
                    break
                arrays.append(value)
            else:
                return arrays
        values = []
        for name, dtype, rank, dims in self._fast:
            value = feed.get(name)
            if not isinstance(value, np.ndarray | jax.Array) or value.dtype != dtype \
                    or value.ndim != rank:
                return None
            shape = value.shape
            for axis, size in dims:
                if shape[axis] != size:
                    return None
            values.append(value)
        return values

    def _check_feeds(self, feed: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(feed, Mapping):
            raise InputError(f"feeds must be a dict of input name -> array, got {type(feed).__name__}; "
                             f"the model's inputs are {[i.name for i in self._inputs]}")
        declared = {i.name: i for i in self._inputs}
        overridable = {i.name: i for i in self._compiled.model.graph.input if i.name not in declared}
        unknown = [n for n in feed if n not in declared and n not in overridable]
        if unknown:
            raise InputError(f"unknown input names {unknown}; the model's inputs are {list(declared)}")
        missing = [n for n in declared if n not in feed and not _optional(declared[n].type)]
        if missing:
            raise InputError(f"missing inputs {missing}; the model's inputs are {list(declared)}")
        out: dict[str, Any] = {}
        for name, value in feed.items():
            info = declared.get(name) or overridable[name]
            out[name] = _check_value(name, value, info.type)
        for name in declared:
            out.setdefault(name, None)
        return out


# A model whose inputs all have fixed shapes, fed numpy arrays of exactly those (the common case
# when serving), runs through one function of the executor's (Executor.host_runner) after a check
# of each feed's type, dtype and shape: no device scope, no cache lookup, no lists in between.
# The small models' calls are mostly such Python: on AMD EPYC (Zen 3), 2 cores, a model of three
# trivial nodes over the VAD's feeds ((1, 512), (1, 1, 64) x 2) took 47 us a call through run_fast
# (onnxruntime 12 us; its executable alone, with the result's numpy view, 25 us) and 36-40 us
# this way; the VAD model 114-117 against 98-101 us. Python between two executable calls runs
# 2-3x slower than in a loop of its own (the executable's code and data evict it from the caches):
# each line on this path counts.
def _run_lean(runner: tuple[tuple[tuple[str, np.dtype, tuple[int, ...]], ...],
                            Callable[[Sequence[np.ndarray]], list[Any] | None]],
              feed: dict[str, Any]) -> list[Any] | None:
    """The outputs for numpy feeds matching the static declarations exactly; None otherwise (or
    when another thread holds the stage), for the general path to run."""
    static, run = runner
    args = []
    for name, dtype, shape in static:
        value = feed.get(name)
        if type(value) is not np.ndarray or value.dtype != dtype or value.shape != shape:
            return None
        args.append(value)
    return run(args)


def _keep(value: Any) -> Any:
    return value


def _fast_check(info: ValueInfoProto) -> tuple[str, Any, int, tuple[tuple[int, int], ...]]:
    """(name, dtype, rank, fixed dims) a plain feed must match; anything else takes the checks."""
    tp = info.type
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape") \
            or not tp.tensor_type.elem_type:
        return (info.name, None, -1, ())  # never matches: the general path checks it
    try:
        dtype = to_numpy_dtype(tp.tensor_type.elem_type)
    except OxlaError:
        return (info.name, None, -1, ())
    dims = _shape_of(tp)
    fixed = tuple((i, d) for i, d in enumerate(dims) if isinstance(d, int) and d > 0)
    return (info.name, dtype, len(dims), fixed)


def _optional(tp: TypeProto) -> bool:
    return tp.WhichOneof("value") == "optional_type"


def _check_value(name: str, value: Any, tp: TypeProto) -> Any:
    kind = tp.WhichOneof("value")
    if kind == "optional_type":
        return None if value is None else _check_value(name, value, tp.optional_type.elem_type)
    if kind == "sequence_type":
        if not isinstance(value, list | tuple):
            raise InputError(f"input '{name}' is a sequence; pass a list of arrays, got {type(value).__name__}")
        return [_check_value(name, v, tp.sequence_type.elem_type) for v in value]
    if kind != "tensor_type":
        return value
    try:
        if isinstance(value, list | tuple) and tp.tensor_type.elem_type:  # cast as onnxruntime does
            value = np.asarray(value, to_numpy_dtype(tp.tensor_type.elem_type))
        # device arrays stay where they are: only their dtype and shape are checked
        arr = value if isinstance(value, np.ndarray | jax.Array) else np.asarray(value)
    except (ValueError, TypeError) as e:  # a ragged nested list, values that are not numbers
        raise InputError(f"input '{name}' is not an array of one shape and type: {e}") from None
    want = to_numpy_dtype(tp.tensor_type.elem_type) if tp.tensor_type.elem_type else None
    if want is not None:
        if want == np.dtype(object) and arr.dtype.kind in "US":
            arr = arr.astype(object)
        if arr.dtype != want:
            raise InputError(f"input '{name}' must have dtype {type_name(tp.tensor_type.elem_type)}, "
                             f"got {arr.dtype}")
    if tp.tensor_type.HasField("shape"):
        dims = _shape_of(tp)
        bad = len(dims) != arr.ndim or any(
            isinstance(d, int) and d > 0 and d != s for d, s in zip(dims, arr.shape))
        if bad:
            shown = tuple(d if d is not None else "?" for d in dims)
            raise InputError(f"input '{name}' must have shape {shown}, got {arr.shape}")
    return arr

