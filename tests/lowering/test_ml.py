"""ai.onnx.ml rules against onnx.reference and onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from oxla.errors import LoweringError
from tests.lowering.util import node_model, run_onnxruntime, run_oxla, run_reference

ML = "ai.onnx.ml"
RNG = np.random.default_rng(0)
X = RNG.standard_normal((5, 4)).astype(np.float32)


def _norm(values: list[Any]) -> list[np.ndarray]:
    out = []
    for v in values:
        v = np.asarray(v)
        out.append(v.astype(object) if v.dtype.kind == "U" else v)
    return out


def check(op: str, inputs: dict[str, np.ndarray], outputs: tuple[str, ...] = ("y",), *,
          opset: int = 1, reference: bool = True, ort: bool = True, rtol: float = 1e-5,
          atol: float = 1e-6, **attrs: Any) -> list[np.ndarray]:
    """Run one ai.onnx.ml node with oxla and compare with the references that get it right."""
    model = node_model(op, inputs, outputs, domain=ML, opset=opset, **attrs)
    got = _norm(run_oxla(model, inputs))
    wants = ([run_reference] if reference else []) + ([run_onnxruntime] if ort else [])
    for run in wants:
        want = _norm(run(model, inputs))
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
