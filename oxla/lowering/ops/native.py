"""oxla.native::Gemm*: Y = act(X @ W + B (+ R)) through oxla's own GEMM kernel.

The kernel: oxla/native/kernels.cc.

NativeGemmPass (oxla/passes/native_gemm.py) makes these nodes, with W packed into panels of 32
columns, (ceil(N / 32), K, 32), and B always present (zeros where the model had none): N is B's
length. The op type names the epilogue: Gemm, then Add when a residual R (Y's shape) is the 4th
input, then the activation (Relu, Clip with its bounds as the last two inputs, Silu, HardSwish).
The rule calls the kernel through an XLA FFI custom call on the cores the plan was made for
(`Options.native_threads`, capped by the client's intra-op pool). Where the kernel cannot be
used when the node is traced (not float32, or no longer available) it unpacks W and computes
the same with XLA. A planned model loaded again runs the ops' model-local function bodies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla import native
from oxla.lowering.ops.elementwise import sigmoid
from oxla.lowering.registry import rule

DOMAIN = "oxla.native"
# activation name -> the kernel's code (kernels.cc, enum Act)
ACTIVATIONS = {"": 0, "Relu": 1, "Clip": 2, "Silu": 3, "HardSwish": 4}


def op_type(residual: bool, activation: str) -> str:
    """The op type for an epilogue: Gemm[Add][activation]."""
    return "Gemm" + ("Add" if residual else "") + activation


def _epilogue(y, activation: str, lo: float, hi: float):
    if activation == "Relu":
        return jnp.maximum(y, np.float32(0))
    if activation == "Clip":
        return jnp.clip(y, np.float32(lo), np.float32(hi))
    if activation == "Silu":
        return y * sigmoid(y)
    if activation == "HardSwish":
        return y * jnp.clip(y * np.float32(1 / 6) + np.float32(0.5), 0, 1)
    return y


def _gemm(cx, x, w, b, r, activation: str, lo: float = 0.0, hi: float = 0.0):
    n = b.shape[0]
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise cx.shape_error(f"X {tuple(x.shape)} has {x.shape[-1] if x.ndim else 0} channels "
                             f"where the 1x1 kernel reads {w.shape[1]}; check the model's "
                             f"Conv input")
    if r is not None:
        try:
            np.broadcast_shapes((*x.shape[:-1], n), tuple(r.shape))
        except ValueError:
            raise cx.shape_error(f"the residual Add's other input {tuple(r.shape)} does not "
                                 f"broadcast with the product {(*x.shape[:-1], n)}") from None
    if x.dtype == jnp.float32 and native.available():
        out = jax.ShapeDtypeStruct((*x.shape[:-1], n), jnp.float32)
        if r is not None and (r.shape != out.shape or r.dtype != jnp.float32):
            # broadcast (or mistyped) residual: the product alone, the rest as ONNX would
            y = _gemm(cx, x, w, b, None, "")
            return _epilogue(y + r, activation, lo, hi)
        residual = jnp.zeros((0,), jnp.float32) if r is None else r
        return jax.ffi.ffi_call(native.GEMM_TARGET, out)(
            x, w, b, residual, threads=np.int64(max(1, cx.options.native_threads)),
            act=np.int64(ACTIVATIONS[activation]), lo=np.float32(lo), hi=np.float32(hi))
    kn = jnp.transpose(w, (1, 0, 2)).reshape((w.shape[1], -1))[:, :n]
    y = lax.dot_general(x, kn.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ()))) + b.astype(x.dtype)
    if r is not None:
        y = y + r.astype(y.dtype)
    return _epilogue(y, activation, lo, hi)


def _register(residual: bool, activation: str) -> None:
    name = op_type(residual, activation)
    if activation == "Clip":
        bounds = ("lo", "hi")
        if residual:
            def fn(cx, x, w, b, r, lo, hi):
                return _gemm(cx, x, w, b, r, "Clip", float(cx.static(lo)), float(cx.static(hi)))
        else:
            def fn(cx, x, w, b, lo, hi):  # type: ignore[misc]
                return _gemm(cx, x, w, b, None, "Clip", float(cx.static(lo)),
                             float(cx.static(hi)))
        rule(name, since=1, domain=DOMAIN, static=bounds)(fn)
    elif residual:
        rule(name, since=1, domain=DOMAIN)(lambda cx, x, w, b, r: _gemm(cx, x, w, b, r, activation))
    else:
        rule(name, since=1, domain=DOMAIN)(lambda cx, x, w, b: _gemm(cx, x, w, b, None, activation))


for _residual in (False, True):
    for _activation in ACTIVATIONS:
        _register(_residual, _activation)

