"""Loss rules (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss) against references; gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import oxla
from oxla.errors import LoweringError
from tests.lowering.util import check_node, node_model, run_oxla

RNG = np.random.default_rng(0)
SCORES = RNG.standard_normal((3, 5, 2)).astype(np.float32)  # (N, C, d1)
LABELS = np.array([[0, 4], [2, 1], [4, 3]], np.int64)
WEIGHTS = RNG.random(5).astype(np.float32) + 0.1
LOG_PROB = np.log(np.exp(SCORES) / np.exp(SCORES).sum(1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nllloss_reductions(reduction: str, weighted: bool) -> None:
    feeds = {"input": LOG_PROB, "target": LABELS, "weight": WEIGHTS if weighted else None}
    check_node("NegativeLogLikelihoodLoss", feeds, reduction=reduction)


@pytest.mark.parametrize("ignore_index", [2, -1, 0])
def test_nllloss_ignore_index_out_of_range_allowed(ignore_index: int) -> None:
    target = LABELS.copy()
    target[1, 0] = ignore_index  # -1 is not a class: it must not be gathered
    feeds = {"input": LOG_PROB, "target": target, "weight": WEIGHTS}
    check_node("NegativeLogLikelihoodLoss", feeds, ignore_index=ignore_index)


def test_nllloss_2d_input_int32_target() -> None:
    feeds = {"input": LOG_PROB[:, :, 0].copy(), "target": LABELS[:, 0].astype(np.int32)}
    check_node("NegativeLogLikelihoodLoss", feeds, reduction="sum")


def test_nllloss_rank5_mean_weighted() -> None:
    x = RNG.standard_normal((2, 3, 2, 1, 2)).astype(np.float32)
    t = RNG.integers(0, 3, (2, 2, 1, 2)).astype(np.int64)
    check_node("NegativeLogLikelihoodLoss", {"input": x, "target": t, "weight": WEIGHTS[:3]})


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_sce_reductions_with_log_prob(reduction: str) -> None:
    feeds = {"scores": SCORES, "labels": LABELS, "weights": None}
    check_node("SoftmaxCrossEntropyLoss", feeds, ("loss", "log_prob"), reduction=reduction)


def test_sce_weights_and_negative_ignore_index() -> None:
    labels = LABELS.copy()
    labels[0, 1] = -5
    feeds = {"scores": SCORES, "labels": labels, "weights": WEIGHTS}
    check_node("SoftmaxCrossEntropyLoss", feeds, ignore_index=-5)


def test_sce_float64() -> None:
    feeds = {"scores": SCORES[:, :, 0].astype(np.float64), "labels": LABELS[:, 0]}
    check_node("SoftmaxCrossEntropyLoss", feeds, reduction="sum")


def test_bad_reduction_is_reported() -> None:
    feeds = {"input": LOG_PROB, "target": LABELS}
    with pytest.raises(LoweringError, match="reduction must be one of none, sum, mean, got 'avg'"):
        run_oxla(node_model("NegativeLogLikelihoodLoss", feeds, reduction="avg"), feeds)


def test_target_shape_is_checked() -> None:
    feeds = {"input": LOG_PROB, "target": LABELS[:, :1].copy()}
    with pytest.raises(LoweringError, match="target \\(N, d1, ...\\)"):
        run_oxla(node_model("NegativeLogLikelihoodLoss", feeds), feeds)


def test_sce_gradient_is_softmax_minus_one_hot() -> None:
    scores, labels = SCORES[:, :, 0].copy(), LABELS[:, 0].copy()
    compiled = oxla.compile(node_model("SoftmaxCrossEntropyLoss", {"scores": scores, "labels": labels}))

    def loss(s: jax.Array) -> jax.Array:
        return compiled.fn(compiled.params, {"scores": s, "labels": jnp.asarray(labels)})["y"]

    grad = np.asarray(jax.grad(loss)(jnp.asarray(scores)))
    probs = np.exp(scores) / np.exp(scores).sum(1, keepdims=True)
    np.testing.assert_allclose(grad, (probs - np.eye(5)[labels]) / 3, rtol=1e-5, atol=1e-6)
