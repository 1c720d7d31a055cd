"""Image rules (Resize, Upsample, GridSample, AffineGrid, NonMaxSuppression) against references."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.util import check_node, node_model, run_onnxruntime, run_oxla

RNG = np.random.default_rng(0)
IMG = RNG.standard_normal((1, 2, 4, 5)).astype(np.float32)
OPSET = 21  # onnxruntime 1.32 has no opset 28 kernels


def check(op: str, feeds: dict, *args: object, **kwargs: object) -> list:
    kwargs.setdefault("opset", OPSET)
    return check_node(op, feeds, *args, **kwargs)


def scales(*v: float) -> np.ndarray:
    return np.array(v, np.float32)


def sizes(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("ctm", ["half_pixel", "asymmetric"])
def test_resize_nearest_modes(nearest_mode: str, ctm: str) -> None:
    check("Resize", {"x": IMG, "roi": None, "scales": None, "sizes": sizes(1, 2, 7, 8)},
          mode="nearest", nearest_mode=nearest_mode, coordinate_transformation_mode=ctm)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("factors", [(1, 1, 2, 2), (1, 1, 3, 2), (1, 1, 1.7, 0.6)], ids=["2x", "3x2", "frac"])
def test_resize_tf_half_pixel_for_nn(nearest_mode: str, factors: tuple) -> None:
    # tf2onnx writes it for TensorFlow's nearest resizing; it left the spec in v13, so onnx.reference
    # lacks it, and onnxruntime accepts it at every opset
    check("Resize", {"x": IMG, "roi": None, "scales": scales(*factors)}, mode="nearest",
          nearest_mode=nearest_mode, coordinate_transformation_mode="tf_half_pixel_for_nn",
          reference=False)


@pytest.mark.parametrize("ctm", ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                                 "asymmetric", "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_coordinates_on_a_float32_edge(ctm: str, mode: str) -> None:
    # (1 + 0.5) / 0.6f is 2.5 in float32 (onnxruntime) and 2.4999999 in float64: nearest floor
    # picks another pixel, so coordinates are computed in float32, in onnxruntime's order
    x = RNG.standard_normal((1, 1, 5, 7)).astype(np.float32)
    check("Resize", {"x": x, "roi": None, "scales": scales(1, 1, 1.7, 0.6)}, mode=mode,
          nearest_mode="floor", coordinate_transformation_mode=ctm, reference=False, rtol=1e-4)


def test_resize_tf_crop_and_resize_border_in_float32() -> None:
    # 0.2f * 6 + 8 * (1.2f - 0.2f) * 6 / 10 is 6.0 in float32, just past the border (6) in float64:
    # onnxruntime samples there instead of extrapolating
    x = RNG.standard_normal((1, 1, 5, 7)).astype(np.float32)
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 1.2], np.float32)
    check("Resize", {"x": x, "roi": roi, "scales": None, "sizes": sizes(1, 1, 3, 11)}, mode="linear",
          coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-9.0,
          reference=False, rtol=1e-4)


@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                 "half_pixel_symmetric"])
@pytest.mark.parametrize("factors", [(1, 1, 1.7, 0.6), (1, 1, 0.5, 2.5)], ids=["up-down", "down-up"])
def test_resize_linear_coordinate_modes(ctm: str, factors: tuple) -> None:
    # onnxruntime maps align_corners with the integer output length, onnx.reference (and the
    # conformance data) with the fractional one: they differ when scales do not divide evenly
    check("Resize", {"x": IMG, "roi": None, "scales": scales(*factors)}, mode="linear",
          coordinate_transformation_mode=ctm, ort=ctm != "align_corners", rtol=1e-4)


@pytest.mark.parametrize("a, exclude", [(-0.75, 0), (-0.5, 1)])
def test_resize_cubic(a: float, exclude: int) -> None:
    check("Resize", {"x": IMG, "roi": None, "scales": None, "sizes": sizes(1, 2, 9, 3)},
          mode="cubic", cubic_coeff_a=a, exclude_outside=exclude, rtol=1e-4)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_downsample(mode: str) -> None:
    x = RNG.standard_normal((1, 1, 12, 10)).astype(np.float32)
    check("Resize", {"x": x, "roi": None, "scales": scales(1, 1, 0.4, 0.6)}, mode=mode, antialias=1,
          rtol=1e-4, atol=1e-5)


def test_resize_tf_crop_and_resize_extrapolation() -> None:
    roi = np.array([0, 0, 0.2, -0.3, 1, 1, 1.1, 0.9], np.float32)
    check("Resize", {"x": IMG, "roi": roi, "scales": None, "sizes": sizes(1, 2, 3, 6)}, mode="linear",
          coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.5, rtol=1e-4)


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_axes_and_aspect_ratio(policy: str) -> None:
    got = check("Resize", {"x": IMG, "roi": None, "scales": None, "sizes": sizes(10, 6)}, axes=(3, 2),
                mode="nearest", keep_aspect_ratio_policy=policy)
    want = {"stretch": (6, 10), "not_larger": (6, 8), "not_smaller": (8, 10)}[policy]
    assert got[0].shape == (1, 2, *want)


def test_resize_negative_axes() -> None:
    # onnx.reference cannot take negative axes
    feeds = {"x": IMG, "roi": None, "scales": None, "sizes": sizes(10, 6)}
    got = check("Resize", feeds, axes=(-1, -2), mode="linear", reference=False)
    np.testing.assert_array_equal(got[0], check("Resize", feeds, axes=(3, 2), mode="linear")[0])


def test_resize_uint8_linear_rounds() -> None:
    x = RNG.integers(0, 256, (1, 1, 3, 3)).astype(np.uint8)
    # onnxruntime truncates toward zero (203.5 -> 203); onnx.reference rounds half to even
    got = check("Resize", {"x": x, "roi": None, "scales": scales(1, 1, 2, 2)}, mode="linear", ort=False)
    assert got[0].dtype == np.uint8


@pytest.mark.parametrize("factor", [0.7, 1.7])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_v10_is_asymmetric(factor: float, mode: str) -> None:
    # onnx.reference has no opset-10 Resize; onnxruntime is the reference here
    check("Resize", {"x": IMG, "scales": scales(1, 1, factor, factor)}, opset=10, mode=mode,
          reference=False)


def test_upsample_v9_and_v7() -> None:
    check("Upsample", {"x": IMG, "scales": scales(1, 1, 2, 3)}, opset=9)
    got = check("Upsample", {"x": IMG}, opset=7, reference=False, scales=(1.0, 1.0, 1.5, 2.0),
                mode="linear")
    assert got[0].shape == (1, 2, 6, 10)


def test_resize_errors() -> None:
    feeds = {"x": IMG, "roi": None, "scales": scales(1, 1, 2, 2), "sizes": sizes(1, 2, 8, 10)}
    with pytest.raises(LoweringError, match="only one of scales and sizes"):
        run_oxla(node_model("Resize", feeds, opset=OPSET), feeds)
    feeds = {"x": IMG, "roi": None, "scales": scales(1, 1, 2, 2)}
    with pytest.raises(LoweringError, match="mode must be 'nearest', 'linear' or 'cubic'"):
        run_oxla(node_model("Resize", feeds, opset=OPSET, mode="bilinear"), feeds)


GRID = RNG.uniform(-1.3, 1.3, (1, 3, 4, 2)).astype(np.float32)


GRID_CASES = [(m, p, 0) for m in ("nearest", "linear", "cubic") for p in ("zeros", "border", "reflection")]
GRID_CASES += [("nearest", "border", 1), ("linear", "reflection", 1), ("cubic", "zeros", 1)]


@pytest.mark.parametrize("mode, padding, align", GRID_CASES)
def test_grid_sample_2d(padding: str, mode: str, align: int) -> None:
    # cubic pads each tap as PyTorch and onnxruntime do; onnx.reference pads the coordinate
    check("GridSample", {"x": IMG, "grid": GRID}, mode=mode, padding_mode=padding, align_corners=align,
          reference=mode != "cubic" or padding == "zeros", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_3d(mode: str) -> None:
    x = RNG.standard_normal((2, 2, 3, 4, 5)).astype(np.float32)
    grid = RNG.uniform(-1.2, 1.2, (2, 2, 3, 2, 3)).astype(np.float32)
    check("GridSample", {"x": x, "grid": grid}, mode=mode, padding_mode="border", rtol=1e-4, atol=1e-5)


def test_grid_sample_v16_mode_names() -> None:
    # onnx.reference knows only the v20 mode names
    check("GridSample", {"x": IMG, "grid": GRID}, opset=16, mode="bicubic", reference=False,
          rtol=1e-4, atol=1e-5)
    feeds = {"x": IMG, "grid": GRID}
    with pytest.raises(LoweringError, match="mode must be 'bilinear', 'nearest' or 'bicubic'"):
        run_oxla(node_model("GridSample", feeds, opset=16, mode="linear"), feeds)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 4, 2)], ids=["2d", "3d"])
def test_affine_grid(align: int, size: tuple) -> None:
    nd = len(size) - 2
    theta = RNG.standard_normal((2, nd, nd + 1)).astype(np.float32)
    check("AffineGrid", {"theta": theta, "size": np.array(size, np.int64)}, align_corners=align,
          rtol=1e-4, atol=1e-5)


BOXES = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11],
                   [1, 10.1, 0, 11.1], [0, 100, 1, 101]]], np.float32)
SCORES = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3], [0.1, 0.9, 0.9, 0.2, 0.3, 0.9]]], np.float32)


def nms(boxes: np.ndarray = BOXES, scores: np.ndarray = SCORES, limit: int | None = 3,
        iou: float | None = 0.5, score: float | None = None, **attrs: object) -> np.ndarray:
    feeds = {"boxes": boxes, "scores": scores,
             "max": None if limit is None else np.array([limit], np.int64),
             "iou": None if iou is None else np.array([iou], np.float32),
             "score": None if score is None else np.array([score], np.float32)}
    return check("NonMaxSuppression", feeds, **attrs)[0]


def test_nms_suppresses_by_iou_and_keeps_ties_in_index_order() -> None:
    got = nms()
    # class 1 has three boxes tied at 0.9: the lower index goes first
    assert got.tolist() == [[0, 0, 3], [0, 0, 0], [0, 0, 5], [0, 1, 1], [0, 1, 5], [0, 1, 4]]


def test_nms_score_threshold_limit_and_batches() -> None:
    nms(np.concatenate([BOXES, BOXES[:, ::-1]]), np.concatenate([SCORES, SCORES]), limit=2, score=0.4)


def test_nms_center_point_box() -> None:
    centers = np.array([[[0.5, 0.5, 1, 1], [0.5, 0.6, 1, 1], [0.5, 10.5, 1, 1]]], np.float32)
    nms(centers, SCORES[:, :, :3], center_point_box=1, iou=0.3)


def test_nms_absent_limit_selects_nothing() -> None:
    # onnx.reference fails on absent optional inputs
    assert nms(limit=None, iou=None, reference=False).shape == (0, 3)


def nms_exact(boxes: np.ndarray, scores: np.ndarray, limit: int, iou: float, score: float | None,
              **attrs: object) -> np.ndarray:
    """oxla's selection, checked equal to onnxruntime's row for row (onnx.reference is too slow)."""
    feeds = {"boxes": boxes, "scores": scores, "max": np.array([limit], np.int64),
             "iou": np.array([iou], np.float32),
             "score": None if score is None else np.array([score], np.float32)}
    model = node_model("NonMaxSuppression", feeds, opset=OPSET, **attrs)
    got = run_oxla(model, feeds)[0]
    np.testing.assert_array_equal(got, run_onnxruntime(model, feeds)[0])
    return got


def _random_boxes(rng: np.random.Generator, kind: str, shape: tuple[int, int], center: int) -> np.ndarray:
    if kind == "grid":  # coordinates on a half-unit grid: many equal, zero-area and reversed boxes
        return (rng.integers(0, 4, (*shape, 4)) / 2).astype(np.float32)
    if kind == "normal":  # corners in any order, widths and heights of either sign
        return (rng.standard_normal((*shape, 4)) * 2).astype(np.float32)
    xy, wh = rng.random((*shape, 2)) * 10, rng.random((*shape, 2)) * 3
    return np.concatenate([xy, wh if center else xy + wh], -1).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("kind", ["grid", "normal", "boxes"])
def test_nms_matches_onnxruntime_on_random_and_degenerate_boxes(kind: str, center: int) -> None:
    rng = np.random.default_rng(7)
    for n, classes, limit, iou, score in [(5, 3, 3, 0.5, None), (40, 2, 10, 0.0, 0.3),
                                          (300, 3, 50, 0.5, 0.5), (300, 2, 2**40, 0.7, None),
                                          (200, 2, 20, 1.0, 0.0)]:
        boxes = _random_boxes(rng, kind, (2, n), center)
        scores = (rng.integers(0, 5, (2, classes, n)) / 4 if kind == "grid"  # many tied scores
                  else rng.random((2, classes, n))).astype(np.float32)
        nms_exact(boxes, scores, limit, iou, score, center_point_box=center)


def test_nms_tie_at_the_ranking_cut_keeps_the_lower_index() -> None:
    # 200 boxes far apart, scores tied in blocks: the best 2 * limit cut falls inside a tie
    boxes = np.stack([np.arange(200) * 2, np.zeros(200), np.arange(200) * 2 + 1, np.ones(200)], 1)
    scores = (np.arange(200)[::-1] // 7).astype(np.float32)[None, None]
    got = nms_exact(boxes[None].astype(np.float32), scores, 30, 0.5, None)
    assert len(got) == 30


def test_nms_heavy_suppression_past_the_ranked_prefix() -> None:
    # nested boxes suppress each other: the limit needs candidates beyond the first ranked prefix
    rng = np.random.default_rng(3)
    base = rng.random((1, 400, 2)).astype(np.float32)
    boxes = np.concatenate([base, base + rng.random((1, 400, 2)).astype(np.float32) * 0.1 + 0.9], -1)
    got = nms_exact(boxes, rng.random((1, 2, 400)).astype(np.float32), 40, 0.05, None)
    assert 0 < len(got) < 80


def test_nms_long_suppression_chain_still_exact() -> None:
    # each box overlaps only its neighbours (IoU 1/3): the fixed-point rounds settle one box at a
    # time, so the rows finish in the sequential pass
    x = np.arange(200, dtype=np.float32) * 0.5
    boxes = np.stack([np.zeros(200), x, np.ones(200), x + 1], 1).astype(np.float32)[None]
    scores = np.stack([np.linspace(1, 0, 200), np.linspace(0, 1, 200)]).astype(np.float32)[None]
    got = nms_exact(boxes, scores, 100, 0.3, None)
    assert len(got) == 200


def test_nms_long_candidate_list_uses_the_chunked_loop() -> None:
    rng = np.random.default_rng(4)
    boxes = _random_boxes(rng, "boxes", (1, 1500), 0)
    nms_exact(boxes, rng.random((1, 1, 1500)).astype(np.float32), 1000, 0.3, 0.1)


PIXELS = RNG.integers(0, 256, (5, 4, 3)).astype(np.uint8)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else b if pb <= pc else c


def _png(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG whose rows use filters 0, 1, 2, 3, 4 in turn."""
    h, w, bpp = pixels.shape
    rows, prior = b"", np.zeros(w * bpp, int)
    for y in range(h):
        row, kind, out = pixels[y].reshape(-1).astype(int), y % 5, []
        for i, v in enumerate(row):
            a, b, c = (row[i - bpp] if i >= bpp else 0), prior[i], (prior[i - bpp] if i >= bpp else 0)
            pred = [0, a, b, (a + b) // 2, _paeth(a, b, c)][kind]
            out.append((v - pred) % 256)
        rows += bytes([kind, *out])
        prior = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def _bmp(pixels: np.ndarray) -> bytes:
    h, w, _ = pixels.shape
    stride = (w * 3 + 3) // 4 * 4
    rows = b"".join(pixels[y, :, ::-1].tobytes().ljust(stride, b"\0") for y in range(h - 1, -1, -1))
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(rows), 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + len(rows), 0, 0, 54) + info + rows


def _decode(data: bytes, **attrs: object) -> np.ndarray:
    # onnxruntime lacks the op; the expected pixels are known (the JPEG, JPEG 2000, WebP and TIFF
    # cases of the conformance suite check the lossy codecs against onnx.reference)
    feeds = {"x": np.frombuffer(data, np.uint8).copy()}
    return run_oxla(node_model("ImageDecoder", feeds, opset=OPSET, **attrs), feeds)[0]


@pytest.mark.parametrize("encode", [_png, _bmp, lambda p: b"P6\n# c\n4 5\n255\n" + p.tobytes()],
                         ids=["png", "bmp", "pnm"])
def test_image_decoder_lossless_formats(encode: Callable[[np.ndarray], bytes]) -> None:
    data = encode(PIXELS)
    np.testing.assert_array_equal(_decode(data), PIXELS)
    np.testing.assert_array_equal(_decode(data, pixel_format="BGR"), PIXELS[..., ::-1])
    gray = _decode(data, pixel_format="Grayscale")
    want = (PIXELS.astype(np.int64) @ np.array([19595, 38470, 7471]) + 0x8000) >> 16
    np.testing.assert_array_equal(gray[..., 0], want)


def test_image_decoder_corrupt_stream_is_empty() -> None:
    assert _decode(b"not an image").shape == (0, 0, 3)
    assert _decode(_png(PIXELS)[:40], pixel_format="Grayscale").shape == (0, 0, 1)
    assert _decode(b"\xff\xd8\xff\xe0" + bytes(20)).shape == (0, 0, 3)  # a JPEG header, no image


def test_image_decoder_without_pillow_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_pil(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("PIL"):
            raise ImportError(name)
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(LoweringError, match=r"needs Pillow: pip install 'oxla\[image\]'"):
        _decode(_png(PIXELS))
