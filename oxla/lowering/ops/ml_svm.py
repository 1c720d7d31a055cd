"""Support vector machines (ai.onnx.ml): SVMClassifier (libsvm one-vs-one, liblinear) and SVMRegressor.

Computed in float32 like onnxruntime; labels, votes and binary scores follow its conventions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.ops.ml import ML, as_rows, pick_labels, transform_scores
from oxla.lowering.ops.string import text
from oxla.lowering.registry import rule

KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def kernel(cx, x: Any, vectors: np.ndarray, kind: str, params: Sequence[float] | None) -> Any:
    """K[n, v] = kernel(x[n], vectors[v]): linear, poly, rbf or sigmoid."""
    if kind not in KERNELS:
        raise cx.fail(f"kernel_type must be one of {', '.join(KERNELS)}, got {kind!r}")
    gamma, coef0, degree = [*(params or ()), 0.0, 0.0, 0.0][:3]
    sv = jnp.asarray(vectors)
    if kind == "RBF":
        d = x[:, None, :] - sv[None, :, :]
        return jnp.exp(-gamma * jnp.sum(d * d, axis=-1))
    dot = x @ sv.T
    if kind == "POLY":
        return (gamma * dot + coef0) ** degree
    if kind == "SIGMOID":
        return jnp.tanh(gamma * dot + coef0)
    return dot


def _pair_weights(coefficients: np.ndarray, per_class: Sequence[int]) -> tuple[np.ndarray, list]:
    """[vectors, pairs] weights of each one-vs-one classifier (i, j), i < j, and the pairs.

    libsvm stores, for each support vector of class i, its coefficient against class j in row
    j - 1 if j > i else row j of the [classes - 1, vectors] coefficient matrix.
    """
    classes = len(per_class)
    start = np.concatenate([[0], np.cumsum(per_class)]).astype(int)
    pairs = [(i, j) for i in range(classes) for j in range(i + 1, classes)]
    w = np.zeros((coefficients.shape[1], len(pairs)), np.float32)
    for p, (i, j) in enumerate(pairs):
        w[start[i]:start[i + 1], p] = coefficients[j - 1, start[i]:start[i + 1]]
        w[start[j]:start[j + 1], p] = coefficients[i, start[j]:start[j + 1]]
    return w, pairs


def multiclass_probability(r: Any) -> Any:
    """Class probabilities from pairwise ones r [C, C] (Wu, Lin and Weng 2004, method 2)."""
    k = r.shape[0]
    off = 1 - jnp.eye(k, dtype=r.dtype)
    q = jnp.where(jnp.eye(k, dtype=bool), jnp.sum(off * r * r, axis=0), -(r.T * r))
    eps = 0.005 / k

    def sweep(p: Any) -> Any:
        qp = q @ p
        pqp = p @ qp

        def one(i: Any, state: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
            p, qp, pqp = state
            diff = (-qp[i] + pqp) / q[i, i]
            p = p.at[i].add(diff)
            pqp = (pqp + diff * (diff * q[i, i] + 2 * qp[i])) / (1 + diff) / (1 + diff)
            return p / (1 + diff), (qp + diff * q[i]) / (1 + diff), pqp
        return lax.fori_loop(0, k, one, (p, qp, pqp))[0]

    def unfinished(state: tuple[Any, Any]) -> Any:
        p, it = state
        qp = q @ p
        return (it < 100) & (jnp.max(jnp.abs(qp - p @ qp)) >= eps)

    p0 = jnp.full((k,), 1.0 / k, r.dtype)
    return lax.while_loop(unfinished, lambda s: (sweep(s[0]), s[1] + 1), (p0, 0))[0]


def _probabilities(scores: Any, pairs: list, classes: int, prob_a: Sequence[float],
                   prob_b: Sequence[float]) -> Any:
    """[N, C] probabilities from the one-vs-one scores, through libsvm's Platt sigmoids."""
    a = jnp.asarray(np.asarray(prob_a[:len(pairs)], np.float32))
    b = jnp.asarray(np.asarray(prob_b[:len(pairs)], np.float32))
    p = jnp.clip(1 - jax.nn.sigmoid(scores * a + b), 1e-7, 1 - 1e-7)
    i = np.array([i for i, _ in pairs])
    j = np.array([j for _, j in pairs])
    r = jnp.zeros((scores.shape[0], classes, classes), scores.dtype)
    r = r.at[:, i, j].set(p).at[:, j, i].set(1 - p)
    return jax.vmap(multiclass_probability)(r)


def _svc(cx, x: Any, labels: list, coefficients: np.ndarray, vectors: np.ndarray,
         per_class: Sequence[int], rho: np.ndarray, kernel_type: str, params: Any) -> tuple:
    """One-vs-one scores [N, pairs], the pairs, and the class with the most votes [N]."""
    classes = len(labels)
    if len(per_class) != classes:
        raise cx.fail(f"vectors_per_class has {len(per_class)} entries for {classes} classes")
    count = int(sum(per_class))
    if coefficients.size != (classes - 1) * count or vectors.size % max(count, 1):
        raise cx.fail(f"{classes} classes and {count} support vectors need {(classes - 1) * count} "
                      f"coefficients and a multiple of {count} support vector values, got "
                      f"{coefficients.size} and {vectors.size}")
    w, pairs = _pair_weights(coefficients.reshape(classes - 1, count), per_class)
    if rho.size < len(pairs):
        raise cx.fail(f"rho needs {len(pairs)} values (one per pair of classes), got {rho.size}")
    k = kernel(cx, x, vectors.reshape(count, -1), kernel_type, params)
    scores = k @ jnp.asarray(w) + jnp.asarray(rho[:len(pairs)])
    win_i = np.eye(classes, dtype=np.float32)[[i for i, _ in pairs]]
    win_j = np.eye(classes, dtype=np.float32)[[j for _, j in pairs]]
    votes = jnp.where(scores[..., None] > 0, win_i, win_j).sum(axis=1)  # class i wins when > 0
    return scores, pairs, jnp.argmax(votes, axis=1)


@rule("SVMClassifier", since=1, domain=ML)
def svm_classifier(cx, x, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                   kernel_params=None, kernel_type="LINEAR", post_transform="NONE", prob_a=None,
                   prob_b=None, rho=None, support_vectors=None, vectors_per_class=None):
    """Z = one-vs-one SVM scores (or Platt probabilities), Y = the class with most votes  (v1+)."""
    named = bool(classlabels_strings)
    labels = [text(s) for s in classlabels_strings] if named else list(classlabels_ints or ())
    x = as_rows(jnp.asarray(x).astype(jnp.float32))
    coef = np.asarray(coefficients or (), np.float32)
    rho_ = np.asarray(rho or (0.0,), np.float32)
    if len(labels) < 1 or coef.size == 0:
        raise cx.fail("needs class labels and coefficients")
    if sum(vectors_per_class or ()) == 0:  # liblinear: one weight row per class
        if coef.size % len(labels):
            raise cx.fail(f"{coef.size} coefficients do not split into {len(labels)} class rows")
        scores = x @ jnp.asarray(coef.reshape(len(labels), -1)).T + rho_[0]
        index = jnp.argmax(scores, axis=1)
        if len(labels) == 2 and not prob_a:  # onnxruntime's binary rule on the top score
            top = jnp.max(scores, axis=1)
            one = (top >= 0.5) if coef.min() >= 0 else (top > 0)
            index = jnp.where(one, 1, index)
        return pick_labels(cx, index, labels, named), transform_scores(cx, scores, post_transform)
    scores, pairs, index = _svc(cx, x, labels, coef, np.asarray(support_vectors or (), np.float32),
                                vectors_per_class, rho_, kernel_type, kernel_params)
    y = pick_labels(cx, index, labels, named)
    if prob_a:
        probs = _probabilities(scores, pairs, len(labels), prob_a, prob_b or ())
        return y, transform_scores(cx, probs, post_transform)
    # two classes, one score: [-s, s] without a transform, else [1 - s, s] transformed
    expand = 2 if post_transform == "NONE" else 0
    return y, transform_scores(cx, scores, post_transform, expand if len(labels) <= 2 else -1)


@rule("SVMRegressor", since=1, domain=ML)
def svm_regressor(cx, x, *, coefficients=None, kernel_params=None, kernel_type="LINEAR",
                  n_supports=0, one_class=0, post_transform="NONE", rho=None, support_vectors=None):
    """Y = sum_v coefficients[v] K(X, sv[v]) + rho (or X . coefficients + rho), [N, 1]  (v1+)."""
    x = as_rows(jnp.asarray(x).astype(jnp.float32))
    coef = np.asarray(coefficients or (), np.float32)
    rho0 = float((rho or (0.0,))[0])
    if n_supports > 0:
        vectors = np.asarray(support_vectors or (), np.float32)
        if vectors.size != n_supports * x.shape[1] or coef.size != n_supports:
            raise cx.shape_error(f"{n_supports} support vectors of {x.shape[1]} features need "
                          f"{n_supports * x.shape[1]} values and {n_supports} coefficients, got "
                          f"{vectors.size} and {coef.size}")
        y = kernel(cx, x, vectors.reshape(n_supports, -1), kernel_type, kernel_params) @ coef + rho0
    else:  # linear: the coefficients are the weight vector (the kernel is ignored)
        if coef.size != x.shape[1]:
            raise cx.shape_error(f"{x.shape[1]} features need as many coefficients, got {coef.size}")
        y = x @ jnp.asarray(coef) + rho0
    if one_class:
        y = jnp.where(y > 0, 1.0, -1.0).astype(jnp.float32)
    return y[:, None]
