"""Pooling rules against onnx.reference and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.util import check_node

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 7, 8)).astype(np.float32)

MAX_POOL = {
    "pads-strides": {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "strides": [2, 2]},
    "ceil": {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
    "dilations": {"kernel_shape": [2, 2], "dilations": [2, 3]},
    "same-upper": {"kernel_shape": [3, 2], "strides": [2, 3], "auto_pad": "SAME_UPPER"},
    "valid": {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "VALID"},
}


@pytest.mark.parametrize("case", MAX_POOL, ids=lambda c: f"MaxPool-{c}")
def test_max_pool(case: str) -> None:
    check_node("MaxPool", {"x": X}, **MAX_POOL[case])


def test_max_pool_same_lower() -> None:
    # onnx.reference pads SAME_LOWER like SAME_UPPER
    check_node("MaxPool", {"x": X}, kernel_shape=[3, 2], strides=[2, 3], auto_pad="SAME_LOWER",
               reference=False)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float16])
def test_max_pool_small_types(dtype: type) -> None:
    x = RNG.integers(-128 if dtype == np.int8 else 0, 127, (1, 2, 5, 5)).astype(dtype)
    check_node("MaxPool", {"x": x}, kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2])


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices(storage_order: int) -> None:
    got = check_node("MaxPool", {"x": X}, ["y", "indices"], kernel_shape=[3, 3], strides=[2, 2],
                     pads=[1, 1, 0, 1], storage_order=storage_order)
    assert got[1].dtype == np.int64


@pytest.mark.parametrize("rank", [1, 3])
def test_max_pool_indices_1d_3d(rank: int) -> None:
    x = RNG.standard_normal((2, 2, 9, 4, 5)[: rank + 2]).astype(np.float32)
    check_node("MaxPool", {"x": x}, ["y", "indices"], kernel_shape=[3, 2, 2][:rank],
               strides=[2, 1, 2][:rank], dilations=[1, 2, 1][:rank])


def test_max_pool_opset7() -> None:
    check_node("MaxPool", {"x": X}, opset=7, kernel_shape=[2, 2], pads=[1, 1, 1, 1])


AVERAGE_POOL = {
    "pads": {"kernel_shape": [3, 3], "pads": [1, 1, 2, 0]},
    "pads-count-include-pad": {"kernel_shape": [3, 3], "pads": [1, 1, 2, 0],
                               "count_include_pad": 1},
    "ceil-last-window-on-pad": {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [3, 3],
                                "ceil_mode": 1, "count_include_pad": 1},
    "ceil": {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1},
    "dilations": {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
    "same-upper": {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    "same-lower-count-pad": {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER",
                             "count_include_pad": 1},
}


@pytest.mark.parametrize("case", AVERAGE_POOL, ids=lambda c: f"AveragePool-{c}")
def test_average_pool(case: str) -> None:
    check_node("AveragePool", {"x": X}, **AVERAGE_POOL[case])


def test_average_pool_ceil_extra_is_not_padding() -> None:
    # ceil_mode adds two trailing elements here; onnx.reference spreads them over both ends
    check_node("AveragePool", {"x": X[:, :, :5]}, kernel_shape=[4, 4], strides=[3, 4],
               ceil_mode=1, count_include_pad=1, reference=False)


def test_average_pool_opset7_float16() -> None:
    x = X.astype(np.float16)
    check_node("AveragePool", {"x": x}, opset=7, kernel_shape=[2, 2], pads=[0, 0, 1, 1],
               rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p: int) -> None:
    check_node("LpPool", {"x": X}, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 0, 1], p=p,
               rtol=1e-4)


def test_lp_pool_ceil_dilations() -> None:
    # onnx.reference counts the ceil_mode padding in LpPool's last windows
    check_node("LpPool", {"x": X}, kernel_shape=[2, 2], dilations=[1, 2], ceil_mode=1,
               strides=[2, 2], reference=False, rtol=1e-4)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
@pytest.mark.parametrize("rank", [3, 5])
def test_global_pools(op: str, rank: int) -> None:
    x = RNG.standard_normal((2, 3, 4, 5, 2)[:rank]).astype(np.float32)
    # onnx.reference has no GlobalLpPool, and its GlobalMaxPool reduces the wrong axes unless 4-D;
    # onnxruntime has no GlobalLpPool-22 (bfloat16): opset 21
    check_node(op, {"x": x}, opset=21, reference=op == "GlobalAveragePool", rtol=1e-5)


def test_global_lp_pool_p3() -> None:
    check_node("GlobalLpPool", {"x": X}, opset=21, p=3, reference=False, rtol=1e-4)


def test_global_max_pool_4d() -> None:
    check_node("GlobalMaxPool", {"x": X})


def test_max_unpool_inverts_max_pool() -> None:
    y, i = check_node("MaxPool", {"x": X[:, :, :6]}, ["y", "indices"], kernel_shape=[2, 2],
                      strides=[2, 2])
    got = check_node("MaxUnpool", {"x": y, "i": i}, kernel_shape=[2, 2], strides=[2, 2])
    assert got[0].shape == (2, 3, 6, 8)


def test_max_unpool_output_shape() -> None:
    # the indices address the inferred (6, 8) output, grown at the end to output_shape, as in the
    # ONNX conformance case; onnxruntime instead reads them as indices into output_shape
    y, i = check_node("MaxPool", {"x": X[:, :, :6]}, ["y", "indices"], kernel_shape=[2, 2],
                      strides=[2, 2])
    shape = np.array([2, 3, 7, 9], np.int64)
    got = check_node("MaxUnpool", {"x": y, "i": i, "output_shape": shape}, kernel_shape=[2, 2],
                     strides=[2, 2], ort=False)
    assert got[0].shape == (2, 3, 7, 9)


def test_max_roi_pool() -> None:
    rois = np.array([[0, 1, 1, 6, 5], [1, 0, 2, 3, 3], [0, 2.4, 0.6, 7.5, 6.5]], np.float32)
    # onnx.reference has no MaxRoiPool; onnxruntime has no MaxRoiPool-22 (bfloat16): opset 21
    check_node("MaxRoiPool", {"x": X, "rois": rois}, opset=21, pooled_shape=[2, 3],
               spatial_scale=0.9, reference=False)


ROIS = np.array([[0.5, 0.5, 6.0, 5.0], [1.0, 0.0, 3.3, 6.2], [-1.0, 2.0, 9.0, 9.0]], np.float32)
BATCH = np.array([0, 1, 1], np.int64)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
def test_roi_align(mode: str, transform: str) -> None:
    # onnxruntime has no RoiAlign-22 (bfloat16): opset 21
    check_node("RoiAlign", {"x": X, "rois": ROIS, "batch_indices": BATCH}, opset=21, mode=mode,
               coordinate_transformation_mode=transform, output_height=3, output_width=2,
               sampling_ratio=2, spatial_scale=0.8, rtol=1e-4, atol=1e-5)


def test_roi_align_adaptive_grid_opset10() -> None:
    # sampling_ratio=0 takes ceil(roi size / bins) samples per bin: the rois must be known;
    # onnx.reference applies v16's half-pixel shift to v10 models too
    check_node("RoiAlign", {"x": X, "rois": ROIS, "batch_indices": BATCH}, opset=10,
               output_height=2, output_width=3, reference=False, rtol=1e-4, atol=1e-5)


def test_pool_kernel_shape_message() -> None:
    with pytest.raises(LoweringError, match="kernel_shape must have 2 values"):
        check_node("MaxPool", {"x": X}, kernel_shape=[2])


def test_pooling_is_differentiable() -> None:
    import jax
    import jax.numpy as jnp
    import onnx

    import oxla

    m = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[1,1,4,4] x) => (float[1,1,2,2] y, float[1,1,2,2] z) {
            y = MaxPool<kernel_shape=[2,2], strides=[2,2]>(x)
            z = AveragePool<kernel_shape=[2,2], strides=[2,2]>(x) }""")
    c = oxla.compile(m)
    x = jnp.arange(16.0, dtype=jnp.float32).reshape(1, 1, 4, 4)
    grad = jax.jit(jax.grad(lambda x: sum(jnp.sum(v) for v in c.fn(c.params, {"x": x}).values())))(x)
    want = np.full((4, 4), 0.25, np.float32)
    want[1::2, 1::2] += 1.0  # the max of each window gets the MaxPool gradient
    np.testing.assert_array_equal(np.asarray(grad).reshape(4, 4), want)


def _window_for(x: np.ndarray, **attrs: object):  # type: ignore[no-untyped-def]
    from oxla.lowering.ops import pool

    class Cx:
        def fail(self, message: str) -> Exception:
            return ValueError(message)

        shape_error = fail

    return pool.window(Cx(), x, attrs["kernel_shape"], attrs.get("strides"), attrs.get("dilations"),
                       attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), attrs.get("ceil_mode", 0))


@pytest.mark.parametrize("case", MAX_POOL, ids=lambda c: f"MaxPool-slices-{c}")
def test_max_pool_slices_match_reduce_window_with_ties_and_nan(case: str) -> None:
    """The strided-slice max is reduce_window's value, gradient (ties: the first maximum) and JVP."""
    import jax
    from jax import lax

    x = np.round(X * 2) / 2  # many ties inside windows
    x[0, 0, 1, 1] = np.nan
    win = _window_for(x, **MAX_POOL[case])
    slow = lambda v: win.reduce(v, -np.inf, lax.max)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(win.max(x)), np.asarray(slow(x)))
    x = np.nan_to_num(x)
    cot = RNG.standard_normal(win.max(x).shape).astype(np.float32)
    if "dilations" in MAX_POOL[case]:  # JAX has no VJP of a dilated reduce_window max: neither form
        for f in (win.max, slow):
            with pytest.raises(NotImplementedError):
                jax.vjp(f, x)[1](cot)
    else:
        grads = [jax.vjp(f, x)[1](cot)[0] for f in (win.max, slow)]
        np.testing.assert_array_equal(*grads)
    tangents = [jax.jvp(f, (x,), (X,))[1] for f in (win.max, slow)]
    np.testing.assert_array_equal(*tangents)


@pytest.mark.parametrize("rank", [1, 3])
def test_max_pool_slices_other_ranks_and_large_windows(rank: int) -> None:
    x = RNG.standard_normal((1, 2, 9, 8, 7)[:2 + rank]).astype(np.float32)
    check_node("MaxPool", {"x": x}, kernel_shape=[3, 2, 2][:rank], strides=[2, 1, 2][:rank],
               pads=[1, 0, 1, 1, 1, 0][:rank] + [0, 1, 1][:rank])
    check_node("MaxPool", {"x": x}, kernel_shape=[9, 8, 7][:rank])  # past the slice budget in 3-D
