"""Model -> pure function (params, inputs) -> outputs; jit-compiled segments cached per signature."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from onnx import ModelProto, NodeProto

from oxla.dtypes import is_float
from oxla.errors import LoweringError, NotStaticError
from oxla.load import ModelSource, load_model
from oxla.lowering import ops as _ops  # noqa: F401  (registers every rule)
from oxla.lowering.context import NeedStatic, Options
from oxla.lowering.interpreter import Interpreter, Scope, initializer_values, node_reads
from oxla.lowering.values import Value, is_static, signature, to_static
from oxla.passes import prepare

jax.config.update("jax_enable_x64", True)  # ONNX float64/int64 are real types

# Integer and bool initializers up to this size are compile-time constants by default: they are
# almost always shapes, axes or indices that rules need static.
SMALL_CONSTANT = 1024
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})


@dataclass
class _Segment:
    """A run of nodes compiled as one XLA computation, ended by a host step (or the graph end)."""

    stop: int | None = None
    inputs: tuple[str, ...] = ()
    statics: dict[str, Value] = field(default_factory=dict)
    compiled: Any = None
    children: dict[Any, _Segment] = field(default_factory=dict)


@dataclass
class RunStats:
    """Counts since the model was compiled: XLA compiles, segments run, host steps."""

    compiles: int = 0
    host_steps: int = 0
    segments: int = 0
    host_nodes: set[str] = field(default_factory=set)


class _Promote(Exception):
    def __init__(self, names: set[str]) -> None:
        super().__init__(sorted(names))
        self.names = names


class CompiledModel:
    """A loaded model, ready to run: `model(feeds)` or the pure `fn(params, inputs)`.

    `fn` is a pure JAX function of (params, inputs) -> {output name: value} that can be jitted,
    differentiated, vmapped or sharded by the caller, as long as the model needs no graph break
    (no data-dependent shapes); calling the model object handles breaks itself.
    """

    def __init__(self, model: ModelProto, options: Options | None = None, *, copy: bool = True) -> None:
        self.options = options or Options()
        if copy:  # the passes rewrite the graph; the caller's proto stays as it was
            owned = ModelProto()
            owned.CopyFrom(model)
            model = owned
        self.model = prepare(model, bake_weights=self.options.bake_weights,
                             layout_weights=self.options.layout_weights)
        graph = self.model.graph
        self.interpreter = Interpreter(self.model, self.options)
        self.nodes: list[NodeProto] = list(graph.node)
        inits = initializer_values(graph)
        self.input_names = [i.name for i in graph.input if i.name not in inits]
        self.output_names = [o.name for o in graph.output]
        self.constants: dict[str, Value] = {}
        self.params: dict[str, jax.Array] = {}
        for name, value in inits.items():
            if self._starts_static(value):
                self.constants[name] = value
            else:
                self.params[name] = jax.device_put(value)
        self._overridable = {i.name for i in graph.input if i.name in inits}
        self._reads = [node_reads(n) for n in self.nodes]
        self._producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self._live: dict[int, frozenset[str]] = {}
        self._live_in_cache: dict[int, tuple[str, ...]] = {}
        self._roots: dict[Any, _Segment] = {}
        self._fast: dict[Any, _Segment] = {}
        self._lock = threading.Lock()
        self.stats = RunStats()

    def _starts_static(self, value: np.ndarray) -> bool:
        if self.options.bake_weights or value.dtype == object:
            return True
        return not is_float(value.dtype) and value.dtype.kind != "c" and value.size <= SMALL_CONSTANT

    # --- the pure function --------------------------------------------------------------------

    def fn(self, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Value]:
        """Run the whole graph in the caller's JAX context (no graph breaks allowed)."""
        scope = Scope()
        scope.values.update(self.constants)
        scope.values.update(params)
        scope.values.update(inputs)
        try:
            self.interpreter.run_nodes(self.nodes, scope, self.interpreter.opsets)
        except NeedStatic as e:
            raise NotStaticError(
                f"{e}: the value is computed from data, so this model cannot run as one pure "
                "function; call the CompiledModel (or InferenceSession.run), which splits the "
                "graph at such nodes"
            ) from None
        return {name: scope.get(name) for name in self.output_names}

    # --- running with graph breaks ------------------------------------------------------------

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Value]:
        """Run the model on concrete inputs; compiles (and caches) what this signature needs."""
        key = _fast_key(inputs)
        seg = self._fast.get(key) if key is not None else None
        if seg is not None:  # the whole graph is one compiled segment for this signature
            self.stats.segments += 1
            env = dict(seg.statics)
            if seg.compiled is not None:
                env.update(seg.compiled(self.params, {n: inputs[n] for n in seg.inputs}))
            return {n: env[n] if n in env else self._lookup(inputs, n) for n in self.output_names}
        with self._lock:
            while True:
                try:
                    return self._execute(inputs, key)
                except _Promote as p:
                    for name in p.names:
                        self.constants[name] = np.asarray(self.params.pop(name))
                    self._roots.clear()
                    self._fast.clear()

    def _execute(self, inputs: Mapping[str, Any], fast_key: Any = None) -> dict[str, Value]:
        env: dict[str, Value] = {}  # feeds, segment outputs and host-step outputs (no params)
        keyed: list[Any] = []
        for name, value in inputs.items():
            if name in self._overridable or _host_only(value):  # keyed by value: rare
                env[name] = to_static(value)
                keyed.append((name, _value_key(value)))
            else:
                env[name] = _to_device(value)
        pos = 0
        children = self._roots
        while True:
            traced = tuple(n for n in self._live_in(pos) if n in env and not is_static(env[n]))
            key = (pos, tuple(signature(env[n]) for n in traced), tuple(keyed))
            seg = children.get(key)
            if seg is None:
                seg = self._build(pos, env, traced)
                children[key] = seg
            if seg.compiled is not None:
                self.stats.segments += 1
                env.update(seg.compiled(self.params, {n: env[n] for n in traced}))
            env.update(seg.statics)
            if seg.stop is None:
                if pos == 0 and fast_key is not None and not keyed:
                    self._fast[fast_key] = seg
                return {name: self._lookup(env, name) for name in self.output_names}
            keyed.extend(self._host_step(seg.stop, env))
            pos = seg.stop + 1
            children = seg.children

    def _lookup(self, env: Mapping[str, Value], name: str) -> Value:
        if name in env:
            return env[name]
        return self.params[name] if name in self.params else self.constants[name]

    def _live_from(self, pos: int) -> frozenset[str]:
        """Names read by nodes at index >= pos, plus the graph outputs."""
        live = self._live.get(pos)
        if live is None:
            acc: set[str] = set(self.output_names)
            for reads in self._reads[pos:]:
                acc |= reads
            live = self._live[pos] = frozenset(acc)
        return live

    def _live_in(self, pos: int) -> tuple[str, ...]:
        """Values live at `pos` that come from before it: graph inputs and earlier nodes' outputs."""
        cached = self._live_in_cache.get(pos)
        if cached is None:
            cached = tuple(sorted(n for n in self._live_from(pos)
                                  if n not in self.params and n not in self.constants
                                  and self._producer.get(n, -1) < pos))
            self._live_in_cache[pos] = cached
        return cached

    def _build(self, pos: int, env: dict[str, Value], traced: tuple[str, ...]) -> _Segment:
        seg = _Segment(inputs=traced)
        env_statics = {n: v for n, v in env.items() if is_static(v)}
        static_env = {**self.constants, **env_statics}
        record: dict[str, Any] = {}

        def segment(params: dict[str, Value], args: dict[str, Value]) -> dict[str, Value]:
            scope = Scope()
            scope.values.update(self.constants)
            scope.values.update(params)
            scope.values.update(env_statics)  # feeds overriding initializers win over them
            scope.values.update(args)
            stop = None
            with self.interpreter.in_graph(self.nodes):
                for i in range(pos, len(self.nodes)):
                    try:
                        self.interpreter.run_node(self.nodes[i], scope, self.interpreter.opsets)
                    except NeedStatic as e:
                        self._maybe_promote(i, e, scope)
                        stop = i
                        break
            live = self._live_from(len(self.nodes) if stop is None else stop)
            outs = {n: scope.values[n] for n in live if n in scope.values and n not in args
                    and n not in params and not is_static(scope.values[n])}
            record["stop"] = stop
            record["statics"] = {n: scope.values[n] for n in live
                                 if n in scope.values and n not in static_env and is_static(scope.values[n])}
            return outs

        specs = {n: _spec(env[n]) for n in traced}
        param_specs = {n: _spec(v) for n, v in self.params.items()}
        lowered = jax.jit(segment).lower(param_specs, specs)
        seg.stop = record["stop"]
        seg.statics = record["statics"]
        out_tree = lowered.out_info
        if isinstance(out_tree, dict) and out_tree:  # a segment with no traced outputs needs no XLA
            seg.compiled = lowered.compile()
            self.stats.compiles += 1
        return seg

    def _maybe_promote(self, index: int, need: NeedStatic, scope: Scope) -> None:
        """A static value that derives from initializers only: make them constants and retrace."""
        names = [need.value_name] if need.value_name and (
            need.value_name in self._producer or need.value_name in self.params) else []
        if not names:
            names = [n for n in self.nodes[index].input if n and n in scope and not is_static(scope.get(n))]
        promote: set[str] = set()
        for name in names:
            found = self._upstream_params(name)
            if found is not None:
                promote |= found
        if promote:
            raise _Promote(promote)

    def _upstream_params(self, name: str) -> set[str] | None:
        """Parameters a value derives from, or None when it also derives from a graph input."""
        found: set[str] = set()
        stack, seen = [name], set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in self.params:
                found.add(n)
            elif n in self._producer:
                node = self.nodes[self._producer[n]]
                if node.op_type not in SHAPE_ONLY_OPS:
                    stack.extend(node_reads(node))
            elif n not in self.constants:
                return None  # a graph input
        return found

    def _host_step(self, index: int, env: dict[str, Value]) -> list[Any]:
        """Run one node on concrete values; returns cache-key entries for host-only outputs."""
        node = self.nodes[index]
        self.stats.host_steps += 1
        self.stats.host_nodes.add(node.name or node.op_type)
        scope = Scope()
        for n in self._reads[index]:
            if n in env or n in self.params or n in self.constants:
                scope.set(n, to_static(self._lookup(env, n)))
        try:
            with self.interpreter.in_graph(self.nodes):
                self.interpreter.run_node(node, scope, self.interpreter.opsets)
        except NeedStatic as e:  # every input is concrete here; a rule asking again is a bug
            raise LoweringError(f"{e} even with concrete inputs") from None
        keyed = []
        for name in node.output:
            if not name:
                continue
            value = scope.get(name)
            if _host_only(value):
                env[name] = value
                keyed.append((name, _value_key(value)))
            else:
                env[name] = _to_device(value)
        return keyed


def _fast_key(inputs: Mapping[str, Any]) -> Any:
    """A signature of plain-array feeds (None when a feed needs the general path)."""
    key: list[tuple[Any, ...]] = []
    for name, value in inputs.items():
        if value is None:
            key.append((name, None))
        elif isinstance(value, np.ndarray | jax.Array) and value.dtype != object:
            key.append((name, value.shape, value.dtype))
        else:
            return None
    return tuple(key)


def _host_only(value: Value) -> bool:
    """Strings and maps live on the host: static, and cache keys hold their values."""
    if isinstance(value, list):
        return any(_host_only(v) for v in value)
    return isinstance(value, dict) or (isinstance(value, np.ndarray) and value.dtype == object)


def _to_device(value: Value) -> Value:
    if value is None:
        return None
    if isinstance(value, list):
        return [_to_device(v) for v in value]
    return jax.device_put(value)


def _spec(value: Value) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_spec(v) for v in value]
    return jax.ShapeDtypeStruct(value.shape, value.dtype)


def _value_key(value: Any) -> Any:
    if isinstance(value, dict):
        return ("map", tuple(sorted((str(k), _value_key(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("seq", tuple(_value_key(v) for v in value))
    arr = np.asarray(value)
    if arr.dtype == object:
        return (arr.shape, tuple(str(v) for v in arr.ravel()))
    return (arr.shape, str(arr.dtype), hashlib.sha1(arr.tobytes()).hexdigest())


def compile(model: ModelSource | ModelProto, *, bake_weights: bool = False) -> CompiledModel:
    """Load (if needed) and prepare a model for running.

    Args:
        model: a path, bytes or ModelProto.
        bake_weights: put initializers into the XLA program as constants instead of passing them
            as parameters (slower compiles, sometimes faster runs).

    Returns:
        A CompiledModel; call it with a dict of inputs, or use `.fn(params, inputs)` with `.params`.
    """
    proto = load_model(model)
    return CompiledModel(proto, Options(bake_weights=bake_weights), copy=False)
