"""Cast, CastLike and BitCast rules against onnx.reference and onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto

from oxla.errors import LoweringError
from tests.lowering.util import check_node, node_model, run_oxla, run_reference

T = TensorProto
F32 = np.array([[0.5, -1.75, 3.0], [np.nan, np.inf, -np.inf]], np.float32)
BIG = np.array([0.47892547, 1e6, -1e6, 1e-7, np.nan, np.inf, -np.inf, -0.0], np.float32)

# onnxruntime's Python binding refuses the ml_dtypes arrays (bfloat16, float8, 4- and 2-bit
# types), so those cases compare with onnx.reference only.
CASES = [
    ("f32-f16", F32, T.FLOAT16, True),
    ("f32-f64", F32, T.DOUBLE, True),
    ("f32-bool", F32, T.BOOL, True),
    ("f64-f32", F32.astype(np.float64), T.FLOAT, True),
    ("i64-f32", np.array([-3, 0, 7, 2**40], np.int64), T.FLOAT, True),
    ("i32-i8-wraps", np.array([200, -200, 127, 128], np.int32), T.INT8, True),
    ("i64-u8-wraps", np.array([256, 257, -1], np.int64), T.UINT8, True),
    ("bool-f32", np.array([True, False]), T.FLOAT, True),
    ("bool-i64", np.array([True, False]), T.INT64, True),
    ("f32-i32-truncates", np.array([1.9, -1.9, 0.5], np.float32), T.INT32, True),
    ("f32-bf16", F32, T.BFLOAT16, False),
    ("bf16-f32", F32.astype(ml_dtypes.bfloat16), T.FLOAT, False),
    ("f32-e4m3fn", BIG, T.FLOAT8E4M3FN, False),
    ("f32-e4m3fnuz", BIG, T.FLOAT8E4M3FNUZ, False),
    ("f16-e5m2", np.float16([0.47, 6e4, -6e4, 1e-7, np.nan, np.inf, -np.inf]), T.FLOAT8E5M2, False),
    ("f32-e5m2fnuz", BIG, T.FLOAT8E5M2FNUZ, False),
    ("e4m3fn-f32", np.array([0.5, 448, -2], ml_dtypes.float8_e4m3fn), T.FLOAT, False),
    ("f32-int4", np.arange(-9, 16, dtype=np.float32), T.INT4, False),
    ("f32-uint4", np.arange(-9, 16, dtype=np.float32), T.UINT4, False),
    ("int4-i8", np.arange(-8, 8).astype(ml_dtypes.int4), T.INT8, False),
    ("i8-int4-wraps", np.array([9, -9, 7], np.int8), T.INT4, False),
    ("f32-int2", np.arange(-3, 4, dtype=np.float32), T.INT2, False),
    ("uint2-f16", np.arange(0, 4).astype(ml_dtypes.uint2), T.FLOAT16, False),
    ("f32-float4e2m1", np.array([0.48, 1.05, -3.5, 9, 1e6, -0.0], np.float32), T.FLOAT4E2M1, False),
]


@pytest.mark.parametrize(("x", "to", "ort"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cast(x: np.ndarray, to: int, ort: bool) -> None:
    check_node("Cast", {"x": x}, to=to, ort=ort)


@pytest.mark.parametrize("to", [T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ])
def test_cast_float8_no_saturate(to: int) -> None:
    check_node("Cast", {"x": BIG}, to=to, saturate=0, ort=False)


def test_cast_float8_saturates_by_default() -> None:
    got = check_node("Cast", {"x": BIG}, to=T.FLOAT8E4M3FN, ort=False)[0].astype(np.float32)
    assert got[1] == 448 and got[2] == -448 and got[5] == 448 and np.isnan(got[4])


E8M0_IN = np.array([0.0, 0.124, 0.25, 0.5, 1.1, 2.0, 3.0, 1e38, 3.4e38, np.inf], np.float32)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_e8m0(round_mode: str, saturate: int) -> None:
    check_node("Cast", {"x": E8M0_IN}, to=T.FLOAT8E8M0, round_mode=round_mode,
               saturate=saturate, ort=False)


def test_cast_from_e8m0() -> None:
    x = np.array([0.25, 1.0, 8.0], np.float32).astype(ml_dtypes.float8_e8m0fnu)
    check_node("Cast", {"x": x}, to=T.FLOAT16, ort=False)


@pytest.mark.parametrize("opset", [6, 13, 19])
def test_cast_older_opsets(opset: int) -> None:
    check_node("Cast", {"x": F32}, to=T.FLOAT16, opset=opset)


def test_cast_v1_takes_a_type_name() -> None:
    # Cast-1's `to` is a string; onnx.reference and onnxruntime no longer run opset 1
    got = check_node("Cast", {"x": np.array([1.5, -2.5], np.float32)}, to="INT32", opset=1,
                     ort=False, reference=False)
    assert got[0].dtype == np.int32 and got[0].tolist() == [1, -2]


def test_cast_strings_to_numbers() -> None:
    x = np.array(["1.5", "-2", "INF", "-inf", "NaN", "1e-5", "+INF"], object)
    check_node("Cast", {"x": x}, to=T.FLOAT, ort=False)  # ort's Python binding mangles NaN here
    got = check_node("Cast", {"x": np.array(["7", "-300", "12"], object)}, to=T.INT64)
    assert got[0].tolist() == [7, -300, 12]


@pytest.mark.parametrize("x", [np.array([0.5, -2.25, 1e-7], np.float32), np.array([3, -4], np.int64)],
                         ids=["float32", "int64"])
def test_cast_numbers_to_strings(x: np.ndarray) -> None:
    # strings are object arrays in oxla (onnx.reference returns numpy str_ arrays); ort formats
    # floats with its own precision, onnx.reference with numpy's str()
    model = node_model("Cast", {"x": x}, to=T.STRING)
    got, want = run_oxla(model, {"x": x})[0], run_reference(model, {"x": x})[0]
    assert got.dtype == object and got.tolist() == want.tolist()


def test_castlike_takes_the_target_type() -> None:
    check_node("CastLike", {"x": F32, "like": np.zeros(1, np.float16)})
    check_node("CastLike", {"x": np.array([1.9, -3.2], np.float32), "like": np.zeros(0, np.int64)},
               opset=15)


def test_castlike_float8_no_saturate() -> None:
    like = np.zeros(1, ml_dtypes.float8_e4m3fn)
    check_node("CastLike", {"x": BIG, "like": like}, saturate=0, ort=False)


BITCASTS = [
    ("f32-i32", np.array([1.0, -2.5, np.inf], np.float32), T.INT32),
    ("i64-f64", np.array([1, 2**62, -5], np.int64), T.DOUBLE),
    ("bool-u8", np.array([True, False, True]), T.UINT8),
    ("u16-f16", np.array([0x3C00, 0xC000], np.uint16), T.FLOAT16),
    ("i8-u8", np.array([-1, 5, -128], np.int8), T.UINT8),
    ("scalar", np.array(3.5, np.float32), T.UINT32),
    ("int4-uint4", np.array([-8, -1, 0, 7], ml_dtypes.int4), T.UINT4),
    ("u8-e8m0", np.array([127, 128, 255], np.uint8), T.FLOAT8E8M0),
    ("c64-i64", np.array([1 + 2j, -3.5j], np.complex64), T.INT64),
    ("u64-c64", np.array([1, 2**40], np.uint64), T.COMPLEX64),
]


@pytest.mark.parametrize(("x", "to"), [c[1:] for c in BITCASTS], ids=[c[0] for c in BITCASTS])
def test_bitcast(x: np.ndarray, to: int) -> None:
    # onnxruntime 1.32 has no BitCast (opset 26)
    got = np.asarray(check_node("BitCast", {"x": x}, to=to, ort=False)[0])
    assert got.shape == x.shape
    if x.dtype.itemsize == got.dtype.itemsize and "4" not in x.dtype.name:
        assert got.tobytes() == x.tobytes()  # the bits themselves, imaginary parts included


def test_bitcast_needs_equal_widths() -> None:
    x = np.zeros(3, np.float32)
    with pytest.raises(LoweringError, match=r"same width, got float32 \(32 bits\) to int64"):
        run_oxla(node_model("BitCast", {"x": x}, to=T.INT64), {"x": x})
