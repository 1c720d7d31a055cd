"""ai.onnx.ml ops: encoders, scalers, linear models, and the score transforms the classifiers share.

Where the spec leaves a detail open (binary classifiers, empty rows), the rules follow
onnxruntime, which converters such as skl2onnx are validated against.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from oxla.lowering.ops.string import strings, text
from oxla.lowering.registry import rule
from oxla.lowering.values import is_concrete

ML = "ai.onnx.ml"
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


# --- score transforms (onnxruntime's ml_common.h) ----------------------------------------------

def probit(p: Any) -> Any:
    """sqrt(2) * erfinv(2p - 1), with the Winitzki erfinv approximation onnxruntime uses."""
    x = 2 * p - 1
    sign = jnp.where(x < 0, -1.0, 1.0).astype(p.dtype)
    log = jnp.log((1 - x) * (1 + x))
    v = 2 / (math.pi * 0.147) + 0.5 * log
    return math.sqrt(2) * sign * jnp.sqrt(-v + jnp.sqrt(v * v - log / 0.147))


def softmax_zero(s: Any) -> Any:
    """Softmax over the last axis that leaves exact zeros (|v| <= 1e-7) at zero."""
    top = jnp.max(s, axis=-1, keepdims=True)
    nonzero = jnp.abs(s) > 1e-7
    e = jnp.where(nonzero, jnp.exp(s - top), s * jnp.exp(-top))
    return e / jnp.sum(jnp.where(nonzero, e, 0), axis=-1, keepdims=True)


def transform_scores(cx, scores: Any, post_transform: str, add_second_class: int = -1) -> Any:
    """Post-transform [N, K] scores; a single score column may grow a second (binary models).

    add_second_class (onnxruntime's convention): -1 keep one column; 0 or 1 [1 - s, s];
    2 or 3 [-s, s]; under LOGISTIC both give [logistic(-s), logistic(s)].
    """
    if post_transform not in TRANSFORMS:
        raise cx.fail(f"post_transform must be one of {', '.join(TRANSFORMS)}, got {post_transform!r}")
    if scores.shape[-1] == 1 and add_second_class >= 0:
        s = scores[..., 0]
        if post_transform == "PROBIT":  # onnxruntime leaves the second column unwritten
            return jnp.stack([probit(s), jnp.zeros_like(s)], axis=-1)
        if post_transform == "LOGISTIC":
            return jnp.stack([jax.nn.sigmoid(-s), jax.nn.sigmoid(s)], axis=-1)
        if add_second_class in (0, 1):
            return jnp.stack([1 - s, s], axis=-1)
        return jnp.stack([-s, s], axis=-1)
    if scores.shape[-1] == 1:
        return probit(scores) if post_transform == "PROBIT" else scores
    if post_transform == "LOGISTIC":
        return jax.nn.sigmoid(scores)
    if post_transform == "SOFTMAX":
        return jax.nn.softmax(scores, axis=-1)
    if post_transform == "SOFTMAX_ZERO":
        return softmax_zero(scores)
    if post_transform == "PROBIT":
        return probit(scores)
    return scores


def host_value(cx, value: Any, what: str) -> np.ndarray:
    """A value computed inside a rule, on the host: concrete now, or a graph break."""
    return np.asarray(value) if is_concrete(value) else np.asarray(cx.static(value, what))


def pick_labels(cx, index: Any, labels: Sequence[Any], strings_: bool) -> Any:
    """labels[index] (int64 or string); string labels need the index on the host."""
    if strings_:
        at = host_value(cx, index, "the predicted class")
        return np.array([labels[i] for i in at.reshape(-1)], dtype=object).reshape(at.shape)
    return jnp.asarray(np.asarray(labels, np.int64))[index]


def as_rows(x: Any) -> Any:
    """[C] -> [1, C]; [N, C] unchanged (the ml ops treat a vector as one sample)."""
    return x.reshape(1, -1) if x.ndim == 1 else x


def float_input(x: Any) -> Any:
    """Classifier inputs are computed in float32 unless they are double."""
    return jnp.asarray(x) if x.dtype == np.float64 else jnp.asarray(x).astype(jnp.float32)


# --- elementwise and per-feature ops ---------------------------------------------------------------

@rule("Binarizer", since=1, domain=ML)
def binarizer(cx, x, *, threshold=0.0):
    """Y = X > threshold ? 1 : 0, in X's type  (v1+)."""
    return jnp.where(x > threshold, 1, 0).astype(x.dtype)


@rule("Scaler", since=1, domain=ML)
def scaler(cx, x, *, offset=None, scale=None):
    """Y = (X - offset) * scale, per feature (last axis) or one value for all, float32  (v1+)."""
    x = jnp.asarray(x).astype(jnp.float32)
    off = jnp.asarray(np.asarray(offset or (0.0,), np.float32))
    sc = jnp.asarray(np.asarray(scale or (1.0,), np.float32))
    return (x - off) * sc


@rule("Normalizer", since=1, domain=ML)
def normalizer(cx, x, *, norm="MAX"):
    """Y = X / max(X), / sum|X| or / sqrt(sum X^2) per row, float32  (v1+)."""
    x = jnp.asarray(x).astype(jnp.float32)
    if norm == "MAX":
        d = jnp.max(x, axis=-1, keepdims=True)  # onnxruntime divides by the max, not max |x|
    elif norm == "L1":
        d = jnp.sum(jnp.abs(x), axis=-1, keepdims=True)
    elif norm == "L2":
        d = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    else:
        raise cx.fail(f"norm must be MAX, L1 or L2, got {norm!r}")
    return jnp.where(d == 0, x, x / jnp.where(d == 0, 1, d))  # an all-zero row stays as it is


@rule("Imputer", since=1, domain=ML)
def imputer(cx, x, *, imputed_value_floats=None, imputed_value_int64s=None,
            replaced_value_float=0.0, replaced_value_int64=0):
    """Y = X with each replaced_value (NaN: any NaN) set to imputed_value[feature]  (v1+)."""
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    values = imputed_value_floats if floating else imputed_value_int64s
    if not values:
        kind = "imputed_value_floats" if floating else "imputed_value_int64s"
        raise cx.fail(f"attribute {kind} is required for {x.dtype} input")
    if len(values) not in (1, x.shape[-1]):
        raise cx.fail(f"imputed values must number 1 or {x.shape[-1]} (the features), got {len(values)}")
    fill = jnp.asarray(np.asarray(values, x.dtype))
    if floating and math.isnan(replaced_value_float):
        hit = jnp.isnan(x)
    else:
        hit = x == (replaced_value_float if floating else replaced_value_int64)
    return jnp.where(hit, fill, x)


@rule("ArrayFeatureExtractor", since=1, domain=ML)
def array_feature_extractor(cx, x, y):
    """Z = X[..., Y] with Y flattened; a vector X gives [1, len(Y)]  (v1+)."""
    if cx.is_static(y):
        index = np.asarray(y, np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= x.shape[-1]):
            raise cx.fail(f"indices must lie in [0, {x.shape[-1]}), got {index.tolist()}")
    else:
        index = jnp.asarray(y).reshape(-1)
    if x.dtype == object:
        index = np.asarray(cx.static(index, "indices"))
        z = np.asarray(x)[..., index]
    else:
        z = jnp.take(x, index, axis=-1)
    return z.reshape(1, -1) if x.ndim == 1 else z


@rule("FeatureVectorizer", since=1, domain=ML)
def feature_vectorizer(cx, *x, inputdimensions=None):
    """Y = concat of each X_i's first inputdimensions[i] features (zero-padded), float32  (v1+)."""
    if inputdimensions is None or len(inputdimensions) != len(x):
        raise cx.fail(f"inputdimensions must give one size per input ({len(x)}), got {inputdimensions}")
    parts = []
    for xi, width in zip(x, inputdimensions):
        xi = jnp.asarray(xi).astype(jnp.float32)
        xi = xi.reshape(xi.shape[0], -1) if xi.ndim > 1 else xi.reshape(1, -1)
        xi = xi[:, :width]
        parts.append(jnp.pad(xi, ((0, 0), (0, width - xi.shape[1]))))
    return jnp.concatenate(parts, axis=1)


# --- encoders: lookups of keys to values ---------------------------------------------------------

def _host_lookup(x: np.ndarray, keys: Sequence[Any], values: np.ndarray, default: Any) -> np.ndarray:
    """Y = values[i] where X == keys[i] (the last repeat wins, NaN matches NaN), else default."""
    table: dict[Any, Any] = {}
    nan_value = None
    for k, v in zip(keys, values):
        if isinstance(k, float) and math.isnan(k):
            nan_value = v
        else:
            table[k] = v
    flat = [text(v) if isinstance(v, bytes | str) else v.item() for v in np.asarray(x).reshape(-1)]
    out = [nan_value if nan_value is not None and isinstance(v, float) and math.isnan(v)
           else table.get(v, default) for v in flat]
    return np.array(out, dtype=values.dtype).reshape(np.shape(x))


def lookup(cx, x: Any, keys: Sequence[Any], values: np.ndarray, default: Any) -> Any:
    """Map X elementwise through keys -> values; jnp when X and values are numeric."""
    if x.dtype == object or values.dtype == object:
        x = strings(cx.static(x)) if x.dtype == object else host_value(cx, x, "input X")
        return _host_lookup(x, keys, values, default)
    last = {}
    for k, v in zip(np.asarray(keys, x.dtype).tolist(), values):
        last[k] = v  # a repeated key: the last one counts
    nan = [v for k, v in last.items() if isinstance(k, float) and math.isnan(k)]
    pairs = sorted((k, v) for k, v in last.items() if not (isinstance(k, float) and math.isnan(k)))
    y = jnp.full(x.shape, default, values.dtype)
    if pairs:
        sk = jnp.asarray(np.array([k for k, _ in pairs], x.dtype))
        sv = jnp.asarray(np.array([v for _, v in pairs], values.dtype))
        at = jnp.clip(jnp.searchsorted(sk, x), 0, len(pairs) - 1)
        y = jnp.where(sk[at] == x, sv[at], y)
    if nan:
        y = jnp.where(jnp.isnan(x), jnp.asarray(nan[-1], values.dtype), y)
    return y


@rule("LabelEncoder", since=1, domain=ML)
def label_encoder_v1(cx, x, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """Y = index of X in classes_strings (string X), or classes_strings[X] (int64 X)  (v1)."""
    classes = list(classes_strings or ())
    if x.dtype == object:
        return lookup(cx, x, classes, np.arange(len(classes), dtype=np.int64), default_int64)
    return lookup(cx, x, list(range(len(classes))), np.array(classes, dtype=object), default_string)


def _encoder_table(cx, keys: dict[str, Any], values: dict[str, Any]) -> tuple[list[Any], np.ndarray]:
    """The one keys_* and the one values_* attribute that are set, as (keys list, values array)."""
    given_keys = [(n, v) for n, v in keys.items() if v is not None]
    given_values = [(n, v) for n, v in values.items() if v is not None]
    if len(given_keys) != 1 or len(given_values) != 1:
        raise cx.fail(f"exactly one keys_* and one values_* attribute must be set, got "
                      f"{[n for n, _ in given_keys]} and {[n for n, _ in given_values]}")
    (kname, k), (vname, v) = given_keys[0], given_values[0]
    key_list = [text(s) for s in np.asarray(k).reshape(-1)] if np.asarray(k).dtype == object \
        or kname == "keys_strings" else np.asarray(k).reshape(-1).tolist()
    dtype = {"values_strings": object, "values_int64s": np.int64, "values_floats": np.float32}
    val = np.asarray(v, dtype=dtype.get(vname, np.asarray(v).dtype)).reshape(-1)
    if val.dtype == object:
        val = strings(val)
    if len(key_list) != len(val):
        raise cx.fail(f"{kname} and {vname} must have the same length, got {len(key_list)} and {len(val)}")
    return key_list, val


def _typed_default(values: np.ndarray, default_float: float, default_int64: int,
                   default_string: str) -> Any:
    if values.dtype == object:
        return default_string
    if np.issubdtype(values.dtype, np.integer):
        return default_int64
    return default_float


@rule("LabelEncoder", since=2, domain=ML)
def label_encoder_v2(cx, x, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                     keys_floats=None, keys_int64s=None, keys_strings=None, values_floats=None,
                     values_int64s=None, values_strings=None):
    """Y = values_*[i] where X == keys_*[i], else default_*  (v2-v3: float, int64, string)."""
    keys, values = _encoder_table(
        cx, {"keys_floats": keys_floats, "keys_int64s": keys_int64s, "keys_strings": keys_strings},
        {"values_floats": values_floats, "values_int64s": values_int64s,
         "values_strings": values_strings})
    return lookup(cx, x, keys, values, _typed_default(values, default_float, default_int64,
                                                      default_string))


@rule("LabelEncoder", since=4, domain=ML)
def label_encoder(cx, x, *, default_float=-0.0, default_int64=-1, default_string="_Unused",
                  default_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                  keys_tensor=None, values_floats=None, values_int64s=None, values_strings=None,
                  values_tensor=None):
    """Y = values[i] where X == keys[i], else the default  (v4+: keys/values/default tensors)."""
    keys, values = _encoder_table(
        cx, {"keys_floats": keys_floats, "keys_int64s": keys_int64s, "keys_strings": keys_strings,
             "keys_tensor": keys_tensor},
        {"values_floats": values_floats, "values_int64s": values_int64s,
         "values_strings": values_strings, "values_tensor": values_tensor})
    if default_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0]
        default = text(default) if values.dtype == object else default
    else:
        default = _typed_default(values, default_float, default_int64, default_string)
    return lookup(cx, x, keys, values, default)


@rule("CategoryMapper", since=1, domain=ML)
def category_mapper(cx, x, *, cats_int64s=None, cats_strings=None, default_int64=-1,
                    default_string="_Unused"):
    """Y = cats_int64s[i] where X == cats_strings[i] (string X), or the reverse (int64 X)  (v1+)."""
    ints, strs = list(cats_int64s or ()), [text(s) for s in cats_strings or ()]
    if len(ints) != len(strs):
        raise cx.fail(f"cats_int64s and cats_strings must have the same length, got "
                      f"{len(ints)} and {len(strs)}")
    if x.dtype == object:
        return lookup(cx, x, strs, np.array(ints, np.int64), default_int64)
    return lookup(cx, x, ints, np.array(strs, dtype=object), default_string)


@rule("OneHotEncoder", since=1, domain=ML)
def one_hot_encoder(cx, x, *, cats_int64s=None, cats_strings=None, zeros=1):
    """Y[..., j] = (X == cats[j]), float32; zeros=0 rejects values in no category  (v1+)."""
    if x.dtype == object:
        def table() -> dict[str, int]:  # a repeated category: the last one counts
            return {text(s): i for i, s in enumerate(cats_strings or ())}

        index = cx.derived("OneHotEncoder", (cats_strings,), table)
        flat = np.asarray(cx.static(x)).reshape(-1)
        codes = np.fromiter((index.get(text(v), -1) for v in flat), np.int64,
                            count=flat.size).reshape(x.shape)
        cats = range(len(cats_strings or ()))
    else:
        cats = list(cats_int64s or ())
        # onnxruntime truncates float inputs to int64 before looking them up
        xi = jnp.asarray(x).astype(jnp.int64)
        codes = lookup(cx, xi, cats, np.arange(len(cats), dtype=np.int64), -1)
    if not cats:
        raise cx.fail("one of cats_int64s or cats_strings must be set")
    if not zeros:
        unknown = host_value(cx, codes, "the input (zeros=0 checks every value)") < 0
        if unknown.any():
            raise cx.fail(f"zeros=0 and {int(unknown.sum())} input value(s) are in no category")
    if isinstance(codes, np.ndarray):  # looked up on the host: stay there
        return (codes[..., None] == np.arange(len(cats))).astype(np.float32)
    return jax.nn.one_hot(codes, len(cats), dtype=jnp.float32)


# --- linear models ---------------------------------------------------------------------------------

def _weights(cx, coefficients: Any, rows: int | None, features: int, what: str) -> np.ndarray:
    """coefficients as a float32 [rows, features] matrix."""
    coef = np.asarray(coefficients or (), np.float32)
    rows = rows if rows is not None else coef.size // max(features, 1)
    if coef.size != rows * features:
        raise cx.fail(f"{what} must hold {rows} x {features} = {rows * features} values "
                      f"(one row per target, one column per feature), got {coef.size}")
    return coef.reshape(rows, features)


@rule("LinearClassifier", since=1, domain=ML)
def linear_classifier(cx, x, *, classlabels_ints=None, classlabels_strings=None, coefficients=None,
                      intercepts=None, multi_class=0, post_transform="NONE"):
    """Z = post_transform(X @ coefficients^T + intercepts), Y = the top class  (v1+)."""
    x = as_rows(jnp.asarray(x).astype(jnp.float32))  # onnxruntime computes in float32
    classes = len(intercepts) if intercepts else None
    coef = _weights(cx, coefficients, classes, x.shape[1], "coefficients")
    scores = x @ coef.T + jnp.asarray(np.asarray(intercepts or (0.0,), np.float32))
    labels = list(classlabels_strings or classlabels_ints or ())
    named = bool(classlabels_strings)
    add_second_class = -1
    if coef.shape[0] == 1:  # one weight row: a binary model, positive class when the score > 0
        pair = labels if len(labels) == 2 else (["0", "1"] if named else [0, 1])
        add_second_class = 1 if len(labels) == 2 else -1
        y = pick_labels(cx, (scores[:, 0] > 0).astype(jnp.int32), pair, named)
    else:
        if len(labels) != coef.shape[0]:
            raise cx.fail(f"{coef.shape[0]} weight rows need as many class labels, got {len(labels)}")
        y = pick_labels(cx, jnp.argmax(scores, axis=1), labels, named)
    return y, transform_scores(cx, scores, post_transform, add_second_class)


@rule("LinearRegressor", since=1, domain=ML)
def linear_regressor(cx, x, *, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    """Y = post_transform(X @ coefficients^T + intercepts), [N, targets] float32  (v1+)."""
    x = as_rows(jnp.asarray(x).astype(jnp.float32))
    coef = _weights(cx, coefficients, targets, x.shape[1], "coefficients")
    y = x @ coef.T
    if intercepts:
        y = y + jnp.asarray(np.asarray(intercepts, np.float32))
    return transform_scores(cx, y, post_transform)
