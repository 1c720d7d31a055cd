"""Neural-net layer rules (softmax family, normalizations, LRN, dropout, Swish) against references."""

from __future__ import annotations

import numpy as np
import pytest

import oxla
from oxla.errors import LoweringError, ShapeError
from tests.lowering.util import check_node, node_model, run_oxla

RNG = np.random.default_rng(0)
X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
X4 = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
C3 = RNG.standard_normal(3).astype(np.float32)
VAR3 = (RNG.random(3) + 0.5).astype(np.float32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_family_v13_single_axis(op: str, axis: int) -> None:
    check_node(op, {"x": X3}, axis=axis)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_family_v11_coerces_to_2d(op: str) -> None:
    # onnx.reference runs opset < 13 with the v13 single-axis semantics (FACTS.md)
    got = check_node(op, {"x": X3}, opset=11, axis=1, reference=False)
    if op == "Softmax":  # one distribution over the 3 * 4 trailing values, not over the last axis
        np.testing.assert_allclose(got[0].sum(axis=(1, 2)), 1, rtol=1e-5)


def test_softmax_float64_and_large_values() -> None:
    check_node("Softmax", {"x": np.array([[1000.0, 1001.0, 1002.0]], np.float64)})


def test_hardmax_ties_pick_the_first() -> None:
    got = check_node("Hardmax", {"x": np.array([[1, 3, 3, 0]], np.float32)})
    assert got[0].tolist() == [[0, 1, 0, 0]]


def test_softmax_axis_out_of_range() -> None:
    with pytest.raises(LoweringError, match="axis 3 is out of range for rank 3"):
        run_oxla(node_model("Softmax", {"x": X3}, axis=3), {"x": X3})


BN = {"x": X4, "scale": C3, "b": C3[::-1].copy(), "mean": C3 * 0.1, "var": VAR3}


@pytest.mark.parametrize("opset", [7, 9, 15])
def test_batch_normalization_inference_uses_stored_statistics(opset: int) -> None:
    # onnx.reference normalizes with the batch's statistics at opsets 9-13 (FACTS.md)
    check_node("BatchNormalization", BN, opset=opset, reference=opset >= 14, epsilon=1e-3)


def test_batch_normalization_v1_v6_is_test() -> None:
    want = check_node("BatchNormalization", BN, opset=6, ort=False, is_test=1)
    # neither oracle has v1; its result is v6's (consumed_inputs is only an in-place hint)
    model = node_model("BatchNormalization", BN, opset=1, is_test=1, consumed_inputs=(0, 0, 0, 1, 1))
    np.testing.assert_allclose(run_oxla(model, BN)[0], want[0], rtol=1e-6)


def test_batch_normalization_2d_input() -> None:
    check_node("BatchNormalization", {**BN, "x": X4[:, :, 0, 0].copy()})


def test_batch_normalization_training_mode_outputs() -> None:
    check_node("BatchNormalization", BN, ("y", "running_mean", "running_var"), training_mode=1,
               momentum=0.8, ort=False)  # onnxruntime's CPU kernel has no training mode


def test_instance_normalization() -> None:
    check_node("InstanceNormalization", {"x": X4, "scale": C3, "b": C3 + 1}, epsilon=1e-2, rtol=1e-4)


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_layer_normalization_axes(axis: int) -> None:
    shape = X3.shape[axis:]
    scale = RNG.standard_normal(shape).astype(np.float32)
    bias = RNG.standard_normal(shape).astype(np.float32)
    check_node("LayerNormalization", {"x": X3, "scale": scale, "b": bias}, ("y", "mean", "inv_std"),
               axis=axis, rtol=1e-4, atol=1e-5)


def test_layer_normalization_without_bias_float16() -> None:
    x = X3.astype(np.float16)
    # onnxruntime 1.32 segfaults building a session for this float16 node
    check_node("LayerNormalization", {"x": x, "scale": np.ones(4, np.float16), "b": None},
               epsilon=0.5, rtol=2e-3, atol=2e-3, ort=False)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_scale_per_group_or_channel(opset: int) -> None:
    x = RNG.standard_normal((2, 4, 3, 2)).astype(np.float32)
    n = 2 if opset == 18 else 4  # v18 scales each group, v21 each channel
    scale, bias = RNG.standard_normal(n).astype(np.float32), RNG.standard_normal(n).astype(np.float32)
    check_node("GroupNormalization", {"x": x, "scale": scale, "bias": bias}, opset=opset,
               num_groups=2, ort=opset == 21, rtol=1e-4, atol=1e-5)


def test_group_normalization_bad_groups() -> None:
    feeds = {"x": X4, "scale": C3, "bias": C3}
    with pytest.raises(LoweringError, match="num_groups \\(2\\) must divide the channel count"):
        run_oxla(node_model("GroupNormalization", feeds, num_groups=2), feeds)


@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_normalization(axis: int) -> None:
    scale = RNG.standard_normal(X3.shape[axis:]).astype(np.float32)
    check_node("RMSNormalization", {"x": X3, "scale": scale}, axis=axis, ort=False, rtol=1e-4)


@pytest.mark.parametrize("axes", [None, (0, 1)])
def test_mean_variance_normalization(axes: tuple[int, ...] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    check_node("MeanVarianceNormalization", {"x": X4}, rtol=1e-4, atol=1e-5, **attrs)


@pytest.mark.parametrize(("p", "axis"), [(1, 0), (2, -1), (2, 1)])
def test_lp_normalization(p: int, axis: int) -> None:
    x = X3.copy()
    x[0, :, 0] = 0  # a zero norm gives 0, not NaN
    # onnx.reference sums x**p without abs, wrong for p=1 and negative values
    got = check_node("LpNormalization", {"x": x}, p=p, axis=axis, reference=p == 2)
    assert not np.isnan(got[0]).any()


@pytest.mark.parametrize("size", [3, 4])
def test_lrn_odd_and_even_sizes(size: int) -> None:
    # N == C: onnx.reference loops over range(N) where it means range(C);
    # onnxruntime refuses even sizes
    x = RNG.standard_normal((3, 3, 4, 2)).astype(np.float32)
    check_node("LRN", {"x": x}, size=size, alpha=0.01, beta=0.6, bias=2.0, rtol=1e-4, ort=size % 2 == 1)


@pytest.mark.parametrize("alpha", [1.0, 0.0, 1.7])
def test_swish(alpha: float) -> None:
    check_node("Swish", {"x": X3}, alpha=alpha, ort=False)


def test_swiglu() -> None:
    check_node("SwiGLU", {"a": X3, "b": X3[::-1].copy()}, alpha=1.5, ort=False)


def test_swiglu_shapes_must_match() -> None:
    feeds = {"a": X3, "b": X3[:, :, :1].copy()}
    with pytest.raises(ShapeError, match="A and B must have the same shape"):
        run_oxla(node_model("SwiGLU", feeds), feeds)


@pytest.mark.parametrize("opset", [10, 22])
def test_dropout_inference_is_identity(opset: int) -> None:
    # onnxruntime returns an all-zero mask at opset < 12; nothing was dropped, so it is all ones
    got = check_node("Dropout", {"x": X3}, ("y", "mask"), opset=opset, ort=opset >= 12)
    assert got[1].all()


def test_dropout_v7_mask_has_the_input_type() -> None:
    # v7 types the mask like X (v10 made it bool); onnx.reference returns bool here
    y, mask = run_oxla(node_model("Dropout", {"x": X3}, ("y", "mask"), opset=7), {"x": X3})
    np.testing.assert_array_equal(y, X3)
    assert mask.dtype == np.float32 and mask.all()


def test_dropout_training_zero_ratio() -> None:
    feeds = {"x": X3, "ratio": np.array(0.0, np.float32), "training_mode": np.array(True)}
    check_node("Dropout", feeds, ("y", "mask"), seed=3)


def test_dropout_training_drops_and_rescales() -> None:
    # a real PRNG: the mask cannot match another runtime's, so check its statistics instead
    x = np.ones((100, 100), np.float32)
    feeds = {"x": x, "ratio": np.array(0.25, np.float32), "training_mode": np.array(True)}
    y, mask = run_oxla(node_model("Dropout", feeds, ("y", "mask"), seed=1), feeds)
    assert mask.dtype == np.bool_ and abs(mask.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y, np.where(mask, 1 / 0.75, 0), rtol=1e-6)
    y2, _ = run_oxla(node_model("Dropout", feeds, ("y", "mask"), seed=1), feeds)
    np.testing.assert_array_equal(y, y2)  # one seed, one mask


def test_dropout_without_seed_draws_a_new_mask_every_run() -> None:
    x = np.ones((50, 50), np.float32)
    feeds = {"x": x, "ratio": np.array(0.5, np.float32), "training_mode": np.array(True)}
    compiled = oxla.compile(node_model("Dropout", feeds, ("y", "mask")))
    first, second = compiled(feeds)["mask"], compiled(feeds)["mask"]
    assert np.asarray(first).mean() > 0.4 and not np.array_equal(first, second)
