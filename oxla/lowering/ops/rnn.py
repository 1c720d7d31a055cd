"""Recurrent layers: RNN, GRU and LSTM as one lax.scan over time per direction.

Shapes (layout 0): X [T, batch, input], W [dirs, gates*H, input], R [dirs, gates*H, H],
B [dirs, 2*gates*H] (input biases then recurrent biases), initial states [dirs, batch, H];
Y [T, dirs, batch, H]. Layout 1 (v14+) puts batch first: X [batch, T, input], Y [batch, T, dirs, H],
states [batch, dirs, H].
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla import native
from oxla.lowering.registry import rule

Act = Callable[[Any], Any]
Cell = Callable[[tuple, Any], tuple]
HIGHEST = lax.Precision.HIGHEST  # recurrences compound rounding: keep full float32 matmuls

# name -> (f(x, alpha, beta), default alpha, default beta); None: the function takes no such value.
_ACTIVATIONS: dict[str, tuple[Callable[[Any, Any, Any], Any], float | None, float | None]] = {
    "relu": (lambda x, a, b: jnp.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: jnp.tanh(x), None, None),
    # through tanh: XLA:CPU's logistic took 1.6-2.1 ns per element, tanh 0.33; batch-8 LSTM/GRU
    # layers ran in 0.87-0.91x the time this way (differences ~1e-7)
    "sigmoid": (lambda x, a, b: 0.5 * jnp.tanh(0.5 * x) + 0.5, None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: jnp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: jnp.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * jnp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: jnp.where(x >= 0, x, a * jnp.expm1(x)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), None, None),
    "softplus": (lambda x, a, b: jnp.logaddexp(x, 0), None, None),
}



def _apply(f: Any, alpha: Any, beta: Any, x: Any) -> Any:
    return f(x, alpha, beta)


def _activations(cx, names: Sequence[str] | None, alphas: Sequence[float] | None,
                 betas: Sequence[float] | None, defaults: tuple[str, ...], dirs: int) -> list[list[Act]]:
    """Per direction, the activation functions (alpha/beta lists are consumed in order)."""
    names = list(names) if names else list(defaults)
    if len(names) == len(defaults) and dirs == 2:
        names = names * 2  # one set given for a bidirectional layer: both directions use it
    if len(names) != len(defaults) * dirs:
        raise cx.fail(f"activations {names} must name {len(defaults)} functions per direction "
                      f"({dirs} directions)")
    alphas, betas = list(alphas or ()), list(betas or ())
    acts: list[Act] = []
    for name in names:
        entry = _ACTIVATIONS.get(name.lower())
        if entry is None:
            raise cx.fail(f"unknown activation '{name}' (known: {', '.join(_ACTIVATIONS)})")
        f, alpha, beta = entry
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        acts.append(functools.partial(_apply, f, alpha, beta))
    k = len(defaults)
    return [acts[d * k:(d + 1) * k] for d in range(dirs)]


def _directions(cx, direction: str, num: int) -> list[bool]:
    """Whether each direction runs backward in time."""
    table = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}
    if direction not in table:
        raise cx.fail(f"direction must be forward, reverse or bidirectional, got '{direction}'")
    if len(table[direction]) != num:
        raise cx.fail(f"direction '{direction}' needs {len(table[direction])} weight sets in W, got {num}")
    return table[direction]


def _clipper(clip: float | None) -> Act:
    if clip is None:
        return lambda x: x
    return lambda x: jnp.clip(x, -clip, clip)


def _recur(cell: Cell, xw: Any, init: tuple, mask: Any, reverse: bool) -> tuple[Any, tuple]:
    """Run cell over time; steps past a sequence's length keep the state and output zeros."""
    def step(carry: tuple, inputs: tuple) -> tuple:
        xw_t, m_t = inputs
        new = cell(carry, xw_t)
        if m_t is None:
            return new, new[0]
        new = tuple(jnp.where(m_t, n, c) for n, c in zip(new, carry))
        return new, jnp.where(m_t, new[0], 0)

    # Not unrolled: unroll=2..10 measured no faster on XLA:CPU (a step is one matrix-vector
    # product that reads all of R); unrolling 50 steps fully ran 8x slower and compiled in 5-8 s.
    final, y = lax.scan(step, init, (xw, mask), reverse=reverse)  # type: ignore[var-annotated]
    if mask is not None:
        # A sequence of length 0 ends in zero states, not its initial ones (as onnxruntime does).
        final = tuple(jnp.where(mask.any(axis=0), s, 0) for s in final)
    return y, final


Fused = Callable[[Any, Any, Any, Any, list, Any, list[bool]], tuple | None]


def _layer(cx, X, W, R, B, sequence_lens, states: list, *, gates: int, direction: str,
           hidden_size: int | None, layout: int, make_cell: Callable[[int, Any, Any], Cell],
           project: Callable[[int, Any], Any] | None = None, fused: Fused | None = None) -> tuple:
    """The shared driver: returns Y and the final states, in the node's layout.

    `project(d, X)` replaces the input projection X W[d]^T + Wb[d] (quantized variants).
    `fused(xw, Wb, R, Rb, states, sequence_lens, reverse)` may run every direction's time loop
    at once from the input projections xw = X W^T (T, batch, dirs * gates * H) and the biases
    Wb, Rb (dirs, gates * H): it returns (Y, final states) in layout 0, or None to leave them to
    the scans.
    """
    for name, v in (("X", X), ("W", W), ("R", R)):
        cx.expect_rank(name, v, 3)
    if layout not in (0, 1):
        raise cx.fail(f"layout must be 0 or 1, got {layout}")
    reverse = _directions(cx, direction, W.shape[0])
    H = R.shape[-1]
    if hidden_size is not None and hidden_size != H:
        raise cx.fail(f"hidden_size is {hidden_size} but R has shape {tuple(R.shape)}")
    if W.shape[1] != gates * H:
        raise cx.fail(f"W must have {gates}*hidden_size = {gates * H} rows, got shape {tuple(W.shape)}")
    if layout:
        X = jnp.swapaxes(X, 0, 1)
        states = [None if s is None else jnp.swapaxes(s, 0, 1) for s in states]
    T, batch = X.shape[0], X.shape[1]
    if B is None:
        B = jnp.zeros((len(reverse), 2 * gates * H), X.dtype)
    states = [jnp.zeros((len(reverse), batch, H), X.dtype) if s is None else s for s in states]
    mask = None
    if sequence_lens is not None:
        mask = (jnp.arange(T)[:, None] < jnp.reshape(sequence_lens, (1, batch)))[..., None]
    # The input projections of every step and both directions are one dot, hoisted out of the
    # time loop (one dot per direction ran 1.05-1.1x slower: slicing W[d] copied it). Directions
    # stay separate scans: one scan over both (a dot per direction per step) ran 1.2-1.5x slower
    # on XLA:CPU, presumably because the two independent loops overlap.
    ys, finals = [], []
    G = gates * H
    if project is None:  # W [dirs, G, input] read as [dirs*G, input]
        xw_all = jnp.einsum("tbi,gi->tbg", X, jnp.reshape(W, (-1, W.shape[-1])), precision=HIGHEST)
        done = None if fused is None else fused(xw_all, B[:, :G], R, B[:, G:], states,
                                                sequence_lens, reverse)
        if done is not None:
            Y, outs = done
            if layout:
                return jnp.transpose(Y, (2, 0, 1, 3)), *[jnp.swapaxes(s, 0, 1) for s in outs]
            return Y, *outs
        xw_all = xw_all + jnp.reshape(B[:, :G], (-1,))
    for d, backward in enumerate(reverse):
        if project is None:
            xw = xw_all[..., d * G:(d + 1) * G]
        else:
            xw = project(d, X)
        cell = make_cell(d, _recurrent_weights(R[d], T, batch), B[d, gates * H:])
        y, final = _recur(cell, xw, tuple(s[d] for s in states), mask, backward)
        ys.append(y)
        finals.append(final)
    Y = jnp.stack(ys, axis=1)
    outs = [jnp.stack([f[j] for f in finals]) for j in range(len(states))]
    if layout:
        return jnp.transpose(Y, (2, 0, 1, 3)), *[jnp.swapaxes(s, 0, 1) for s in outs]
    return Y, *outs


def _dot(h, w):
    """h [batch, H] times the transpose of w [k, H].

    At batch 1 as the matrix-vector product w h, which reads w's rows in order: XLA:CPU emits
    h w^T as a transposed dot fusion that took 1.5-3x as long per step (w 768x256: 24 us against
    7.5 us, one thread); bidirectional GRU layers of hidden 256 ran in 0.7-0.8x the time.
    """
    if h.shape[0] == 1:
        return jnp.dot(w, h[0], precision=HIGHEST)[None]
    return jnp.dot(h, w.T, precision=HIGHEST)


def _recurrent_weights(r: Any, steps: int, batch: int) -> Any:
    """R of one direction; above batch 1, stored transposed once, before the time loop.

    XLA:CPU's per-step h @ R^T contracts R's rows (an NT product). With R^T laid out once, the
    dot is plain: 0.4-0.8x the time from batch 2 up; at batch 1 the copy does not pay (1.4-1.75x
    at 5-20 steps), nor at batch 8 over 5 steps (1.15x).
    """
    if batch > 1 and steps * batch >= 64:
        return lax.optimization_barrier(r.T).T  # the barrier keeps XLA from folding the copy away
    return r


@rule("RNN", since=7)
def rnn(cx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=("Tanh", "Tanh"), clip=None, direction="forward",
        hidden_size=None, layout=0):
    """H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb); returns Y, Y_h  (v7+; v14+ layout)."""
    if W.shape[0] == 1 and activations and len(activations) == 2:
        activations = activations[:1]  # the default lists two, one per direction: forward uses one
    acts = _activations(cx, activations, activation_alpha, activation_beta, ("Tanh",),
                        W.shape[0])
    clipped = _clipper(clip)

    def make_cell(d: int, r: Any, rb: Any) -> Cell:
        (f,) = acts[d]
        return lambda carry, xw: (f(clipped(xw + _dot(carry[0], r) + rb)),)

    return _layer(cx, X, W, R, B, sequence_lens, [initial_h], gates=1, direction=direction,
                  hidden_size=hidden_size, layout=layout, make_cell=make_cell)


# The native GRU/LSTM loops (oxla/native/kernels.cc, Sgru and Slstm) against the scans, a
# bidirectional GRU of hidden 256 over 50 steps: at two threads batch 1 ~0.5-0.7x the time, 8-64
# 0.42-0.5x, 128-256 0.7x; at one thread batch 1 1.15x (both stream R from L3 once a step), 8
# 0.66x, 32 0.75x (docs/benchmarks.md, thirteenth round). So on one thread, batches only; and a
# layer under NATIVE_MIN_MACS multiply-adds a step (the kernel then runs on one thread) too.
NATIVE_MIN_MACS = 1e5
# False: that op's layers stay XLA's scans (for measuring)
NATIVE_RECURRENT = {"GRU": True, "LSTM": True}
DEFAULT_ACTIVATIONS = {"GRU": ("sigmoid", "tanh"), "LSTM": ("sigmoid", "tanh", "tanh")}


def _native_loop(cx, kind: str, activations: Sequence[str] | None, clip: float | None,
                 attr: int, P: Any = None) -> Fused | None:
    """A GRU's or LSTM's time loops as one oxla_sgru / oxla_slstm call, where the options ask
    for it and the layer is one the kernel runs (default activations, float32; on one thread,
    batches only); `attr` is GRU's linear_before_reset or LSTM's input_forget."""
    if cx.options.native_recurrent <= 0 or not NATIVE_RECURRENT.get(kind, False):
        return None
    default = DEFAULT_ACTIVATIONS[kind]
    names = tuple(a.lower() for a in activations) if activations else default
    if names not in (default, default * 2) or (clip is not None and clip <= 0):
        return None
    lstm = kind == "LSTM"

    def fused(xw, wb, R, rb, states: list, sequence_lens, reverse: list[bool]) -> tuple | None:
        T, batch, H = xw.shape[0], xw.shape[1], R.shape[-1]
        operands = [xw, wb, R, rb, *states] + ([] if P is None else [P])
        gates = 4 if lstm else 3
        # the kernel's own rule (kernels.cc, GRU_PART_MACS): under two parts' worth, one thread
        alone = cx.options.native_recurrent == 1 or gates * H * H * batch < NATIVE_MIN_MACS
        if (min(T, batch, H) < 1 or (alone and batch == 1)
                or any(v.dtype != jnp.float32 for v in operands) or not native.available()):
            return None
        dirs = len(reverse)
        if ((P is not None and tuple(P.shape) != (dirs, 3 * H))
                or (sequence_lens is not None and sequence_lens.size != batch)):
            return None  # the scans raise the node's error
        lens = (jnp.zeros((0,), jnp.int32) if sequence_lens is None
                else jnp.reshape(sequence_lens, (-1,)).astype(jnp.int32))
        state = jax.ShapeDtypeStruct((dirs, batch, H), jnp.float32)
        out = (jax.ShapeDtypeStruct((T, dirs, batch, H), jnp.float32), state) + ((state,) if lstm else ())
        # R per direction: XLA folds the slices of the per-direction parameters' Concat
        # (recurrent_weights_per_direction) away, so R is never copied.
        head = [jnp.reshape(xw, (T * batch, -1)), wb, R[0], R[dirs - 1], rb]
        if lstm:
            peep = jnp.zeros((0,), jnp.float32) if P is None else jnp.reshape(P, (-1,))
            args = [*head, peep, *states, lens]
            flag = {"input_forget": np.int64(1 if attr else 0)}
        else:
            args = [*head, *states, lens]
            flag = {"linear_before_reset": np.int64(1 if attr else 0)}
        y, *finals = jax.ffi.ffi_call(native.LSTM_TARGET if lstm else native.GRU_TARGET, out)(
            *args, threads=np.int64(cx.options.native_recurrent), **flag,
            reverse=np.int64(1 if reverse == [True] else 0),
            clip=np.float32(0.0 if clip is None else clip))
        return y, finals
    return fused


@rule("GRU", since=7)
def gru(cx, X, W, R, B=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    """z, r = f(..), h = g(X Wh^T + (r*H) Rh^T + ..) (or r*(H Rh^T + Rbh) when linear_before_reset);
    H_t = (1-z)*h + z*H_{t-1}; gates ordered z, r, h  (v7+; v14+ layout)."""
    acts = _activations(cx, activations, activation_alpha, activation_beta, ("Sigmoid", "Tanh"),
                        W.shape[0])
    clipped = _clipper(clip)

    def make_cell(d: int, r: Any, rb: Any) -> Cell:
        f, g = acts[d]
        H = r.shape[-1]
        r_zr, r_h = r[:2 * H], r[2 * H:]  # sliced once, outside the time loop

        def cell(carry: tuple, xw: Any) -> tuple:
            (h,) = carry
            if linear_before_reset:  # one dot per step for all three gates
                hr = _dot(h, r) + rb
                zr, hh = xw[:, :2 * H] + hr[:, :2 * H], hr[:, 2 * H:]
            else:
                zr = xw[:, :2 * H] + _dot(h, r_zr) + rb[:2 * H]
            z, reset = f(clipped(zr[:, :H])), f(clipped(zr[:, H:]))
            if linear_before_reset:
                cand = xw[:, 2 * H:] + reset * hh
            else:
                cand = xw[:, 2 * H:] + _dot(reset * h, r_h) + rb[2 * H:]
            return ((1 - z) * g(clipped(cand)) + z * h,)
        return cell

    return _layer(cx, X, W, R, B, sequence_lens, [initial_h], gates=3, direction=direction,
                  hidden_size=hidden_size, layout=layout, make_cell=make_cell,
                  fused=_native_loop(cx, "GRU", activations, clip, linear_before_reset))


@rule("LSTM", since=7)
def lstm(cx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    """i, f, o = f(.. + P*C), C_t = f*C_{t-1} + i*g(..), H_t = o*h(C_t); gates ordered i, o, f, c,
    peepholes i, o, f; returns Y, Y_h, Y_c  (v7+; v14+ layout)."""
    return lstm_layer(cx, X, W, R, B, sequence_lens, initial_h, initial_c, P,
                      activation_alpha=activation_alpha, activation_beta=activation_beta,
                      activations=activations, clip=clip, direction=direction,
                      hidden_size=hidden_size, input_forget=input_forget, layout=layout)


def lstm_layer(cx, X, W, R, B, sequence_lens, initial_h, initial_c, P, *, activation_alpha,
               activation_beta, activations, clip, direction, hidden_size, input_forget, layout,
               recur: Callable[[int, Any, Any], Any] | None = None,
               project: Callable[[int, Any], Any] | None = None) -> tuple:
    """LSTM; `recur(d, h, R[d])` replaces h R[d]^T and `project` the input projection (the
    quantized com.microsoft variant computes both as dynamically quantized int8 products)."""
    acts = _activations(cx, activations, activation_alpha, activation_beta,
                        ("Sigmoid", "Tanh", "Tanh"), W.shape[0])
    clipped = _clipper(clip)

    def make_cell(d: int, r: Any, rb: Any) -> Cell:
        f, g, h_act = acts[d]
        H = r.shape[-1]
        p = None if P is None else P[d]

        def peep(k: int, v: Any) -> Any:  # the k-th peephole term; none without P (XLA keeps v*0)
            return 0 if p is None else p[k * H:(k + 1) * H] * v

        def cell(carry: tuple, xw: Any) -> tuple:
            h, c = carry
            z = xw + (_dot(h, r) if recur is None else recur(d, h, r)) + rb
            i = f(clipped(z[:, :H] + peep(0, c)))
            # input_forget couples the gates: what is forgotten is what gets written.
            forget = 1 - i if input_forget else f(clipped(z[:, 2 * H:3 * H] + peep(2, c)))
            c_new = forget * c + i * g(clipped(z[:, 3 * H:]))
            o = f(clipped(z[:, H:2 * H] + peep(1, c_new)))
            return o * h_act(c_new), c_new
        return cell

    fused = None
    if recur is None and project is None:
        fused = _native_loop(cx, "LSTM", activations, clip, input_forget, P)
    return _layer(cx, X, W, R, B, sequence_lens, [initial_h, initial_c], gates=4,
                  direction=direction, hidden_size=hidden_size, layout=layout,
                  make_cell=make_cell, project=project, fused=fused)
