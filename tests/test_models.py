"""Real converter-exported models (scripts/export_models.py) agree with onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import oxla

MODELS = Path(__file__).resolve().parent.parent / "models"
RNG = np.random.default_rng(0)


def _both(name: str, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    path = str(MODELS / name)
    got = oxla.InferenceSession(path).run(None, feeds)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def _assert_close(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-3, atol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["resnet_small.onnx", "mobilenet_small.onnx"])
@pytest.mark.parametrize("batch", [1, 3])
def test_cnn(name: str, batch: int) -> None:
    image = RNG.standard_normal((batch, 3, 64, 64)).astype(np.float32)
    _assert_close(*_both(name, {"image": image}))


@pytest.mark.parametrize("shape", [(1, 8), (2, 16), (3, 5)])
def test_transformer_encoder(shape: tuple[int, int]) -> None:
    ids = RNG.integers(0, 100, shape).astype(np.int64)
    _assert_close(*_both("transformer_encoder.onnx", {"ids": ids}))


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("steps", [0, 3])
def test_if_and_loop(sign: float, steps: int) -> None:
    x = (sign * np.abs(RNG.standard_normal((2, 8)))).astype(np.float32)
    _assert_close(*_both("control_flow.onnx", {"x": x, "steps": np.array(steps, np.int64)}))


def test_detector_with_non_max_suppression() -> None:
    image = RNG.standard_normal((1, 3, 64, 64)).astype(np.float32)
    (sel, boxes), (sel_ref, boxes_ref) = _both("detector_nms.onnx", {"image": image})
    np.testing.assert_array_equal(sel, sel_ref)
    _assert_close([boxes], [boxes_ref])
    assert len(sel) > 0
