"""Convolutions (N-D, channels first): Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.ops import conv_forms
from oxla.lowering.ops.qmath import int_conv
from oxla.lowering.registry import rule

Pads = list[tuple[int, int]]
SAME = ("SAME_UPPER", "SAME_LOWER")


# --- window geometry: strides, dilations, pads, auto_pad (pool.py shares it) ---------------------

def spatial_ints(cx, name: str, value: Sequence[int] | None, n: int,
                 default: int) -> tuple[int, ...]:
    """An ints attribute with one value per spatial axis; `default` on every axis when absent."""
    if value is None:
        return (default,) * n
    if len(value) != n:
        raise cx.fail(f"{name} must have {n} values (one per spatial axis), got {list(value)}")
    return tuple(int(v) for v in value)


def explicit_pads(cx, pads: Sequence[int] | None, n: int) -> Pads:
    """ONNX pads [x1_begin, x2_begin, ..., x1_end, x2_end, ...] as (begin, end) per axis."""
    if pads is None:
        return [(0, 0)] * n
    if len(pads) != 2 * n:
        raise cx.fail(f"pads must have {2 * n} values (begin and end per spatial axis), "
                      f"got {list(pads)}")
    return [(int(pads[i]), int(pads[i + n])) for i in range(n)]


def split_padding(total: int, extra_at_end: bool) -> tuple[int, int]:
    """Split a total padding in two halves; the odd element goes to the end or the beginning."""
    small = total // 2
    return (small, total - small) if extra_at_end else (total - small, small)


def window_pads(cx, auto_pad: str, pads: Sequence[int] | None, sizes: Sequence[int],
                kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]) -> Pads:
    """Begin/end padding per spatial axis; SAME_* pads so that out = ceil(in / stride)."""
    n = len(sizes)
    if auto_pad in ("NOTSET", ""):
        return explicit_pads(cx, pads, n)
    if auto_pad == "VALID":
        return [(0, 0)] * n
    if auto_pad not in SAME:
        raise cx.fail(f"auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '{auto_pad}'")
    out = []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        out.append(split_padding(total, auto_pad == "SAME_UPPER"))
    return out


def _channels_first(n: int) -> lax.ConvDimensionNumbers:
    # ONNX layouts: X and Y are (N, C, D1..Dn), W is (M, C/group, k1..kn)
    spec = tuple(range(n + 2))
    return lax.ConvDimensionNumbers(spec, spec, spec)


def _check_conv_shapes(cx, x, w, group: int, kernel_shape: Sequence[int] | None) -> int:
    """The number of spatial axes, after checking X, W, group and kernel_shape agree."""
    if x.ndim < 3:
        raise cx.fail(f"input X must have rank >= 3 (N, C, spatial...), got shape {tuple(x.shape)}")
    if w.ndim != x.ndim:
        raise cx.fail(f"input W must have the rank of X ({x.ndim}), got shape {tuple(w.shape)}")
    if kernel_shape is not None and tuple(kernel_shape) != tuple(w.shape[2:]):
        raise cx.fail(f"kernel_shape {list(kernel_shape)} does not match W's spatial shape "
                      f"{list(w.shape[2:])}")
    if group < 1:
        raise cx.fail(f"group must be >= 1, got {group}")
    return x.ndim - 2


def _add_bias(y, b):
    if b is None:
        return y
    return y + b.reshape((-1,) + (1,) * (y.ndim - 2)).astype(y.dtype)


# --- Conv ---------------------------------------------------------------------------------------

def _conv(cx, x, w, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    s, padding, d = conv_window(cx, x, w, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides)
    # XLA:CPU's grouped convolution is its slowest kernel: each shape class gets the form that
    # ran fastest for it (conv_forms.choose, measured by benchmarks/conv.py)
    form = conv_forms.choose(x.shape[2:], w.shape, s, padding, d, group)
    return form(x, w, s, padding, d, group)


@rule("Conv", since=1)
def conv(cx, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    """Y = X (*) W + B: N-D cross-correlation with strides, dilations, pads and groups (v1+)."""
    y = _conv(cx, x, w, auto_pad=auto_pad, dilations=dilations, group=group,
              kernel_shape=kernel_shape, pads=pads, strides=strides)
    return _add_bias(y, b)


def conv_window(cx, x, w, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    """(strides, (begin, end) pads, dilations) of a Conv-like node, after checking its shapes."""
    n = _check_conv_shapes(cx, x, w, group, kernel_shape)
    if x.shape[1] != w.shape[1] * group or w.shape[0] % group:
        raise cx.fail(f"X has {x.shape[1]} channels and W has shape {tuple(w.shape)}: with "
                      f"group={group}, W must be (M, C/group, ...) with M divisible by group")
    s = spatial_ints(cx, "strides", strides, n, 1)
    d = spatial_ints(cx, "dilations", dilations, n, 1)
    return s, window_pads(cx, auto_pad, pads, x.shape[2:], w.shape[2:], s, d), d


@rule("ConvInteger", since=10)
def conv_integer(cx, x, w, x_zero_point=None, w_zero_point=None, *, auto_pad="NOTSET",
                 dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Y = (X - x_zero_point) (*) (W - w_zero_point) as int32, w_zero_point per M (v10+)."""
    s, padding, d = conv_window(cx, x, w, auto_pad=auto_pad, dilations=dilations, group=group,
                                kernel_shape=kernel_shape, pads=pads, strides=strides)
    if x_zero_point is not None:
        if np.size(x_zero_point) != 1:
            raise cx.fail(f"x_zero_point must be a scalar, got shape {tuple(x_zero_point.shape)}")
        x_zero_point = x_zero_point.reshape(())
    if w_zero_point is not None and np.size(w_zero_point) not in (1, w.shape[0]):
        raise cx.fail(f"w_zero_point must be a scalar or have {w.shape[0]} values (one per "
                      f"output channel), got shape {tuple(w_zero_point.shape)}")
    # padding adds zeros after the zero point is subtracted, i.e. pads X with x_zero_point
    return int_conv(x, w, x_zero_point, w_zero_point, s, padding, d, group)


# --- ConvTranspose ------------------------------------------------------------------------------

def _transpose_pads(cx, x, k, s, d, auto_pad, output_padding, output_shape, pads,
                    upper: bool) -> Pads:
    """Begin/end pads of the full transposed output; output_shape or SAME_* derive them."""
    n = len(k)
    sizes = x.shape[2:]
    full = [si * (i - 1) + op + (ki - 1) * di + 1
            for i, si, ki, di, op in zip(sizes, s, k, d, output_padding)]
    if output_shape is None and auto_pad not in SAME:
        return [(0, 0)] * n if auto_pad == "VALID" else explicit_pads(cx, pads, n)
    if output_shape is not None:
        if len(output_shape) not in (n, n + 2):
            raise cx.fail(f"output_shape must have {n} values (spatial axes), "
                          f"got {list(output_shape)}")
        target = [int(v) for v in output_shape[-n:]]
    else:
        target = [i * si for i, si in zip(sizes, s)]
    # an output_shape with NOTSET splits like SAME_LOWER: the odd element at the beginning
    return [split_padding(f - t, upper) for f, t in zip(full, target)]


def transpose_window(cx, x, w, *, auto_pad, dilations, group, kernel_shape, output_padding,
                     output_shape, pads, strides):
    """(strides, dilations, output_padding, (begin, end) pads) of a ConvTranspose node, after
    checking its shapes."""
    n = _check_conv_shapes(cx, x, w, group, kernel_shape)
    c, k = x.shape[1], tuple(w.shape[2:])
    if w.shape[0] != c or c % group:
        raise cx.fail(f"X has {c} channels and W has shape {tuple(w.shape)}: W must be "
                      f"(C, M/group, ...) with C divisible by group={group}")
    s = spatial_ints(cx, "strides", strides, n, 1)
    d = spatial_ints(cx, "dilations", dilations, n, 1)
    op = spatial_ints(cx, "output_padding", output_padding, n, 0)
    # v1-v10's text swaps SAME_UPPER/SAME_LOWER when it derives pads; onnxruntime and
    # onnx.reference apply v11's rule (the odd element at the end for SAME_UPPER) to every version
    padding = _transpose_pads(cx, x, k, s, d, auto_pad, op, output_shape, pads,
                              auto_pad == "SAME_UPPER")
    return s, d, op, padding


@rule("ConvTranspose", since=1)
def conv_transpose(cx, x, w, b=None, *, auto_pad="NOTSET", dilations=None, group=1,
                   kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                   strides=None):
    """Y = the gradient of Conv w.r.t. its input, applied to X, plus B (v1+)."""
    s, d, op, padding = transpose_window(
        cx, x, w, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
        output_padding=output_padding, output_shape=output_shape, pads=pads, strides=strides)
    n, c, k = x.ndim - 2, x.shape[1], tuple(w.shape[2:])
    if conv_forms.transposed_fits(k, s, d, padding):
        # kernel == stride (upsampling heads): one dot and a depth-to-space, not 4x the work
        y = conv_forms.crop(conv_forms.transposed_dot(x, w, group), padding, op)
        return _add_bias(y, b)
    # a transposed conv is a conv of the stride-dilated input with the flipped, I/O-swapped kernel
    m = w.shape[1] * group
    wt = w.reshape((group, c // group, m // group, *k)).swapaxes(1, 2).reshape((m, c // group, *k))
    wt = jnp.flip(wt, tuple(range(2, n + 2)))
    conv_pads = [((ki - 1) * di - lo, (ki - 1) * di - hi + o)
                 for ki, di, (lo, hi), o in zip(k, d, padding, op)]
    y = lax.conv_general_dilated(x, wt, (1,) * n, conv_pads, lhs_dilation=s, rhs_dilation=d,
                                 dimension_numbers=_channels_first(n), feature_group_count=group)
    return _add_bias(y, b)


# --- DeformConv ---------------------------------------------------------------------------------

def _sample_linear(x, pos, sizes):
    """Multilinear samples of x (N, G, Cg, prod(sizes)) at pos (n, N, G, P), zero outside."""
    out = 0
    for corner in itertools.product((0, 1), repeat=len(sizes)):
        flat, weight, valid = 0, 1, True
        for axis, (size, bit) in enumerate(zip(sizes, corner)):
            p = pos[axis]
            lo = jnp.floor(p)
            i = lo + bit
            weight = weight * (1 - jnp.abs(p - i))
            valid = valid & (i >= 0) & (i <= size - 1)
            flat = flat * size + jnp.clip(i, 0, size - 1).astype(jnp.int32)
        vals = jnp.take_along_axis(x, flat[:, :, None, :], axis=3)
        out = out + vals * jnp.where(valid, weight, 0).astype(x.dtype)[:, :, None, :]
    return out


@rule("DeformConv", since=19)
def deform_conv(cx, x, w, offset, b=None, mask=None, *, dilations=None, group=1,
                kernel_shape=None, offset_group=1, pads=None, strides=None):
    """Y = sum_k W_k * mask_k * X(p0 + p_k + offset_k) + B, X sampled bilinearly (v19+)."""
    n = _check_conv_shapes(cx, x, w, group, kernel_shape)
    nb, c = x.shape[:2]
    k, out = tuple(w.shape[2:]), tuple(offset.shape[2:])
    kk, pp = math.prod(k), math.prod(out)
    if c != w.shape[1] * group or w.shape[0] % group or c % offset_group:
        raise cx.fail(f"X has {c} channels, W has shape {tuple(w.shape)}: channels must divide "
                      f"by group={group} and offset_group={offset_group}")
    if offset.shape[1] != offset_group * kk * n:
        raise cx.fail(f"offset must have {offset_group * kk * n} channels "
                      f"(offset_group * prod(kernel) * {n}), got shape {tuple(offset.shape)}")
    s = spatial_ints(cx, "strides", strides, n, 1)
    d = spatial_ints(cx, "dilations", dilations, n, 1)
    padding = explicit_pads(cx, pads, n)
    # where each kernel tap lands without offsets, per axis: (K, P)
    taps = np.stack(np.meshgrid(*[np.arange(ki) for ki in k], indexing="ij"), 0).reshape(n, kk, 1)
    cells = np.stack(np.meshgrid(*[np.arange(o) for o in out], indexing="ij"), 0).reshape(n, 1, pp)
    base = (cells * np.reshape(s, (n, 1, 1)) - np.reshape([p[0] for p in padding], (n, 1, 1))
            + taps * np.reshape(d, (n, 1, 1)))
    delta = offset.reshape(nb, offset_group, kk, n, pp).transpose(3, 0, 1, 2, 4)
    pos = (jnp.asarray(base, x.dtype)[:, None, None] + delta).reshape(n, nb, offset_group, kk * pp)
    xg = x.reshape(nb, offset_group, c // offset_group, -1)
    cols = _sample_linear(xg, pos, x.shape[2:]).reshape(nb, offset_group, c // offset_group, kk, pp)
    if mask is not None:
        cols = cols * mask.reshape(nb, offset_group, 1, kk, pp).astype(x.dtype)
    cols = cols.reshape(nb, group, (c // group) * kk, pp)
    wg = w.reshape(group, w.shape[0] // group, (c // group) * kk)
    y = jnp.einsum("gmk,ngkp->ngmp", wg, cols).reshape((nb, w.shape[0], *out))
    return _add_bias(y, b)


# --- Col2Im -------------------------------------------------------------------------------------

@rule("Col2Im", since=18, static=("image_shape", "block_shape"))
def col2im(cx, x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    """Sum sliding blocks (N, C*prod(block), L) back into an image (N, C, *image_shape) (v18+)."""
    image, block = tuple(int(v) for v in image_shape), tuple(int(v) for v in block_shape)
    n = len(image)
    if len(block) != n or x.ndim != 3:
        raise cx.fail(f"input must be (N, C*prod(block), L) and block_shape {list(block)} must "
                      f"match image_shape {list(image)}; got input shape {tuple(x.shape)}")
    s = spatial_ints(cx, "strides", strides, n, 1)
    d = spatial_ints(cx, "dilations", dilations, n, 1)
    padding = explicit_pads(cx, pads, n)
    padded = [i + lo + hi for i, (lo, hi) in zip(image, padding)]
    blocks = [(p - (k - 1) * di - 1) // si + 1 for p, k, di, si in zip(padded, block, d, s)]
    kk = math.prod(block)
    if x.shape[1] % kk or x.shape[2] != math.prod(blocks):
        raise cx.fail(f"input shape {tuple(x.shape)} does not match: dimension 1 must divide by "
                      f"prod(block_shape)={kk} and dimension 2 must be {math.prod(blocks)} "
                      f"blocks {blocks}")
    # padded-image position of every (block element, block position) pair
    grids = np.meshgrid(*[np.arange(k) for k in block], *[np.arange(b) for b in blocks],
                        indexing="ij")
    where = [grids[i + n] * s[i] + grids[i] * d[i] for i in range(n)]
    flat = np.ravel_multi_index(where, padded).reshape(-1)
    cols = x.reshape(x.shape[0], x.shape[1] // kk, -1)
    y = jnp.zeros((*cols.shape[:2], math.prod(padded)), x.dtype).at[:, :, flat].add(cols)
    y = y.reshape(cols.shape[:2] + tuple(padded))
    crop = tuple(slice(lo, lo + i) for i, (lo, _) in zip(image, padding))
    return y[(slice(None), slice(None), *crop)]
