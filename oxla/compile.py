"""Model -> CompiledModel: the plan, the pure function `fn(params, inputs)`, and the executor."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from onnx import ModelProto

from oxla.dtypes import to_numpy_dtype
from oxla.errors import InputError, NotStaticError
from oxla.executor import DEFAULT_CACHE_SIZE, Executor, RunStats, x64
from oxla.load import ModelSource, load_model
from oxla.lowering import ops as _ops  # noqa: F401  (registers every rule)
from oxla.lowering.context import NeedStatic, Options, Scope
from oxla.lowering.interpreter import Interpreter
from oxla.lowering.values import Value
from oxla.lru import CacheInfo
from oxla.plan import Plan, make_plan

# What a caller's JAX makes of 64-bit values when its x64 mode is off.
_NARROWED = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
             np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.complex64)}


class CompiledModel:
    """A loaded model, ready to run: `model(feeds)` or the pure `fn(params, inputs)`.

    `fn` is a pure JAX function of (params, inputs) -> {output name: value} that can be jitted,
    differentiated, vmapped or sharded by the caller, as long as the model needs no graph break
    (no data-dependent shapes); calling the model object handles breaks itself.

    Args:
        model: a loaded ModelProto.
        options: compile options.
        copy: copy the proto first (the passes rewrite it); False hands it over.
        cache_size: how many compiled segments to keep (least recently used go first).
        dynamic: initializers that stay parameters even when small (state a trainer updates).
    """

    def __init__(self, model: ModelProto, options: Options | None = None, *, copy: bool = True,
                 cache_size: int = DEFAULT_CACHE_SIZE, dynamic: frozenset[str] = frozenset()) -> None:
        if copy:  # the passes rewrite the graph; the caller's proto stays as it was
            owned = ModelProto()
            owned.CopyFrom(model)
            model = owned
        self.plan: Plan = make_plan(model, options, dynamic=dynamic)
        self.options = self.plan.options
        self.model = self.plan.model
        self.interpreter = Interpreter(self.plan.dispatch, self.options)
        self.input_names = list(self.plan.input_names)
        self.output_names = list(self.plan.output_names)
        self.constants: Mapping[str, np.ndarray] = self.plan.constants
        with x64():
            params = {n: jax.device_put(v) for n, v in self.plan.parameters.items()}
        self.params: dict[str, jax.Array] = params
        self._executor = Executor(self.plan, self.interpreter, params, cache_size)
        self._declared = {n: _declared_dtype(self.plan.input_types.get(n)) for n in self.input_names}

    # --- the pure function --------------------------------------------------------------------

    def fn(self, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Value]:
        """Run the whole graph as a pure JAX function (no graph breaks allowed).

        It computes in the model's own types whatever the caller's x64 setting: the body runs
        with 64-bit types on. When the caller's x64 mode is off, its JAX has already narrowed
        64-bit arrays to 32 bits on the way in (jit does that to its arguments); such inputs and
        parameters are widened back to their declared type, so results are exact for every value
        the narrowed type holds. Outputs keep their declared (possibly 64-bit) dtypes.

        Raises:
            NotStaticError: the model needs a value computed from data at compile time.
        """
        narrowed = not jax.config.jax_enable_x64
        with x64():
            scope = Scope(None, self.constants)
            for name, value in params.items():
                want = self.plan.parameters.get(name)
                scope.set(name, _widen(value, None if want is None else want.dtype, narrowed))
            for name, value in inputs.items():
                scope.set(name, _widen(value, self._declared.get(name), narrowed))
            try:
                self.interpreter.run_nodes(self.plan.nodes, scope, self.plan.opsets)
            except NeedStatic as e:
                raise NotStaticError(
                    f"{e}: the value is computed from data, so this model cannot run as one pure "
                    "function; call the CompiledModel (or InferenceSession.run), which splits the "
                    "graph at such nodes"
                ) from None
            return {name: scope.get(name) for name in self.output_names}

    # --- running ------------------------------------------------------------------------------

    def __call__(self, inputs: Mapping[str, Any], host: bool = False) -> dict[str, Value]:
        """Run the model on concrete inputs; compiles (and caches) what this signature needs.
        With `host`, outputs may come back as numpy arrays (read-only, as JAX's are).

        Raises:
            InputError: `inputs` is not a dict of input name -> value.
        """
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs must be a dict of input name -> array, got "
                             f"{type(inputs).__name__}; the model's inputs are {self.input_names}")
        return self._executor.run(inputs, host)

    def run_fast(self, values: list[Any], host: bool = False) -> Sequence[Value] | None:
        """Outputs in graph order for array feeds given in `input_names` order, when this
        signature is already compiled as one computation; None otherwise (then call the model).
        With `host`, outputs may come back as numpy arrays (read-only, as JAX's are)."""
        return self._executor.run_fast(values, host)

    def host_runner(self, signature: Sequence[tuple[tuple[int, ...], np.dtype]]
                    ) -> Callable[[Sequence[np.ndarray]], list[Any] | None] | None:
        """A function of numpy feeds of this signature ((shape, dtype) per input, in
        `input_names` order) returning the outputs as `run_fast(host=True)` does, once this
        signature is compiled as one computation (see Executor.host_runner); None otherwise."""
        return self._executor.host_runner(signature)

    @property
    def stats(self) -> RunStats:
        """XLA compiles and host steps so far."""
        return self._executor.stats

    def cache_info(self) -> CacheInfo:
        """The compiled-segment cache: hits, misses, size, bound, evictions."""
        return self._executor.cache_info()

    def set_parameters(self, values: Mapping[str, Any]) -> None:
        """New values for parameters (same shapes and dtypes); compiled code is reused.

        Raises:
            InputError: a value for an initializer compiled in as a constant (`bake_weights`, or
                InferenceSession's model of small weights: plan.SMALL_WEIGHTS).
        """
        baked = sorted(n for n in values if n in self.constants)
        if baked:
            why = "bake_weights" if self.options.bake_weights else (
                f"an InferenceSession's model whose float weights total at most "
                f"{self.options.constant_weights} bytes")
            raise InputError(f"initializers {baked} are compiled into the model as constants "
                             f"({why}), so their values cannot be replaced; compile with "
                             f"oxla.compile(model) to keep them parameters")
        self._executor.set_parameters(values)
        self.params = dict(self._executor.params)


def _declared_dtype(tp: Any) -> np.dtype | None:
    if tp is None or tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.elem_type:
        return None
    return to_numpy_dtype(tp.tensor_type.elem_type)


def _widen(value: Any, want: np.dtype | None, narrowed: bool) -> Any:
    """An input the caller's x64-off JAX narrowed, back in its declared 64-bit type."""
    if narrowed and want is not None and hasattr(value, "dtype") and _NARROWED.get(want) == value.dtype:
        return value.astype(want)
    return value


def compile(model: ModelSource | ModelProto, *, bake_weights: bool = False,
            cache_size: int = DEFAULT_CACHE_SIZE, memory_limit: int | None = None,
            layout_weights: bool = False) -> CompiledModel:
    """Load (if needed) and prepare a model for running.

    Args:
        model: a path, bytes or ModelProto.
        bake_weights: put initializers into the XLA program as constants instead of passing them
            as parameters (slower compiles, sometimes faster runs).
        layout_weights: run the graph passes InferenceSession runs (convolution kernels stored
            HWIO, conv nets channels last, Winograd, sibling convs merged), which rename and
            re-lay some parameters: `.params` then holds those, not the file's initializers.
            Off by default, so that `fn` takes the model's own parameters; a conv net called
            through the returned model is much faster with it on (ResNet-50: 116 against 44 ms
            at default threads).
        cache_size: how many compiled segments to keep per model.
        memory_limit: the most bytes one value may take (default: the machine's memory); a node
            whose output would need more raises ResourceError before anything allocates it.

    Returns:
        A CompiledModel; call it with a dict of inputs, or use `.fn(params, inputs)` with `.params`.
    """
    proto = load_model(model)
    options = Options(bake_weights=bake_weights, memory_limit=memory_limit, layout_weights=layout_weights)
    return CompiledModel(proto, options, copy=False, cache_size=cache_size)
