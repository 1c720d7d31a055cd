"""Layout rules (Transpose, Concat, Split, Slice, Tile, Pad, CenterCropPad, DepthToSpace,
SpaceToDepth, Trilu) against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.test_shape import check_folded
from tests.lowering.util import check_node, node_model, run_oxla

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
INT_MAX = 2**63 - 1


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


@pytest.mark.parametrize("perm", [None, (0, 2, 1), (2, 0, 1), (1, 0, 2)])
def test_transpose(perm: tuple[int, ...] | None) -> None:
    check_node("Transpose", {"x": X}, **({} if perm is None else {"perm": perm}))


def test_transpose_rejects_bad_perm() -> None:
    with pytest.raises(LoweringError, match=r"perm \(0, 0, 1\) is not a permutation"):
        run_oxla(node_model("Transpose", {"x": X}, perm=(0, 0, 1)), {"x": X})


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_concat(axis: int) -> None:
    check_node("Concat", {"a": X, "b": X * 2, "c": X - 1}, axis=axis)


def test_concat_empty_part_ints_and_strings() -> None:
    check_node("Concat", {"a": np.zeros((0, 2), np.int64), "b": np.ones((3, 2), np.int64)}, axis=0)
    got = run_oxla(node_model("Concat", {"a": np.array(["x"], object), "b": np.array(["y", "z"], object)},
                              axis=0), {"a": np.array(["x"], object), "b": np.array(["y", "z"], object)})
    assert got[0].tolist() == ["x", "y", "z"]


def test_concat_v1_default_axis() -> None:
    # opset 1 is older than onnx.reference and onnxruntime run
    model = node_model("Concat", {"a": X, "b": X}, opset=1)
    assert run_oxla(model, {"a": X, "b": X})[0].shape == (2, 6, 4)


@pytest.mark.parametrize(("split", "axis", "outs"), [
    (None, 0, 2), (None, -1, 2), (i64(1, 3), -1, 2), (i64(1, 0, 2), 1, 3), (i64(4), 2, 1),
], ids=["equal", "equal-neg", "sizes", "zero-size", "one"])
def test_split(split: np.ndarray | None, axis: int, outs: int) -> None:
    # from v18 an equal split needs num_outputs, so equal splits run at opset 13
    inputs = {"x": X} | ({} if split is None else {"split": split})
    check_node("Split", inputs, [f"y{i}" for i in range(outs)], axis=axis,
               opset=13 if split is None else None)


@pytest.mark.parametrize(("num_outputs", "dim"), [(2, 4), (3, 7), (4, 6)])
def test_split_num_outputs(num_outputs: int, dim: int) -> None:
    x = np.arange(dim * 2, dtype=np.float32).reshape(2, dim)
    got = check_node("Split", {"x": x}, [f"y{i}" for i in range(num_outputs)], axis=1,
                     num_outputs=num_outputs)
    assert sum(g.shape[1] for g in got) == dim


def test_split_v11_and_v13() -> None:
    check_node("Split", {"x": X}, ["a", "b"], opset=11, axis=2, split=[3, 1])
    check_node("Split", {"x": X}, ["a", "b", "c"], opset=13, axis=1)
    check_node("Split", {"x": X, "split": i64(2, 2)}, ["a", "b"], opset=13, axis=-1)


def test_split_num_outputs_error() -> None:
    x = np.zeros((2, 5), np.float32)
    model = node_model("Split", {"x": x}, list("abcd"), axis=1, num_outputs=4)
    with pytest.raises(LoweringError, match="num_outputs 4 cannot split dim 5"):
        run_oxla(model, {"x": x})


def test_split_error() -> None:
    split = i64(1, 1)
    model = node_model("Split", {"x": X, "split": split}, ["a", "b"], axis=1)
    with pytest.raises(LoweringError, match=r"split sizes \(1, 1\) do not add up to dim 3"):
        run_oxla(model, {"x": X, "split": split})


SLICES = [
    ("basic", i64(0, 1), i64(2, 3), None, None),
    ("axes-steps", i64(1, 0), i64(4, 2), i64(2, 0), i64(2, 1)),
    ("negative-index", i64(-3), i64(-1), i64(-1), None),
    ("negative-step", i64(-1), i64(-INT_MAX), i64(2), i64(-1)),
    ("negative-step-2", i64(3, 2), i64(0, -10), i64(2, 1), i64(-2, -1)),
    ("int-max-end", i64(1), i64(INT_MAX), i64(1), None),
    ("start-out-of-bounds", i64(10), i64(20), i64(2), None),
    ("end-before-start", i64(3), i64(1), i64(2), None),
    ("clamp-negative", i64(-100), i64(100), i64(0), i64(1)),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), [s[1:] for s in SLICES],
                         ids=[s[0] for s in SLICES])
def test_slice(starts: np.ndarray, ends: np.ndarray, axes: np.ndarray | None,
               steps: np.ndarray | None) -> None:
    inputs = {"x": X, "starts": starts, "ends": ends}
    if axes is not None:
        inputs["axes"] = axes
    if steps is not None:
        inputs["steps"] = steps
    check_node("Slice", inputs)


def test_slice_v1_attributes() -> None:
    check_node("Slice", {"x": X}, opset=9, starts=[1, -2], ends=[INT_MAX, 4], axes=[1, 2])
    check_node("Slice", {"x": X}, opset=9, starts=[0, 1], ends=[1, 3])


def test_slice_rejects_zero_step() -> None:
    feeds = {"x": X, "starts": i64(0), "ends": i64(2), "axes": i64(0), "steps": i64(0)}
    with pytest.raises(LoweringError, match="steps must not be 0"):
        run_oxla(node_model("Slice", feeds), feeds)


@pytest.mark.parametrize("repeats", [i64(1, 2, 1), i64(2, 1, 3), i64(1, 0, 1)])
def test_tile(repeats: np.ndarray) -> None:
    check_node("Tile", {"x": X, "repeats": repeats})


def test_tile_error() -> None:
    feeds = {"x": X, "repeats": i64(2, 2)}
    with pytest.raises(LoweringError, match="one non-negative count per axis"):
        run_oxla(node_model("Tile", feeds), feeds)


P = RNG.standard_normal((1, 3, 4, 5)).astype(np.float32)
PADS = [
    ("constant", "constant", i64(0, 0, 1, 2, 0, 0, 2, 1), np.array(1.5, np.float32)),
    ("constant-default", "constant", i64(0, 1, 0, 1, 0, 0, 1, 0), None),
    ("reflect", "reflect", i64(0, 0, 2, 1, 0, 0, 1, 3), None),
    ("edge", "edge", i64(0, 0, 2, 2, 0, 1, 0, 3), None),
    ("wrap", "wrap", i64(0, 0, 1, 2, 0, 0, 1, 4), None),
    ("negative", "constant", i64(0, -1, 1, -2, 0, 0, -1, 3), None),
    ("negative-reflect", "reflect", i64(0, 0, -1, 2, 0, 0, 1, -2), None),
]


@pytest.mark.parametrize(("mode", "pads", "value"), [p[1:] for p in PADS], ids=[p[0] for p in PADS])
def test_pad(mode: str, pads: np.ndarray, value: np.ndarray | None) -> None:
    # onnx.reference hands negative pads to np.pad, which refuses them; onnxruntime crops
    inputs = {"x": P, "pads": pads} | ({} if value is None else {"value": value})
    check_node("Pad", inputs, mode=mode, reference=bool((pads >= 0).all()))


def test_pad_axes_and_int_data() -> None:
    check_node("Pad", {"x": P, "pads": i64(1, 2, 0, 3), "value": np.array(-1, np.float32),
                       "axes": i64(-1, 1)})
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    check_node("Pad", {"x": x, "pads": i64(1, 0, 1, 2), "value": np.array(9, np.int32)})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_v2_attributes(mode: str) -> None:
    check_node("Pad", {"x": P}, opset=10, mode=mode, pads=[0, 0, 1, 2, 0, 0, 2, 1], value=0.0)


def test_pad_rejects_unknown_mode() -> None:
    feeds = {"x": P, "pads": i64(0, 0, 1, 1, 0, 0, 1, 1)}
    with pytest.raises(LoweringError, match="mode must be one of constant, reflect, edge, wrap"):
        run_oxla(node_model("Pad", feeds, mode="mirror"), feeds)


@pytest.mark.parametrize(("shape", "axes"), [
    (i64(2, 5, 3), None), (i64(1, 6), (1, 2)), (i64(7, 2), (-2, -1)), (i64(2, 3, 4), None),
], ids=["crop-and-pad", "axes", "negative-axes", "same"])
def test_center_crop_pad(shape: np.ndarray, axes: tuple[int, ...] | None) -> None:
    check_node("CenterCropPad", {"x": X, "shape": shape}, **({} if axes is None else {"axes": axes}))


D = np.arange(2 * 8 * 2 * 3, dtype=np.float32).reshape(2, 8, 2, 3)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode: str) -> None:
    check_node("DepthToSpace", {"x": D}, blocksize=2, mode=mode)


def test_depth_to_space_v1_is_dcr() -> None:
    got_v1 = run_oxla(node_model("DepthToSpace", {"x": D}, opset=1, blocksize=2), {"x": D})[0]
    got_dcr = check_node("DepthToSpace", {"x": D}, blocksize=2, mode="DCR")[0]
    np.testing.assert_array_equal(got_v1, got_dcr)


S = np.arange(2 * 3 * 4 * 6, dtype=np.float32).reshape(2, 3, 4, 6)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth(mode: str) -> None:
    # ort 1.32 has no SpaceToDepth-28 (the version with mode)
    check_node("SpaceToDepth", {"x": S}, blocksize=2, mode=mode, ort=False)


def test_space_to_depth_v13_inverts_depth_to_space() -> None:
    y = check_node("SpaceToDepth", {"x": S}, opset=13, blocksize=2)[0]
    back = check_node("DepthToSpace", {"x": np.asarray(y)}, opset=13, blocksize=2)[0]
    np.testing.assert_array_equal(back, S)


def test_space_to_depth_error() -> None:
    with pytest.raises(LoweringError, match=r"spatial dims \(4, 6\) are not divisible by blocksize 4"):
        run_oxla(node_model("SpaceToDepth", {"x": S}, blocksize=4), {"x": S})


T = RNG.standard_normal((2, 3, 5)).astype(np.float32)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -7, 9])
def test_trilu(upper: int, k: int | None) -> None:
    check_node("Trilu", {"x": T} | ({} if k is None else {"k": np.array(k, np.int64)}), upper=upper)


def test_trilu_int_and_square() -> None:
    check_node("Trilu", {"x": np.arange(16, dtype=np.int64).reshape(4, 4), "k": np.array(1, np.int64)},
               upper=0)


FOLDED = [
    ("Slice", {"x": X, "starts": i64(-1, 0), "ends": i64(-INT_MAX, 3), "axes": i64(2, 1),
               "steps": i64(-2, 2)}, {}, ("starts", "ends", "axes", "steps")),
    ("Split", {"x": X, "split": i64(1, 3)}, {"axis": 2}, ("split",)),
    ("Tile", {"x": X, "repeats": i64(2, 1, 2)}, {}, ("repeats",)),
    ("Pad", {"x": P, "pads": i64(0, 0, 1, 2, 0, 0, 2, 1), "value": np.array(2.5, np.float32)},
     {}, ("pads", "value")),
    ("Pad", {"x": P, "pads": i64(0, 2, 1, 1), "value": None, "axes": i64(1, 3)}, {"mode": "reflect"},
     ("pads", "axes")),
    ("Trilu", {"x": T, "k": np.array(-1, np.int64)}, {"upper": 0}, ("k",)),
    ("CenterCropPad", {"x": X, "shape": i64(5, 2)}, {"axes": (1, 2)}, ("shape",)),
    ("Concat", {"x": X, "c": np.ones((2, 1, 4), np.float32)}, {"axis": 1}, ("c",)),
]


@pytest.mark.parametrize(("op", "inputs", "attrs", "constants"), FOLDED,
                         ids=[f"{f[0]}-{i}" for i, f in enumerate(FOLDED)])
def test_traced_data_with_constant_shapes(op: str, inputs: dict, attrs: dict,
                                          constants: tuple[str, ...]) -> None:
    """Data traced, shape-like inputs folded (float constants stay traced: Pad's value)."""
    outs = ("a", "b") if op == "Split" else ("y",)
    check_folded(op, inputs, set(constants), outs, **attrs)
