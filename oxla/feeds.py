"""Inputs for a model: read from .npy/.pb files, or random ones shaped like the declared inputs."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from oxla.errors import InputError, ResourceError, format_bytes
from oxla.host import machine_memory, read_regular

if TYPE_CHECKING:  # onnx is imported where a model is read: exported models run without it
    import onnx

# An input to fill: name, dtype (None: not a tensor), shape with ints or dim names.
InputSpec = tuple[str, "np.dtype | None", "list[int | str] | None"]  # None: not a tensor / no shape


def read_array(path: str | Path) -> Any:
    """A .npy file, or a serialized TensorProto / SequenceProto (.pb)."""
    p = Path(path)
    try:
        data = read_regular(p)
        if p.suffix == ".npy":
            return np.load(io.BytesIO(data), allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read input file '{p}': {e}") from None
    import onnx
    from onnx import numpy_helper

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


# Ops an index input may pass through unchanged in value on its way to a Gather.
_VALUE_KEEPING = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"})


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph inputs that feed a Gather's indices -> the size of the axis they index (the least,
    when several Gathers read one input): random indices stay below it (a vocabulary size)."""
    graph = model.graph
    sizes = {t.name: tuple(t.dims) for t in graph.initializer}
    for info in [*graph.input, *graph.value_info]:
        dims = info.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            sizes.setdefault(info.name, tuple(d.dim_value for d in dims))
    source = {i.name: i.name for i in graph.input}
    for node in graph.node:  # graph order is topological: sources propagate forward
        if node.op_type in _VALUE_KEEPING and node.input and node.input[0] in source:
            source[node.output[0]] = source[node.input[0]]
    bounds: dict[str, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] not in source:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        data = sizes.get(node.input[0])
        if data and -len(data) <= axis < len(data):
            name = source[node.input[1]]
            bounds[name] = min(bounds.get(name, data[axis]), data[axis])
    return bounds


def random_feeds(model: onnx.ModelProto, *, seed: int = 0, dims: Mapping[str, int] | None = None,
                 default_dim: int = 1, int_range: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """Random values for every non-initializer graph input, shaped as declared.

    Args:
        model: the model whose inputs to fill.
        seed: the generator's seed.
        dims: sizes of symbolic dims by name; the others are `default_dim`.
        default_dim: the size of a symbolic dim not in `dims`.
        int_range: [LO, HI) for integer inputs (default [0, 10)); an input feeding a Gather's
            indices stays inside [0, axis size) by default, and inside the axis when given.

    Returns:
        {input name: array}; integer indices in range, boolean inputs as masks.

    Raises:
        InputError: a `dims` name the inputs do not have, a non-tensor input or one without a
            shape, an empty range.
    """
    specs = input_specs(model)
    named = symbolic_dims(specs)
    unknown = sorted(set(dims or {}) - named)
    if unknown:
        raise InputError(f"--dim names {unknown} are not dims of this model's inputs; "
                         f"its symbolic dims are {sorted(named) or 'none'}")
    return random_for_specs(specs, index_bounds(model), seed=seed, dims=dims,
                            default_dim=default_dim, int_range=int_range)


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's non-initializer inputs as (name, dtype, shape with dim names, "?" for an
    unnamed unknown dim); dtype None for a non-tensor input, shape None for a tensor declared
    without a shape (its rank unknown)."""
    from oxla.dtypes import to_numpy_dtype

    inits = {t.name for t in model.graph.initializer}
    specs: list[InputSpec] = []
    for info in model.graph.input:
        if info.name in inits:
            continue
        if info.type.WhichOneof("value") != "tensor_type":
            specs.append((info.name, None, []))
            continue
        tt = info.type.tensor_type
        shape: list[int | str] | None = None
        if tt.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or "?")
                     for d in tt.shape.dim]
        specs.append((info.name, to_numpy_dtype(tt.elem_type), shape))
    return specs


def symbolic_dims(specs: Sequence[InputSpec]) -> set[str]:
    """The dim names of these inputs' shapes."""
    return {d for _, _, shape in specs for d in shape or [] if isinstance(d, str) and d != "?"}


def random_for_specs(specs: Sequence[InputSpec], bounds: Mapping[str, int],
                     *, seed: int = 0, dims: Mapping[str, int] | None = None, default_dim: int = 1,
                     int_range: tuple[int, int] | None = None,
                     memory_limit: int | None = None) -> dict[str, np.ndarray]:
    """Random inputs from (name, dtype, shape with ints or dim names) triples; see random_feeds.
    An input over `memory_limit` bytes (default: the machine's memory) is a ResourceError."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name, dtype, shape in specs:
        if dtype is None:
            raise InputError(f"input '{name}' is not a tensor; give it with --input")
        if shape is None:
            raise InputError(f"input '{name}' has no shape in the model (its rank is unknown); "
                             "give it with --input")
        concrete = tuple(d if isinstance(d, int) else (dims or {}).get(d, default_dim) for d in shape)
        size = math.prod(concrete) * dtype.itemsize
        limit = memory_limit or machine_memory()
        if size > limit:
            raise ResourceError(f"random input '{name}' of shape {concrete} {dtype} would take "
                                f"{format_bytes(size)}, more than the memory limit {format_bytes(limit)}; "
                                "give smaller --dim sizes")
        low, high = _int_range(name, bounds.get(name), int_range)
        feeds[name] = random_array(dtype, concrete, rng, low=low, high=high)
    return feeds


def _int_range(name: str, bound: int | None, given: tuple[int, int] | None) -> tuple[int, int]:
    if bound is None:
        return given or (0, 10)
    # Gather takes indices in [-n, n): a given range is clipped to the axis it indexes.
    low, high = (max(given[0], -bound), min(given[1], bound)) if given else (0, bound)
    if low >= high:
        raise InputError(f"--int-range {given} leaves no valid index for '{name}', "
                         f"which indexes an axis of size {bound}")
    return low, high


def random_array(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator, *,
                 low: int = 0, high: int = 10) -> np.ndarray:
    """Random values of a dtype: normal floats, integers in [low, high), booleans as masks."""
    if dtype == np.bool_:
        return _mask(shape, rng)
    if dtype.kind in "iu":
        return rng.integers(low, high, shape).astype(dtype)
    if dtype == np.dtype(object):
        return np.array(rng.choice(["a", "b", "c"], shape), dtype=object)
    return rng.standard_normal(shape).astype(dtype)


def _mask(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A padding mask: along the last axis each row is True for a prefix of at least one."""
    if not shape or shape[-1] == 0:
        return np.ones(shape, np.bool_)
    lengths = rng.integers(1, shape[-1] + 1, shape[:-1])
    return np.arange(shape[-1]) < lengths[..., None]
