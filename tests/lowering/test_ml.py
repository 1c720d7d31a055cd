"""ai.onnx.ml rules against onnx.reference and onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from oxla.errors import LoweringError, ShapeError
from tests.lowering.util import (
    node_model,
    run_onnxruntime,
    run_oxla,
    run_reference,
    strings_as_objects,
)

ML = "ai.onnx.ml"
RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 4)).astype(np.float32)



def check(op: str, inputs: dict[str, np.ndarray], outputs: tuple[str, ...] = ("y",), *,
          opset: int = 1, reference: bool = True, ort: bool = True, rtol: float = 1e-5,
          atol: float = 1e-6, **attrs: Any) -> list[np.ndarray]:
    """Run one ai.onnx.ml node with oxla and compare with the references that get it right."""
    model = node_model(op, inputs, outputs, domain=ML, opset=opset, **attrs)
    got = strings_as_objects(run_oxla(model, inputs))
    wants = ([run_reference] if reference else []) + ([run_onnxruntime] if ort else [])
    for run in wants:
        want = strings_as_objects(run(model, inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape, (run.__name__, g, w)
            assert g.dtype == w.dtype, (run.__name__, g.dtype, w.dtype)
            if w.dtype == object:
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                           rtol=rtol, atol=atol, err_msg=run.__name__)
    return got


def S(*values: Any) -> np.ndarray:
    return np.array(values, dtype=object)


def T(name: str, values: Any, dtype: int) -> TensorProto:
    arr = np.asarray(values)
    return helper.make_tensor(name, dtype, arr.shape, arr.reshape(-1).tolist())


# --- elementwise and per-feature ops -----------------------------------------------------------

@pytest.mark.parametrize("x", [X, X.astype(np.float64), np.array([[-2, 0, 3]], np.int64)],
                         ids=["float", "double", "int64"])
@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_binarizer(x: np.ndarray, threshold: float) -> None:
    # onnxruntime implements Binarizer for float only
    check("Binarizer", {"x": x}, ort=x.dtype == np.float32, threshold=threshold)


@pytest.mark.parametrize("attrs", [{"offset": [0.5], "scale": [2.0]},
                                   {"offset": [0.1, 0.2, 0.3, 0.4], "scale": [1.0, 2.0, 3.0, 4.0]}])
@pytest.mark.parametrize("x", [X, X.astype(np.float64)], ids=["float", "double"])
def test_scaler(x: np.ndarray, attrs: dict[str, Any]) -> None:
    # onnx.reference keeps double input double; the schema (and onnxruntime) say float
    check("Scaler", {"x": x}, reference=x.dtype == np.float32, **attrs)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm: str) -> None:
    x = np.abs(X)
    x[2] = 0.0  # an all-zero row stays zero
    check("Normalizer", {"x": x}, norm=norm)


def test_normalizer_max_is_the_signed_max() -> None:
    # onnxruntime divides by max(x), onnx.reference by max(|x|): we follow onnxruntime
    x = np.array([[-4.0, 1.0, 2.0]], np.float32)
    got = check("Normalizer", {"x": x}, reference=False, norm="MAX")
    assert got[0].tolist() == [[-2.0, 0.5, 1.0]]


@pytest.mark.parametrize("x,attrs", [
    (np.array([[1, np.nan, 3], [np.nan, 5, np.nan]], np.float32),
     {"imputed_value_floats": [9.0, 8.0, 7.0], "replaced_value_float": float("nan")}),
    (np.array([[1, 0, 3], [0, 5, 0]], np.float32), {"imputed_value_floats": [-1.0]}),
    (np.array([[1, -1, 3], [-1, 5, -1]], np.int64),
     {"imputed_value_int64s": [7, 8, 9], "replaced_value_int64": -1}),
], ids=["nan-per-feature", "zero-one-value", "int64"])
def test_imputer(x: np.ndarray, attrs: dict[str, Any]) -> None:
    check("Imputer", {"x": x}, **attrs)


@pytest.mark.parametrize("x,y", [
    (X, np.array([0, 2], np.int64)),
    (X[0], np.array([3, 1, 1], np.int64)),
    (RNG.standard_normal((2, 3, 4)).astype(np.float32), np.array([[1, 3]], np.int64)),
    (S(["a", "b", "c"], ["d", "e", "f"]), np.array([2, 0], np.int64)),
], ids=["2d", "vector", "3d", "strings"])
def test_array_feature_extractor(x: np.ndarray, y: np.ndarray) -> None:
    check("ArrayFeatureExtractor", {"x": x, "i": y}, ("z",))


def test_array_feature_extractor_index_out_of_range() -> None:
    model = node_model("ArrayFeatureExtractor", {"x": X}, ("z",), domain=ML, opset=1)
    model.graph.node[0].input.append("i")
    model.graph.initializer.append(helper.make_tensor("i", TensorProto.INT64, [1], [4]))
    with pytest.raises(LoweringError, match=r"indices must lie in \[0, 4\), got \[4\]"):
        run_oxla(model, {"x": X})


def test_feature_vectorizer_pads_and_truncates() -> None:
    a, b = X[:, :2], np.arange(15, dtype=np.float32).reshape(5, 3)
    got = check("FeatureVectorizer", {"a": a, "b": b, "c": X}, inputdimensions=[3, 2, 4])
    assert got[0].shape == (5, 9) and (got[0][:, 2] == 0).all()


# --- encoders ------------------------------------------------------------------------------------

@pytest.mark.parametrize("x,attrs", [
    (S("a", "b", "zz", "c"), {"keys_strings": ["a", "b", "c"], "values_int64s": [0, 1, 2]}),
    (S("a", "zz"), {"keys_strings": ["a", "b"], "values_floats": [0.5, 1.5], "default_float": 7.0}),
    (np.array([3, 1, 9], np.int64), {"keys_int64s": [1, 3], "values_strings": ["x", "y"],
                                     "default_string": "?"}),
    (np.array([[1.5, 3.0], [2.0, 8.0]], np.float32),
     {"keys_floats": [1.5, 2.0], "values_int64s": [10, 30]}),
], ids=["string-int", "string-float-default", "int-string", "float-int"])
def test_label_encoder_v2(x: np.ndarray, attrs: dict[str, Any]) -> None:
    check("LabelEncoder", {"x": x}, opset=2, **attrs)


def test_label_encoder_repeated_key_last_wins() -> None:
    # The spec: the last of a repeated key counts (onnxruntime keeps the first)
    got = check("LabelEncoder", {"x": np.array([4, 5], np.int64)}, opset=2, ort=False,
                keys_int64s=[4, 5, 4], values_int64s=[1, 2, 3])
    assert got[0].tolist() == [3, 2]


def test_label_encoder_nan_key_matches_nan() -> None:
    # The spec: a NaN key matches any NaN (onnx.reference misses it; onnxruntime v4 gets it)
    x = np.array([[1.5, np.nan], [2.0, 8.0]], np.float32)
    got = check("LabelEncoder", {"x": x}, opset=4, reference=False,
                keys_floats=[1.5, float("nan"), 2.0], values_int64s=[10, 20, 30])
    assert got[0].tolist() == [[10, 20], [30, -1]]


def test_feature_vectorizer_mixed_types() -> None:
    # onnxruntime wants one input type for all; the schema allows any mix
    # (onnx.reference answers double when an input is double; the schema says float)
    got = check("FeatureVectorizer", {"a": X[:, :2], "b": np.arange(10, dtype=np.int64).reshape(5, 2),
                                      "c": X.astype(np.float64)}, ort=False, reference=False,
                inputdimensions=[2, 2, 1])
    assert got[0].dtype == np.float32 and got[0][1, 2:4].tolist() == [2.0, 3.0]


def test_label_encoder_v4_tensors() -> None:
    # onnxruntime has no double -> int32 LabelEncoder kernel
    x = np.array([1.0, 2.5, -3.0], np.float64)
    check("LabelEncoder", {"x": x}, opset=4, ort=False,
          keys_tensor=T("k", [2.5, -3.0], TensorProto.DOUBLE),
          values_tensor=T("v", [7, 8], TensorProto.INT32),
          default_tensor=T("d", [-5], TensorProto.INT32))


def test_label_encoder_v4_typed_default() -> None:
    x = np.array([1, 2, 3], np.int64)
    got = check("LabelEncoder", {"x": x}, opset=4, keys_int64s=[1, 3], values_floats=[0.5, 1.5])
    assert got[0][1] == 0.0 and np.signbit(got[0][1])  # default_float is -0.0


@pytest.mark.parametrize("x", [S("b", "c", "q"), np.array([[2, 0], [5, 1]], np.int64)],
                         ids=["string-to-int", "int-to-string"])
def test_label_encoder_v1(x: np.ndarray) -> None:
    # onnx.reference implements LabelEncoder from v2 on only
    got = check("LabelEncoder", {"x": x}, reference=False, classes_strings=["a", "b", "c"])
    assert got[0].tolist() in ([1, 2, -1], [["c", "a"], ["_Unused", "b"]])


@pytest.mark.parametrize("x", [S(["cat", "dog"], ["emu", "cow"]), np.array([2, 7, 5], np.int64)],
                         ids=["string-to-int", "int-to-string"])
def test_category_mapper(x: np.ndarray) -> None:
    # onnx.reference has no CategoryMapper
    check("CategoryMapper", {"x": x}, reference=False, cats_strings=["cat", "dog", "cow"], cats_int64s=[5, 2, 9],
          default_string="none")


@pytest.mark.parametrize("x,attrs", [
    (np.array([[3, 1], [9, 2]], np.int64), {"cats_int64s": [1, 2, 3]}),
    (np.array([3.0, 1.0, 7.0], np.float64), {"cats_int64s": [1, 3]}),
    (S("b", "x", "a"), {"cats_strings": ["a", "b"]}),
], ids=["int64-2d", "double", "strings"])
def test_one_hot_encoder(x: np.ndarray, attrs: dict[str, Any]) -> None:
    check("OneHotEncoder", {"x": x}, **attrs)


def test_one_hot_encoder_zeros0_rejects_unknown_values() -> None:
    x = np.array([1, 5], np.int64)
    model = node_model("OneHotEncoder", {"x": x}, domain=ML, opset=1, cats_int64s=[1, 2], zeros=0)
    with pytest.raises(LoweringError, match=r"zeros=0 and 1 input value\(s\) are in no category"):
        run_oxla(model, {"x": x})
    ok = np.array([2, 1], np.int64)
    assert run_oxla(model, {"x": ok})[0].tolist() == [[0.0, 1.0], [1.0, 0.0]]


# --- linear models ---------------------------------------------------------------------------------

COEF3 = RNG.standard_normal(12).round(2).tolist()


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels", [{"classlabels_ints": [7, 8, 9]},
                                    {"classlabels_strings": ["a", "b", "c"]}], ids=["ints", "strings"])
def test_linear_classifier_multiclass(post: str, labels: dict[str, Any]) -> None:
    check("LinearClassifier", {"x": X}, ("y", "z"), coefficients=COEF3,
          intercepts=[0.1, -0.2, 0.3], post_transform=post, **labels)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_linear_classifier_binary_one_row(post: str) -> None:
    # onnxruntime: label by score > 0, scores [1 - s, s] (onnx.reference: [-s, s], transformed)
    got = check("LinearClassifier", {"x": X}, ("y", "z"), reference=False,
                coefficients=COEF3[:4], intercepts=[0.05], classlabels_ints=[3, 4],
                post_transform=post)
    assert set(got[0].tolist()) <= {3, 4} and got[1].shape == (5, 2)


def test_linear_classifier_double_and_vector_input() -> None:
    check("LinearClassifier", {"x": X[0].astype(np.float64)}, ("y", "z"), reference=False,
          coefficients=COEF3, intercepts=[0.1, -0.2, 0.3], classlabels_ints=[0, 1, 2])


@pytest.mark.parametrize("targets,post", [(1, "NONE"), (3, "NONE"), (3, "SOFTMAX")])
def test_linear_regressor(targets: int, post: str) -> None:
    # onnx.reference implements post_transform NONE only
    check("LinearRegressor", {"x": X}, reference=post == "NONE", coefficients=COEF3[:4 * targets],
          intercepts=[0.5] * targets, targets=targets, post_transform=post)


def test_linear_regressor_rejects_bad_coefficients() -> None:
    model = node_model("LinearRegressor", {"x": X}, domain=ML, opset=1, coefficients=[1.0, 2.0])
    with pytest.raises(LoweringError, match=r"coefficients must hold 1 x 4 = 4 values"):
        run_oxla(model, {"x": X})


# --- tree ensembles --------------------------------------------------------------------------------
# Two trees over 3 features: tree 0 splits twice (modes vary), tree 1 is a single split.
TREES = {
    "nodes_treeids": [0, 0, 0, 0, 0, 1, 1, 1],
    "nodes_nodeids": [0, 1, 2, 3, 4, 0, 1, 2],
    "nodes_featureids": [0, 1, 0, 0, 0, 2, 0, 0],
    "nodes_values": [0.2, -0.3, 0, 0, 0, 0.5, 0, 0],
    "nodes_modes": ["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"],
    "nodes_truenodeids": [1, 2, 0, 0, 0, 1, 0, 0],
    "nodes_falsenodeids": [4, 3, 0, 0, 0, 2, 0, 0],
    "nodes_missing_value_tracks_true": [1, 0, 0, 0, 0, 0, 0, 0],
}
LEAVES = [(0, 2), (0, 3), (0, 4), (1, 1), (1, 2)]
XT = RNG.standard_normal((8, 3)).astype(np.float32)
XT[0, 0] = np.nan  # takes tree 0's true branch (missing_value_tracks_true)


def _votes(prefix: str, targets: int) -> dict[str, list[Any]]:
    """Every leaf votes for every target with a distinct weight."""
    pairs = [(t, n, k) for t, n in LEAVES for k in range(targets)]
    return {f"{prefix}_treeids": [t for t, _, _ in pairs], f"{prefix}_nodeids": [n for _, n, _ in pairs],
            f"{prefix}_ids": [k for _, _, k in pairs],
            f"{prefix}_weights": [round(0.1 * (i + 1) * (-1) ** i, 2) for i in range(len(pairs))]}


@pytest.mark.parametrize("how", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("targets", [1, 2])
def test_tree_ensemble_regressor(how: str, targets: int) -> None:
    check("TreeEnsembleRegressor", {"x": XT}, opset=3, n_targets=targets, aggregate_function=how,
          base_values=[0.5] * targets, **TREES, **_votes("target", targets))


def test_tree_ensemble_regressor_double_tensors() -> None:
    # (onnx.reference needs nodes_values even when nodes_values_as_tensor is set)
    attrs = dict(TREES, **_votes("target", 1))
    values = attrs.pop("nodes_values")
    weights = attrs.pop("target_weights")
    check("TreeEnsembleRegressor", {"x": XT.astype(np.float64)}, opset=3, reference=False, n_targets=1,
          nodes_values_as_tensor=T("v", values, TensorProto.DOUBLE),
          target_weights_as_tensor=T("w", weights, TensorProto.DOUBLE), **attrs)


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels", [{"classlabels_int64s": [3, 5, 7]},
                                    {"classlabels_strings": ["a", "b", "c"]}], ids=["ints", "strings"])
def test_tree_ensemble_classifier_multiclass(post: str, labels: dict[str, Any]) -> None:
    check("TreeEnsembleClassifier", {"x": XT}, ("y", "z"), opset=3, post_transform=post,
          base_values=[0.1, 0.0, -0.1], **TREES, **_votes("class", 3), **labels)


@pytest.mark.parametrize("votes,base,post", [
    ({"class_ids": [0] * 5, "class_weights": [-0.4, 0.3, 0.9, -0.2, 0.1]}, [0.2], "LOGISTIC"),
    ({"class_ids": [0] * 5, "class_weights": [-0.4, 0.3, 0.9, -0.2, 0.1]}, None, "NONE"),
    ({"class_ids": [1] * 5, "class_weights": [0.4, 0.3, 0.9, 0.2, 0.1]}, None, "NONE"),
    ({"class_ids": [0, 1] * 5, "class_weights": [0.6, 0.4, 0.3, 0.7, 0.5, 0.5, 0.8, 0.2, 0.1, 0.9]},
     None, "NONE"),
], ids=["boosted-logistic", "boosted-margin", "class1-probabilities", "both-classes"])
def test_tree_ensemble_classifier_binary(votes: dict[str, Any], base: list[float] | None,
                                         post: str) -> None:
    # Binary conventions are onnxruntime's (onnx.reference disagrees whenever one class votes)
    per_leaf = len(votes["class_ids"]) // len(LEAVES)
    votes = dict(votes, class_treeids=[t for t, _ in LEAVES for _ in range(per_leaf)],
                 class_nodeids=[n for _, n in LEAVES for _ in range(per_leaf)])
    extra = {"base_values": base} if base else {}
    check("TreeEnsembleClassifier", {"x": XT}, ("y", "z"), opset=3, reference=False,
          post_transform=post, classlabels_int64s=[0, 1], **TREES, **votes, **extra)


def test_tree_ensemble_classifier_rejects_dangling_child() -> None:
    attrs = dict(TREES, nodes_falsenodeids=[9, 3, 0, 0, 0, 2, 0, 0])
    model = node_model("TreeEnsembleClassifier", {"x": XT}, ("y", "z"), domain=ML, opset=3,
                       classlabels_int64s=[0, 1, 2], **attrs, **_votes("class", 3))
    with pytest.raises(LoweringError, match="node 0 of tree 0 points at missing node 9"):
        run_oxla(model, {"x": XT})


V5 = {  # tree 0: two splits then a set-membership split (members -1 and 2); tree 1: one split
    "nodes_featureids": [0, 1, 2, 1], "nodes_modes": T("m", [0, 3, 1, 6], TensorProto.UINT8),
    "nodes_splits": T("s", [0.2, -0.3, 0.5, 0.0], TensorProto.FLOAT),
    "nodes_truenodeids": [1, 0, 4, 2], "nodes_trueleafs": [0, 1, 1, 1],
    "nodes_falsenodeids": [3, 1, 5, 3], "nodes_falseleafs": [0, 1, 1, 1],
    "nodes_missing_value_tracks_true": [1, 0, 0, 0],
    "membership_values": T("mv", [-1.0, 2.0, np.nan], TensorProto.FLOAT),
    "tree_roots": [0, 2], "leaf_targetids": [0, 1, 0, 1, 1, 0],
    "leaf_weights": T("w", [0.5, -1.0, 2.0, 0.25, 3.0, -0.5], TensorProto.FLOAT),
}


# onnxruntime truncates X to an integer for set membership: feature 1 avoids -1.x and 2.x
XV5 = XT.copy()
XV5[:, 1] = [-1.0, 2.0, 0.5, -0.5, 1.5, 3.0, -2.0, 0.25]


@pytest.mark.parametrize("how", [0, 1, 2, 3])
def test_tree_ensemble_v5(how: int) -> None:
    # onnx.reference leaves a target no tree votes for at +-FLT_MAX under MIN/MAX, ort at 0
    check("TreeEnsemble", {"x": XV5}, opset=5, reference=how < 2, n_targets=2,
          aggregate_function=how, **V5)


def test_tree_ensemble_v5_post_transform_numbering() -> None:
    # The spec numbers SOFTMAX 1 and LOGISTIC 2; onnxruntime swaps them, onnx.reference ignores both
    raw = check("TreeEnsemble", {"x": XV5}, opset=5, n_targets=2, **V5)[0].astype(np.float64)
    for code, want in [(1, np.exp(raw) / np.exp(raw).sum(axis=1, keepdims=True)),
                       (2, 1 / (1 + np.exp(-raw)))]:
        model = node_model("TreeEnsemble", {"x": XV5}, domain=ML, opset=5, n_targets=2,
                           post_transform=code, **V5)
        np.testing.assert_allclose(run_oxla(model, {"x": XV5})[0], want, rtol=1e-5)


# --- support vector machines ---------------------------------------------------------------------
SV = RNG.standard_normal((5, 4)).round(2)
SVC = {"vectors_per_class": [2, 2, 1], "support_vectors": SV.reshape(-1).tolist(),
       "coefficients": RNG.standard_normal(10).round(2).tolist(), "rho": [0.1, -0.2, 0.3],
       "classlabels_ints": [0, 1, 2]}


@pytest.mark.parametrize("kind", ["LINEAR", "POLY", "RBF", "SIGMOID"])
def test_svm_classifier_one_vs_one(kind: str) -> None:
    check("SVMClassifier", {"x": X}, ("y", "z"), rtol=1e-4, kernel_type=kind,
          kernel_params=[0.5, 0.1, 3.0], **SVC)


def test_svm_classifier_probabilities() -> None:
    # onnx.reference's multiclass_probability builds Q wrongly (a dot product for a product)
    check("SVMClassifier", {"x": X}, ("y", "z"), reference=False, rtol=1e-4, kernel_type="RBF",
          kernel_params=[0.5, 0, 0], prob_a=[-1.0, -2.0, -0.5], prob_b=[0.1, 0.0, -0.2], **SVC)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC"])
def test_svm_classifier_binary_strings(post: str) -> None:
    # (onnx.reference fails on string labels here)
    check("SVMClassifier", {"x": X}, ("y", "z"), reference=False, rtol=1e-4, kernel_type="RBF",
          kernel_params=[0.5, 0, 0], vectors_per_class=[2, 3], support_vectors=SV.reshape(-1).tolist(),
          coefficients=SVC["coefficients"][:5], rho=[0.1], classlabels_strings=["no", "yes"],
          post_transform=post)


@pytest.mark.parametrize("classes", [2, 3])
def test_svm_classifier_liblinear(classes: int) -> None:
    # onnx.reference labels a liblinear model by the sign of the top score, not its class
    check("SVMClassifier", {"x": X}, ("y", "z"), reference=False, kernel_params=[0.0, 0.0, 0.0],
          coefficients=COEF3[:4 * classes], rho=[0.3],
          classlabels_ints=list(range(classes)))


@pytest.mark.parametrize("attrs", [
    {"n_supports": 5, "support_vectors": SV.reshape(-1).tolist(), "kernel_type": "RBF",
     "kernel_params": [0.3, 0, 0], "coefficients": [0.5, -0.2, 0.1, 0.9, -1.0], "rho": [0.2]},
    {"n_supports": 5, "support_vectors": SV.reshape(-1).tolist(), "kernel_type": "POLY",
     "kernel_params": [0.3, 1.0, 2.0], "coefficients": [0.5, -0.2, 0.1, 0.9, -1.0], "rho": [0.2],
     "one_class": 1},
    {"coefficients": [0.1, 0.2, -0.3, 0.4], "rho": [0.2], "kernel_params": [0.0, 0.0, 0.0]},
], ids=["rbf", "poly-one-class", "linear"])
def test_svm_regressor(attrs: dict[str, Any]) -> None:
    check("SVMRegressor", {"x": X}, rtol=1e-4, **attrs)


def test_tree_ensemble_rejects_features_beyond_x() -> None:
    x = XT[:, :2]  # tree 1 tests feature 2
    model = node_model("TreeEnsembleRegressor", {"x": x}, domain=ML, opset=3, n_targets=1,
                       **TREES, **_votes("target", 1))
    with pytest.raises(ShapeError, match="the trees test features up to 2, but X has 2"):
        run_oxla(model, {"x": x})
