"""ai.onnx.preview.training v1: Gradient (JAX autodiff over the identified subgraph), Adagrad,
Momentum (standard, nesterov) and Adam, each for any number of tensors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from onnx import NodeProto

from oxla.errors import LoweringError
from oxla.graph import node_reads, producers
from oxla.lowering.context import Context, NeedStatic
from oxla.lowering.registry import rule
from oxla.lowering.values import Value

DOMAIN = "ai.onnx.preview.training"


# --- optimizers ----------------------------------------------------------------------------------

def _groups(cx: Context, tensors: Sequence[Value], per: int, what: str) -> list[tuple[Value, ...]]:
    """Split the variadic inputs [X1..Xn, G1..Gn, ...] into n tuples (Xi, Gi, ...)."""
    if not tensors or len(tensors) % per:
        raise cx.fail(f"expects R, T, then {per} tensors ({what}) per optimized tensor, "
                      f"got {len(tensors)} inputs after R and T")
    n = len(tensors) // per
    return [tuple(tensors[i + k * n] for k in range(per)) for i in range(n)]


def _scalar(cx: Context, name: str, value: Value) -> jax.Array:
    if value is None or int(np.prod(value.shape)) != 1:
        raise cx.fail(f"input {name} must be a scalar, got "
                      f"{'none' if value is None else tuple(value.shape)}")
    # Scalar factors are computed in float64: 1 - beta**T loses digits in float32 for large T.
    return jnp.reshape(value, ()).astype(jnp.float64)


def _flatten(columns: list[tuple[Value, ...]]) -> tuple[Value, ...]:
    """[(X1, V1), (X2, V2)] -> (X1, X2, V1, V2): outputs are grouped by kind, like the inputs."""
    return tuple(col[k] for k in range(len(columns[0])) for col in columns)


@rule("Adagrad", since=1, domain=DOMAIN)
def adagrad(cx, r, t, *inputs, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """r = R / (1 + T*decay); G' = norm*X + G; H' = H + G'^2; X' = X - r*G' / (sqrt(H') + eps)."""
    rate = _scalar(cx, "R", r) / (1.0 + _scalar(cx, "T", t) * decay_factor)
    out = []
    for x, g, h in _groups(cx, inputs, 3, "X, G, H"):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        x_new = x - rate.astype(x.dtype) * g_reg / (jnp.sqrt(h_new) + epsilon)
        out.append((x_new.astype(x.dtype), h_new.astype(h.dtype)))
    return _flatten(out)


@rule("Momentum", since=1, domain=DOMAIN)
def momentum(cx, r, t, *inputs, alpha=None, beta=None, mode=None, norm_coefficient=None):
    """V' = alpha*V + (T > 0 ? beta : 1)*G'; X' = X - R*V' (standard) or X - R*(G' + alpha*V')."""
    if mode not in ("standard", "nesterov"):
        raise cx.fail(f"mode must be 'standard' or 'nesterov', got {mode!r}")
    if alpha is None or beta is None or norm_coefficient is None:
        raise cx.fail("attributes alpha, beta and norm_coefficient are required")
    rate = _scalar(cx, "R", r)
    beta_adjusted = jnp.where(_scalar(cx, "T", t) > 0, beta, 1.0)
    out = []
    for x, g, v in _groups(cx, inputs, 3, "X, G, V"):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + beta_adjusted.astype(x.dtype) * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        out.append(((x - rate.astype(x.dtype) * step).astype(x.dtype), v_new.astype(v.dtype)))
    return _flatten(out)


@rule("Adam", since=1, domain=DOMAIN)
def adam(cx, r, t, *inputs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0,
         norm_coefficient_post=0.0):
    """V' = a*V + (1-a)*G'; H' = b*H + (1-b)*G'^2; X' = (1-post)*(X - R_adj*V'/(sqrt(H')+eps))."""
    rate, step = _scalar(cx, "R", r), _scalar(cx, "T", t)
    safe = jnp.maximum(step, 1.0)  # the T = 0 branch is not taken, but must not divide by zero
    corrected = rate * jnp.sqrt(1.0 - beta ** safe) / (1.0 - alpha ** safe)
    rate_adjusted = jnp.where(step > 0, corrected, rate)
    out = []
    for x, g, v, h in _groups(cx, inputs, 4, "X, G, V, H"):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * (g_reg * g_reg)
        x_new = x - rate_adjusted.astype(x.dtype) * (v_new / (jnp.sqrt(h_new) + epsilon))
        x_final = (1 - norm_coefficient_post) * x_new
        out.append((x_final.astype(x.dtype), v_new.astype(v.dtype), h_new.astype(h.dtype)))
    return _flatten(out)


# --- Gradient ------------------------------------------------------------------------------------

def _ancestors(nodes: Sequence[NodeProto], producer: dict[str, int], start: str,
               cut: set[str]) -> tuple[set[int], set[str]]:
    """Nodes computing `start` (not looking past names in `cut`) and the names they read."""
    needed: set[int] = set()
    names: set[str] = set()
    stack = [start]
    while stack:
        name = stack.pop()
        if name in names:
            continue
        names.add(name)
        if name in cut and name != start:
            continue
        i = producer.get(name)
        if i is None or i in needed:
            continue
        needed.add(i)
        stack.extend(node_reads(nodes[i]))
    return needed, names


def _check_independent(cx: Context, nodes: Sequence[NodeProto], producer: dict[str, int],
                       leaves: Sequence[str]) -> None:
    """No name in xs/zs may be computed from another one: it would not be an independent variable."""
    known = set(leaves)
    for leaf in leaves:
        if leaf not in producer:
            continue
        _, upstream = _ancestors(nodes, producer, leaf, set())
        other = sorted((upstream - {leaf}) & known)
        if other:
            raise cx.fail(
                f"'{leaf}' (in xs/zs) is an intermediate value computed from {other}, which are "
                "also in xs/zs: it is not an independent variable. List only the tensors it is "
                "computed from, or only it.")


def _subgraph(cx: Context, xs: Sequence[str], zs: Sequence[str], y: str) -> list[NodeProto]:
    """The nodes of the Gradient node's graph that compute y from xs and zs, in graph order."""
    nodes = cx.graph_nodes
    producer = producers(nodes)
    leaves = [*xs, *zs]
    missing = [n for n in leaves if n not in producer and not cx.defined(n)]
    if missing:
        raise cx.fail(f"xs/zs names {missing} are neither computed in this graph nor its inputs "
                      "or initializers")
    if y not in producer and y not in leaves:
        raise cx.fail(f"y '{y}' is not computed by any node of this graph")
    _check_independent(cx, nodes, producer, leaves)
    if y in leaves:
        return []
    needed, _ = _ancestors(nodes, producer, y, set(leaves))
    if any(nodes[i] is cx.node for i in needed):
        raise cx.fail(f"y '{y}' depends on this Gradient node's own outputs")
    return [nodes[i] for i in sorted(needed)]


def _check_differentiable(cx: Context, names: Sequence[str], values: Sequence[Value],
                          what: str) -> None:
    for name, value in zip(names, values):
        if value is None or isinstance(value, list) or not jnp.issubdtype(value.dtype, jnp.inexact):
            kind = "none" if value is None else getattr(value, "dtype", type(value).__name__)
            raise cx.fail(f"{what} '{name}' is not differentiable (it is {kind}); Gradient "
                          "differentiates floating-point tensors only")


@rule("Gradient", since=1, domain=DOMAIN)
def gradient(cx, *inputs, xs=None, y=None, zs=()):
    """dy/dx for each x in xs, at the point the inputs give (xs values, then zs values)."""
    if not xs or not y:
        raise cx.fail("attributes xs and y are required")
    if len(inputs) != len(xs) + len(zs):
        raise cx.fail(f"takes one input per name in xs and zs ({len(xs)} + {len(zs)}), "
                      f"got {len(inputs)}")
    _check_differentiable(cx, xs, inputs[:len(xs)], "xs")
    body = _subgraph(cx, xs, zs, y)
    z_values = dict(zip(zs, inputs[len(xs):]))

    def forward(*x_values: Any) -> Any:
        try:  # nested Gradient nodes in `body` search this node's graph too
            (out,) = cx.evaluate(body, {**z_values, **dict(zip(xs, x_values))}, [y])
        except NeedStatic as e:
            raise LoweringError(f"{cx.ref.describe()}: the differentiated subgraph needs a value "
                                f"computed from xs at compile time ({e})") from None
        _check_differentiable(cx, [y], [out], "y")
        return out

    primals = tuple(jnp.asarray(v) for v in inputs[:len(xs)])
    out, pullback = jax.vjp(forward, *primals)
    # A non-scalar y is differentiated as the sum of its elements (a cotangent of ones).
    grads = pullback(jnp.ones_like(out))
    return tuple(g if cx.output_used(i) else None for i, g in enumerate(grads))
