"""Control flow: If, Loop and Scan run their subgraphs through cx.run_graph.

When every value a node touches is static the subgraph runs in a Python loop and the results stay
static. Otherwise If becomes lax.cond (a branch that cannot trace on these inputs becomes one that
raises when taken) and Loop/Scan become lax.scan/while_loop when the carried values keep their
shapes (a while-loop whose condition follows from static values is run ahead to its count and
becomes a scan); else the loop is unrolled (static trip count) or the graph breaks here and the
node runs on the host with concrete values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback
from onnx import GraphProto

from oxla.errors import LoweringError, OxlaError
from oxla.graph import graph_free_names
from oxla.lowering.common import check_size
from oxla.lowering.context import NeedStatic
from oxla.lowering.registry import rule
from oxla.lowering.values import Value, is_static

# A traced loop that must be unrolled runs on the host instead when it has more iterations.
UNROLL_LIMIT = 256
# A loop whose condition follows from static values is run ahead at trace time this far at most.
RUN_AHEAD_LIMIT = 4096
TRUE = np.array(True)


class _NoLax(Exception):
    """The loop cannot be one lax loop; the message says why."""


# --- helpers shared by If, Loop and Scan ----------------------------------------------------------

def _everything_static(cx, graphs: Sequence[GraphProto], values: Sequence[Value]) -> bool:
    """The node's inputs and every outer value its subgraphs read are static."""
    if not all(is_static(v) for v in values):
        return False
    for graph in graphs:
        for name in graph_free_names(graph):
            if cx.defined(name) and not is_static(cx.value(name)):
                return False
    return True


def _avals(tree: Any) -> Any:
    """Structure, shapes and dtypes of a value tree (sequences are lists, None is empty)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), np.dtype(x.dtype)) for x in leaves)


def _truth(cx, cond: Value, what: str) -> bool:
    flat = np.asarray(cx.static(cond, what)).reshape(-1)
    if flat.size != 1:
        raise cx.shape_error(f"{what} must hold one element, got shape {np.shape(cond)}")
    return bool(flat[0])


def _to_host(cx, what: str, value: Value = None) -> None:
    """Break the graph here: the node then runs on the host, where every value is concrete."""
    if value is not None and not is_static(value):
        cx.static(value, what)
    cx.break_graph(what)


def _stack(values: list[Value]) -> Value:
    return np.stack(values) if all(is_static(v) for v in values) else jnp.stack(values)


def _empty_scans(shapes: Sequence[Any]) -> list[np.ndarray]:
    """Scan outputs of a loop that ran zero times: (0, *shape of one iteration)."""
    return [np.zeros((0, *s.shape), s.dtype) for s in shapes]


# --- If -------------------------------------------------------------------------------------------

@rule("If", since=1, fold=False)
def if_(cx, cond, *, else_branch=None, then_branch=None):
    """outputs = then_branch() if cond else else_branch()  (v1+; v11+ branches may differ in shape)."""
    if cx.is_static(cond):
        return tuple(cx.run_graph(then_branch if _truth(cx, cond, "cond") else else_branch, []))
    then_fn = partial(cx.run_graph, then_branch, [])
    else_fn = partial(cx.run_graph, else_branch, [])
    pred = jnp.reshape(cond, ()).astype(bool)
    try:  # each branch is traced once: nested Ifs cost time linear in their depth
        return tuple(lax.cond(pred, then_fn, else_fn))
    except TypeError as e:  # raised by lax.cond itself: rules' errors arrive as OxlaErrors
        # lax.cond needs both branches to give the same types: choose the branch on the host,
        # never broadcast or stack values of different shapes.
        cx.static(cond, f"cond (the If branches give different shapes or types: {str(e).splitlines()[0]})")
        raise
    except OxlaError:
        pass  # a branch cannot trace on these inputs: find out which (rare; traces again)
    then_out, then_error = _branch_types(cx, cond, then_fn, "then")
    else_out, else_error = _branch_types(cx, cond, else_fn, "else")
    if then_error is not None and else_error is not None:
        cx.static(cond, "cond (neither branch can run on these inputs)")
    if then_error is not None:
        then_fn = _failing_branch(cx, else_out, then_error, "then")
    elif else_error is not None:
        else_fn = _failing_branch(cx, then_out, else_error, "else")
    elif _avals(then_out) != _avals(else_out):
        # lax.cond needs both branches to give the same types: choose the branch on the host,
        # never broadcast or stack values of different shapes.
        cx.static(cond, "cond (the If branches give different shapes or types)")
    return tuple(lax.cond(pred, then_fn, else_fn))


def _branch_types(cx, cond: Value, branch: Callable[[], list[Value]],
                  which: str) -> tuple[Any, OxlaError | None]:
    """The output types of one branch traced on the node's inputs, or the error tracing it gave.

    A branch may only make sense for other inputs: a voice model handles 8 and 16 kHz audio in
    two branches, each shaping the samples for its own rate, so one of them fails to trace.
    """
    try:
        return jax.eval_shape(branch), None
    except OxlaError as e:
        if _wants_values(e):  # the branch itself is fine once its values are concrete
            cx.static(cond, f"cond (the {which} branch needs concrete values: {e})")
        return None, e


def _wants_values(error: BaseException) -> bool:
    """Whether a rule failed only because it met a traced value where it needed a concrete one."""
    concrete = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError)
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, concrete):
            return True
        cause = cause.__cause__
    return False


def _failing_branch(cx, like: Any, error: OxlaError, which: str) -> Callable[[], Any]:
    """A stand-in for a branch that cannot run on these inputs: it raises the branch's error when
    taken at run time (onnxruntime fails there too), so the other branch stays compiled."""
    message = f"{cx.ref.describe()}: the {which} branch was taken and cannot run on these inputs: {error}"

    def fail() -> None:
        raise type(error)(message)

    def branch() -> Any:
        io_callback(fail, None)
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), like)
    return branch


# --- Loop -----------------------------------------------------------------------------------------

Step = Callable[[Value, list[Value]], tuple[Value, list[Value], list[Value]]]


def _loop_step(cx, body: GraphProto, n_carried: int) -> Step:
    """One iteration: (i, v) -> (cond_out, v_out, scan values); the body only runs while cond is
    true, so its cond input is always (static) true."""
    def step(i: Value, v: list[Value]) -> tuple[Value, list[Value], list[Value]]:
        outs = cx.run_graph(body, [i, TRUE, *v])
        return outs[0], list(outs[1:1 + n_carried]), list(outs[1 + n_carried:])
    return step


@rule("Loop", since=1, fold=False)
def loop(cx, M=None, cond=None, *v_initial, body=None):
    """while i < M and cond: cond, v, scan[i] = body(i, cond, v)  (v1+; v13+ sequences, v16+
    optionals); returns v and the stacked scan values."""
    n_scan = len(body.output) - 1 - len(v_initial)
    if n_scan < 0 or len(body.input) != 2 + len(v_initial):
        raise cx.fail(f"the body takes {len(body.input)} inputs and gives {len(body.output)} "
                      f"outputs; with {len(v_initial)} loop-carried values it must take "
                      f"{2 + len(v_initial)} and give at least {1 + len(v_initial)}")
    step = _loop_step(cx, body, len(v_initial))
    v = list(v_initial)
    static = _everything_static(cx, [body], [M, cond, *v])
    # a long loop over constants still compiles: unrolled in Python it would take minutes
    if static and (M is None or int(np.reshape(M, ())) <= UNROLL_LIMIT):
        return _unrolled(cx, step, M, cond, v, n_scan)
    try:
        return _lax_loop(cx, step, M, cond, v, n_scan)
    except (NeedStatic, _NoLax) as e:
        if static:
            return _unrolled(cx, step, M, cond, v, n_scan)
        if M is None or not cx.is_static(M) or int(np.reshape(M, ())) > UNROLL_LIMIT:
            if isinstance(e, NeedStatic):
                raise
            _to_host(cx, f"M ({e})", M)
    # Unrolled with a static iteration number, the body can use it as a shape or index.
    return _unrolled(cx, step, M, cond, v, n_scan)


def _unrolled(cx, step: Step, M: Value, cond: Value, v: list[Value], n_scan: int) -> tuple:
    """The loop as a Python loop (every iteration traced or evaluated in turn)."""
    limit = None if M is None else int(np.reshape(cx.static(M, "M"), ()))
    keep = cond is None or _truth(cx, cond, "cond")
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    i = 0
    while keep and (limit is None or i < limit):
        c, v, s = step(np.array(i, np.int64), v)
        for acc, x in zip(scans, s):
            acc.append(x)
        keep = _truth(cx, c, "the loop condition the body computes")
        i += 1
    if i == 0 and n_scan:
        first = jax.eval_shape(lambda: step(np.array(0, np.int64), v)[2])
        return (*v, *_empty_scans(first))
    return (*v, *[_stack(acc) for acc in scans])


def _lax_loop(cx, step: Step, M: Value, cond: Value, v: list[Value], n_scan: int) -> tuple:
    """The loop as lax.scan (known trip count, no early exit) or lax.while_loop."""
    seen: dict[str, Any] = {}

    def probe(i: Value, v: list[Value]) -> tuple:
        c, v_out, s = step(i, v)
        seen["cond"] = bool(np.asarray(c).reshape(-1)[0]) if is_static(c) else None
        return v_out, s

    v_out, scans = jax.eval_shape(probe, jax.ShapeDtypeStruct((), np.int64), v)
    if _avals(v_out) != _avals(v):
        raise _NoLax("the loop-carried values change shape or type")
    if seen["cond"] is False:
        raise _NoLax("the body always ends the loop after one iteration")
    early_exit = seen["cond"] is None
    if cond is not None and is_static(cond) and not _truth(cx, cond, "cond"):
        return (*v, *_empty_scans(scans))
    start_known = cond is None or is_static(cond)
    if not early_exit and start_known and M is None:
        raise cx.fail("the loop never ends: no trip count M and the body's condition is always true")
    if n_scan and early_exit:
        # tf2onnx's RNN loops: the body's condition never depends on data, so the count is known;
        # their first condition may still be traced (a float parameter in it): it must hold
        trips = _run_ahead(step, M, cond if start_known else TRUE, v)
        if trips is not None:
            if not trips:
                return (*v, *_empty_scans(scans))
            if not start_known:
                _require_start(cx, cond)
            _check_scans(cx, trips, scans)
            return _scan_loop(step, trips, v)
    if n_scan and not (start_known and not early_exit):
        # The number of scan values, hence the output shapes, depends on data.
        _to_host(cx, "cond (the iteration count decides the scan outputs' shapes)", cond)
    if n_scan and not is_static(M):
        cx.static(M, "M (the trip count decides the scan outputs' shapes)")
    if start_known and not early_exit and is_static(M):
        _check_scans(cx, int(np.reshape(M, ())), scans)
        return _scan_loop(step, int(np.reshape(M, ())), v)
    return _while_loop(step, M, cond, v)


def _check_scans(cx, trips: int, scans: list[Any]) -> None:
    """Refuse scan outputs (one value per iteration, stacked) over the memory limit."""
    for s in jax.tree.leaves(scans):
        check_size(cx, [trips, *s.shape], s.dtype)


def _require_start(cx, cond: Value) -> None:
    """Fail at run time when a loop compiled for its known count would not start at all."""
    message = (f"{cx.ref.describe()}: the initial condition is false, but the loop was compiled for "
               "the iteration count its body gives; feed the condition as a constant")

    def check(started: np.ndarray) -> None:
        if not bool(started):
            raise LoweringError(message)

    io_callback(check, None, jnp.reshape(cond, ()).astype(bool))


def _run_ahead(step: Step, M: Value, cond: Value, v: list[Value]) -> int | None:
    """The iteration count, when the condition the body computes follows from the iteration
    number and static loop-carried values alone (tf2onnx's RNN loops compare a carried time
    counter with the sequence length); None when it depends on data.

    Each iteration traces the body abstractly with the static values it knows so far.
    """
    if not all(hasattr(x, "shape") for x in v) or (M is not None and not is_static(M)):
        return None
    limit = None if M is None else int(np.reshape(M, ()))
    keep = cond is None or bool(np.asarray(cond).reshape(-1)[0])
    known: list[Value] = [x if is_static(x) else None for x in v]
    i = 0
    while keep and (limit is None or i < limit):
        if i >= RUN_AHEAD_LIMIT:
            return None
        found = _static_step(step, i, known, v)
        if found is None:
            return None
        keep, known = found
        i += 1
    return i


def _static_step(step: Step, i: int, known: list[Value], v: list[Value]) -> tuple[bool, list[Value]] | None:
    """One iteration traced with iteration number i: its condition (None when traced) and which
    loop-carried values come out static."""
    seen: dict[str, Any] = {}

    def probe(traced: list[Value]) -> int:
        values = [k if k is not None else t for k, t in zip(known, traced)]
        c, v_out, _ = step(np.array(i, np.int64), values)
        seen["cond"] = bool(np.asarray(c).reshape(-1)[0]) if is_static(c) else None
        seen["known"] = [x if is_static(x) else None for x in v_out]
        return 0

    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in v]
    try:
        jax.eval_shape(probe, specs)
    except (NeedStatic, OxlaError):
        return None
    return None if seen["cond"] is None else (seen["cond"], seen["known"])


def _scan_loop(step: Step, trip: int, v: list[Value]) -> tuple:
    def f(carry: tuple, _: Any) -> tuple:
        i, v = carry
        _, v_out, s = step(i, v)
        return (i + 1, v_out), s

    (_, v), scans = lax.scan(f, (jnp.asarray(0, jnp.int64), v), length=trip)  # type: ignore[var-annotated]
    return (*v, *scans)


def _while_loop(step: Step, M: Value, cond: Value, v: list[Value]) -> tuple:
    limit = None if M is None else jnp.reshape(M, ()).astype(jnp.int64)
    keep = jnp.asarray(True) if cond is None else jnp.reshape(cond, ()).astype(bool)

    def test(carry: tuple) -> Value:
        i, keep, _ = carry
        return keep if limit is None else keep & (i < limit)

    def f(carry: tuple) -> tuple:
        i, _, v = carry
        c, v_out, _ = step(i, v)
        return i + 1, jnp.reshape(c, ()).astype(bool), v_out

    _, _, v = lax.while_loop(test, f, (jnp.asarray(0, jnp.int64), keep, v))
    return tuple(v)


# --- Scan -----------------------------------------------------------------------------------------

def _xp(x: Value) -> Any:
    """numpy for static values (the result stays static), jax.numpy for traced ones."""
    return np if is_static(x) else jnp


def _flip(x: Value) -> Value:
    return _xp(x).flip(x, axis=0)


def _axes(cx, given: tuple[int, ...] | None, ranks: Sequence[int], what: str) -> list[int]:
    """Per-value axes (default 0), negative ones counted from each value's rank."""
    axes = list(given) if given is not None else [0] * len(ranks)
    if len(axes) != len(ranks):
        raise cx.fail(f"{what} has {len(axes)} entries for {len(ranks)} values")
    for a, r in zip(axes, ranks):
        if not -r <= a < r:
            raise cx.fail(f"{what} entry {a} is out of range for rank {r}")
    return [a % r for a, r in zip(axes, ranks)]


def _directions(cx, given: tuple[int, ...] | None, count: int, what: str) -> list[int]:
    dirs = list(given) if given is not None else [0] * count
    if len(dirs) != count or any(d not in (0, 1) for d in dirs):
        raise cx.fail(f"{what} must be {count} values of 0 (forward) or 1 (reverse), got {dirs}")
    return dirs


ScanStep = Callable[[list[Value], list[Value]], tuple[list[Value], list[Value]]]


def _scan_core(cx, body: GraphProto, state: list[Value], xs: list[Value]) -> tuple[list, list]:
    """state, ys[t] = body(state, xs[t]) over the leading axis of every xs; ys stacked on axis 0."""
    n = len(state)
    lengths = {x.shape[0] for x in xs}
    if len(lengths) != 1:
        raise cx.fail(f"the scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    length = lengths.pop()

    def step(state: list[Value], x_t: list[Value]) -> tuple[list[Value], list[Value]]:
        outs = cx.run_graph(body, [*state, *x_t])
        return list(outs[:n]), list(outs[n:])

    if not _everything_static(cx, [body], [*state, *xs]):
        try:
            return _scan_lax(step, state, xs)
        except (NeedStatic, _NoLax) as e:
            if length > UNROLL_LIMIT:
                if isinstance(e, NeedStatic):
                    raise
                _to_host(cx, f"the scan ({e})")
    return _scan_unrolled(step, state, xs, length)


def _slice_specs(xs: list[Value]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in xs]


def _scan_lax(step: ScanStep, state: list[Value], xs: list[Value]) -> tuple[list, list]:
    state_out, _ = jax.eval_shape(step, state, _slice_specs(xs))
    if _avals(state_out) != _avals(state):
        raise _NoLax("the scan state changes shape or type")
    state, ys = lax.scan(step, state, xs)
    return list(state), list(ys)


def _scan_unrolled(step: ScanStep, state: list[Value], xs: list[Value], length: int) -> tuple[list, list]:
    per_step = []
    for t in range(length):
        state, y = step(state, [x[t] for x in xs])
        per_step.append(y)
    if not per_step:
        return state, _empty_scans(jax.eval_shape(step, state, _slice_specs(xs))[1])
    return state, [_stack([y[j] for y in per_step]) for j in range(len(per_step[0]))]


@rule("Scan", since=9, fold=False)
def scan(cx, *initial_state_and_scan_inputs, body=None, num_scan_inputs=None,
         scan_input_axes=None, scan_input_directions=None, scan_output_axes=None,
         scan_output_directions=None):
    """state, y[t] = body(state, x[t]) over slices of the scan inputs along their axes  (v9+)."""
    values = list(initial_state_and_scan_inputs)
    n = _state_count(cx, num_scan_inputs, len(values))
    state, xs = values[:n], values[n:]
    k = len(body.output) - n
    in_axes = _axes(cx, scan_input_axes, [len(x.shape) for x in xs], "scan_input_axes")
    in_dirs = _directions(cx, scan_input_directions, len(xs), "scan_input_directions")
    out_dirs = _directions(cx, scan_output_directions, k, "scan_output_directions")
    xs = [_xp(x).moveaxis(x, a, 0) for x, a in zip(xs, in_axes)]
    xs = [_flip(x) if d else x for x, d in zip(xs, in_dirs)]
    state, ys = _scan_core(cx, body, state, xs)
    ys = [_flip(y) if d else y for y, d in zip(ys, out_dirs)]
    out_axes = _axes(cx, scan_output_axes, [len(y.shape) for y in ys], "scan_output_axes")
    return (*state, *[_xp(y).moveaxis(y, 0, a) for y, a in zip(ys, out_axes)])


def _state_count(cx, num_scan_inputs: int | None, total: int) -> int:
    if num_scan_inputs is None or not 0 < num_scan_inputs <= total:
        raise cx.fail(f"num_scan_inputs must be in 1..{total}, got {num_scan_inputs}")
    return total - num_scan_inputs


@rule("Scan", since=8, fold=False)
def scan_v8(cx, sequence_lens, *initial_state_and_scan_inputs, body=None, directions=None,
            num_scan_inputs=None):
    """Scan with a leading batch axis on every input and output, sequence_lens per batch  (v8)."""
    values = list(initial_state_and_scan_inputs)
    n = _state_count(cx, num_scan_inputs, len(values))
    dirs = _directions(cx, directions, len(values) - n, "directions")
    batch, length = values[n].shape[0], values[n].shape[1]
    lens = [length] * batch if sequence_lens is None else list(cx.static_ints(sequence_lens, "sequence_lens"))
    if len(lens) != batch or any(not 0 <= s <= length for s in lens):
        raise cx.fail(f"sequence_lens {lens} must give one length in 0..{length} per batch entry")
    states, ys = [], []
    for b in range(batch):
        xs = [x[b, :lens[b]] for x in values[n:]]
        xs = [_flip(x) if d else x for x, d in zip(xs, dirs)]
        state, y = _scan_core(cx, body, [s[b] for s in values[:n]], xs)
        states.append(state)
        # Steps past a batch entry's sequence length give zeros.
        ys.append([_xp(t).pad(t, [(0, length - lens[b])] + [(0, 0)] * (len(t.shape) - 1)) for t in y])
    stacked = [_stack([s[j] for s in states]) for j in range(n)]
    return (*stacked, *[_stack([y[j] for y in ys]) for j in range(len(ys[0]) if ys else 0)])
