"""ai.onnx.ml ops on maps (Python dicts on the host): ZipMap, DictVectorizer, CastMap."""

from __future__ import annotations

from typing import Any

import numpy as np

from oxla.lowering.common import check_size
from oxla.lowering.registry import rule

ML = "ai.onnx.ml"


@rule("ZipMap", since=1, domain=ML, static=("*",))
def zip_map(cx, x, *, classlabels_int64s=None, classlabels_strings=None):
    """Z[i] = {label_j: X[i, j]}: one map per row, keys from exactly one label attribute."""
    if (classlabels_int64s is None) == (classlabels_strings is None):
        raise cx.fail("give exactly one of classlabels_int64s and classlabels_strings")
    labels = classlabels_int64s if classlabels_int64s is not None else classlabels_strings
    rows = np.asarray(x, np.float32)
    rows = rows.reshape(1, -1) if rows.ndim == 1 else rows
    if rows.ndim != 2 or rows.shape[1] != len(labels):
        raise cx.shape_error(f"X must be [N, {len(labels)}] (one column per label), got shape {rows.shape}")
    return [dict(zip(labels, row)) for row in rows.tolist()]  # Python floats, as float(v) gives


def _value_dtype(values: list[object]) -> np.dtype:
    if any(isinstance(v, str) for v in values):
        return np.dtype(object)
    if all(isinstance(v, int | np.integer) for v in values):
        return np.dtype(np.int64)
    return np.dtype(np.float32)


@rule("DictVectorizer", since=1, domain=ML, static=("*",))
def dict_vectorizer(cx, x, *, int64_vocabulary=None, string_vocabulary=None):
    """Y[j] = X[vocabulary[j]] (0 for keys the map lacks); one row per map of a sequence."""
    vocab = int64_vocabulary if int64_vocabulary is not None else string_vocabulary
    if vocab is None:
        raise cx.fail("give int64_vocabulary or string_vocabulary")
    maps = x if isinstance(x, list) else [x]
    if not all(isinstance(m, dict) for m in maps):
        raise cx.fail(f"X must be a map, got {type(x).__name__}")
    values = [v for m in maps for v in m.values()]
    dtype = _value_dtype(values) if values else np.dtype(np.float32)
    if values and isinstance(values[0], np.floating):
        dtype = np.asarray(values[0]).dtype
    zero = "" if dtype.kind == "O" else 0
    out = np.array([[m.get(k, zero) for k in vocab] for m in maps], dtype=dtype)
    return out if isinstance(x, list) else out.reshape(-1)


@rule("CastMap", since=1, domain=ML, static=("*",))
def cast_map(cx, x, *, cast_to="TO_FLOAT", map_form="DENSE", max_map=1):
    """Map int64 -> value to a [1, C] tensor ordered by key; SPARSE packs keys into [0, max_map)."""
    if not isinstance(x, dict):
        raise cx.fail(f"X must be a map, got {type(x).__name__}")
    dtype = {"TO_FLOAT": np.float32, "TO_INT64": np.int64, "TO_STRING": object}.get(cast_to)
    if dtype is None:
        raise cx.fail(f"cast_to must be TO_FLOAT, TO_INT64 or TO_STRING, got '{cast_to}'")
    keys = sorted(int(k) for k in x)

    def cast(v: Any) -> Any:
        return str(v) if dtype is object else dtype(float(v))  # type: ignore[operator]

    if map_form == "DENSE":
        return np.array([[cast(x[k]) for k in keys]], dtype=dtype)
    if map_form != "SPARSE":
        raise cx.fail(f"map_form must be DENSE or SPARSE, got '{map_form}'")
    check_size(cx, [1, max_map], dtype)
    out = np.full((1, max_map), "" if dtype is object else 0, dtype=dtype)
    for k in keys:
        if not 0 <= k < max_map:
            raise cx.fail(f"key {k} is outside [0, max_map={max_map})")
        out[0, k] = cast(x[k])
    return out
