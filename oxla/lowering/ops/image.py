"""Image ops: GridSample, AffineGrid, NonMaxSuppression and ImageDecoder."""

from __future__ import annotations

import itertools
import math
import re
import struct
import zlib
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.registry import rule

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
    if align_corners:
        ticks = [np.linspace(-1.0, 1.0, n) for n in size[2:]]
    else:
        ticks = [(2.0 * np.arange(n) + 1) / n - 1 for n in size[2:]]
    mesh = np.meshgrid(*ticks, indexing="ij")
    base = np.stack([*mesh[::-1], np.ones_like(mesh[0])], axis=-1)  # (x, y[, z], 1)
    return jnp.einsum("...k,njk->n...j", jnp.asarray(base, theta.dtype), theta,
                      precision=lax.Precision.HIGHEST)


# --- NonMaxSuppression ------------------------------------------------------------------------

def _box_edges(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """(x_min, x_max, y_min, y_max) of every box, in the boxes' own float type."""
    if center_point_box:  # [x_center, y_center, width, height]
        xc, yc, w, h = (boxes[..., k] for k in range(4))
        return xc - w / 2, xc + w / 2, yc - h / 2, yc + h / 2
    y1, x1, y2, x2 = (boxes[..., k] for k in range(4))  # corners, in either order
    return np.minimum(x1, x2), np.maximum(x1, x2), np.minimum(y1, y2), np.maximum(y1, y2)


def _overlaps(edges: tuple[np.ndarray, ...], area: np.ndarray, a: np.ndarray, b: np.ndarray,
              threshold: float) -> np.ndarray:
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


def _select(edges, area, scores: np.ndarray, limit: int, iou: float, min_score: float | None) -> list[int]:
    """Greedy NMS of one (batch, class): highest score first (ties to the lower box index); a box
    is kept unless it overlaps a kept one. Only the best-scored prefix is sorted until more is
    needed, and candidates go in chunks so work stops at the limit."""
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


@rule("NonMaxSuppression", since=10, static=("*",))
def non_max_suppression(cx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    """Rows [batch, class, box] kept by greedy per-class NMS: IoU > iou_threshold with a kept,
    higher-scoring box suppresses; scores must exceed score_threshold when given (v10+)."""
    if center_point_box not in (0, 1):
        raise cx.fail(f"center_point_box must be 0 or 1, got {center_point_box}")
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise cx.fail(f"boxes must be (batches, boxes, 4) and scores (batches, classes, boxes); "
                      f"got {boxes.shape} and {scores.shape}")
    limit = max(int(_first(max_output_boxes_per_class, 0)), 0)
    iou = float(_first(iou_threshold, 0.0))
    min_score = _first(score_threshold, None)
    min_score = None if min_score is None else float(min_score)
    rows = []
    for b in range(boxes.shape[0]):
        edges = _box_edges(np.asarray(boxes[b]), center_point_box)
        area = (edges[1] - edges[0]) * (edges[3] - edges[2])
        for c in range(scores.shape[1]):
            rows += [(b, c, k) for k in _select(edges, area, np.asarray(scores[b, c]), limit, iou, min_score)]
    return np.asarray(rows, np.int64).reshape(-1, 3)


# --- ImageDecoder: the lossless formats the standard library can decode (zlib for PNG) ----------

_PNM_FIELD = re.compile(rb"\s*(#[^\n]*\n\s*)*(\d+)")  # whitespace and comments, then a number
_CODEC_NEEDED = {b"\xff\xd8\xff": "JPEG", b"\x00\x00\x00\x0cjP  ": "JPEG 2000", b"II*\x00": "TIFF",
                 b"MM\x00*": "TIFF", b"RIFF": "WebP"}


class _Unsupported(Exception):
    """A valid stream using a feature these decoders lack (an error, not an empty image)."""


def _unfilter_png(raw: np.ndarray, height: int, stride: int, bpp: int) -> np.ndarray:
    """Undo PNG's per-row filters (none, sub, up, average, paeth) on 8-bit samples."""
    rows = raw.reshape(height, stride + 1).astype(np.int32)
    out = np.zeros((height, stride), np.int32)
    prior = np.zeros(stride, np.int32)
    for y in range(height):
        kind, row = rows[y, 0], rows[y, 1:].copy()
        if kind == 1:
            row = (np.cumsum(row.reshape(-1, bpp), axis=0).reshape(-1) % 256).astype(np.int32)
        elif kind == 2:
            row = (row + prior) % 256
        elif kind in (3, 4):
            for i in range(0, stride, bpp):
                left = row[i - bpp:i] if i else np.zeros(bpp, np.int32)
                up, corner = prior[i:i + bpp], prior[i - bpp:i] if i else np.zeros(bpp, np.int32)
                if kind == 3:
                    pred = (left + up) // 2
                else:
                    p = left + up - corner
                    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - corner)
                    pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, corner))
                row[i:i + bpp] = (row[i:i + bpp] + pred) % 256
        out[y] = prior = row
    return out.astype(np.uint8)


def _decode_png(data: bytes) -> np.ndarray:
    pos, idat = 8, b""
    palette: np.ndarray | None = None
    header: tuple[int, ...] | None = None
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body, pos = data[pos + 8:pos + 8 + size], pos + 12 + size
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = np.frombuffer(body, np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat += body
    if header is None:
        raise _Unsupported("PNG without an IHDR chunk")
    width, height, depth, color, _, _, interlace = header
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    if depth != 8 or interlace:
        raise _Unsupported(f"PNG with bit depth {depth} or interlacing is not supported")
    raw = np.frombuffer(zlib.decompress(idat), np.uint8)
    pixels = _unfilter_png(raw, height, width * channels, channels).reshape(height, width, channels)
    if color == 3:
        if palette is None:
            raise _Unsupported("palette PNG without a PLTE chunk")
        return palette[pixels[..., 0]]
    return pixels


def _decode_bmp(data: bytes) -> np.ndarray:
    (offset,) = struct.unpack_from("<I", data, 10)
    width, height = struct.unpack_from("<ii", data, 18)
    bits, compression = struct.unpack_from("<HI", data, 28)
    if bits not in (24, 32) or compression != 0:
        raise _Unsupported(f"BMP with {bits} bits per pixel or compression {compression} is not supported")
    stride = (width * bits // 8 + 3) // 4 * 4
    rows = np.frombuffer(data, np.uint8, stride * abs(height), offset).reshape(abs(height), stride)
    pixels = rows[:, :width * bits // 8].reshape(abs(height), width, bits // 8)[..., 2::-1]  # BGR(A)
    return pixels[::-1] if height > 0 else pixels  # positive heights are stored bottom-up


def _decode_pnm(data: bytes) -> np.ndarray:
    fields: list[int] = []
    pos = 2
    while len(fields) < 3:
        m = _PNM_FIELD.match(data, pos)
        if m is None:
            raise _Unsupported("malformed PNM header")
        fields.append(int(m.group(2)))
        pos = m.end()
    width, height, top = fields
    if top > 255:
        raise _Unsupported("16-bit PNM is not supported")
    channels = 3 if data[:2] == b"P6" else 1
    return np.frombuffer(data, np.uint8, width * height * channels, pos + 1).reshape(height, width, channels)


def _as_pixel_format(pixels: np.ndarray, pixel_format: str) -> np.ndarray:
    rgb = np.repeat(pixels[..., :1], 3, axis=2) if pixels.shape[2] <= 2 else pixels[..., :3]
    if pixel_format == "Grayscale":  # ITU-R 601-2 luma in fixed point, as libjpeg and Pillow do
        weights = np.array([19595, 38470, 7471])
        return ((rgb.astype(np.int64) @ weights + 0x8000) >> 16).astype(np.uint8)[..., None]
    return np.ascontiguousarray(rgb[..., ::-1] if pixel_format == "BGR" else rgb)


@rule("ImageDecoder", since=20, static=("*",))
def image_decoder(cx, encoded_stream, *, pixel_format="RGB"):
    """(H, W, C) uint8 pixels of a BMP, PNG or PNM stream; an empty (0, 0, C) image for a
    corrupt or unknown stream (v20). JPEG, JPEG 2000, TIFF and WebP need a codec oxla lacks."""
    if pixel_format not in ("RGB", "BGR", "Grayscale"):
        raise cx.fail(f"pixel_format must be 'RGB', 'BGR' or 'Grayscale', got '{pixel_format}'")
    data = np.asarray(encoded_stream, np.uint8).tobytes()
    for magic, name in _CODEC_NEEDED.items():
        if data.startswith(magic):
            raise cx.fail(f"cannot decode {name} images: that needs an image codec oxla does not have "
                          "(BMP, PNG and PNM decode)")
    decoders = {b"\x89PNG": _decode_png, b"BM": _decode_bmp, b"P5": _decode_pnm, b"P6": _decode_pnm}
    decode = next((f for magic, f in decoders.items() if data.startswith(magic)), None)
    try:
        pixels = decode(data) if decode else None
    except _Unsupported as e:
        raise cx.fail(str(e)) from e
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error, zlib.error):
        pixels = None  # a corrupt stream decodes to an empty image, as the spec says
    if pixels is None:
        return np.zeros((0, 0, 1 if pixel_format == "Grayscale" else 3), np.uint8)
    return _as_pixel_format(pixels, pixel_format)
