"""The executor: runs a plan. Owns the compile cache, its locks, resident parameters and x64.

A call binds the feeds, then walks the graph in segments: each segment is one XLA executable,
compiled once per signature (shapes and dtypes of what flows in, plus only the values a rule
declared static) and cached in a bounded LRU; a node that needs a value only known at run time
ends the segment and runs on the host, and the next segment starts after it. Strings and maps
never enter a trace: a node that reads one runs on the host, so their values are never compiled
in. Every JAX call happens inside a 64-bit scope: oxla never changes a global JAX setting.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax import lax

from oxla.cpu_client import (
    compiler_options,
    inline_device,
    is_single_thread,
    prefers_one_thread,
    single_thread_device,
)
from oxla.dtypes import to_numpy_dtype
from oxla.errors import InputError, LoweringError, OxlaError, ResourceError, ShapeError
from oxla.graph import canonical_domain
from oxla.lowering.context import NeedStatic, Scope
from oxla.lowering.interpreter import Interpreter
from oxla.lowering.values import Value, is_static, to_host, to_static
from oxla.lru import LRU, CacheInfo
from oxla.native import CONV_TARGET, DEPTHWISE_TARGET, GEMM_TARGET
from oxla.params import ParamLayout
from oxla.passes.nms_split import DOMAIN as NMS_DOMAIN
from oxla.passes.nms_split import TAKE_ROWS, take_rows
from oxla.plan import Plan

DEFAULT_CACHE_SIZE = 64   # compiled segments kept per model
_UIDS = itertools.count(1)
_WIDE = frozenset(np.dtype(t) for t in (np.int64, np.uint64, np.float64, np.complex128))


def x64() -> Any:
    """The scope oxla runs JAX in: 64-bit types on for this thread only (ONNX has int64/float64)."""
    return jax.enable_x64(True)


class HostValue:
    """Stands for a string or map value inside a trace: nodes reading it run on the host."""


HOST = HostValue()


@dataclass(frozen=True)
class RunStats:
    """Counts since the model was compiled: XLA compiles, host steps and the nodes they ran."""

    compiles: int = 0
    host_steps: int = 0
    host_nodes: frozenset[str] = frozenset()


@dataclass(eq=False)
class Segment:
    """A run of nodes compiled as one XLA computation, ended by a host step (or the graph end)."""

    pos: int
    stop: int | None                     # the node that runs on the host next (None: graph end)
    inputs: tuple[str, ...]              # traced values it takes, in argument order
    in_tree: Any                         # their structure (sequences are lists)
    outputs: tuple[str, ...]             # traced values it returns, in order
    statics: dict[str, Value]            # values it computed while tracing (live after it)
    call: Callable[..., Any] | None      # the executable: (*parameter leaves, *input leaves)
    uid: int = 0                         # identifies it in the keys of the segments after it
    checks: tuple[str, ...] = ()         # messages of its run-time checks (a code output follows)
    # The fast path's view: feed positions of `inputs` (None: in order), how to assemble the graph
    # outputs ("out", i) | ("in", i) | ("value", v) (None: the outputs are the graph's, in order),
    # and whether an argument is 64-bit (the call then needs the 64-bit scope).
    order: tuple[int, ...] | None = None
    fast: tuple[tuple[str, Any], ...] | None = None
    wide: bool = True
    packed: Packed | None = None         # the staged form of `call` (see Packed), when it has one
    # graph outputs the graph's trailing oxla.nms::TakeRows nodes cut from this (last) segment's
    # results: (output, padded rows, hint), applied on the host after the call (see `_trims`)
    trims: tuple[tuple[str, str, str], ...] = ()
    # the fast path's host steps after this (first) segment, when the rest of the graph is such
    # steps alone (a classifier's ZipMap): node indices, run in order after the call (`_run_tail`)
    tail: tuple[int, ...] = ()


# The first segment of a call takes its feeds in one staging buffer (Packed) when they are arrays
# of bool, integer or float types of at most PACK_MAX_BYTES together, on a CPU; a whole-graph
# segment also gives its results back in one buffer when there are several, of such types, of at
# most PACK_MAX_BYTES together. Measured on oxla's one-thread client (an executable with the VAD
# model's feeds and results, (1, 512), (1, 1, 64) x 2 in and (1,), (1, 1, 64) x 2 out, both
# orders in rotation): JAX takes a numpy feed for 3.5-6 us unless it is 64-byte aligned, and turns
# each result into numpy for 5-7 us; three of each cost 64 us a call where one aligned buffer each
# way cost 43 us (the copies into the buffer and the views of the result included). Returning the
# results one by one as well (for callers that want JAX arrays) cost the buffer's path ~2 us a
# result and, in the VAD model, the whole gain (1.010x and 1.015x the unstaged time); compiling a
# second executable without the buffers doubled the VAD model's first call (0.45 -> 0.85 s). So
# JAX arrays come from the result buffer through a small executable of slices, compiled when first
# asked for (device_outputs, CompiledModel's own calls).
PACK_MAX_BYTES = 32 << 10
_PACK_ALIGN = 64
_PACKABLE = frozenset("biuf")  # numpy dtype kinds a byte buffer carries (bool, ints, floats)
Layout = tuple[tuple[int, int, np.dtype, tuple[int, ...]], ...]  # (offset, bytes, dtype, shape)s


@dataclass(eq=False)
class Packed:
    """A segment's executable that takes its inputs in one uint8 buffer (each at a 64-byte aligned
    offset: JAX takes an aligned numpy array without copying it), slices and bitcasts them out, and
    returns its results, or (`results` set) all of them in one uint8 buffer. Calling it is calling
    the segment (inputs staged into a new buffer, JAX arrays back); `host` gives the results as
    numpy views of the one buffer, staged through a buffer kept for one caller at a time."""

    call: Callable[..., Any]           # (*parameter leaves, stage)
    inputs: Layout                     # where each input is in the stage
    results: Layout | None             # where each result is in the result buffer
    sharding: Any                      # where the results are (for the slicing executable)
    size: int = field(init=False)      # the stage's bytes
    stage: np.ndarray = field(init=False)
    views: tuple[np.ndarray, ...] = field(init=False)  # each input's view into `stage`
    lock: threading.Lock = field(default_factory=threading.Lock)
    # when every result has one dtype: it, and each result's (start, stop, shape) in its elements
    same: tuple[np.dtype, tuple[tuple[int, int, tuple[int, ...]], ...]] | None = None
    _split: Callable[..., Any] | None = None    # result buffer -> JAX arrays, made on first use

    def __post_init__(self) -> None:
        self.size = _layout_bytes(self.inputs)
        self.stage = _buffer(self.size)
        self.views = tuple(_view(self.stage, entry) for entry in self.inputs)
        dtypes = {dtype for _, _, dtype, _ in self.results or ()}
        if self.results and len(dtypes) == 1:
            dtype = dtypes.pop()
            self.same = (dtype, tuple((at // dtype.itemsize, (at + size) // dtype.itemsize, shape)
                                      for at, size, _, shape in self.results))

    def __call__(self, *args: Any) -> Any:
        n = len(args) - len(self.inputs)
        stage = _staged(self.inputs, self.size, args[n:])
        outs = self.call(*args[:n], stage)
        return outs if self.results is None else self._splitter()(outs)

    def host(self, leaves: Sequence[Any], args: Sequence[Any]) -> list[np.ndarray]:
        """The results as numpy arrays (read-only views of one result buffer; `results` set)."""
        assert self.results is not None
        if self.lock.acquire(blocking=False):
            try:
                for view, value in zip(self.views, args, strict=True):
                    view[...] = value
                data = np.asarray(self.call(*leaves, self.stage))  # done: the stage is free again
            finally:
                self.lock.release()
        else:  # another thread stages through `stage`: a buffer of this call's own
            data = np.asarray(self.call(*leaves, _staged(self.inputs, self.size, args)))
        if self.same is not None:
            flat = data.view(self.same[0])
            return [flat[start:stop].reshape(shape) for start, stop, shape in self.same[1]]
        return [_view(data, entry) for entry in self.results]

    def _splitter(self) -> Callable[..., Any]:
        if self._split is None:
            results = self.results
            assert results is not None
            spec = jax.ShapeDtypeStruct((_layout_bytes(results),), np.uint8, sharding=self.sharding)
            with x64():
                self._split = _entry(jax.jit(lambda raw: tuple(_unpack(raw, entry) for entry in results))
                                     .lower(spec).compile())
        return self._split


@dataclass(eq=False)
class _Slot:
    lock: threading.Lock = field(default_factory=threading.Lock)
    segment: Segment | None = None


@dataclass
class _Env:
    """The values of one call: traced (arrays), static (known while tracing), host (strings, maps)."""

    traced: dict[str, Value]
    static: dict[str, Value]
    host: dict[str, Value]
    overrides: frozenset[str] = frozenset()   # feeds that replace initializers
    origin: Any = None                        # the static feeds' values, as a cache key part

    def concrete(self, name: str) -> Value:
        for table in (self.traced, self.static, self.host):
            if name in table:
                return table[name]
        raise KeyError(name)


class Executor:
    """Runs one plan: `run(feeds)`; `run_fast(values)` for plain array feeds in input order."""

    def __init__(self, plan: Plan, interpreter: Interpreter, params: Mapping[str, Any],
                 cache_size: int = DEFAULT_CACHE_SIZE, device: Any = None) -> None:
        self.plan = plan
        self.interpreter = interpreter
        self.params = dict(params)
        self.layout = ParamLayout(plan.parameters)
        self.device = device if device is not None else _runtime_device()
        self._sharding = jax.sharding.SingleDeviceSharding(self.device)
        with x64():
            self._leaves = self.layout.leaves(self.params, self.device)
        # on oxla's pooled CPU client, the first segment built decides whether the model moves to
        # the one-thread client (oxla.cpu_client.prefers_one_thread); later builds wait for that
        self._undecided = self.device.platform == "cpu" and self.device == inline_device()
        self._decide_lock = threading.Lock()
        self._cache: LRU[_Slot] = LRU(cache_size)
        self._stageable = _declared_results_fit(plan)
        self._live_in: dict[int, tuple[str, ...]] = {}
        self._host_calls: dict[int, _HostCall] = {}  # node index -> its prepared host step
        self._stats_lock = threading.Lock()
        self._compiles = 0
        self._host_steps = 0
        self._host_nodes: set[str] = set()
        self._runner_calls = itertools.count()  # calls through host_runner's functions (cache hits)
        self._runner_reads = 0                  # of that count by cache_info (each read takes one)

    # --- what it holds ------------------------------------------------------------------------

    @property
    def stats(self) -> RunStats:
        with self._stats_lock:
            return RunStats(self._compiles, self._host_steps, frozenset(self._host_nodes))

    def cache_info(self) -> CacheInfo:
        """Hits, misses, size, bound and evictions of the compiled-segment cache."""
        info = self._cache.info()
        with self._stats_lock:
            calls = next(self._runner_calls) - self._runner_reads
            self._runner_reads += 1
        return dataclasses.replace(info, hits=info.hits + calls)

    def set_parameters(self, values: Mapping[str, Any]) -> None:
        """Replace parameter values (same shapes and dtypes): no recompilation."""
        params = {**self.params, **{n: v for n, v in values.items() if n in self.params}}
        with x64():
            leaves = self.layout.leaves(params, self.device)
        self.params, self._leaves = params, leaves

    # --- the fast path ------------------------------------------------------------------------

    def run_fast(self, values: Sequence[Any], host: bool = False) -> Sequence[Value] | None:
        """Outputs in graph order for array feeds in input order, or None when not compiled yet.
        With `host`, outputs may come back as numpy arrays (read-only, as JAX's are)."""
        slot = self._cache.get(tuple([(v.shape, v.dtype) for v in values]), count_miss=False)
        seg = None if slot is None else slot.segment
        if seg is None or seg.call is None:
            return None
        args = values if seg.order is None else [values[i] for i in seg.order]
        packed = seg.packed if host and seg.packed is not None and seg.packed.results else None
        try:
            if seg.wide:
                with x64():
                    outs = packed.host(self._leaves, args) if packed is not None \
                        else seg.call(*self._leaves, *args)
            else:  # no 64-bit argument: the executable needs no 64-bit scope to take them
                outs = packed.host(self._leaves, args) if packed is not None \
                    else seg.call(*self._leaves, *args)
        except jax.errors.JaxRuntimeError as e:
            raise _runtime_error(e) from None
        if seg.tail:
            return self._run_tail(seg, values, outs)
        if seg.checks:
            outs = _checked(seg, outs)
        if seg.fast is None:
            return outs
        return [outs[x] if kind == "out" else values[x] if kind == "in"
                else self._taken(outs[x[0]], outs[x[1]], host) if kind == "trim" else x
                for kind, x in seg.fast]

    def _taken(self, rows: Any, hint: Any, host: bool) -> Any:
        taken = take_rows(rows, hint)
        return taken if host else jax.device_put(taken, self._sharding)

    def host_runner(self, signature: Sequence[tuple[tuple[int, ...], np.dtype]]
                    ) -> Callable[[Sequence[np.ndarray]], list[Any] | None] | None:
        """For numpy feeds of this signature ((shape, dtype) per input, in input order), once
        `run` has compiled the whole graph for them as one segment without run-time checks: a
        function of such feeds (in input order, not checked again) that runs that segment and
        returns the outputs in graph order as `run_fast(host=True)` does (numpy arrays; a graph
        output that is a graph input is the caller's array), or None while another thread stages
        its feeds (then call `run_fast`). None when there is no such segment. It saves the cache's
        lookup and lock, the segment's fields read per call and the lists in between: see
        InferenceSession.run. It repeats `run_fast`'s and `Packed.host`'s steps on purpose, their
        choices made once here (where each output comes from, the stage written in place):
        written as a call of run_fast's body after the lookup, with Packed.host staging, the
        trivial model of InferenceSession.run's note took 42.7 against 38.1 us a call and the VAD
        93.6 against 88.7 us (one process, interleaved)."""
        slot = self._cache.get(tuple(signature), count_miss=False)
        seg = None if slot is None else slot.segment
        if seg is None or seg.call is None or seg.checks or seg.trims or seg.tail:  # run_fast's
            return None
        n_out, n_in = len(seg.outputs), len(signature)
        fast = seg.fast or tuple(("out", i) for i in range(n_out))
        # each graph output's place in [*results, *feeds, *values]
        values = tuple(_read_only(to_host(x)) for kind, x in fast if kind == "value")
        picks, k = [], 0
        for kind, x in fast:
            picks.append(x if kind == "out" else n_out + x if kind == "in" else n_out + n_in + k)
            k += kind == "value"
        order = tuple(seg.order or range(n_in))
        packed, wide, count = seg.packed, seg.wide, self._runner_calls
        asarray, ndarray, array_type = np.asarray, np.ndarray, jax.Array

        def host(value: Any) -> Any:
            return value if type(value) is ndarray else asarray(value) \
                if isinstance(value, array_type) else to_host(value)

        if packed is None:
            call = seg.call

            def run(args: Sequence[np.ndarray]) -> list[Any] | None:
                next(count)
                try:
                    if wide:
                        with x64():
                            outs = call(*self._leaves, *[args[i] for i in order])
                    else:
                        outs = call(*self._leaves, *[args[i] for i in order])
                except jax.errors.JaxRuntimeError as e:
                    raise _runtime_error(e) from None
                pool = [*map(host, outs), *args, *values]
                return [pool[i] for i in picks]
            return run

        call, stage, lock = packed.call, packed.stage, packed.lock
        feeds = tuple(zip(packed.views, order, strict=True))
        results, same = packed.results, packed.same

        def run_packed(args: Sequence[np.ndarray]) -> list[Any] | None:
            if not lock.acquire(blocking=False):
                return None
            next(count)
            try:
                for view, i in feeds:
                    view[...] = args[i]
                if wide:
                    with x64():
                        outs = call(*self._leaves, stage)
                else:
                    outs = call(*self._leaves, stage)
                if results is None:  # on the host: done, the stage is free again
                    pool = [*map(host, outs), *args, *values]
                    return [pool[i] for i in picks]
                data = asarray(outs)
            except jax.errors.JaxRuntimeError as e:
                raise _runtime_error(e) from None
            finally:
                lock.release()
            if same is not None:
                flat = data.view(same[0])
                pool = [flat[start:stop].reshape(shape) for start, stop, shape in same[1]]
            else:
                pool = [_view(data, entry) for entry in results]
            pool += args
            pool += values
            return [pool[i] for i in picks]
        return run_packed

    # --- the general path ---------------------------------------------------------------------

    def run(self, feeds: Mapping[str, Value], host: bool = False) -> dict[str, Value]:
        """Run on concrete feeds; compiles (and caches) what this signature needs. With `host`,
        outputs may come back as numpy arrays (read-only, as JAX's are)."""
        with x64():
            env = self._bind(feeds)
            plain = not env.host  # no string or map feeds
            pos, prev, first = 0, env.origin, None
            steps: list[int] = []  # the host steps this call ran, in order
            tail = True  # every segment after the first was empty (its nodes all host steps)
            while True:
                if env.host and pos < len(self.plan.nodes) \
                        and not self.plan.reads[pos].isdisjoint(env.host):
                    # a node reading a host value (a string, a map): a segment starting there
                    # would stop at once, empty (see _trace); no lookup for it
                    self._host_step(pos, env)
                    steps.append(pos)
                    pos += 1
                    continue
                seg = self._segment(pos, env, prev)
                if first is None:
                    first = seg
                elif seg.call is not None or seg.statics or seg.outputs or seg.checks:
                    tail = False
                if seg.call is not None:
                    args = jax.tree.leaves([env.traced[n] for n in seg.inputs])
                    try:
                        if host and seg.packed is not None and seg.packed.results:
                            outs = seg.packed.host(self._leaves, args)
                        else:
                            outs = seg.call(*self._leaves, *args)
                    except jax.errors.JaxRuntimeError as e:
                        raise _runtime_error(e) from None
                    env.traced.update(zip(seg.outputs, _checked(seg, outs) if seg.checks else outs))
                env.static.update(seg.statics)
                if seg.stop is None:
                    break
                self._host_step(seg.stop, env)
                steps.append(seg.stop)
                pos, prev = seg.stop + 1, seg.uid
            for name, rows, hint in seg.trims:
                env.traced[name] = self._taken(env.traced[rows], env.traced[hint], host)
            if seg is first and env.origin is None and not env.host:
                self._register_fast(feeds, seg)
            elif plain and tail and env.origin is None and first.stop is not None \
                    and not first.trims and not seg.trims \
                    and steps == list(range(first.stop, len(self.plan.nodes))):
                self._register_fast(feeds, first, tuple(steps))
            return {n: self._lookup(env, n) for n in self.plan.output_names}

    def _run_tail(self, seg: Segment, values: Sequence[Any], outs: Sequence[Any]) -> list[Value]:
        """The graph's outputs from the first segment's results `outs` for feeds `values` (in input
        order) and the host steps of `seg.tail`, as `run` computes them; no segment lookups.
        skl_scaler_logreg (its ZipMap after a compiled segment), one process, interleaved: 83 -> 56
        us a call (onnxruntime 8 us)."""
        env = _Env(dict(zip(self.plan.input_names, values)), dict(seg.statics), {})
        env.traced.update(zip(seg.outputs, _checked(seg, outs) if seg.checks else outs))
        with x64():
            for index in seg.tail:
                self._host_step(index, env)
        return [self._lookup(env, n) for n in self.plan.output_names]

    def _bind(self, feeds: Mapping[str, Value]) -> _Env:
        env = _Env({}, {}, {})
        for name, value in feeds.items():
            if _host_only(value):
                env.host[name] = value
            elif name in self.plan.required_static:  # an override of a constant a rule needs
                env.static[name] = to_static(value)
            else:
                env.traced[name] = value
        env.overrides = frozenset(n for n in feeds if n in self.plan.overridable)
        if env.static:  # compiled in by value: only what a rule declared static
            env.origin = tuple(sorted((n, _value_key(v)) for n, v in env.static.items()))
        return env

    def _lookup(self, env: _Env, name: str) -> Value:
        for table in (env.traced, env.static, env.host, self.params, self.plan.constants):
            if name in table:
                return table[name]
        raise LoweringError(f"graph output '{name}' is never computed")

    def _live(self, pos: int, env: _Env) -> tuple[str, ...]:
        names = self._live_in.get(pos)
        if names is None:
            names = self._live_in[pos] = self.plan.live_in(pos)
        if env.overrides:  # a feed overriding an initializer replaces it while it is still read
            names = tuple(sorted({*names, *[n for n in env.overrides
                                            if self.plan.last_use.get(n, -1) >= pos]}))
        return names

    def _segment(self, pos: int, env: _Env, prev: Any) -> Segment:
        """The segment starting at `pos`. Its key: the signatures of the traced values flowing in,
        which values are host values, and `prev` (the segment before it, or the static feeds):
        static values come only from static feeds and earlier segments, so `prev` determines
        them without hashing them on every call."""
        live = self._live(pos, env)
        traced = tuple(n for n in live if n in env.traced)
        host = tuple(n for n in live if n in env.host)
        key = (pos, prev, tuple([_signature(env.traced[n]) for n in traced]), host)
        slot = self._cache.get(key) or self._cache.setdefault(key, _Slot())
        if slot.segment is None:
            with slot.lock:  # one compile per signature; other signatures go on meanwhile
                if slot.segment is None:
                    slot.segment = self._build(pos, env, traced, host)
        return slot.segment

    def _register_fast(self, feeds: Mapping[str, Value], seg: Segment, tail: tuple[int, ...] = ()) -> None:
        """The fast path's entry for these feeds' signature: `seg` (the first segment) alone, or
        followed by the host steps `tail` (see Segment.tail)."""
        names = self.plan.input_names
        if set(feeds) != set(names) or not all(_plain(feeds[n]) for n in names) or seg.call is None:
            return
        order = tuple(names.index(n) for n in seg.inputs)
        fast: list[tuple[str, Any]] = []
        trimmed = {name: (seg.outputs.index(rows), seg.outputs.index(hint))
                   for name, rows, hint in seg.trims}
        for name in self.plan.output_names:
            if name in seg.outputs:
                fast.append(("out", seg.outputs.index(name)))
            elif name in trimmed:
                fast.append(("trim", trimmed[name]))
            elif name in names:
                fast.append(("in", names.index(name)))
            else:
                fast.append(("value", seg.statics.get(name, self.params.get(name, self.plan.constants.get(name)))))
        direct = fast == [("out", i) for i in range(len(seg.outputs))]
        # a computation with host callbacks (random seeds) has no C++ entry; its callbacks need
        # the 64-bit scope at run time, as do 64-bit arguments
        call = seg.call if seg.packed is None else seg.packed.call
        wide = isinstance(call, jax.stages.Compiled) or any(
            np.dtype(a.dtype) in _WIDE for a in (*self._leaves, *feeds.values()))
        entry = Segment(seg.pos, None, seg.inputs, seg.in_tree, seg.outputs, seg.statics, seg.call,
                        seg.uid, seg.checks, None if order == tuple(range(len(names))) else order,
                        None if direct or tail else tuple(fast), wide, seg.packed, seg.trims, tail)
        slot = self._cache.setdefault(tuple([(feeds[n].shape, feeds[n].dtype) for n in names]), _Slot())
        slot.segment = entry

    # --- building a segment -------------------------------------------------------------------

    def _build(self, pos: int, env: _Env, traced: tuple[str, ...], host: tuple[str, ...]) -> Segment:
        if self._undecided:
            with self._decide_lock:
                if self._undecided:
                    seg = self._build_on(pos, env, traced, host, decide=True)
                    self._undecided = seg.call is None  # decided by the first one XLA compiles
                    return seg
        return self._build_on(pos, env, traced, host, decide=False)

    def _move(self, device: Any) -> None:
        """Compile and run on `device` from now on (before any segment has been compiled)."""
        with x64():
            self._leaves = self.layout.leaves(self.params, device)
        self.device, self._sharding = device, jax.sharding.SingleDeviceSharding(device)

    def _build_on(self, pos: int, env: _Env, traced: tuple[str, ...], host: tuple[str, ...],
                  decide: bool) -> Segment:
        plan, layout = self.plan, self.layout
        values = [env.traced[n] for n in traced]
        leaves, in_tree = jax.tree.flatten(values)
        n_params = len(self._leaves)
        static_in = {n: env.static[n] for n in env.static}
        record: dict[str, Any] = {}

        def segment(*args: Any) -> tuple[Value, ...]:
            scope = Scope(None, plan.constants)
            scope.values.update(layout.unpack(args[:n_params]))
            scope.values.update(static_in)
            scope.values.update(dict.fromkeys(host, HOST))
            scope.values.update(zip(traced, jax.tree.unflatten(in_tree, args[n_params:])))
            self.interpreter.begin_checks()
            try:
                stop = self._trace(pos, scope, frozenset(host))
            finally:
                checks = self.interpreter.end_checks()
            live = plan.live_after(len(plan.nodes) if stop is None else stop)
            made = {n: v for n, v in scope.values.items() if n in live and n not in traced
                    and n not in plan.constants and n not in plan.parameters and n not in static_in
                    and v is not HOST}
            record["statics"] = {n: v for n, v in made.items() if is_static(v)}
            record["outputs"] = tuple(sorted(n for n, v in made.items() if not is_static(v)))
            record["trims"] = self._trims(stop, record["outputs"])
            record["stop"] = None if record["trims"] else stop
            record["checks"] = tuple(message for _, _, message in checks)
            outs = tuple(made[n] for n in record["outputs"])
            return (*outs, _check_code(checks)) if checks else outs

        # the first segment takes its feeds in one staging buffer where they allow (see Packed)
        inputs = _stage_layout(values) if pos == 0 and self._stageable \
            and self.device.platform == "cpu" and len(leaves) == len(values) else None
        fn: Callable[..., Any] = segment
        if inputs is not None:
            stage_in = inputs  # (narrowed for the closure)

            def staged(*args: Any) -> Any:
                stage = args[n_params]
                # the barriers keep XLA from folding these bitcasts into a rule's own (its
                # simplifier then made an invalid one: u8[2,8] -> f32 for BitCast u64 -> c64)
                ins = lax.optimization_barrier(tuple(_unpack(stage, entry) for entry in stage_in))
                outs = segment(*args[:n_params], *ins)
                record["results"] = None
                if record["stop"] is None and not record["checks"] and len(outs) > 1:
                    gathered = _pack_results(outs)
                    if gathered is not None:
                        packed, record["results"] = gathered
                        return packed
                return outs

            fn = staged

        def lower() -> Any:
            specs = [_spec(v, self._sharding) for v in self._leaves]
            if inputs is None:
                specs += [_spec(v, self._sharding) for v in leaves]
            else:
                specs.append(jax.ShapeDtypeStruct((_layout_bytes(inputs),), np.uint8,
                                                  sharding=self._sharding))
            return jax.jit(fn).lower(*specs)

        lowered = lower()
        call = packed = None
        if record["outputs"] or record["checks"]:  # no traced outputs, no checks: no XLA
            nodes = plan.nodes[pos:len(plan.nodes) if record["stop"] is None else record["stop"]]
            if decide and (plan.one_thread
                           or prefers_one_thread(len(nodes), lambda: _cost(lowered))):
                single = single_thread_device()
                if single is not None:
                    self._move(single)
                    lowered = lower()
            call = self._compile(lowered, nodes)
            if inputs is not None:
                call = packed = Packed(call, inputs, record["results"], self._sharding)
        return Segment(pos, record["stop"], traced, in_tree, record["outputs"], record["statics"], call,
                       next(_UIDS), record["checks"], packed=packed, trims=record["trims"])

    def _trims(self, stop: int | None, outputs: tuple[str, ...]) -> tuple[tuple[str, str, str], ...]:
        """The graph's nodes from `stop` on as (output, rows, hint) when every one of them is an
        oxla.nms::TakeRows of this segment's results (`nms_split.trim_nms_rows`), else ()."""
        nodes = self.plan.nodes[stop:] if stop is not None else ()
        trims = tuple((n.output[0], n.input[0], n.input[1]) for n in nodes
                      if n.domain == NMS_DOMAIN and n.op_type == TAKE_ROWS
                      and len(n.input) == 2 and len(n.output) == 1)
        if not trims or len(trims) != len(nodes) \
                or any(rows not in outputs or hint not in outputs for _, rows, hint in trims):
            return ()
        return trims

    def _compile(self, lowered: Any, nodes: Sequence[Any]) -> Callable[..., Any]:
        """The C++ entry of `lowered`, compiled with the options for `nodes`."""
        try:
            ops = [n.op_type for n in nodes] + [f"{n.domain}::{n.op_type}" for n in nodes
                                                if n.domain.startswith("oxla.")]
            compiled = lowered.compile(compiler_options(self.device, ops))
        except jax.errors.JaxRuntimeError as e:
            raise _compile_error(e, nodes) from None
        with self._stats_lock:
            self._compiles += 1
        return _entry(compiled)

    def _trace(self, pos: int, scope: Scope, host: frozenset[str]) -> int | None:
        """Run nodes from `pos` until one needs a run-time value static; returns its index."""
        plan = self.plan
        for i in range(pos, len(plan.nodes)):
            if host and plan.reads[i] & host:
                return i
            try:
                self.interpreter.run_node(plan.nodes[i], scope, plan.opsets, plan.nodes)
            except NeedStatic:
                return i
        return None

    # --- host steps ---------------------------------------------------------------------------

    def _host_step(self, index: int, env: _Env) -> None:
        """Run one node on concrete values; its outputs join the call's values."""
        step = self._host_calls.get(index)
        if step is None:
            step = self._host_calls.setdefault(index, self._prepare_host(index))
        with self._stats_lock:
            self._host_steps += 1
            self._host_nodes.add(step.label)
        traced = env.traced
        if step.shortcut is not None and step.inputs[0] in traced:
            outputs = step.shortcut(to_static(traced[step.inputs[0]]))
            if outputs is not None and len(outputs) == len(step.outputs):
                for name, value in zip(step.outputs, outputs, strict=True):
                    if name:
                        traced[name] = value
                return
        values: dict[str, Value] = {}
        static, host = env.static, env.host
        for n in step.reads:
            if n in traced:
                values[n] = to_static(traced[n])
            elif n in static:
                values[n] = static[n]
            elif n in host:
                values[n] = host[n]
            elif n in self.params or n in self.plan.constants:
                values[n] = to_static(self._lookup(env, n))
        scope = Scope(None)
        scope.values = values
        try:
            if step.call is not None:
                try:
                    inputs: list[Value] | None = [values[n] if n else None for n in step.inputs]
                except KeyError:  # a value found nowhere: run_node names it
                    inputs = None
                if inputs is not None:
                    for name, value in zip(step.outputs, step.call(inputs, scope)):
                        if name:
                            (host if _host_only(value) else traced)[name] = value
                    return
            self.interpreter.run_node(step.node, scope, self.plan.opsets, self.plan.nodes)
        except NeedStatic as e:  # every input is concrete here; a rule asking again is a bug
            raise LoweringError(f"{e} even with concrete inputs") from None
        for name in step.outputs:
            if name:
                value = scope.get(name)
                (host if _host_only(value) else traced)[name] = value

    def _prepare_host(self, index: int) -> _HostCall:
        """What a host step of node `index` needs on every call, resolved on its first."""
        plan = self.plan
        node = plan.nodes[index]
        domain = canonical_domain(node.domain)
        rule = plan.dispatch.get(domain, node.op_type, plan.opsets.get(domain, 0)).rule
        shortcut = rule.host if rule is not None and node.input else None
        return _HostCall(node, tuple(plan.reads[index]), shortcut,
                         self.interpreter.host_call(node, plan.opsets, plan.nodes),
                         node.name or node.op_type, tuple(node.input), tuple(node.output))


@dataclass(frozen=True)
class _HostCall:
    """A host step's node, the values it reads, its rule's shortcut on its first input
    (`Rule.host`) and the interpreter's prepared call (None: run_node)."""

    node: Any
    reads: tuple[str, ...]
    shortcut: Callable[[Any], tuple[Any, ...] | None] | None
    call: Callable[[list[Value], Scope], tuple[Value, ...]] | None
    label: str                 # what RunStats.host_nodes names it by
    inputs: tuple[str, ...]    # the node's input and output names
    outputs: tuple[str, ...]


def _runtime_error(error: Exception) -> OxlaError:
    """An error raised while a compiled segment ran, as the oxla error it carries (a host
    callback that raised one), else a LoweringError with XLA's first line."""
    lines = str(error).splitlines()
    for line in reversed(lines):
        for cls in (ShapeError, InputError, LoweringError, ResourceError, OxlaError):
            prefix = f"{cls.__name__}: "
            at = line.find(prefix)
            if at >= 0:
                return cls(line[at + len(prefix):])
    first = lines[0] if lines else type(error).__name__
    return LoweringError(f"running the compiled model failed: {first}")


def _compile_error(error: Exception, nodes: Sequence[Any]) -> LoweringError:
    """XLA refusing to compile a traced segment (it happens on exotic dtypes such as 4-bit
    floats in some fusions): a LoweringError naming the nodes, instead of XLA's internals."""
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    ops = sorted({n.op_type for n in nodes})
    span = (f"node '{nodes[0].name or nodes[0].op_type}' to '{nodes[-1].name or nodes[-1].op_type}'"
            if nodes else "the graph")
    return LoweringError(f"XLA could not compile {span} (ops: {', '.join(ops[:12])}"
                         f"{', ...' if len(ops) > 12 else ''}): {first}. Check the tensors' data "
                         "types; please report this model to oxla.")


def _aligned(n: int) -> int:
    return -(-n // _PACK_ALIGN) * _PACK_ALIGN


def _declared_results_fit(plan: Plan) -> bool:
    """Whether the graph declares several outputs of types a result buffer carries, within
    PACK_MAX_BYTES together where their sizes are declared (converters often leave a dimension
    symbolic: the trace decides then). Only then do feeds go through a staging buffer: alone, it
    cost a model of one Add and one output 1.57x the time."""
    outputs = {o.name: o.type for o in plan.model.graph.output}
    if len(plan.output_names) < 2:
        return False
    declared = []
    for name in plan.output_names:
        tp = outputs.get(name)
        if tp is None or tp.WhichOneof("value") != "tensor_type":
            return False
        try:
            dtype = to_numpy_dtype(tp.tensor_type.elem_type)
        except OxlaError:
            return False
        if dtype.kind not in _PACKABLE:
            return False
        declared.append((dtype, tuple(d.dim_value if d.HasField("dim_value") else 1
                                      for d in tp.tensor_type.shape.dim)))
    return _layout_bytes(_layout(declared)) <= PACK_MAX_BYTES


def _layout(arrays: Sequence[tuple[np.dtype, tuple[int, ...]]]) -> Layout:
    """Where arrays of these (dtype, shape)s go in one buffer: each at a 64-byte aligned offset."""
    layout, at = [], 0
    for dtype, shape in arrays:
        size = math.prod(shape) * dtype.itemsize
        layout.append((at, size, dtype, shape))
        at = _aligned(at + size)
    return tuple(layout)


def _layout_bytes(layout: Layout) -> int:
    """The bytes of a buffer holding `layout` (not empty)."""
    return _aligned(layout[-1][0] + layout[-1][1])


def _stage_layout(values: Sequence[Any]) -> Layout | None:
    """Where each input goes in a staging buffer, or None when one of them cannot go there (not
    an array, a dtype outside _PACKABLE, a weak type) or they pass PACK_MAX_BYTES together."""
    if not values or any(not isinstance(v, np.ndarray | jax.Array) or getattr(v, "weak_type", False)
                         or np.dtype(v.dtype).kind not in _PACKABLE for v in values):
        return None
    layout = _layout([(np.dtype(v.dtype), tuple(v.shape)) for v in values])
    return layout if _layout_bytes(layout) <= PACK_MAX_BYTES else None


def _buffer(size: int) -> np.ndarray:
    """`size` bytes at a 64-byte aligned address."""
    raw = np.empty(size + _PACK_ALIGN, np.uint8)
    start = -raw.ctypes.data % _PACK_ALIGN
    return raw[start:start + size]


def _staged(layout: Layout, size: int, values: Sequence[Any]) -> np.ndarray:
    """A new staging buffer holding `values`, not made 64-byte aligned: JAX copies such a buffer
    (~2 us), where taking a new aligned array in place cost it ~14 us a call (a trivial
    executable: 17.4 against 29.3 us; the kept, aligned `stage` 15.4 us)."""
    stage = np.empty(size, np.uint8)
    for entry, value in zip(layout, values, strict=True):
        _view(stage, entry)[...] = value
    return stage


def _view(stage: np.ndarray, entry: tuple[int, int, np.dtype, tuple[int, ...]]) -> np.ndarray:
    at, size, dtype, shape = entry
    return stage[at:at + size].view(dtype).reshape(shape)


def _unpack(stage: Any, entry: tuple[int, int, np.dtype, tuple[int, ...]]) -> Any:
    """An input out of the staging bytes, inside the computation."""
    at, size, dtype, shape = entry
    raw = lax.slice(stage, (at,), (at + size,))
    if dtype == np.bool_:
        return (raw != 0).reshape(shape)
    if dtype.itemsize > 1:
        raw = raw.reshape(-1, dtype.itemsize)
    return lax.bitcast_convert_type(raw, dtype).reshape(shape)


def _pack_results(outs: Sequence[Any]) -> tuple[Any, Layout] | None:
    """Every result in one uint8 array, inside the computation, and where each is in it; None
    when one of them cannot go there (a sequence, a dtype outside _PACKABLE) or they pass
    PACK_MAX_BYTES together."""
    import jax.numpy as jnp

    if any(not isinstance(out, jax.Array) or np.dtype(out.dtype).kind not in _PACKABLE for out in outs):
        return None
    layout = _layout([(np.dtype(out.dtype), tuple(out.shape)) for out in outs])
    if _layout_bytes(layout) > PACK_MAX_BYTES:
        return None
    pieces = []
    for out, (at, size, dtype, _) in zip(lax.optimization_barrier(tuple(outs)), layout, strict=True):
        # (the barrier: see the inputs' in _build_on)
        pieces.append((out.astype(np.uint8) if dtype == np.bool_
                       else lax.bitcast_convert_type(out, np.uint8)).reshape(-1))
        if _aligned(at + size) > at + size:
            pieces.append(jnp.zeros(_aligned(at + size) - at - size, np.uint8))
    return jnp.concatenate(pieces), layout


def _check_code(checks: Sequence[tuple[Any, Any, str]]) -> Any:
    """int64[2]: the index of the first failed check (-1: none failed) and its witness value."""
    import jax.numpy as jnp

    oks = jnp.stack([jnp.all(ok) for ok, _, _ in checks])
    witnesses = jnp.stack([jnp.asarray(0 if w is None else w, jnp.int64).reshape(()) for _, w, _ in checks])
    first = jnp.argmin(oks)  # the first False; 0 when every check holds
    failed = ~jnp.all(oks)
    return jnp.stack([jnp.where(failed, first, -1).astype(jnp.int64), witnesses[first]])


def _checked(seg: Segment, outs: Sequence[Any]) -> Sequence[Any]:
    """The outputs without the check code; raises InputError when a check failed."""
    code = np.asarray(outs[-1])
    if code[0] >= 0:
        raise InputError(seg.checks[int(code[0])].format(witness=int(code[1])))
    return outs[:-1]


def _read_only(value: Any) -> Any:
    """A numpy array as a read-only view (a value handed out on every call); others as they are."""
    if isinstance(value, np.ndarray):
        value = value.view()
        value.flags.writeable = False
    return value


def _entry(compiled: Any) -> Callable[..., Any]:
    """The compiled computation's C++ entry point when JAX offers one: `Compiled.__call__` is a
    Python frame in front of it (~0.3 us of a ~6 us call). Falls back to the Compiled object."""
    make = getattr(getattr(compiled, "_executable", None), "create_cpp_call", None)
    params = getattr(compiled, "_params", None)
    direct = make(params) if make is not None and params is not None else None
    return direct or compiled


def _cost(lowered: Any) -> tuple[float, float]:
    """XLA's count of a lowered computation's flops, with those of oxla's custom calls, and
    bytes accessed (infinite when it cannot tell: nothing is then judged small). XLA leaves out
    a count that is zero."""
    try:
        cost = lowered.cost_analysis()
    except Exception:  # a computation XLA's cost analysis does not cover
        return math.inf, math.inf
    cost = cost[0] if isinstance(cost, list) and cost else cost
    if not isinstance(cost, dict):
        return math.inf, math.inf
    return float(cost.get("flops", 0.0)) + _native_flops(lowered), \
        float(cost.get("bytes accessed", 0.0))


_NATIVE_CALL = re.compile(
    rf"custom_call @({re.escape(GEMM_TARGET)}|{re.escape(CONV_TARGET)}|{re.escape(DEPTHWISE_TARGET)})"
    r"\(.*? : \(tensor<[0-9x]*xf32>, tensor<([0-9x]*)xf32>.*?-> tensor<([0-9x]*)xf32>")


def _native_flops(lowered: Any) -> float:
    """The flops of oxla's native custom calls in a lowered computation, which XLA's cost
    analysis does not count: 2 x Y's size x K for the GEMM and the convolution (K read from the
    packed W's type, (P, K, 32)), 2 x Y's size x KH KW for the depthwise one (W (KH, KW, C))."""
    try:
        text = lowered.as_text()
    except Exception:  # no text: count nothing
        return 0.0
    total = 0.0
    for target, w, y in _NATIVE_CALL.findall(text):
        dims_w = [int(d) for d in w.split("x") if d]
        dims_y = [int(d) for d in y.split("x") if d]
        if len(dims_w) == 3 and dims_y:
            k = dims_w[0] * dims_w[1] if target == DEPTHWISE_TARGET else dims_w[1]
            total += 2.0 * math.prod(dims_y) * k
    return total


def _plain(value: Value) -> bool:
    return isinstance(value, np.ndarray | jax.Array) and value.dtype != object


def _host_only(value: Value) -> bool:
    """Strings and maps live on the host."""
    if isinstance(value, list):
        return any(_host_only(v) for v in value)
    return isinstance(value, dict) or (isinstance(value, np.ndarray) and value.dtype == object)


def _signature(value: Value) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return ("seq", tuple(_signature(v) for v in value))
    return (tuple(value.shape), np.dtype(value.dtype), bool(getattr(value, "weak_type", False)))


def _spec(value: Any, sharding: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding,
                                weak_type=bool(getattr(value, "weak_type", False)))


def _runtime_device() -> Any:
    """Where segments compile and run: the device JAX would use here (a session's provider sets
    it with jax.default_device); for a CPU, oxla's own synchronous client's (oxla.cpu_client),
    the one-thread one where that was asked for (SessionOptions.intra_op_num_threads = 1)."""
    chosen = jax.config.jax_default_device
    if isinstance(chosen, str):
        chosen = jax.devices(chosen)[0]
    device = chosen if chosen is not None else jax.devices()[0]
    if device.platform != "cpu" or is_single_thread(device):  # a session asked for one thread
        return device
    return inline_device()


def _value_key(value: Any) -> Any:
    if isinstance(value, dict):
        return ("map", tuple(sorted((str(k), _value_key(v)) for k, v in value.items())))
    if isinstance(value, list):
        return ("seq", tuple(_value_key(v) for v in value))
    if value is None:
        return None
    arr = np.asarray(value)
    if arr.dtype == object:
        return (arr.shape, tuple(str(v) for v in arr.ravel()))
    return (arr.shape, str(arr.dtype), hashlib.sha1(arr.tobytes()).hexdigest())
