"""oxla.native::Gemm* and Conv*: Y = act(X @ W + B (+ R)) and its convolution through oxla's
own kernels.

The kernels: oxla/native/kernels.cc.

NativeGemmPass (oxla/passes/native_gemm.py) makes these nodes, with W packed into panels of 32
columns, (ceil(N / 32), K, 32), and B always present (zeros where the model had none): N is B's
length. The op type names the epilogue: Gemm, then Add when a residual R (Y's shape) is the 4th
input, then the activation (Relu, Clip with its bounds as the last two inputs, Silu, HardSwish).
The rule calls the kernel through an XLA FFI custom call on the cores the plan was made for
(`Options.native_threads`, capped by the client's intra-op pool). Where the kernel cannot be
used when the node is traced (not float32, or no longer available) it unpacks W and computes
the same with XLA. A planned model loaded again runs the ops' model-local function bodies.

Conv* (Conv, ConvRelu, ConvAddRelu, ...) is the same for a 2-D convolution of a channels-last X
(N, H, W, C) with group 1: W is the (KH, KW, C, M) kernel as (KH KW C, M), packed alike, and the
node carries kernel_shape, strides, pads and dilations as ONNX's Conv does (all explicit).

Stem* (Stem, StemRelu, ...) is a 2-D group-1 convolution over a few channels of a channels-first
X (N, C, H, W), the model's image before the transpose ChannelsLastPass put at the graph's edge,
with a channels-last Y (N, OH, OW, M); W packed as Conv*'s, the same attributes, and out_pads:
Y zero padded (ONNX Pad's 8 pads, on its height and width only; the next Conv's padding).

Wino* (Wino, WinoRelu, WinoAddRelu, ...) is a 3x3 convolution (stride 1, dilation 1, padding 1)
of a channels-last X by Winograd F(2x2, 3x3): W is its transform U = G g G^T (4, 4, C, M) as 16
(C, M) products, each packed like a GEMM's W: (16, ceil(M / 32), C, 32); B, R and the
activation as Gemm*'s.

Depthwise* (Depthwise, DepthwiseRelu, ...) is a 2-D depthwise convolution (group = X's channels,
C / group output channels each) of a channels-last X: W is (KH, KW, C), B (C,), the node carries
strides, pads, dilations and group (for its function body) as ONNX's Conv does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla import native
from oxla.lowering.ops.elementwise import sigmoid
from oxla.lowering.ops.winograd import convolve
from oxla.lowering.registry import rule

DOMAIN = "oxla.native"
# What the depthwise kernel can apply to X as it loads it (after a bias): kernels.cc's dw_part.
# SiLU's division per load is left to the GEMM epilogue that makes EfficientNet's products.
PRE_ACTIVATIONS = ("Relu", "Clip", "HardSwish")
# activation name -> the kernel's code (kernels.cc, enum Act)
ACTIVATIONS = {"": 0, "Relu": 1, "Clip": 2, "Silu": 3, "HardSwish": 4}


def op_type(residual: bool, activation: str, base: str = "Gemm") -> str:
    """The op type for an epilogue: Gemm[Add][activation] (base "Conv": Conv[Add][activation])."""
    return base + ("Add" if residual else "") + activation


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


def _check_packed(cx, w, b, group: int = 1) -> None:
    """W packed for B's N columns: (ceil(N / 32), K, 32), B (N,); in `group` groups, each its own
    panels: (group ceil(N / group / 32), K, 32)."""
    n = b.shape[0] if b.ndim == 1 else -1
    panels = group * -(-max(n, 1) // group // native.NR)
    if w.ndim != 3 or w.shape[2] != native.NR or n < 1 or n % group or w.shape[0] != panels:
        raise cx.shape_error(f"W {tuple(w.shape)} is not packed for the {tuple(b.shape)} bias "
                             f"in {group} group(s) (want ({panels}, K, {native.NR})); this node "
                             f"was not made by oxla's planner")


def _check_window(cx, kernel, strides, pads, dilations) -> None:
    if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        raise cx.fail(f"kernel {list(kernel)}, strides {list(strides)} and dilations "
                      f"{list(dilations)} must be at least 1 and pads {list(pads)} at least 0; "
                      f"this node was not made by oxla's planner")


def _conv_window(cx, w, b, kernel_shape, strides, pads, dilations, group: int = 1):
    """A Conv*/Stem* node's checked window as ints ((kh, kw), (sh, sw), (pt, pl, pb, pr),
    (dh, dw)), W packed for B (in `group` groups)."""
    window = (kernel_shape, strides, pads, dilations)
    if any(a is None for a in window) or [len(a) for a in window] != [2, 2, 4, 2]:
        raise cx.fail("needs 2-D kernel_shape, strides, pads and dilations attributes, all given "
                      "(NativeGemmPass writes them); this node was not made by oxla's planner")
    _check_packed(cx, w, b, group)
    _check_window(cx, kernel_shape, strides, pads, dilations)
    return tuple(tuple(int(v) for v in a) for a in window)


def _out_sizes(cx, x, kernel, strides, pads, dilations) -> tuple[int, int]:
    """(OH, OW) of a 2-D window over channels-last X, which must hold one window at least."""
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = kernel, strides, pads, dilations
    oh = (x.shape[1] + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (x.shape[2] + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise cx.shape_error(f"X {tuple(x.shape)} is smaller than the {kh}x{kw} kernel's "
                             f"window (pads {list(pads)}, dilations {list(dilations)})")
    return oh, ow


def _check_residual(cx, r, shape: tuple[int, ...], what: str) -> None:
    """The residual Add's other input R broadcasts with the kernel's result `shape`."""
    if r is None:
        return
    try:
        np.broadcast_shapes(shape, tuple(r.shape))
    except ValueError:
        raise cx.shape_error(f"the residual Add's other input {tuple(r.shape)} does not "
                             f"broadcast with the {what} {shape}") from None


def _kernel_call(cx, target: str, shape: tuple[int, ...], x, w, b, r, activation: str,
                 lo: float, hi: float, alone, **window):
    """The kernel `target` on X, W, B with its epilogue (R, the activation); a residual of
    another shape or dtype is added after the product `alone()` as ONNX would."""
    out = jax.ShapeDtypeStruct(shape, jnp.float32)
    if r is not None and (r.shape != out.shape or r.dtype != jnp.float32):
        return _epilogue(alone() + r, activation, lo, hi)
    residual = jnp.zeros((0,), jnp.float32) if r is None else r
    return jax.ffi.ffi_call(target, out)(
        x, w, b, residual, threads=np.int64(max(1, cx.options.native_threads)),
        act=np.int64(ACTIVATIONS[activation]), lo=np.float32(lo), hi=np.float32(hi),
        **{k: np.int64(v) for k, v in window.items()})


def _gemm(cx, x, w, b, r, activation: str, lo: float = 0.0, hi: float = 0.0):
    _check_packed(cx, w, b)
    n = b.shape[0]
    if x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise cx.shape_error(f"X {tuple(x.shape)} has {x.shape[-1] if x.ndim else 0} channels "
                             f"where the 1x1 kernel reads {w.shape[1]}; check the model's "
                             f"Conv input")
    _check_residual(cx, r, (*x.shape[:-1], n), "product")
    if x.dtype == jnp.float32 and native.available():
        return _kernel_call(cx, native.GEMM_TARGET, (*x.shape[:-1], n), x, w, b, r, activation,
                            lo, hi, lambda: _gemm(cx, x, w, b, None, ""))
    kn = jnp.transpose(w, (1, 0, 2)).reshape((w.shape[1], -1))[:, :n]
    y = lax.dot_general(x, kn.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ()))) + b.astype(x.dtype)
    if r is not None:
        y = y + r.astype(y.dtype)
    return _epilogue(y, activation, lo, hi)


def _conv(cx, x, w, b, r, activation: str, lo: float, hi: float, kernel_shape, strides, pads,
          dilations, group: int = 1):
    """Conv*: W packed as the kernel reads it; with `group` > 1 X's channels and Y's in that many
    equal groups, each group's W panels of its own (NativeGemmPass packs a grouped convolution's
    groups so, several of the model's groups in one where they are narrow)."""
    n = b.shape[0]
    group = int(group)
    if group < 1:
        raise cx.fail(f"group {group} must be at least 1; this node was not made by oxla's planner")
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = _conv_window(cx, w, b, kernel_shape, strides,
                                                                  pads, dilations, group)
    c = w.shape[1] // (kh * kw)
    if x.ndim != 4 or x.shape[-1] != c * group or c * kh * kw != w.shape[1]:
        raise cx.shape_error(f"X {tuple(x.shape)} is not (N, H, W, {c * group}) as the {kh}x{kw} "
                             f"kernel reads; check the model's Conv input")
    oh, ow = _out_sizes(cx, x, (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw))
    shape = (x.shape[0], oh, ow, n)
    _check_residual(cx, r, shape, "convolution's")
    if x.dtype == jnp.float32 and native.available():
        return _kernel_call(
            cx, native.CONV_TARGET, shape, x, w, b, r, activation, lo, hi,
            lambda: _conv(cx, x, w, b, None, "", 0.0, 0.0, kernel_shape, strides, pads, dilations,
                          group),
            kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw, pt=pt, pl=pl, groups=group)
    # each group's panels side by side, their columns past the group's N / group dropped
    kg = jnp.transpose(w.reshape((group, -1, *w.shape[1:])), (2, 0, 1, 3))  # (K, group, PP, NR)
    hwio = kg.reshape((w.shape[1], group, -1))[..., :n // group].reshape((kh, kw, c, n))
    y = lax.conv_general_dilated(x, hwio.astype(x.dtype), (sh, sw), [(pt, pb), (pl, pr)],
                                 rhs_dilation=(dh, dw), dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 feature_group_count=group) + b.astype(x.dtype)
    if r is not None:
        y = y + r.astype(y.dtype)
    return _epilogue(y, activation, lo, hi)


def _stem(cx, x, w, b, activation: str, lo: float, hi: float, kernel_shape, strides, pads,
          dilations, out_pads):
    """Stem*: the convolution of channels-first X, channels-last Y (oxla's stem kernel), Y then
    zero padded by out_pads (ONNX Pad's pads for (N, H, W, C), zero on N and C)."""
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = _conv_window(cx, w, b, kernel_shape, strides,
                                                                  pads, dilations)
    if x.ndim != 4:
        raise cx.shape_error(f"X {tuple(x.shape)} is not an (N, C, H, W) image; check the "
                             f"model's input")
    if x.shape[1] * kh * kw != w.shape[1]:
        raise cx.shape_error(f"X {tuple(x.shape)} does not have the {w.shape[1] // (kh * kw)} "
                             f"channels (axis 1) the {kh}x{kw} kernel reads; check the model's "
                             f"Conv input")
    out_pads = [0] * 8 if out_pads is None else [int(v) for v in out_pads]
    if len(out_pads) != 8 or min(out_pads) < 0 or any(out_pads[i] for i in (0, 3, 4, 7)):
        raise cx.fail(f"out_pads {out_pads} must be 8 pads of Y's height and width, at least 0; "
                      f"this node was not made by oxla's planner")
    ot, ol, ob, orr = out_pads[1], out_pads[2], out_pads[5], out_pads[6]
    last = jnp.transpose(x, (0, 2, 3, 1))
    if not (x.dtype == jnp.float32 and native.available()):
        y = _conv(cx, last, w, b, None, activation, lo, hi, kernel_shape, strides, pads,
                  dilations)
        return jnp.pad(y, ((0, 0), (ot, ob), (ol, orr), (0, 0)))
    oh, ow = _out_sizes(cx, last, (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw))
    out = jax.ShapeDtypeStruct((x.shape[0], ot + oh + ob, ol + ow + orr, b.shape[0]),
                               jnp.float32)
    i64 = np.int64
    return jax.ffi.ffi_call(native.STEM_TARGET, out)(
        x, w, b, threads=i64(max(1, cx.options.native_threads)),
        act=i64(ACTIVATIONS[activation]), lo=np.float32(lo), hi=np.float32(hi), kh=i64(kh),
        kw=i64(kw), sh=i64(sh), sw=i64(sw), dh=i64(dh), dw=i64(dw), pt=i64(pt), pl=i64(pl),
        channels_first=i64(1), out_top=i64(ot), out_left=i64(ol), out_bottom=i64(ob),
        out_right=i64(orr))


def _register_stem(activation: str) -> None:
    name = op_type(False, activation, "Stem")
    if activation == "Clip":
        def fn(cx, x, w, b, lo, hi, *, kernel_shape=None, strides=None, pads=None,
               dilations=None, out_pads=None):
            return _stem(cx, x, w, b, "Clip", float(cx.static(lo)), float(cx.static(hi)),
                         kernel_shape, strides, pads, dilations, out_pads)
        rule(name, since=1, domain=DOMAIN, static=("lo", "hi"))(fn)
    else:
        def fn_p(cx, x, w, b, *, kernel_shape=None, strides=None, pads=None, dilations=None,
                 out_pads=None):
            return _stem(cx, x, w, b, activation, 0.0, 0.0, kernel_shape, strides, pads,
                         dilations, out_pads)
        rule(name, since=1, domain=DOMAIN)(fn_p)


def _register_conv(residual: bool, activation: str) -> None:
    name = op_type(residual, activation, "Conv")
    if activation == "Clip":
        if residual:
            def fn(cx, x, w, b, r, lo, hi, *, kernel_shape=None, strides=None, pads=None,
                   dilations=None, group=1):
                return _conv(cx, x, w, b, r, "Clip", float(cx.static(lo)), float(cx.static(hi)),
                             kernel_shape, strides, pads, dilations, group)
        else:
            def fn(cx, x, w, b, lo, hi, *, kernel_shape=None,  # type: ignore[misc]
                   strides=None, pads=None, dilations=None, group=1):
                return _conv(cx, x, w, b, None, "Clip", float(cx.static(lo)),
                             float(cx.static(hi)), kernel_shape, strides, pads, dilations, group)
        rule(name, since=1, domain=DOMAIN, static=("lo", "hi"))(fn)
    elif residual:
        def fn_r(cx, x, w, b, r, *, kernel_shape=None, strides=None, pads=None,
                 dilations=None, group=1):
            return _conv(cx, x, w, b, r, activation, 0.0, 0.0, kernel_shape, strides, pads,
                         dilations, group)
        rule(name, since=1, domain=DOMAIN)(fn_r)
    else:
        def fn_p(cx, x, w, b, *, kernel_shape=None, strides=None, pads=None,
                 dilations=None, group=1):
            return _conv(cx, x, w, b, None, activation, 0.0, 0.0, kernel_shape, strides, pads,
                         dilations, group)
        rule(name, since=1, domain=DOMAIN)(fn_p)


def _depthwise(cx, x, w, b, activation: str, lo: float, hi: float, strides, pads, dilations,
               pre: tuple[Any, str, float, float] | None = None, group: int | None = None):
    """The depthwise convolution of X, or of pre_act(X + pre_bias) when `pre` = (pre_bias,
    pre_act, its lo, its hi). `group` is X's channel count (the Conv's group; W's C when absent):
    W's C output channels are C / group of each input channel's (a channel multiplier)."""
    window = (strides, pads, dilations)
    if any(a is None for a in window) or [len(a) for a in window] != [2, 4, 2] or w.ndim != 3:
        raise cx.fail("needs a (KH, KW, C) kernel and 2-D strides, pads and dilations attributes, "
                      "all given (DepthwisePass writes them); this node was not made by oxla's "
                      "planner")
    _check_window(cx, w.shape, strides, pads, dilations)
    kh, kw, c = (int(v) for v in w.shape)
    ci = c if group is None else int(group)
    if ci < 1 or c % ci:
        raise cx.fail(f"group {ci} does not divide the kernel's {c} output channels; this node "
                      f"was not made by oxla's planner")
    sh, sw = (int(v) for v in strides)
    dh, dw = (int(v) for v in dilations)
    pt, pl, pb, pr = (int(v) for v in pads)
    if x.ndim != 4 or x.shape[-1] != ci:
        raise cx.shape_error(f"X {tuple(x.shape)} is not (N, H, W, {ci}) as the depthwise kernel "
                             f"reads; check the model's Conv input")
    for what, v, n in (("bias", b, c), ("pre-activation's bias", None if pre is None else pre[0], ci)):
        if v is not None and tuple(v.shape) != (n,):
            raise cx.shape_error(f"the {what} {tuple(v.shape)} is not ({n},) as the kernel "
                                 f"{tuple(w.shape)} of group {ci}; this node was not made by "
                                 f"oxla's planner")
    oh, ow = _out_sizes(cx, x, (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw))
    if x.dtype == jnp.float32 and native.available():
        return depthwise(x, w, b, (oh, ow), (sh, sw), (pt, pl), (dh, dw),
                         max(1, cx.options.native_threads), activation, lo, hi, pre)
    if pre is not None:
        x = _epilogue(x + pre[0].astype(x.dtype), *pre[1:])
    y = lax.conv_general_dilated(x, w.astype(x.dtype)[:, :, None, :], (sh, sw),
                                 [(pt, pb), (pl, pr)], rhs_dilation=(dh, dw),
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 feature_group_count=ci) + b.astype(x.dtype)
    return _epilogue(y, activation, lo, hi)


def depthwise(x, w, b, out: tuple[int, int], strides: tuple[int, int], begin: tuple[int, int],
              dilations: tuple[int, int], threads: int, activation: str = "", lo: float = 0.0,
              hi: float = 0.0, pre: tuple[Any, str, float, float] | None = None):
    """The native depthwise kernel's call: float32 X (N, H, W, CX), W (KH, KW, C), B (C,) (C a
    multiple of CX: C / CX output channels each input channel's), the output's (OH, OW) and the
    pads before each axis (those after follow from OH, OW); `pre` (pre_bias (CX,), pre_act, lo,
    hi): X is read as pre_act(X + pre_bias)."""
    i64 = np.int64
    shape = jax.ShapeDtypeStruct((x.shape[0], *out, w.shape[-1]), jnp.float32)
    pre_bias, pre_act, pre_lo, pre_hi = pre if pre is not None else (
        jnp.zeros((0,), jnp.float32), None, 0.0, 0.0)
    return jax.ffi.ffi_call(native.DEPTHWISE_TARGET, shape)(
        x, w, b, pre_bias.astype(jnp.float32), threads=i64(threads),
        act=i64(ACTIVATIONS[activation]), lo=np.float32(lo), hi=np.float32(hi),
        sh=i64(strides[0]), sw=i64(strides[1]), dh=i64(dilations[0]), dw=i64(dilations[1]),
        pt=i64(begin[0]), pl=i64(begin[1]),
        pre_act=i64(-1 if pre_act is None else ACTIVATIONS[pre_act]), pre_lo=np.float32(pre_lo),
        pre_hi=np.float32(pre_hi))


def depthwise_op_type(pre: str | None, activation: str) -> str:
    """[pre activation]Depthwise[activation]: ReluDepthwise, HardSwishDepthwiseHardSwish, ..."""
    return (pre or "") + "Depthwise" + activation


def _register_depthwise(pre: str | None, activation: str) -> None:
    """X, W, B, then the pre-activation's bias (with one), then Clip's bounds: the
    pre-activation's, then the activation's."""

    def fn(cx, x, w, b, e1=None, e2=None, e3=None, e4=None, e5=None, *, strides=None, pads=None,
           dilations=None, group=None):
        extra = [v for v in (e1, e2, e3, e4, e5) if v is not None]
        pre_bias = extra.pop(0) if pre else None
        bounds = [float(cx.static(v)) for v in extra]
        pre_lo, pre_hi = (bounds.pop(0), bounds.pop(0)) if pre == "Clip" else (0.0, 0.0)
        lo, hi = (bounds[0], bounds[1]) if activation == "Clip" else (0.0, 0.0)
        return _depthwise(cx, x, w, b, activation, lo, hi, strides, pads, dilations,
                          None if pre is None else (pre_bias, pre, pre_lo, pre_hi), group)

    bounds = ("e2", "e3", "e4", "e5") if pre else ("e1", "e2", "e3", "e4", "e5")
    rule(depthwise_op_type(pre, activation), since=1, domain=DOMAIN, static=bounds)(fn)


def _register(residual: bool, activation: str, base: str = "Gemm", run: Any = _gemm) -> None:
    name = op_type(residual, activation, base)
    if activation == "Clip":
        bounds = ("lo", "hi")
        if residual:
            def fn(cx, x, w, b, r, lo, hi):
                return run(cx, x, w, b, r, "Clip", float(cx.static(lo)), float(cx.static(hi)))
        else:
            def fn(cx, x, w, b, lo, hi):  # type: ignore[misc]
                return run(cx, x, w, b, None, "Clip", float(cx.static(lo)),
                           float(cx.static(hi)))
        rule(name, since=1, domain=DOMAIN, static=bounds)(fn)
    elif residual:
        rule(name, since=1, domain=DOMAIN)(lambda cx, x, w, b, r: run(cx, x, w, b, r, activation))
    else:
        rule(name, since=1, domain=DOMAIN)(lambda cx, x, w, b: run(cx, x, w, b, None, activation))


def _winograd(cx, x, w, b, r, activation: str, lo: float = 0.0, hi: float = 0.0):
    """Wino*: the 3x3 convolution (stride 1, padding 1) of channels-last X whose Winograd
    transform U (4, 4, C, N) is packed as 16 products' W: (16, ceil(N / 32), C, 32)."""
    n = b.shape[0] if b.ndim == 1 else -1
    if w.ndim != 4 or w.shape[0] != 16 or w.shape[3] != native.NR or n < 1 \
            or w.shape[1] != -(-n // native.NR):
        raise cx.shape_error(f"W {tuple(w.shape)} is not a Winograd transform packed for the "
                             f"{tuple(b.shape)} bias (want (16, {-(-max(n, 1) // native.NR)}, C, "
                             f"{native.NR})); this node was not made by oxla's planner")
    c = w.shape[2]
    if x.ndim != 4 or x.shape[-1] != c:
        raise cx.shape_error(f"X {tuple(x.shape)} is not (N, H, W, {c}) as the 3x3 kernel reads; "
                             f"check the model's Conv input")
    shape = (*x.shape[:3], n)
    _check_residual(cx, r, shape, "convolution's")
    if x.dtype == jnp.float32 and native.available() \
            and all(isinstance(d, int) for d in x.shape):
        return _kernel_call(cx, native.WINOGRAD_TARGET, shape, x, w, b, r, activation, lo, hi,
                            lambda: _winograd(cx, x, w, b, None, ""))
    u = jnp.transpose(w, (0, 2, 1, 3)).reshape((16, c, -1))[:, :, :n].reshape((4, 4, c, n))
    y = convolve(x, u.astype(x.dtype)) + b.astype(x.dtype)
    if r is not None:
        y = y + r.astype(y.dtype)
    return _epilogue(y, activation, lo, hi)


for _residual in (False, True):
    for _activation in ACTIVATIONS:
        _register(_residual, _activation)
        _register(_residual, _activation, "Wino", _winograd)
        _register_conv(_residual, _activation)
for _activation in ACTIVATIONS:
    _register_stem(_activation)
    for _pre in (None, *PRE_ACTIVATIONS):
        _register_depthwise(_pre, _activation)

