"""Data-layout ops: Transpose, Concat, Split, Slice, Tile, Pad, CenterCropPad, DepthToSpace,
SpaceToDepth, Trilu; every shape-like input is static."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from jax import lax

from oxla.lowering.common import axis_index, axis_indices, check_size, xp
from oxla.lowering.registry import rule

PAD_MODES = ("constant", "reflect", "edge", "wrap")


@rule("Transpose", since=1)
def transpose(cx, data, *, perm=None):
    """Y = data with its axes permuted by perm (default: reversed)."""
    rank = len(data.shape)
    perm = tuple(reversed(range(rank))) if perm is None else tuple(perm)
    if sorted(perm) != list(range(rank)):
        raise cx.fail(f"perm {perm} is not a permutation of the {rank} axes")
    return xp(data).transpose(data, perm)


def _concat(cx, inputs: Sequence, axis: int):
    if not inputs:
        raise cx.fail("Concat needs at least one input")
    ranks = {len(v.shape) for v in inputs}
    if len(ranks) != 1:
        raise cx.shape_error(f"inputs must have the same rank, got shapes {[tuple(v.shape) for v in inputs]}")
    axis = axis_index(cx, axis, ranks.pop())
    shape = list(inputs[0].shape)
    shape[axis] = sum(v.shape[axis] for v in inputs)
    check_size(cx, shape, inputs[0].dtype)
    m = xp(*inputs)
    lead = shape[:axis]
    if m is not np and CONCAT_ROWS and axis == len(shape) - 1 and axis >= 2 \
            and all(tuple(v.shape[:axis]) == tuple(lead) for v in inputs) and _read_whole(cx):
        # the last axis (channels last) read by convolutions and pools: joined as rows of a
        # matrix, which XLA:CPU copies 3x faster than the same join of 4-D arrays (two
        # (1, 55, 55, 64): 0.053 against 0.17 ms). Not where elementwise ops read it: they fuse
        # the 4-D join (light densenet121, a BatchNormalization after each Concat: 1.06-1.09x
        # the time with rows)
        rows = int(np.prod(lead))
        joined = m.concatenate([v.reshape(rows, v.shape[-1]) for v in inputs], axis=1)
        return joined.reshape(shape)
    return m.concatenate(inputs, axis=axis)


CONCAT_ROWS = True
# readers that take their input whole: oxla's kernels, convolutions and pools (XLA fused a 4-D
# join into the strided slices of the channels-last MaxPool after it: light squeezenet 0.93x the
# time with rows)
WHOLE_DOMAINS = ("oxla.native", "oxla.winograd")
WHOLE_OPS = frozenset({"Conv", "ConvInteger", "MaxPool", "AveragePool"})


def _read_whole(cx) -> bool:
    """Whether every reader of the node's first output takes it whole (WHOLE_DOMAINS, WHOLE_OPS)."""
    out = cx.node.output[0]
    readers = [n for n in cx.graph_nodes if out in n.input]
    return bool(readers) and all(n.domain.startswith(WHOLE_DOMAINS) or n.op_type in WHOLE_OPS
                                 for n in readers)


@rule("Concat", since=4)
def concat(cx, *inputs, axis=None):
    """Y = the inputs joined along axis (negative axis v11+)."""
    if axis is None:
        raise cx.fail("attribute 'axis' is required")
    return _concat(cx, inputs, axis)


@rule("Concat", since=1)
def concat_v1(cx, *inputs, axis=None):
    """Y = the inputs joined along axis, 1 when absent (v1-v3)."""
    return _concat(cx, inputs, 1 if axis is None else axis)


def _split(cx, x, axis: int, sizes: Sequence[int] | None):
    """Split x along axis into pieces of the given sizes (equal pieces, one per output, if None)."""
    axis = axis_index(cx, axis, len(x.shape))
    dim = x.shape[axis]
    if sizes is None:
        n = cx.num_outputs
        if dim % n:
            raise cx.fail(f"cannot split dim {dim} into {n} equal parts; give split sizes")
        sizes = [dim // n] * n
    if sum(sizes) != dim or any(s < 0 for s in sizes):
        raise cx.fail(f"split sizes {tuple(sizes)} do not add up to dim {dim} of axis {axis}")
    if len(sizes) != cx.num_outputs:
        raise cx.fail(f"{len(sizes)} split sizes for {cx.num_outputs} outputs")
    return tuple(xp(x).split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis))


@rule("Split", since=18, static=("split",))
def split(cx, x, split=None, *, axis=0, num_outputs=None):
    """Outputs = x cut along axis by the split input, or into num_outputs chunks of
    ceil(dim / num_outputs) with a smaller last one (v18+)."""
    if split is not None and num_outputs is not None:
        raise cx.fail("give either the split input or num_outputs, not both")
    if num_outputs is None:
        return _split(cx, x, axis, None if split is None else cx.static_ints(split))
    if num_outputs != cx.num_outputs:
        raise cx.fail(f"num_outputs is {num_outputs} but the node has {cx.num_outputs} outputs")
    dim = x.shape[axis_index(cx, axis, len(x.shape))]
    chunk = -(-dim // num_outputs)
    if chunk * (num_outputs - 1) > dim:
        raise cx.fail(f"num_outputs {num_outputs} cannot split dim {dim}: chunks of {chunk} leave "
                      "a negative last chunk")
    return _split(cx, x, axis, [chunk] * (num_outputs - 1) + [dim - chunk * (num_outputs - 1)])


@rule("Split", since=13, static=("split",))
def split_v13(cx, x, split=None, *, axis=0):
    """Outputs = x cut along axis by the split input (equal parts when absent) (v13-v17)."""
    return _split(cx, x, axis, None if split is None else cx.static_ints(split))


@rule("Split", since=2)
def split_v2(cx, x, *, axis=0, split=None):
    """Outputs = x cut along axis by the split attribute (equal parts when absent) (v2-v12)."""
    return _split(cx, x, axis, split)


@rule("Split", since=1, static=("sizes",))
def split_v1(cx, x, sizes=None, *, axis=0, split=None):
    """Outputs = x cut along axis by the split input or attribute (v1)."""
    return _split(cx, x, axis, cx.static_ints(sizes) if sizes is not None else split)


def _bounds(start: int, end: int, step: int, dim: int) -> slice:
    """ONNX Slice clamping: negatives count from the end, then clamp to the valid range."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)  # end -1 means "through index 0"


def _slice(cx, data, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None,
           steps: Sequence[int] | None):
    rank = len(data.shape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise cx.fail(f"starts, ends, axes and steps differ in length: {len(starts)}, "
                      f"{len(ends)}, {len(axes)}, {len(steps)}")
    index = [slice(None)] * rank
    for s, e, a, step in zip(starts, ends, axis_indices(cx, axes, rank), steps):
        if step == 0:
            raise cx.fail("steps must not be 0")
        index[a] = _bounds(s, e, step, data.shape[a])
    return data[tuple(index)]


@rule("Slice", since=10, static=("starts", "ends", "axes", "steps"))
def slice_(cx, data, starts, ends, axes=None, steps=None):
    """Y = data[starts:ends:steps] along axes, with ONNX clamping (v10+: inputs, steps)."""
    ints = cx.static_ints
    return _slice(cx, data, ints(starts), ints(ends), None if axes is None else ints(axes),
                  None if steps is None else ints(steps))


@rule("Slice", since=1)
def slice_v1(cx, data, *, axes=None, ends=None, starts=None):
    """Y = data[starts:ends] along axes, with ONNX clamping (v1-v9: attributes, step 1)."""
    if starts is None or ends is None:
        raise cx.fail("attributes 'starts' and 'ends' are required")
    return _slice(cx, data, starts, ends, axes, None)


@rule("Tile", since=6, static=("repeats",))
def tile(cx, x, repeats):
    """Y = X repeated repeats[i] times along each axis i."""
    reps = cx.static_ints(repeats)
    if len(reps) != len(x.shape) or any(r < 0 for r in reps):
        raise cx.fail(f"repeats {reps} must hold one non-negative count per axis of "
                      f"shape {tuple(x.shape)}")
    check_size(cx, [d * r for d, r in zip(x.shape, reps)], x.dtype)
    return xp(x).tile(x, reps)


@rule("Tile", since=1, static=("tiles", "axis"))
def tile_v1(cx, x, tiles, axis):
    """Y = X repeated `tiles` times along `axis` (v1-v5: scalar inputs)."""
    reps = [1] * len(x.shape)
    (count,), (a,) = cx.static_ints(tiles), cx.static_ints(axis)
    reps[axis_index(cx, a, len(x.shape))] = count
    check_size(cx, [d * r for d, r in zip(x.shape, reps)], x.dtype)
    return xp(x).tile(x, tuple(reps))


_BYTES = (np.dtype(np.uint8), np.dtype(np.int8))


def _pad(cx, data, pads: Sequence[int], mode: str, value, axes: Sequence[int] | None = None):
    rank = len(data.shape)
    axes = list(range(rank)) if axes is None else axis_indices(cx, axes, rank)
    if len(pads) != 2 * len(axes):
        raise cx.fail(f"pads {tuple(pads)} must hold 2 values per padded axis ({len(axes)} axes)")
    if mode not in PAD_MODES:
        raise cx.fail(f"mode must be one of {', '.join(PAD_MODES)}, got '{mode}'")
    given = [(0, 0)] * rank
    for i, a in enumerate(axes):
        given[a] = (pads[i], pads[len(axes) + i])
    # negative pads remove elements: crop first, then pad by the positive amounts
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for (b, e), d in zip(given, data.shape))
    data = data[crop]
    widths = [(max(b, 0), max(e, 0)) for b, e in given]
    check_size(cx, [d + b + e for d, (b, e) in zip(data.shape, widths)], data.dtype)
    if mode != "constant":
        if any(w != (0, 0) and d == 0 for w, d in zip(widths, data.shape)):
            raise cx.fail(f"mode '{mode}' cannot pad an empty axis of shape {tuple(data.shape)}")
        return xp(data).pad(data, widths, mode=mode)
    if value is None:
        value = "" if data.dtype == np.dtype(object) else 0
    if np.dtype(data.dtype) in _BYTES and not isinstance(data, (np.ndarray, np.generic)):
        # a quantized image before an integer convolution: fused into the pad, XLA:CPU would
        # evaluate the quantization in front of it per padded element, unvectorized (ResNet-50
        # QDQ, 128x56x56: 4.4 ns per element instead of 1.3); materialized, the pad is a copy
        data = lax.optimization_barrier(data)
    lib = xp(data, value)
    return lib.pad(data, widths, constant_values=lib.asarray(value, data.dtype).reshape(()))


@rule("Pad", since=11, static=("pads", "axes"))
def pad(cx, data, pads, constant_value=None, axes=None, *, mode="constant"):
    """Y = data padded by pads ([x1_begin, x2_begin, ..., x1_end, x2_end, ...]; negative crops)
    in mode constant, reflect, edge or wrap (v11+: inputs; v18+: axes; v19+: wrap)."""
    axes = None if axes is None else cx.static_ints(axes)
    return _pad(cx, data, cx.static_ints(pads), mode, constant_value, axes)


@rule("Pad", since=2)
def pad_v2(cx, data, *, mode="constant", pads=None, value=0.0):
    """Y = data padded by the pads attribute with a constant value or reflect/edge (v2-v10)."""
    if pads is None:
        raise cx.fail("attribute 'pads' is required")
    return _pad(cx, data, pads, mode, value)


@rule("Pad", since=1)
def pad_v1(cx, data, *, mode="constant", paddings=None, value=0.0):
    """Y = data padded by the paddings attribute (v1)."""
    if paddings is None:
        raise cx.fail("attribute 'paddings' is required")
    return _pad(cx, data, paddings, mode, value)


@rule("CenterCropPad", since=18, static=("shape",))
def center_crop_pad(cx, input_data, shape, *, axes=None):
    """Y = input_data centred in the given shape along axes: cropped or zero-padded (the odd
    element goes to the end)."""
    rank = len(input_data.shape)
    axes = list(range(rank)) if axes is None else axis_indices(cx, axes, rank)
    sizes = cx.static_ints(shape)
    if len(sizes) != len(axes):
        raise cx.fail(f"shape {sizes} must hold one size per axis ({len(axes)} axes)")
    crop = [slice(None)] * rank
    widths = [(0, 0)] * rank
    for a, size in zip(axes, sizes):
        dim = input_data.shape[a]
        if size < dim:
            start = (dim - size) // 2
            crop[a] = slice(start, start + size)
        elif size > dim:
            before = (size - dim) // 2
            widths[a] = (before, size - dim - before)
    cropped = input_data[tuple(crop)]
    check_size(cx, [d + lo + hi for d, (lo, hi) in zip(cropped.shape, widths)], input_data.dtype)
    return xp(cropped).pad(cropped, widths)


def _blocks(cx, x, blocksize: int | None) -> int:
    cx.expect_rank("input", x, 4)
    if blocksize is None or blocksize < 1:
        raise cx.fail(f"blocksize must be a positive integer, got {blocksize}")
    return blocksize


def _mode(cx, mode: str) -> str:
    if mode not in ("DCR", "CRD"):
        raise cx.fail(f"mode must be 'DCR' or 'CRD', got '{mode}'")
    return mode


@rule("DepthToSpace", since=11)
def depth_to_space(cx, x, *, blocksize=None, mode="DCR"):
    """Y[b, c, h*bs + i, w*bs + j] = X[b, depth(c, i, j), h, w]: depth ordered (i, j, c) in DCR
    mode, (c, i, j) in CRD mode (v11+)."""
    bs, mode = _blocks(cx, x, blocksize), _mode(cx, mode)
    b, c, h, w = x.shape
    if c % (bs * bs):
        raise cx.fail(f"channels {c} are not divisible by blocksize**2 = {bs * bs}")
    lib = xp(x)
    if mode == "DCR":
        tmp = lib.transpose(lib.reshape(x, (b, bs, bs, c // bs**2, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        tmp = lib.transpose(lib.reshape(x, (b, c // bs**2, bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    return lib.reshape(tmp, (b, c // bs**2, h * bs, w * bs))


@rule("DepthToSpace", since=1)
def depth_to_space_v1(cx, x, *, blocksize=None):
    """DepthToSpace in DCR order (v1-v10)."""
    return depth_to_space(cx, x, blocksize=blocksize, mode="DCR")


@rule("SpaceToDepth", since=28)
def space_to_depth(cx, x, *, blocksize=None, mode="DCR"):
    """The inverse of DepthToSpace: bs x bs spatial blocks move into depth, DCR or CRD (v28+)."""
    bs, mode = _blocks(cx, x, blocksize), _mode(cx, mode)
    b, c, h, w = x.shape
    if h % bs or w % bs:
        raise cx.fail(f"spatial dims {(h, w)} are not divisible by blocksize {bs}")
    lib = xp(x)
    tmp = lib.reshape(x, (b, c, h // bs, bs, w // bs, bs))
    perm = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    return lib.reshape(lib.transpose(tmp, perm), (b, c * bs * bs, h // bs, w // bs))


@rule("SpaceToDepth", since=1)
def space_to_depth_v1(cx, x, *, blocksize=None):
    """SpaceToDepth in DCR order (v1-v27)."""
    return space_to_depth(cx, x, blocksize=blocksize, mode="DCR")


@rule("Trilu", since=14, static=("k",))
def trilu(cx, x, k=None, *, upper=1):
    """Y = the upper (upper=1) or lower triangle of the last two dims of X from diagonal k."""
    if len(x.shape) < 2:
        raise cx.shape_error(f"input must have rank >= 2, got shape {tuple(x.shape)}")
    diagonal = 0 if k is None else int(np.asarray(k).reshape(()))
    lib = xp(x)
    return lib.triu(x, diagonal) if upper else lib.tril(x, diagonal)
