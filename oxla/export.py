"""`oxla export`: a model serialized as StableHLO with its weights (jax.export), runnable without onnx.

The artifact is one file: the 8 bytes `OXLAEXP1`, a 4-byte little-endian header length, a UTF-8
JSON header, then the bytes of `jax.export.Exported.serialize()`. The header holds what a caller
needs without deserializing JAX: format version, the jax version that wrote it, the source file
name, and for each input and output its name, dtype name and shape (ints, or the ONNX dim_param
names that stayed symbolic); an integer input that feeds a Gather's indices carries `index_bound`
(the size of the gathered axis) so random inputs stay in range.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oxla.errors import InputError, InvalidModelError, NotStaticError, OxlaError
from oxla.host import is_regular, read_regular

MAGIC = b"OXLAEXP1"
FORMAT_VERSION = 1
_LEN = struct.Struct("<I")
EMITS = ("stablehlo", "hlo")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")   # what jax.export lowers for


class ExportError(OxlaError):
    """A model cannot be exported as one computation (graph break, shapes that must be fixed)."""


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of an exported model: name, dtype name and shape (int or dim name)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    index_bound: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.index_bound is not None:
            out["index_bound"] = self.index_bound
        return out


@dataclass(frozen=True)
class ExportResult:
    """What `export_model` produced: the artifact's bytes and the program's text when asked."""

    data: bytes
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    text: str | None = None


def is_exported(path: str | Path) -> bool:
    """Whether a file starts with the exported-model magic bytes."""
    if not is_regular(path):  # a FIFO would block, a directory cannot be read
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _ident(name: str, taken: set[str]) -> str:
    """A dim_param as an identifier jax.export's shape parser accepts, unique in this model."""
    ident = re.sub(r"\W", "_", name) or "d"
    if ident[0].isdigit():
        ident = "d_" + ident
    while ident in taken:
        ident += "_"
    taken.add(ident)
    return ident


def _input_shapes(model: Any, names: Sequence[str], dims: Mapping[str, int]) -> dict[str, list[int | str]]:
    """Each input's shape: ints, the --dim sizes, or dim names (unnamed dims get one each)."""
    infos = {i.name: i for i in model.graph.input}
    known = {d.dim_param for n in names for d in infos[n].type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(set(dims) - known)
    if unknown:
        raise InputError(f"--dim names {unknown} are not dims of this model's inputs; "
                         f"its symbolic dims are {sorted(known) or 'none'}")
    shapes: dict[str, list[int | str]] = {}
    anon = 0
    for n in names:
        tp = infos[n].type
        if tp.WhichOneof("value") != "tensor_type":
            raise ExportError(f"input '{n}' is not a tensor: only tensor inputs can be exported")
        if not tp.tensor_type.HasField("shape"):  # no dims is not rank 0 here: the rank is unknown
            raise ExportError(f"input '{n}' has no shape (its rank is unknown), and an exported "
                              "computation fixes every input's rank; declare the input's shape")
        shape: list[int | str] = []
        for d in tp.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            elif d.dim_param:
                shape.append(dims.get(d.dim_param, d.dim_param))
            else:
                anon += 1
                shape.append(f"_anon{anon}")   # an unnamed dim: symbolic, its own
        shapes[n] = shape
    return shapes


def _specs(compiled: Any, shapes: Mapping[str, list[int | str]]) -> list[Any]:
    """ShapeDtypeStructs for jax.export, with one symbolic scope shared by every input."""
    import jax
    from jax import export as jax_export

    from oxla.dtypes import to_numpy_dtype

    symbols = sorted({d for s in shapes.values() for d in s if isinstance(d, str)})
    taken: set[str] = set()
    idents = [_ident(s, taken) for s in symbols]
    table: dict[int | str, Any] = (dict(zip(symbols, jax_export.symbolic_shape(", ".join(idents))))
                                   if symbols else {})
    specs = []
    for n, shape in shapes.items():
        tp = compiled.plan.input_types.get(n)
        dtype = to_numpy_dtype(tp.tensor_type.elem_type) if tp is not None else None
        if dtype is None or dtype.kind in "OUS":
            raise ExportError(f"input '{n}' has dtype {dtype}: only numeric tensors can be exported")
        specs.append(jax.ShapeDtypeStruct(tuple(table.get(d, d) for d in shape), dtype))
    return specs


def export_model(model: Any, *, dims: Mapping[str, int] | None = None,
                 emit: str | None = None, platforms: Sequence[str] | None = None) -> ExportResult:
    """Serialize a model's whole graph, weights included, as one jax.export computation.

    Args:
        model: a path, bytes or ModelProto.
        dims: sizes for named symbolic dims; the others stay symbolic.
        emit: also return the program's text, "stablehlo" or "hlo".
        platforms: lower for these JAX platforms ("cpu", "cuda", "rocm", "tpu"); one artifact
            then runs on any of them. Default: the platform JAX runs on here.

    Returns:
        The artifact's bytes (see the module docstring for the layout) and its input/output specs.

    Raises:
        ExportError: the model has a graph break, or a dim cannot stay symbolic.
        InputError: a --dim name is not a dim of the model's inputs.
    """
    import jax
    from jax import export as jax_export

    from oxla.compile import compile as compile_model
    from oxla.executor import x64
    from oxla.feeds import index_bounds

    unknown = sorted(set(platforms or ()) - set(PLATFORMS))
    if unknown:  # jax.export records any name and fails only where the artifact is run
        raise InputError(f"unknown platforms {unknown}; choose from {', '.join(PLATFORMS)}")
    compiled = compile_model(model)
    names, outs = list(compiled.input_names), list(compiled.output_names)
    shapes = _input_shapes(compiled.model, names, dims or {})
    params = compiled.params

    def pure(*args: Any) -> tuple[Any, ...]:
        values = compiled.fn(params, dict(zip(names, args)))
        return tuple(values[o] for o in outs)

    with x64():
        specs = _specs(compiled, shapes)
        exporter = jax_export.export(jax.jit(pure), platforms=tuple(platforms) if platforms else None)
        exported = _trace(exporter, specs, shapes)
        text = None
        if emit == "stablehlo":
            text = exported.mlir_module()
        elif emit == "hlo":
            text = _hlo_text(pure, specs)
        data = exported.serialize()
    bounds = index_bounds(compiled.model)
    inputs = tuple(TensorSpec(n, np.dtype(s.dtype).name, tuple(shapes[n]), bounds.get(n))
                   for n, s in zip(names, specs))
    outputs = tuple(TensorSpec(o, np.dtype(a.dtype).name, tuple(_dim(d) for d in a.shape))
                    for o, a in zip(outs, exported.out_avals))
    source = Path(model).name if isinstance(model, (str, Path)) else None
    data = _artifact(bytes(data), inputs, outputs, source, tuple(exported.platforms))
    return ExportResult(data, inputs, outputs, text)


def _artifact(payload: bytes, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
              source: str | None, platforms: tuple[str, ...]) -> bytes:
    """Magic, header length, JSON header, then jax.export's bytes (the module docstring's layout)."""
    import jax

    header = {"format_version": FORMAT_VERSION, "jax_version": jax.__version__, "source": source,
              "platforms": list(platforms),
              "inputs": [i.to_json() for i in inputs], "outputs": [o.to_json() for o in outputs]}
    blob = json.dumps(header).encode()
    return MAGIC + _LEN.pack(len(blob)) + blob + payload


def _dim(d: Any) -> int | str:
    return d if isinstance(d, int) else str(d)


def _trace(exporter: Any, specs: list[Any], shapes: Mapping[str, list[int | str]]) -> Any:
    """Run jax.export's trace, turning its failures into messages about the model."""
    symbolic = sorted({d for s in shapes.values() for d in s if isinstance(d, str)})
    try:
        return exporter(*specs)
    except NotStaticError as e:
        where = str(e).split(": the value is computed from data")[0]
        raise ExportError(f"cannot export as one computation: the graph breaks at {where} "
                          "(a data-dependent value); run the .onnx file instead") from None
    except Exception as e:
        if not symbolic:
            raise
        first = str(e).splitlines()[0]
        hint = " ".join(f"--dim {s}=N" for s in symbolic)
        raise ExportError(f"the model cannot keep dims {symbolic} symbolic ({first}); "
                          f"give their sizes with {hint}") from None


def _hlo_text(pure: Any, specs: list[Any]) -> str:
    import jax

    try:
        return str(jax.jit(pure).lower(*specs).as_text(dialect="hlo"))
    except Exception as e:
        raise ExportError(f"HLO text needs concrete shapes ({str(e).splitlines()[0]}); "
                          "give every symbolic dim with --dim NAME=N or use --emit stablehlo") from None


class ExportedModel:
    """An exported artifact loaded back: `model(feeds)` or `run(output_names, feeds)`."""

    def __init__(self, data: bytes, origin: str = "<bytes>") -> None:
        if data[:len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + _LEN.size:
            raise InvalidModelError(f"'{origin}' is not an oxla exported model (no {MAGIC!r} header)")
        (size,) = _LEN.unpack_from(data, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        try:
            header = json.loads(data[start:start + size].decode())
            if header["format_version"] != FORMAT_VERSION:
                raise InvalidModelError(f"'{origin}' is export format {header['format_version']}; "
                                        f"this oxla reads format {FORMAT_VERSION}")
            self.inputs = tuple(_spec(d) for d in header["inputs"])
            self.outputs = tuple(_spec(d) for d in header["outputs"])
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidModelError(f"'{origin}' has a damaged export header: {e}") from None
        self.header: dict[str, Any] = header
        self._payload = bytes(data[start + size:])
        self._exported: Any = None

    def _program(self) -> Any:
        if self._exported is None:
            from jax import export as jax_export

            try:
                self._exported = jax_export.deserialize(bytearray(self._payload))
            except Exception as e:
                raise InvalidModelError(f"cannot deserialize the exported program: {e}") from None
        return self._exported

    def get_inputs(self) -> list[TensorSpec]:
        """The inputs, in the order the program takes them."""
        return list(self.inputs)

    def get_outputs(self) -> list[TensorSpec]:
        """The outputs, in the order the program returns them."""
        return list(self.outputs)

    def __call__(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Run on a {name: array} dict; returns {output name: numpy array}.

        Raises:
            InputError: a missing input, or one whose dtype or shape the program does not take.
        """
        args = [_check(spec, feeds) for spec in self.inputs]
        with _x64():
            try:
                values = self._program().call(*args)
            except (ValueError, TypeError) as e:
                if "platform" in str(e):
                    raise InputError(f"the program was exported for {self.header.get('platforms')}, "
                                     f"not for this machine ({e}); export it again with "
                                     "--platform") from None
                raise InputError(f"the inputs do not fit the exported program: {e}") from None
            return {o.name: np.asarray(v) for o, v in zip(self.outputs, values)}

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """onnxruntime's `run`: outputs by name (None: all), as numpy arrays."""
        values = self(feeds)
        names = list(output_names) if output_names else [o.name for o in self.outputs]
        missing = [n for n in names if n not in values]
        if missing:
            raise InputError(f"no outputs named {missing}; the model has {list(values)}")
        return [values[n] for n in names]


def _x64() -> Any:
    """oxla.x64()'s scope (64-bit types on for this thread); oxla.executor imports onnx, and an
    exported model runs without it."""
    import jax

    return jax.enable_x64(True)


def _spec(d: Mapping[str, Any]) -> TensorSpec:
    """A header entry, checked: a damaged file must not reach numpy as a shape or dtype."""
    shape = d["shape"]
    if not isinstance(shape, list) or not all(
            isinstance(s, str) or (isinstance(s, int) and not isinstance(s, bool) and s >= 0) for s in shape):
        raise ValueError(f"input or output '{d['name']}' has shape {shape!r}, not a list of sizes "
                         "and dim names")
    bound = d.get("index_bound")
    if bound is not None and (not isinstance(bound, int) or bound < 1):
        raise ValueError(f"input '{d['name']}' has index_bound {bound!r}, not a positive size")
    dtype = str(d["dtype"])
    try:
        np.dtype(dtype)
    except TypeError:
        import ml_dtypes  # bfloat16, float8 variants: numpy knows them through ml_dtypes

        if not isinstance(getattr(ml_dtypes, dtype, None), type):
            raise ValueError(f"input or output '{d['name']}' has unknown dtype {dtype!r}") from None
    return TensorSpec(str(d["name"]), dtype, tuple(shape), bound)


def _check(spec: TensorSpec, feeds: Mapping[str, Any]) -> np.ndarray:
    """One feed, checked against its spec: the dtype exactly, the rank and the fixed dims."""
    if spec.name not in feeds:
        raise InputError(f"missing input '{spec.name}' ({spec.dtype} {spec.shape})")
    value = np.asarray(feeds[spec.name])
    if value.dtype.name != spec.dtype:
        raise InputError(f"input '{spec.name}' must be {spec.dtype}, got {value.dtype}")
    fixed = all(isinstance(w, str) or w == g for g, w in zip(value.shape, spec.shape))
    if value.ndim != len(spec.shape) or not fixed:
        raise InputError(f"input '{spec.name}' must have shape {spec.shape}, got {value.shape}")
    return value


def load_exported(path: str | Path) -> ExportedModel:
    """Load an artifact written by `oxla export` (or `export_model(...).data`).

    Args:
        path: the file.

    Returns:
        An ExportedModel; call it with a dict of numpy arrays.

    Raises:
        InvalidModelError: the file cannot be read or is not an exported model.
    """
    try:
        data = read_regular(path)
    except OSError as e:
        raise InvalidModelError(f"cannot read '{path}': {e}") from None
    return ExportedModel(data, str(path))
