"""Bytes or path -> a checked ModelProto with external data resolved inside the model's folder."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from oxla.errors import InvalidModelError
from oxla.host import read_regular

# checker complaints that onnxruntime ignores too: oxla infers what the first would declare;
# the others are ops onnxruntime registers in the default domain (its transformer optimizer
# writes them, LayerNormalization below opset 17 included) and oxla has rules for.
BENIGN_CHECKER_ERRORS = (
    "Field 'type' of 'value_info' is required but missing",
    "No Op registered for LayerNormalization with domain_version of",
    "No Op registered for SimplifiedLayerNormalization with domain_version of",
)

ModelSource = str | os.PathLike[str] | bytes | ModelProto


def load_model(source: ModelSource, *, base_dir: str | os.PathLike[str] | None = None,
               check: bool = True) -> ModelProto:
    """Load an ONNX model and resolve its external data.

    Args:
        source: a path to a .onnx file, the serialized bytes, or a ModelProto (copied).
        base_dir: where external data files live when `source` is bytes or a proto; for a path
            it is the file's folder. External data is only ever read from inside this folder.
        check: run onnx.checker on the result.

    Returns:
        A ModelProto whose tensors all hold their data in memory.

    Raises:
        InvalidModelError: unreadable or malformed file, external data that is missing, short,
            or outside the model's folder.
    """
    data: bytes | None = None  # the serialized model, when we have it: checking it skips a copy
    path_text = ""
    if isinstance(source, ModelProto):
        model = ModelProto()
        model.CopyFrom(source)
        label = model.graph.name or "<model>"
    elif isinstance(source, bytes | bytearray | memoryview):
        data = bytes(source)
        model = _parse(data, "<bytes>")
        label = "<bytes>"
    else:
        path = Path(source)
        try:
            data = read_regular(path)
        except OSError as e:
            raise InvalidModelError(f"cannot read model file '{path}': {e.strerror}") from None
        model = _parse(data, str(path))
        label = path_text = str(path)
        base_dir = path.resolve().parent if base_dir is None else base_dir
    if not model.HasField("graph"):
        raise InvalidModelError(f"{label}: the model has no graph (is this an ONNX file?)")
    if model.ir_version <= 0:
        raise InvalidModelError(f"{label}: the model has no ir_version (is this an ONNX file?)")
    _check_opsets(model, label)
    _check_tensor_types(model, label)
    external = _resolve_external_data(model, None if base_dir is None else Path(base_dir), label)
    if check:
        # The checker takes the file's bytes (serializing a large proto costs more than checking
        # it); a model with external data is checked by path, which finds the data files beside
        # it without loading them (a proto over 2 GiB cannot be serialized at all).
        target: ModelProto | bytes | str = model
        if external and path_text:
            target = path_text
        elif not external and data is not None:
            target = data
        _run_checker(model, target, label)
    return model


def _run_checker(model: ModelProto, target: ModelProto | bytes | str, label: str) -> None:
    """onnx.checker on `target` (the model, its file's bytes or its path), the complaints in
    BENIGN_CHECKER_ERRORS let pass."""
    # The IR spec makes a tensor type's shape optional (absent: rank unknown) and onnxruntime
    # loads graph inputs and outputs without one, but onnx.checker requires it on the main
    # graph's and stops at the first one missing. For the check only, those get an empty shape
    # (without full_check the checker reads no shape), so every other check still runs: on the
    # proto in memory, external data included as load_model's resolver read it (the checker's
    # own rules for data files, no symlink or hard link, then go unchecked). Over 2 GiB only
    # the path can be checked, and there the first missing shape ends the check.
    unshaped = [v.type.tensor_type for v in (*model.graph.input, *model.graph.output)
                if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    benign: tuple[str, ...] = BENIGN_CHECKER_ERRORS
    if unshaped and model.ByteSize() <= onnx.checker.MAXIMUM_PROTOBUF:
        target = model
        for tensor_type in unshaped:
            tensor_type.shape.SetInParent()
    elif unshaped:
        benign = (*benign, "Field 'shape' of 'type' is required but missing")
    try:
        onnx.checker.check_model(target)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "validation failed"
        if not any(complaint in first for complaint in benign):
            raise InvalidModelError(f"{label}: onnx.checker rejects the model: {first}") from None
    except UnicodeDecodeError:  # the checker's own message quotes a name that is not UTF-8
        raise InvalidModelError(f"{label}: onnx.checker rejects the model: a name or string "
                                "in it is not valid UTF-8") from None
    finally:
        for tensor_type in unshaped:
            tensor_type.ClearField("shape")  # the model as its file has it


@functools.cache
def _known_opsets() -> dict[str, int]:
    """The newest opset the installed onnx defines for each of its domains."""
    newest: dict[str, int] = {}
    for schema in onnx.defs.get_all_schemas_with_history():
        newest[schema.domain] = max(newest.get(schema.domain, 0), schema.since_version)
    return newest


def _check_opsets(model: ModelProto, label: str) -> None:
    """An ONNX domain imported at an opset newer than this onnx knows is refused, not guessed at."""
    known = _known_opsets()
    for entry in model.opset_import:
        domain = "" if entry.domain == "ai.onnx" else entry.domain
        if domain in known and entry.version > known[domain]:
            raise InvalidModelError(
                f"{label}: the model imports domain '{entry.domain or 'ai.onnx'}' at opset "
                f"{entry.version}, newer than the {known[domain]} this onnx {onnx.__version__} "
                "defines; upgrade onnx/oxla or convert the model to an older opset")


_TYPES = frozenset(TensorProto.DataType.values())


def _check_tensor_types(model: ModelProto, label: str) -> None:
    """Unknown element types and string data that is not UTF-8, named by tensor."""
    for tensor in _model_tensors(model):
        name = tensor.name or "<unnamed>"
        if tensor.data_type not in _TYPES or tensor.data_type == TensorProto.UNDEFINED:
            raise InvalidModelError(f"{label}: tensor '{name}' has unknown data type {tensor.data_type}")
        if tensor.data_type == TensorProto.STRING:
            for value in tensor.string_data:
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InvalidModelError(
                        f"{label}: string tensor '{name}' holds bytes that are not UTF-8 ({e.reason} "
                        f"at byte {e.start})") from None


def _parse(data: bytes, label: str) -> ModelProto:
    if not data:
        raise InvalidModelError(f"{label}: the file is empty")
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise InvalidModelError(
            f"{label}: not a valid ONNX protobuf ({e}); the file may be truncated or not a model"
        ) from None
    return model


def _node_tensors(nodes: Iterable[onnx.NodeProto]) -> Iterator[TensorProto]:
    """Every TensorProto in nodes' attributes (dense, sparse, lists), subgraphs included."""
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            sparse = [attr.sparse_tensor] if attr.HasField("sparse_tensor") else []
            for s in (*sparse, *attr.sparse_tensors):
                yield s.values
                yield s.indices
            if attr.HasField("g"):
                yield from iter_tensors(attr.g)
            for g in attr.graphs:
                yield from iter_tensors(g)


def iter_tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto a graph holds: initializers, sparse ones, node attributes, subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _model_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto of the model: graphs, model-local functions and training graphs."""
    yield from iter_tensors(model.graph)
    for fn in model.functions:
        yield from _node_tensors(fn.node)
    for info in model.training_info:
        yield from iter_tensors(info.initialization)
        yield from iter_tensors(info.algorithm)


def _resolve_external_data(model: ModelProto, base_dir: Path | None, label: str) -> int:
    """Read every external tensor into the proto; returns how many there were."""
    count = 0
    for tensor in _model_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        name = tensor.name or "<unnamed>"
        if base_dir is None:
            raise InvalidModelError(
                f"{label}: tensor '{name}' keeps its data in an external file, but the model was "
                "given as bytes; pass base_dir= (the model's folder) or load it from its path"
            )
        tensor.raw_data = read_external(base_dir, name, info)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        count += 1
    return count


def read_external(base_dir: Path, name: str, info: dict[str, str]) -> bytes:
    """Read one tensor's external data, refusing any location outside `base_dir`.

    Checked before a byte is read: a relative location without NUL bytes, inside the folder
    after resolving symlinks, naming a regular file, with offset and length inside the file.
    """
    location = info.get("location", "")
    if not location:
        raise InvalidModelError(f"tensor '{name}': external data without a 'location'")
    if "\0" in location:
        raise InvalidModelError(f"tensor '{name}': external data location contains a NUL byte")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or ":" in location:
        raise InvalidModelError(
            f"tensor '{name}': external data location '{location}' is an absolute path; "
            "locations must be relative to the model's folder"
        )
    root = base_dir.resolve()
    target = (root / location).resolve()
    if target != root and root not in target.parents:
        raise InvalidModelError(
            f"tensor '{name}': external data location '{location}' escapes the model's folder "
            f"'{root}'; refusing to read it"
        )
    if not target.is_file():
        raise InvalidModelError(
            f"tensor '{name}': external data file '{location}' not found in '{root}' (or not a "
            "regular file)"
        )
    try:
        offset = int(info.get("offset", "0") or 0)
        length = int(info["length"]) if info.get("length") else None
    except ValueError:
        raise InvalidModelError(f"tensor '{name}': external data offset/length are not integers") from None
    size = target.stat().st_size
    if offset < 0 or (length is not None and length < 0):
        raise InvalidModelError(f"tensor '{name}': negative external data offset or length")
    if offset > size or (length is not None and offset + length > size):
        raise InvalidModelError(
            f"tensor '{name}': external data file '{location}' is short: wanted "
            f"{'the rest' if length is None else f'{length} bytes'} at offset {offset}, the file "
            f"has {size} bytes"
        )
    with open(target, "rb") as f:
        f.seek(offset)
        data = f.read() if length is None else f.read(length)
    if length is not None and len(data) != length:
        raise InvalidModelError(
            f"tensor '{name}': external data file '{location}' is short: wanted {length} bytes "
            f"at offset {offset}, got {len(data)}"
        )
    return data
