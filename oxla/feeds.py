"""Inputs for a model: read from .npy/.pb files, or random ones shaped like the declared inputs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from oxla.dtypes import to_numpy_dtype
from oxla.errors import InputError


def read_array(path: str | Path) -> Any:
    """A .npy file, or a serialized TensorProto / SequenceProto (.pb)."""
    p = Path(path)
    try:
        if p.suffix == ".npy":
            return np.load(p, allow_pickle=False)
        data = p.read_bytes()
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read input file '{p}': {e}") from None
    tensor = onnx.TensorProto()
    try:
        tensor.ParseFromString(data)
        return numpy_helper.to_array(tensor)
    except Exception:  # not a tensor: maybe a sequence
        seq = onnx.SequenceProto()
        try:
            seq.ParseFromString(data)
            return numpy_helper.to_list(seq)
        except Exception:
            raise InputError(f"'{p}' is neither a .npy file nor a serialized ONNX tensor") from None


def parse_input_args(items: list[str]) -> dict[str, Any]:
    """`NAME=FILE` pairs from the command line -> {name: array}."""
    feeds: dict[str, Any] = {}
    for item in items:
        name, sep, file = item.partition("=")
        if not sep or not name or not file:
            raise InputError(f"--input takes NAME=FILE, got '{item}'")
        feeds[name] = read_array(file)
    return feeds


def random_feeds(model: onnx.ModelProto, *, seed: int = 0, dims: Mapping[str, int] | None = None,
                 default_dim: int = 1) -> dict[str, np.ndarray]:
    """Random values for every non-initializer graph input; symbolic dims from `dims` or 1."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for info in model.graph.input:
        if info.name in inits:
            continue
        tt = info.type.tensor_type
        if info.type.WhichOneof("value") != "tensor_type":
            raise InputError(f"input '{info.name}' is not a tensor; give it with --input")
        shape = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            else:
                shape.append((dims or {}).get(d.dim_param, default_dim))
        feeds[info.name] = random_array(to_numpy_dtype(tt.elem_type), tuple(shape), rng)
    return feeds


def random_array(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(0, 10, shape).astype(dtype)
    if dtype == np.dtype(object):
        return np.array(rng.choice(["a", "b", "c"], shape), dtype=object)
    return rng.standard_normal(shape).astype(dtype)
