"""Tree ensembles (ai.onnx.ml): TreeEnsembleClassifier/Regressor (v1, v3) and TreeEnsemble (v5).

Every tree descends at once: a [N, trees] array of node indices takes `depth` gather steps inside
one lax.fori_loop, so an ensemble compiles to a fixed-size XLA loop rather than a loop per sample.
Aggregation and the binary-classifier conventions follow onnxruntime.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.ops.ml import ML, as_rows, pick_labels, probit, transform_scores
from oxla.lowering.ops.string import text
from oxla.lowering.registry import rule

# Node modes, in TreeEnsemble v5's numbering; LEAF is ours (v5 keeps leaves in separate arrays)
MODES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4,
         "BRANCH_NEQ": 5, "BRANCH_MEMBER": 6, "LEAF": 7}
LEAF, MEMBER = 7, 6
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")


@dataclass(frozen=True)
class Forest:
    """The trees as flat node arrays (interior nodes and leaves alike), built on the host."""

    mode: np.ndarray          # [nodes] int: MODES
    feature: np.ndarray       # [nodes] int64
    threshold: np.ndarray     # [nodes] float64
    true: np.ndarray          # [nodes] int64 node index (a leaf points at itself)
    false: np.ndarray         # [nodes] int64
    missing_true: np.ndarray  # [nodes] bool: a NaN feature takes the true branch
    members: np.ndarray | None  # [nodes, M] float64 set members (NaN-padded), for MEMBER nodes
    roots: np.ndarray         # [trees] int64
    weight: np.ndarray        # [nodes, targets] float64: sum of a leaf's weights per target
    low: np.ndarray           # [nodes, targets]: least weight (+inf where none), for MIN
    high: np.ndarray          # [nodes, targets]: greatest weight (-inf where none), for MAX
    has: np.ndarray           # [nodes, targets] bool: the leaf votes for the target

    @property
    def depth(self) -> int:
        """The most interior nodes on a root-to-leaf path."""
        depth, level, seen = 0, set(self.roots.tolist()), 0
        while True:
            inner = [i for i in level if self.mode[i] != LEAF]
            if not inner:
                return depth
            seen += len(inner)
            if seen > self.mode.size * self.roots.size:
                raise ValueError("the trees have a cycle (a node is its own descendant)")
            level = {int(self.true[i]) for i in inner} | {int(self.false[i]) for i in inner}
            depth += 1


def _votes(n_nodes: int, targets: int, node: Sequence[int], target: Sequence[int],
           weight: Sequence[float] | np.ndarray) -> tuple[np.ndarray, ...]:
    """Per-(node, target) sum, min, max and presence of the leaf weights."""
    w = np.zeros((n_nodes, targets))
    low = np.full((n_nodes, targets), np.inf)
    high = np.full((n_nodes, targets), -np.inf)
    has = np.zeros((n_nodes, targets), bool)
    for i, t, v in zip(node, target, weight):
        if not 0 <= t < targets:
            raise ValueError(f"target/class id {t} is outside [0, {targets})")
        w[i, t] += v
        low[i, t] = min(low[i, t], v)
        high[i, t] = max(high[i, t], v)
        has[i, t] = True
    return w, low, high, has


def forest_v3(treeids: Sequence[int], nodeids: Sequence[int], featureids: Sequence[int],
              modes: Sequence[str], values: Sequence[float], trueids: Sequence[int],
              falseids: Sequence[int], missing: Sequence[int] | None,
              vote: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[float]],
              targets: int) -> Forest:
    """A Forest from the v1/v3 encoding: nodes named by (tree id, node id)."""
    index = {(t, n): i for i, (t, n) in enumerate(zip(treeids, nodeids))}
    mode = np.array([MODES[text(m)] for m in modes], np.int64)
    n = mode.size

    def child(ids: Sequence[int], i: int) -> int:
        if mode[i] == LEAF:
            return i
        key = (treeids[i], ids[i])
        if key not in index:
            raise ValueError(f"node {nodeids[i]} of tree {treeids[i]} points at missing node {ids[i]}")
        return index[key]

    roots: dict[int, int] = {}
    for i, t in enumerate(treeids):
        roots.setdefault(t, i)  # a tree's first node is its root
    vote_trees, vote_nodes, vote_targets, vote_weights = vote
    nodes = [index[(t, v)] for t, v in zip(vote_trees, vote_nodes)]
    missing_true = np.array(missing or [0] * n, bool)
    return Forest(mode, np.array(featureids, np.int64), np.array(values, np.float64),
                  np.array([child(trueids, i) for i in range(n)], np.int64),
                  np.array([child(falseids, i) for i in range(n)], np.int64), missing_true,
                  None, np.array([roots[t] for t in sorted(roots)], np.int64),
                  *_votes(n, targets, nodes, vote_targets, vote_weights))


def descend(cx, forest: Forest, x: Any) -> Any:
    """The leaf each row of x [N, F] reaches in each tree: [N, trees] node indices."""
    used = forest.feature[forest.mode != LEAF]
    if used.size and (used.min() < 0 or used.max() >= x.shape[1]):
        raise cx.shape_error(f"the trees test features up to {int(used.max())}, but X has {x.shape[1]}")
    modes = sorted({int(m) for m in forest.mode} - {LEAF})
    mode, feature = jnp.asarray(forest.mode), jnp.asarray(forest.feature)
    threshold = jnp.asarray(forest.threshold.astype(x.dtype))
    true, false = jnp.asarray(forest.true), jnp.asarray(forest.false)
    missing = jnp.asarray(forest.missing_true)
    members = None if forest.members is None else jnp.asarray(forest.members.astype(x.dtype))

    def step(_: Any, at: Any) -> Any:
        v = jnp.take_along_axis(x, feature[at], axis=1)
        th, m = threshold[at], mode[at]
        tests = {0: v <= th, 1: v < th, 2: v >= th, 3: v > th, 4: v == th, 5: v != th}
        if MEMBER in modes and members is not None:
            tests[MEMBER] = jnp.any(v[..., None] == members[at], axis=-1)
        go = tests[modes[0]] if len(modes) == 1 else jnp.select(
            [m == k for k in modes], [tests[k] for k in modes], False)
        go = go | (jnp.isnan(v) & missing[at])
        return jnp.where(m == LEAF, at, jnp.where(go, true[at], false[at]))

    start = jnp.broadcast_to(jnp.asarray(forest.roots), (x.shape[0], forest.roots.size))
    if not modes:
        return start
    return lax.fori_loop(0, forest.depth, step, start)


def aggregate(forest: Forest, leaves: Any, how: str, dtype: Any) -> tuple[Any, Any]:
    """(scores, has) [N, targets]: the trees' votes summed, averaged, or their min or max."""
    has = jnp.any(jnp.asarray(forest.has)[leaves], axis=1)
    if how in ("SUM", "AVERAGE"):
        score = jnp.sum(jnp.asarray(forest.weight.astype(dtype))[leaves], axis=1)
        if how == "AVERAGE":
            score = score / forest.roots.size
    elif how == "MIN":
        score = jnp.min(jnp.asarray(forest.low.astype(dtype))[leaves], axis=1)
    else:
        score = jnp.max(jnp.asarray(forest.high.astype(dtype))[leaves], axis=1)
    return jnp.where(has, score, 0), has


def compute_dtype(x: Any, *tensors: Any) -> Any:
    """Thresholds and sums in double when X or any *_as_tensor attribute is double, else float."""
    wide = x.dtype == np.float64 or any(t is not None for t in tensors)
    return jnp.float64 if wide else jnp.float32


def regress(cx, forest: Forest, x: Any, how: str, base: Any, post_transform: str,
            dtype: Any) -> Any:
    """Scores of a regression ensemble, base values and post-transform as onnxruntime does."""
    if how not in AGGREGATES:
        raise cx.fail(f"aggregate_function must be one of {', '.join(AGGREGATES)}, got {how!r}")
    score, has = aggregate(forest, descend(cx, forest, as_rows(x).astype(dtype)), how, dtype)
    targets = forest.weight.shape[1]
    base = np.asarray(base if base is not None else (), np.float64).reshape(-1)
    if targets == 1:  # a single target gets the base value (when one is given) and only PROBIT
        y = score + (base[0] if base.size == 1 else 0)
        return probit(y) if post_transform == "PROBIT" else y
    if base.size == targets:
        score = jnp.where(has, score + jnp.asarray(base.astype(dtype)), 0)
    return transform_scores(cx, score, post_transform)


def _floats(values: Any, tensor: Any) -> Any:
    """A float attribute, or its *_as_tensor (double) twin when that is set."""
    return np.asarray(tensor).reshape(-1) if tensor is not None else values


@rule("TreeEnsembleRegressor", since=1, domain=ML)
def tree_ensemble_regressor(cx, x, *, aggregate_function="SUM", base_values=None,
                            base_values_as_tensor=None, n_targets=None, nodes_falsenodeids=None,
                            nodes_featureids=None, nodes_hitrates=None,
                            nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                            nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                            nodes_truenodeids=None, nodes_values=None, nodes_values_as_tensor=None,
                            post_transform="NONE", target_ids=None, target_nodeids=None,
                            target_treeids=None, target_weights=None,
                            target_weights_as_tensor=None):
    """Y[n, t] = aggregate over trees of the leaf weights for target t, + base_values  (v1, v3+)."""
    votes = (target_treeids or (), target_nodeids or (), target_ids or (),
             _floats(target_weights or (), target_weights_as_tensor))
    forest = forest_v3(nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes,
                       _floats(nodes_values or [0.0] * len(nodes_modes), nodes_values_as_tensor),
                       nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true,
                       votes, n_targets if n_targets is not None else 1)
    dtype = compute_dtype(x, nodes_values_as_tensor, target_weights_as_tensor)
    y = regress(cx, forest, jnp.asarray(x), aggregate_function,
                _floats(base_values, base_values_as_tensor), post_transform, dtype)
    return y.astype(jnp.float32)


def _binary_scores(cx, score: Any, has: Any, base: np.ndarray, post_transform: str,
                   expand: int) -> tuple[Any, Any]:
    """(positive weight, [N, 2] scores) of a two-class ensemble, as onnxruntime computes them."""
    s0, s1, h0, h1 = score[:, 0], score[:, 1], has[:, 0], has[:, 1]
    if base.size == 2:
        # onnxruntime: with a class-1 vote, class 1 scores base[1] + class 0's sum, class 0 minus that
        p1 = jnp.where(h1, base[1] + s0, 0)
        p0 = jnp.where(h0, jnp.where(h1, -p1, s0 + base[0]), 0)
        pair = transform_scores(cx, jnp.stack([p0, p1], axis=1), post_transform)
        return jnp.where(h1, p1, p0), pair
    if base.size == 1:
        s0 = jnp.where(h0, s0 + base[0], 0)
    two = transform_scores(cx, jnp.stack([s0, s1], axis=1), post_transform)
    one = transform_scores(cx, s0[:, None], post_transform, expand)
    one = one if one.shape[1] == 2 else jnp.pad(one, ((0, 0), (0, 1)))
    return jnp.where(h1, s1, s0), jnp.where(h1[:, None], two, one)


def classify(cx, forest: Forest, x: Any, base: Any, labels: list[Any], named: bool,
             post_transform: str, dtype: Any, class_ids: Sequence[int],
             weights: Sequence[float]) -> tuple[Any, Any]:
    """(labels, scores) of a classification ensemble, with onnxruntime's binary conventions."""
    score, has = aggregate(forest, descend(cx, forest, as_rows(x).astype(dtype)), "SUM", dtype)
    base = np.asarray(base if base is not None else (), np.float64).reshape(-1)
    if len(labels) > 2:
        b = jnp.asarray(np.pad(base, (0, len(labels) - base.size)).astype(dtype))
        has = has | jnp.asarray(np.arange(len(labels)) < base.size)
        score = jnp.where(has, score + b, 0)
        index = jnp.argmax(jnp.where(has, score, -jnp.inf), axis=1)
        return pick_labels(cx, index, labels, named), transform_scores(cx, score, post_transform)
    # one class id among the votes: a binary model voting for one class (boosted trees)
    binary = len(set(class_ids)) == 1
    positive = all(w >= 0 for w in weights)
    expand = (0 if positive else 2) if binary else (3 if base.size == 0 else -1)
    weight, scores = _binary_scores(cx, score, has, base, post_transform, expand)
    index = (weight > (0.5 if binary and positive else 0)).astype(jnp.int32)
    if not binary and not named:
        return index.astype(jnp.int64), scores  # onnxruntime answers 1 or 0 here, not the labels
    return pick_labels(cx, index, labels, named), scores


@rule("TreeEnsembleClassifier", since=1, domain=ML)
def tree_ensemble_classifier(cx, x, *, base_values=None, base_values_as_tensor=None,
                             class_ids=None, class_nodeids=None, class_treeids=None,
                             class_weights=None, class_weights_as_tensor=None,
                             classlabels_int64s=None, classlabels_strings=None,
                             nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                             nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                             nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                             nodes_truenodeids=None, nodes_values=None,
                             nodes_values_as_tensor=None, post_transform="NONE"):
    """Z[n, c] = post_transform(sum over trees of leaf weights for class c + base), Y = top class
    (v1, v3+: *_as_tensor doubles)."""
    labels = [text(s) for s in classlabels_strings] if classlabels_strings else \
        list(classlabels_int64s or ())
    if len(labels) < 2:
        raise cx.fail(f"needs at least two class labels, got {labels}")
    weights = _floats(class_weights or (), class_weights_as_tensor)
    votes = (class_treeids or (), class_nodeids or (), class_ids or (), weights)
    forest = forest_v3(nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes,
                       _floats(nodes_values or [0.0] * len(nodes_modes), nodes_values_as_tensor),
                       nodes_truenodeids, nodes_falsenodeids, nodes_missing_value_tracks_true,
                       votes, len(labels))
    dtype = compute_dtype(x, nodes_values_as_tensor, class_weights_as_tensor)
    y, z = classify(cx, forest, jnp.asarray(x), _floats(base_values, base_values_as_tensor), labels,
                    bool(classlabels_strings), post_transform, dtype, class_ids or (),
                    list(np.asarray(weights).reshape(-1)))
    return y, z.astype(jnp.float32)


# --- TreeEnsemble (v5) -----------------------------------------------------------------------------

V5_TRANSFORMS = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def _member_sets(modes: np.ndarray, values: Any) -> np.ndarray | None:
    """Each MEMBER node's set (the NaN-separated runs of membership_values, in node order)."""
    if not (modes == MEMBER).any():
        return None
    runs: list[list[float]] = [[]]
    for v in np.asarray(values if values is not None else (), np.float64).reshape(-1):
        if math.isnan(v):
            runs.append([])
        else:
            runs[-1].append(float(v))
    sets = iter(runs)
    width = max(1, max(len(r) for r in runs))
    members = np.full((modes.size, width), np.nan)
    for i in np.flatnonzero(modes == MEMBER):
        run = next(sets, None)
        if run is None:
            raise ValueError("membership_values has fewer sets than there are BRANCH_MEMBER nodes")
        members[i, :len(run)] = run
    return members


def forest_v5(cx, featureids: Sequence[int], modes: Any, splits: Any, trueids: Sequence[int],
              trueleafs: Sequence[int], falseids: Sequence[int], falseleafs: Sequence[int],
              missing: Sequence[int] | None, members: Any, roots: Sequence[int],
              leaf_targets: Sequence[int], leaf_weights: Any, targets: int) -> Forest:
    """A Forest from the v5 encoding: interior nodes 0..n-1, then the leaves as nodes n.."""
    inner = np.asarray(modes, np.int64).reshape(-1)
    n, leaves = inner.size, len(leaf_targets)
    if inner.size and (inner.min() < 0 or inner.max() > MEMBER):
        raise cx.fail(f"nodes_modes must hold values 0..6, got {sorted(set(inner.tolist()))}")
    mode = np.concatenate([inner, np.full(leaves, LEAF)])
    true = np.array(trueids, np.int64) + n * np.array(trueleafs, np.int64)
    false = np.array(falseids, np.int64) + n * np.array(falseleafs, np.int64)
    limit = np.where(np.concatenate([trueleafs, falseleafs]).astype(bool), n + leaves, n)
    if np.any(np.concatenate([true, false]) >= limit) or np.any(np.concatenate([true, false]) < 0):
        raise cx.fail("a nodes_truenodeids/nodes_falsenodeids entry points past the nodes or leaves")
    itself = np.arange(n, n + leaves)
    pad = np.zeros(leaves)
    return Forest(mode, np.concatenate([featureids, np.zeros(leaves, np.int64)]).astype(np.int64),
                  np.concatenate([np.asarray(splits, np.float64).reshape(-1), pad]),
                  np.concatenate([true, itself]), np.concatenate([false, itself]),
                  np.concatenate([np.array(missing or [0] * n, bool), np.zeros(leaves, bool)]),
                  _member_sets(mode, members), np.array(roots, np.int64),
                  *_votes(n + leaves, targets, list(itself), leaf_targets,
                          np.asarray(leaf_weights, np.float64).reshape(-1)))


@rule("TreeEnsemble", since=5, domain=ML)
def tree_ensemble(cx, x, *, aggregate_function=1, leaf_targetids=None, leaf_weights=None,
                  membership_values=None, n_targets=None, nodes_falseleafs=None,
                  nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                  nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_splits=None,
                  nodes_trueleafs=None, nodes_truenodeids=None, post_transform=0, tree_roots=None):
    """Y[n, t] = aggregate over trees of the reached leaf's weight for target t  (v5+)."""
    if not 0 <= aggregate_function < len(AGGREGATES) or not 0 <= post_transform < len(V5_TRANSFORMS):
        raise cx.fail(f"aggregate_function must be 0..3 and post_transform 0..4, got "
                      f"{aggregate_function} and {post_transform}")
    if n_targets is None:
        n_targets = max(leaf_targetids or (0,)) + 1
    forest = forest_v5(cx, nodes_featureids, nodes_modes, nodes_splits, nodes_truenodeids,
                       nodes_trueleafs, nodes_falsenodeids, nodes_falseleafs,
                       nodes_missing_value_tracks_true, membership_values, tree_roots,
                       leaf_targetids, leaf_weights, n_targets)
    dtype = jnp.float64 if x.dtype == np.float64 else jnp.float32
    y = regress(cx, forest, jnp.asarray(x), AGGREGATES[aggregate_function], None,
                V5_TRANSFORMS[post_transform], dtype)
    return y.astype(x.dtype)
