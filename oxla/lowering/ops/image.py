"""Image ops: GridSample, AffineGrid, NonMaxSuppression and ImageDecoder."""

from __future__ import annotations

import io
import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla import native
from oxla.lowering.common import check_size
from oxla.lowering.registry import rule
from oxla.passes import nms_split
from oxla.passes.nms_split import DOMAIN as NMS_DOMAIN
from oxla.passes.nms_split import take_rows

# --- GridSample, AffineGrid -------------------------------------------------------------------

def _reflect(x, lo: float, hi: float):
    """Reflect coordinates into [lo, hi] by the nearer border, as often as needed."""
    span = hi - lo
    if span <= 0:
        return jnp.full_like(x, lo)
    below = x < lo
    dx = jnp.where(below, lo - x, x - hi)
    n = jnp.floor(dx / span)
    r = dx - n * span
    even = jnp.mod(n, 2) == 0
    low_side, high_side = lo + r, hi - r
    out = jnp.where(below, jnp.where(even, low_side, high_side), jnp.where(even, high_side, low_side))
    return jnp.where((x >= lo) & (x <= hi), x, out)


def _grid_taps(x, size: int, mode: str, padding: str, align: bool):
    """(index, weight, valid) taps of one spatial axis for every output location."""
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    x = (x + 1) / 2 * (size - 1) if align else ((x + 1) * size - 1) / 2
    if mode == "nearest":
        x = jnp.round(x)  # half to even, as PyTorch does
    # cubic pads each of its taps instead, as PyTorch and onnxruntime do (onnx.reference pads the
    # coordinate itself; the two agree for zeros padding, the only one the conformance data uses)
    if padding == "border" and mode != "cubic":
        x = jnp.where((x < lo) | (x > hi), jnp.clip(x, 0, size - 1), x)
    elif padding == "reflection" and mode != "cubic":
        x = _reflect(x, lo, hi)
    if mode == "nearest":
        taps = [(x.astype(jnp.int32), jnp.ones_like(x))]
    else:
        base = jnp.floor(x)
        t = x - base
        offsets = (0, 1) if mode == "linear" else (-1, 0, 1, 2)
        taps = [(base.astype(jnp.int32) + k,
                 1 - jnp.abs(k - t) if mode == "linear" else _cubic_jnp(k - t, -0.75))
                for k in offsets]
    out = []
    for i, w in taps:
        valid = (i >= 0) & (i < size)
        if padding == "reflection":
            i = _reflect(i.astype(x.dtype), lo, hi).astype(jnp.int32)
        out.append((jnp.clip(i, 0, size - 1), w, valid if padding == "zeros" else None))
    return out


def _cubic_jnp(d, a: float):
    d = jnp.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return jnp.where(d <= 1, near, jnp.where(d < 2, far, 0.0))


def _grid_sample(cx, x, grid, mode: str, padding: str, align: bool):
    if padding not in ("zeros", "border", "reflection"):
        raise cx.fail(f"padding_mode must be 'zeros', 'border' or 'reflection', got '{padding}'")
    spatial = x.shape[2:]
    nd = len(spatial)
    if grid.ndim != nd + 2 or grid.shape[-1] != nd or grid.shape[0] != x.shape[0]:
        raise cx.shape_error(f"grid must have shape (N, *out, {nd}) for X of shape {x.shape}, got {grid.shape}")
    wide = jnp.float64 if jnp.float64 in (x.dtype, grid.dtype) else jnp.float32
    g = grid.astype(wide)
    # the grid's last axis lists coordinates innermost first: (x, y[, z]) for (..., H, W)
    axes = [_grid_taps(g[..., nd - 1 - k], spatial[k], mode, padding, bool(align)) for k in range(nd)]
    n, c = x.shape[:2]
    flat_x = x.reshape(n, c, -1)
    if mode != "nearest":
        flat_x = flat_x.astype(wide)
    strides = [math.prod(spatial[k + 1:]) for k in range(nd)]
    total: Any = 0
    for combo in itertools.product(*axes):
        index = sum(i * s for (i, _, _), s in zip(combo, strides))
        weight = math.prod(w for _, w, _ in combo)
        for _, _, valid in combo:
            if valid is not None:
                weight = jnp.where(valid, weight, 0)
        picked = jnp.take_along_axis(flat_x, index.reshape(n, 1, -1), axis=2)
        if mode == "nearest":
            total = jnp.where(weight.reshape(n, 1, -1) > 0, picked, jnp.zeros((), x.dtype))
        else:
            total = total + picked * weight.reshape(n, 1, -1)
    return jnp.asarray(total).reshape((n, c, *grid.shape[1:-1])).astype(x.dtype)


@rule("GridSample", since=20)
def grid_sample(cx, X, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """Y[n, c, p] = X[n, c] interpolated at the denormalized grid[n, p] (v20+: N-D, linear/cubic)."""
    if mode not in ("nearest", "linear", "cubic"):
        raise cx.fail(f"mode must be 'nearest', 'linear' or 'cubic', got '{mode}'")
    return _grid_sample(cx, X, grid, mode, padding_mode, align_corners)


@rule("GridSample", since=16)
def grid_sample_v16(cx, X, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """Y[n, c, h, w] = X[n, c] interpolated at the denormalized grid[n, h, w] (v16-v19: 4-D only)."""
    names = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    if mode not in names:
        raise cx.fail(f"mode must be 'bilinear', 'nearest' or 'bicubic', got '{mode}'")
    cx.expect_rank("X", X, 4)
    return _grid_sample(cx, X, grid, names[mode], padding_mode, align_corners)


@rule("AffineGrid", since=20, static=("size",))
def affine_grid(cx, theta, size, *, align_corners=0):
    """grid[n, ..., :] = theta[n] @ (x, y[, z], 1) over the normalized base grid of size (v20+)."""
    size = cx.static_ints(size, "size")
    nd = len(size) - 2
    if nd not in (2, 3) or tuple(theta.shape[1:]) != (nd, nd + 1):
        raise cx.fail(f"size must be (N, C, H, W) or (N, C, D, H, W) with theta (N, {nd}, {nd + 1}); "
                      f"got size {size} and theta {theta.shape}")
    check_size(cx, [*size[2:], nd + 1], np.float64)  # the base grid, before the output
    check_size(cx, [size[0], *size[2:], nd], theta.dtype)
    if align_corners:
        ticks = [np.linspace(-1.0, 1.0, n) for n in size[2:]]
    else:
        ticks = [(2.0 * np.arange(n) + 1) / n - 1 for n in size[2:]]
    mesh = np.meshgrid(*ticks, indexing="ij")
    base = np.stack([*mesh[::-1], np.ones_like(mesh[0])], axis=-1)  # (x, y[, z], 1)
    return jnp.einsum("...k,njk->n...j", jnp.asarray(base, theta.dtype), theta,
                      precision=lax.Precision.HIGHEST)


# --- NonMaxSuppression ------------------------------------------------------------------------

def _corners(boxes: Any, center_point_box: int, m: Any = np) -> Any:
    """(4, batches, boxes): y_min, x_min, y_max, x_max of every box, in the boxes' own type
    (`m`: numpy, or jax.numpy for traced boxes)."""
    planes = boxes.transpose(2, 0, 1)
    if center_point_box:  # [x_center, y_center, width, height]
        center, half = planes[m.array([1, 0])], planes[m.array([3, 2])] / 2
        return m.concatenate([center - half, center + half])
    return m.concatenate([m.minimum(planes[:2], planes[2:]), m.maximum(planes[:2], planes[2:])])


def _overlaps(edges: tuple[np.ndarray, ...], area: np.ndarray, a: np.ndarray, b: np.ndarray,
              threshold: float | np.floating) -> np.ndarray:
    """(len(a), len(b)): IoU of box a[i] and box b[j] > threshold (degenerate boxes never are)."""
    x0, x1, y0, y1 = (e[:, None] for e in edges)
    ix0, ix1 = np.maximum(x0[a], x0[b].T), np.minimum(x1[a], x1[b].T)
    iy0, iy1 = np.maximum(y0[a], y0[b].T), np.minimum(y1[a], y1[b].T)
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = area[a][:, None], area[b][None, :]
    union = area_a + area_b - inter
    ok = (ix1 > ix0) & (iy1 > iy0) & (inter > 0) & (area_a > 0) & (area_b > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ok & (inter / np.where(ok, union, 1) > threshold)


def _by_score(scores: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Box indices by descending score, ties to the lower index (a stable sort)."""
    return boxes[np.argsort(-scores[boxes], kind="stable")]


def _select(edges, area, scores: np.ndarray, limit: int, iou: float | np.floating,
            min_score: float | np.floating | None) -> list[int]:
    """Greedy NMS of one (batch, class) over all its boxes, for long candidate lists: highest
    score first (ties to the lower box index); a box is kept unless it overlaps a kept one. Only
    the best-scored prefix is sorted until more is needed, and candidates go in chunks so work
    stops at the limit."""
    candidates = np.arange(len(scores)) if min_score is None else np.flatnonzero(scores > min_score)
    rest = None
    if 0 < 4 * limit < len(candidates):  # every score tied with the cut stays in the prefix
        cut = np.partition(scores[candidates], len(candidates) - 4 * limit)[len(candidates) - 4 * limit]
        rest = candidates[scores[candidates] < cut]
        candidates = candidates[scores[candidates] >= cut]
    order = _by_score(scores, candidates)
    keep: list[int] = []
    pos = 0
    while len(keep) < limit:
        if pos == len(order):
            if rest is None:
                break
            order, rest = np.concatenate([order, _by_score(scores, rest)]), None
        chunk = order[pos:pos + int(np.clip(2 * (limit - len(keep)), 64, 1024))]
        pos += len(chunk)
        alive = np.ones(len(chunk), bool)
        if keep:
            alive &= ~_overlaps(edges, area, np.asarray(keep), chunk, iou).any(axis=0)
        pairs = _overlaps(edges, area, chunk, chunk, iou)
        for i in np.flatnonzero(alive):
            if not alive[i]:
                continue
            keep.append(int(chunk[i]))
            if len(keep) == limit:
                break
            alive &= ~pairs[i]
    return keep


def _first(value, default):
    v = None if value is None else np.asarray(value).reshape(-1)
    return default if v is None or v.size == 0 else v[0]


_MATRIX_BOXES = 1024        # a longer prefix goes to the chunked loop (its matrix would be large)
_MATRIX_ELEMENTS = 1 << 20  # (rows, k, k) overlap matrices are built in groups this large
_ROUNDS = 8                 # fixed-point rounds before a row takes the sequential greedy pass
_FEW_KEPT = 64              # at most this many boxes kept in all: the sequential pass right away


def _ranked(scores: np.ndarray, k: int) -> np.ndarray:
    """(rows, k): each row's k best box indices by descending score, ties to the lower index."""
    if k >= scores.shape[1]:
        return np.argsort(-scores, axis=1, kind="stable")
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    top.sort(axis=1)  # index order, so the stable sort below sends ties to the lower index
    picked = np.take_along_axis(scores, top, 1)
    order = np.take_along_axis(top, np.argsort(-picked, axis=1, kind="stable"), 1)
    # a score tied with the cut can have left a lower-indexed twin out: rank those rows fully
    tied = np.flatnonzero((scores >= picked.min(axis=1, keepdims=True)).sum(axis=1) > k)
    if tied.size:
        order[tied] = np.argsort(-scores[tied], axis=1, kind="stable")[:, :k]
    return order


def _overlap_matrix(corners: np.ndarray, area: np.ndarray, threshold: np.floating) -> np.ndarray:
    """(rows, k, k) from (4, rows, k) corners and (rows, k) areas (NaN where not positive):
    IoU > threshold, computed as onnxruntime does (the intersection's width times its height
    over the union; boxes without positive area never overlap)."""
    y0, x0, y1, x1 = np.ascontiguousarray(corners)  # planes: broadcasting strided ones is slow
    inter = np.minimum(x1[:, :, None], x1[:, None, :]) - np.maximum(x0[:, :, None], x0[:, None, :])
    high = np.minimum(y1[:, :, None], y1[:, None, :]) - np.maximum(y0[:, :, None], y0[:, None, :])
    # an empty width gives 0 (or -0, NaN) and an empty height a value <= 0, never above a
    # threshold >= 0; without the clamp two empty sides would multiply to a positive area
    np.maximum(inter, 0, out=inter)
    inter *= high
    union = area[:, :, None] + area[:, None, :]
    union -= inter  # > 0 or NaN (a NaN area): inter <= either area, also in floating point
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = np.divide(inter, union, out=union) > threshold
    if threshold < 0:  # only a negative threshold (outside the spec's range) lets IoU 0 pass
        ok &= inter > 0
    return ok


def _greedy_bits(overlap: np.ndarray, valid: np.ndarray, limit: int) -> list[int]:
    """Greedy NMS over one ranked prefix as bit sets: the kept positions. Bit j of row i of the
    packed `overlap` says box i suppresses box j; the lowest alive bit is the best box left."""
    width = overlap.shape[-1]
    rows = overlap.tobytes()
    alive = int.from_bytes(valid.tobytes(), "little")
    keep: list[int] = []
    while alive and len(keep) < limit:
        low = alive & -alive
        i = low.bit_length() - 1
        keep.append(i)
        alive &= ~(int.from_bytes(rows[i * width:(i + 1) * width], "little") | low)
    return keep


def _greedy(overlap: np.ndarray, valid: np.ndarray, limit: int) -> list[np.ndarray]:
    """Kept positions of each ranked prefix (rows, k): the greedy pass's result is the one fixed
    point of keep[j] = valid[j] and no kept i < j overlaps j. Iterating it from `valid` fixes at
    least one more position per round and stops at that fixed point; detection outputs settle
    in a few rounds (Cluster-NMS), each one batched matrix product. Rows still moving after
    _ROUNDS go through the sequential pass, so the result is exact either way. So do all rows
    when they can keep few boxes: then the sequential pass costs less than one round."""
    k = overlap.shape[-1]
    keep, moving = valid, np.ones(len(valid), bool)
    rounds = 0 if len(valid) * min(limit, k) <= _FEW_KEPT else _ROUNDS
    if rounds:
        upper = (overlap & ~np.tri(k, k, 0, bool)).astype(np.float32)  # only better boxes suppress
    for _ in range(rounds):
        new = valid & ~(np.matmul(keep[:, None, :].astype(np.float32), upper)[:, 0, :] > 0)
        moving = (new != keep).any(axis=1)
        keep = new
        if not moving.any():
            break
    kept = [np.flatnonzero(row)[:limit] for row in keep]
    for r in np.flatnonzero(moving):
        packed = np.packbits(overlap[r], axis=1, bitorder="little")
        kept[r] = np.asarray(_greedy_bits(packed, np.packbits(valid[r], bitorder="little"), limit), np.intp)
    return kept


def _nms_rows(boxes: np.ndarray, scores: np.ndarray, limit: int, iou: np.floating,
              min_score: np.floating | None, center_point_box: int) -> list[np.ndarray]:
    """Kept box indices of each (batch, class), in selection order. All of them at once: rank
    each one's best 2 * limit candidates, one overlap matrix per group, then the greedy pass."""
    batches, classes, n = scores.shape
    flat = scores.reshape(batches * classes, n)
    valid = np.ones(flat.shape, bool) if min_score is None else flat > min_score
    counts = valid.sum(axis=1)
    k = int(min(counts.max(initial=0), max(2 * limit, 64)))
    corners = _corners(boxes, center_point_box)
    sides = corners[2:] - corners[:2]
    area = sides[0] * sides[1]

    def every_box(r: int) -> np.ndarray:  # the chunked loop over all of row r's candidates
        b = r // classes
        edges = tuple(corners[[1, 3, 0, 2], b])  # x_min, x_max, y_min, y_max
        return np.asarray(_select(edges, area[b], flat[r], limit, iou, min_score), np.int64)

    if k == 0 or limit == 0:
        return [np.zeros(0, np.int64)] * len(flat)
    if k > _MATRIX_BOXES:
        return [every_box(r) for r in range(len(flat))]
    order = _ranked(flat, k)
    row = np.arange(len(flat))[:, None]
    ranked_valid, batch = valid[row, order], row // classes
    nan_area = np.where(area > 0, area, area.dtype.type(np.nan))  # see _overlap_matrix
    group = max(1, _MATRIX_ELEMENTS // (k * k))
    out: list[np.ndarray] = []
    for start in range(0, len(flat), group):
        idx, b = order[start:start + group], batch[start:start + group]
        matrix = _overlap_matrix(corners[:, b, idx], nan_area[b, idx], iou)
        for r, keep in enumerate(_greedy(matrix, ranked_valid[start:start + group], limit), start):
            # the prefix ran out before the limit while candidates remain: take them all
            out.append(every_box(r) if len(keep) < limit and counts[r] > k else order[r, keep])
    return out


@rule("NonMaxSuppression", since=10, static=("*",))
def non_max_suppression(cx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    """Rows [batch, class, box] kept by greedy per-class NMS: IoU > iou_threshold with a kept,
    higher-scoring box suppresses; scores must exceed score_threshold when given (v10+)."""
    if center_point_box not in (0, 1):
        raise cx.fail(f"center_point_box must be 0 or 1, got {center_point_box}")
    boxes, scores = np.asarray(boxes), np.asarray(scores)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise cx.fail(f"boxes must be (batches, boxes, 4) and scores (batches, classes, boxes); "
                      f"got {boxes.shape} and {scores.shape}")
    limit = int(min(max(int(_first(max_output_boxes_per_class, 0)), 0), boxes.shape[1]))
    # thresholds compare in the boxes' and scores' own type, as onnxruntime's float does
    iou = boxes.dtype.type(_first(iou_threshold, 0.0))
    min_score = _first(score_threshold, None)
    min_score = None if min_score is None else scores.dtype.type(min_score)
    with np.errstate(invalid="ignore", over="ignore"):  # infinite corners: NaN sides, no overlap
        kept = _nms_rows(boxes, scores, limit, iou, min_score, center_point_box)
    row = np.repeat(np.arange(len(kept)), [len(k) for k in kept])
    classes = scores.shape[1]
    return np.stack([row // classes, row % classes, np.concatenate([row[:0], *kept])], axis=1).astype(np.int64)


# --- NonMaxSuppression split by NmsSplitPass (oxla.nms): the ranked prefix compiled -------------

_COMPILED_ELEMENTS = 1 << 22  # past this many overlap-matrix entries the hint settles nothing


def _settles_nothing() -> Any:
    return jnp.full((1, 1), -1, jnp.int64)


@rule("NonMaxSuppressionRanked", since=1, domain=NMS_DOMAIN,
      static=("max_output_boxes_per_class", "iou_threshold", "score_threshold"))
def non_max_suppression_ranked(cx, boxes, scores, max_output_boxes_per_class, iou_threshold,
                               score_threshold=None, *, center_point_box=0):
    """(1 + batches * classes * limit, 3) hint: [1, count, 0] when every (batch, class)'s K
    best-scored boxes settle greedy NMS, then NonMaxSuppression's `count` rows [batch, class, box]
    (padding after them); [[-1]] when something is not settled or not computed (shapes or sizes
    outside what it handles): the host op then runs the whole NMS."""
    if (center_point_box not in (0, 1) or boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3
            or scores.shape[::2] != boxes.shape[:2] or not jnp.issubdtype(boxes.dtype, jnp.floating)):
        return _settles_nothing()
    batches, classes, n = scores.shape
    rows = batches * classes
    limit = int(min(max(int(_first(max_output_boxes_per_class, 0)), 0), n))
    k = min(n, max(2 * limit, 64))
    iou = boxes.dtype.type(_first(iou_threshold, 0.0))
    min_score = _first(score_threshold, None)
    if rows and limit and nms_split.NATIVE_NMS and cx.options.native_nms \
            and boxes.dtype == scores.dtype == jnp.float32 and rows * limit <= nms_split.NATIVE_ROWS \
            and native.available():
        return _native_nms(boxes, scores, limit, iou, min_score, center_point_box,
                           cx.options.native_threads)
    if rows == 0 or limit == 0 or rows * k * k > _COMPILED_ELEMENTS:
        return _settles_nothing()
    flat = scores.reshape(rows, n)
    valid = jnp.ones(flat.shape, bool) if min_score is None else flat > scores.dtype.type(min_score)
    # the host ranks by a stable descending sort: -0.0 ties 0.0, and NaN goes last where top_k
    # puts it first (such rows are left unsettled)
    key = jnp.where(valid, jnp.where(flat == 0, 0, flat), -jnp.inf)
    order = lax.top_k(key, k)[1]  # ties to the lower index
    corners = _corners(boxes, center_point_box, jnp)  # (4, batches, n)
    picked = corners[:, (jnp.arange(rows) // classes)[:, None], order]  # (4, rows, k)
    matrix = _traced_overlaps(picked, iou)
    keep = _fixed_point(matrix & jnp.triu(jnp.ones((k, k), bool), 1), jnp.take_along_axis(valid, order, 1))
    place = jnp.cumsum(keep, axis=1)
    settled = (place[:, -1] >= limit) | (valid.sum(axis=1) <= k)
    if min_score is None:
        settled &= ~jnp.isnan(flat).any(axis=1)
    # the kept boxes' rows, compacted in (batch, class, rank) order: the host only slices them
    take = (keep & (place <= limit)).reshape(-1)
    slot = jnp.where(take, jnp.cumsum(take) - 1, rows * limit)
    row = jnp.repeat(jnp.arange(rows), k)
    found = jnp.stack([row // classes, row % classes, order.reshape(-1)], axis=1).astype(jnp.int64)
    selected = jnp.zeros((rows * limit, 3), jnp.int64).at[slot].set(found, mode="drop")
    head = jnp.stack([jnp.all(settled), jnp.sum(take), 0]).astype(jnp.int64)
    return jnp.concatenate([head[None], selected])


def _native_nms(boxes: Any, scores: Any, limit: int, iou: np.floating, min_score: Any,
                center_point_box: int, threads: int = 1) -> Any:
    """The hint from oxla's kernel (`oxla_snms`): the exact greedy NMS over every candidate, so it
    always settles; its (batch, class) rows on `threads` threads. The compiled ranked pass below
    took 587 us on the detector's 8 x 1200 scores (top_k 205, the overlap matrix 197, the fixed
    point 65); the kernel, in jax.jit on the one-thread client, 99 us on one thread and 73 on two
    (~20 of them the call)."""
    batches, classes, _ = scores.shape
    out = jax.ShapeDtypeStruct((1 + batches * classes * limit, 3), jnp.int64)
    return jax.ffi.ffi_call(native.NMS_TARGET, out)(
        boxes, scores, threads=np.int64(max(1, threads)), limit=np.int64(limit),
        iou=np.float32(iou),
        has_min=np.int64(min_score is not None),
        min_score=np.float32(0.0 if min_score is None else min_score),
        center=np.int64(center_point_box))


def _traced_overlaps(corners: Any, threshold: Any) -> Any:
    """`_overlap_matrix` on traced corners (4, rows, k), in the same arithmetic."""
    y0, x0, y1, x1 = corners
    area = (y1 - y0) * (x1 - x0)
    area = jnp.where(area > 0, area, jnp.nan)
    inter = jnp.minimum(x1[:, :, None], x1[:, None, :]) - jnp.maximum(x0[:, :, None], x0[:, None, :])
    high = jnp.minimum(y1[:, :, None], y1[:, None, :]) - jnp.maximum(y0[:, :, None], y0[:, None, :])
    inter = jnp.maximum(inter, 0) * high
    ok = inter / (area[:, :, None] + area[:, None, :] - inter) > threshold
    return ok & (inter > 0) if threshold < 0 else ok


def _fixed_point(upper: Any, valid: Any) -> Any:
    """The greedy pass over ranked prefixes (rows, k), as its one fixed point (see `_greedy`):
    iterated from `valid` until nothing changes, which takes at most k rounds."""
    def step(state):
        keep, _, rounds = state
        new = valid & ~jnp.any(keep[:, :, None] & upper, axis=1)
        return new, jnp.any(new != keep), rounds + 1

    return lax.while_loop(lambda s: s[1] & (s[2] <= upper.shape[-1]), step,
                          (valid, jnp.array(True), jnp.array(0)))[0]


def settled_selection(hint: Any) -> np.ndarray | None:
    """NonMaxSuppression's rows from a NonMaxSuppressionRanked hint that settled every (batch,
    class), else None."""
    hint = np.asarray(hint)
    if hint.ndim != 2 or hint.shape[1] != 3 or hint.shape[0] < 1 or hint[0, 0] != 1 \
            or not 0 <= hint[0, 1] < hint.shape[0]:
        return None
    return hint[1:1 + hint[0, 1]]


def _settled_host_step(hint: Any) -> tuple[np.ndarray] | None:
    """The host step's shortcut (Rule.host): it reads only the hint. Through the interpreter (every
    input converted, the rule's checks) the same slice took ~250 us a call (the detector's NMS
    host step: 312 us, of 6.6 ms)."""
    rows = settled_selection(hint)
    return None if rows is None else (rows,)


@rule("NonMaxSuppression", since=1, domain=NMS_DOMAIN, static=("*",), host=_settled_host_step)
def non_max_suppression_hinted(cx, hint, boxes, scores, max_output_boxes_per_class=None,
                               iou_threshold=None, score_threshold=None, *, center_point_box=0):
    """NonMaxSuppression's rows [batch, class, box] from a NonMaxSuppressionRanked hint, or the
    whole NMS where the hint did not settle every (batch, class)."""
    rows = settled_selection(hint)
    if rows is None:
        return non_max_suppression(cx, boxes, scores, max_output_boxes_per_class, iou_threshold,
                                   score_threshold, center_point_box=center_point_box)
    return rows


@rule("HintRows", since=1, domain=NMS_DOMAIN)
def hint_rows(cx, hint):
    """A settled hint's rows after its head, padding included (`nms_split.trim_nms_rows`)."""
    return hint[1:]


@rule("TakeRows", since=1, domain=NMS_DOMAIN, static=("*",))
def take_rows_rule(cx, rows, hint):
    """`rows` cut to the selection's length (the executor does this after the segment itself)."""
    return take_rows(rows, hint)


# --- ImageDecoder: Pillow decodes (the optional `oxla[image]` extra) ---------------------------

@rule("ImageDecoder", since=20, static=("*",))
def image_decoder(cx, encoded_stream, *, pixel_format="RGB"):
    """(H, W, C) uint8 pixels of an encoded image (JPEG, PNG, BMP, TIFF, WebP, JPEG 2000, PNM...);
    an empty (0, 0, C) image for a corrupt or unknown stream, as the spec says (v20)."""
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise cx.fail(f"pixel_format must be 'RGB', 'BGR' or 'Grayscale', got '{pixel_format}'")
    try:
        import PIL.Image
    except ImportError:
        raise cx.fail("decoding images needs Pillow: pip install 'oxla[image]'") from None
    data = np.asarray(encoded_stream, np.uint8).tobytes()
    try:
        with PIL.Image.open(io.BytesIO(data)) as img:
            # the header's size, checked before a pixel is decoded (a small file can claim a lot)
            check_size(cx, [img.height, img.width, 1 if pixel_format == "Grayscale" else 3], np.uint8)
            # Grayscale is Pillow's "L" (ITU-R 601-2 luma), as onnx.reference computes it
            pixels = np.array(img.convert("L" if pixel_format == "Grayscale" else "RGB"))
    except PIL.Image.DecompressionBombError as e:
        raise cx.fail(f"refusing to decode: {e}") from None
    except (OSError, ValueError, SyntaxError):
        return np.zeros((0, 0, 1 if pixel_format == "Grayscale" else 3), np.uint8)
    if pixel_format == "Grayscale":
        return pixels[:, :, None]
    return pixels[:, :, ::-1].copy() if pixel_format == "BGR" else pixels
