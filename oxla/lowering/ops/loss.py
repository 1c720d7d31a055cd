"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (every reduction, ignore_index)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from oxla.lowering.common import accum_dtype
from oxla.lowering.registry import rule

_REDUCTIONS = ("none", "sum", "mean")


def _nll(cx, log_prob, target, weight, ignore_index, reduction):
    """loss[n, d...] = -log_prob[n, target[n, d...], d...] * weight[target]; 0 where ignored.

    'mean' divides by the sum of the weights that were used (the count of targets not ignored
    when there are no weights).
    """
    if reduction not in _REDUCTIONS:
        raise cx.fail(f"reduction must be one of {', '.join(_REDUCTIONS)}, got '{reduction}'")
    if log_prob.ndim < 2 or target.shape != (log_prob.shape[0], *log_prob.shape[2:]):
        raise cx.fail(f"input must be (N, C, d1, ...) and target (N, d1, ...), got "
                      f"{tuple(log_prob.shape)} and {tuple(target.shape)}")
    valid = jnp.ones(target.shape, bool) if ignore_index is None else target != ignore_index
    index = jnp.where(valid, target, jnp.zeros((), target.dtype))  # ignored targets may be out of range
    picked = jnp.take_along_axis(log_prob, index[:, None], axis=1)[:, 0]
    wide = accum_dtype(log_prob.dtype)
    w = jnp.ones(target.shape, wide) if weight is None else jnp.take(weight.astype(wide), index)
    w = jnp.where(valid, w, jnp.zeros((), wide))
    loss = -picked.astype(wide) * w
    if reduction == "sum":
        loss = jnp.sum(loss)
    elif reduction == "mean":
        loss = jnp.sum(loss) / jnp.sum(w)
    return loss.astype(log_prob.dtype)


@rule("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(cx, input, target, weight=None, *, ignore_index=None,
                                 reduction="mean"):
    """loss = -input[n, target[n, d], d] * weight[target], reduced by none / sum / mean (v12+)."""
    return _nll(cx, input, target, weight, ignore_index, reduction)


@rule("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(cx, scores, labels, weights=None, *, ignore_index=None,
                               reduction="mean"):
    """loss = NLL(LogSoftmax(scores, axis=1), labels, weights); also returns log_prob (v12+)."""
    if scores.ndim < 2:
        raise cx.shape_error(f"scores must be (N, C, d1, ...), got {tuple(scores.shape)}")
    log_prob = jax.nn.log_softmax(scores.astype(accum_dtype(scores.dtype)), axis=1).astype(scores.dtype)
    return _nll(cx, log_prob, labels, weights, ignore_index, reduction), log_prob
