"""Signal rules (DFT, STFT, windows, MelWeightMatrix) against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from oxla.errors import LoweringError
from tests.lowering.util import check_node, node_model, run_oxla

RNG = np.random.default_rng(0)
REAL = RNG.standard_normal((2, 8, 3, 1)).astype(np.float32)
CPLX = RNG.standard_normal((2, 8, 3, 2)).astype(np.float32)
OPSET = 21  # onnxruntime 1.32 has no opset 28 kernels
TOL = {"rtol": 1e-4, "atol": 1e-5}


def check(op: str, feeds: dict, *args: object, **kwargs: object) -> list:
    kwargs.setdefault("opset", OPSET)
    return check_node(op, feeds, *args, **{**TOL, **kwargs})


def i64(v: int) -> np.ndarray:
    return np.array(v, np.int64)


@pytest.mark.parametrize("x", [REAL, CPLX], ids=["real", "complex"])
@pytest.mark.parametrize("axis", [1, -2])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_full(x: np.ndarray, axis: int, inverse: int) -> None:
    check("DFT", {"x": x, "n": None, "axis": i64(axis)}, inverse=inverse)


@pytest.mark.parametrize("n", [5, 12])
def test_dft_length_truncates_or_pads(n: int) -> None:
    check("DFT", {"x": REAL, "n": i64(n), "axis": i64(1)})


def test_dft_rfft_and_irfft() -> None:
    spectrum = check("DFT", {"x": REAL, "n": None, "axis": i64(1)}, onesided=1)[0]
    assert spectrum.shape == (2, 5, 3, 2)
    back = check("DFT", {"x": spectrum, "n": None, "axis": i64(1)}, onesided=1, inverse=1)[0]
    np.testing.assert_allclose(back, REAL, atol=1e-5)


def test_dft_v17_axis_attribute_default() -> None:
    check("DFT", {"x": CPLX}, opset=17)
    check("DFT", {"x": CPLX}, opset=17, axis=2, inverse=1)


def test_dft_default_axis_v20_is_minus_two() -> None:
    got = check("DFT", {"x": REAL})[0]
    want = np.fft.fft(REAL[..., 0], axis=-1)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-4, atol=1e-5)


def test_dft_rejects_the_complex_axis() -> None:
    feeds = {"x": REAL, "n": None, "axis": i64(3)}
    with pytest.raises(LoweringError, match="axis 3 is out of range"):
        run_oxla(node_model("DFT", feeds, opset=OPSET), feeds)


SIGNAL = RNG.standard_normal((2, 32, 1)).astype(np.float32)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_with_window(onesided: int) -> None:
    window = np.hanning(10).astype(np.float32)
    check("STFT", {"x": SIGNAL, "step": i64(4), "window": window, "length": None}, onesided=onesided)


def test_stft_frame_length_without_window() -> None:
    got = check("STFT", {"x": SIGNAL, "step": i64(5), "window": None, "length": i64(8)})[0]
    assert got.shape == (2, 5, 5, 2)


def test_stft_complex_signal_two_sided() -> None:
    x = RNG.standard_normal((1, 16, 2)).astype(np.float32)
    check("STFT", {"x": x, "step": i64(3), "window": None, "length": i64(6)}, onesided=0)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op: str, periodic: int) -> None:
    check(op, {"size": np.array(10, np.int32)}, periodic=periodic)


def test_window_output_datatype() -> None:
    got = check("HannWindow", {"size": i64(7)}, output_datatype=TensorProto.DOUBLE)
    assert got[0].dtype == np.float64


def test_mel_weight_matrix() -> None:
    feeds = {"bins": i64(8), "n": i64(64), "rate": i64(8000), "lo": np.array(100, np.float32),
             "hi": np.array(3000, np.float32)}
    got = check("MelWeightMatrix", feeds)
    assert got[0].shape == (33, 8) and got[0].max() == 1
