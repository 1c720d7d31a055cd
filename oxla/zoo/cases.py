"""Find zoo models: backend-test folders, onnx's shipped cases and bare .onnx files."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from oxla.errors import InputError

# The model cases the onnx wheel ships (FACTS.md): light holds light_X.onnx + light_X_output_0.pb,
# the others backend-test folders.
BACKEND_KINDS = ("light", "pytorch-converted", "pytorch-operator", "simple")
BACKEND_PREFIX = "onnx-backend"

FOLDER = "folder"  # model + test_data_set_N/{input,output}_K.pb
LIGHT = "light"    # inputs generated as onnx's runner does, outputs stored beside the model
BARE = "bare"      # no expected outputs: compared with onnxruntime when it is installed


@dataclass(frozen=True)
class DataSet:
    """One test_data_set_N: input_K.pb and output_K.pb files in K order."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class ZooCase:
    """One model to check: where it is, its layout and its test data."""

    id: str
    model: str
    layout: str
    data_sets: tuple[DataSet, ...] = ()


def _numbered(folder: Path, prefix: str) -> tuple[str, ...]:
    """prefix_0.pb, prefix_1.pb, ... up to the first gap."""
    out: list[str] = []
    while (folder / f"{prefix}_{len(out)}.pb").is_file():
        out.append(str(folder / f"{prefix}_{len(out)}.pb"))
    return tuple(out)


def _data_sets(folder: Path) -> tuple[DataSet, ...]:
    sets = sorted((d for d in folder.glob("test_data_set_*") if d.is_dir()),
                  key=lambda d: int(d.name.rsplit("_", 1)[1]) if d.name.rsplit("_", 1)[1].isdigit() else 0)
    return tuple(DataSet(_numbered(d, "input"), _numbered(d, "output")) for d in sets)


def _label(path: Path) -> str:
    """The path as the user would write it: relative to the working directory when inside it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _folder_models(folder: Path) -> list[Path]:
    preferred = folder / "model.onnx"
    if preferred.is_file():
        return [preferred]
    return sorted(p for p in folder.glob("*.onnx") if p.is_file())


def _file_case(path: Path, label: str) -> ZooCase:
    light_outputs = _numbered(path.parent, f"{path.stem}_output")
    if light_outputs:
        return ZooCase(label, str(path), LIGHT, (DataSet((), light_outputs),))
    return ZooCase(label, str(path), BARE)


def _walk(root: Path) -> Iterator[ZooCase]:
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(("test_data_set_", ".")))
        onnx_files = sorted(f for f in files if f.endswith(".onnx"))
        data = _data_sets(here)
        models = _folder_models(here) if onnx_files else []
        if data and len(models) == 1:
            yield ZooCase(_label(here), str(models[0]), FOLDER, data)
            continue
        for name in onnx_files:
            yield _file_case(here / name, _label(here / name))


def discover(paths: Sequence[str | os.PathLike[str]]) -> list[ZooCase]:
    """Every model under `paths`, in a stable order.

    Args:
        paths: folders (searched recursively) and .onnx files.

    Returns:
        One case per model: a folder with test_data_set_N holding one model (model.onnx, or its
        only .onnx) is one case; any other .onnx file is a bare case (or a light one when
        `<stem>_output_0.pb` lies beside it).

    Raises:
        InputError: a path does not exist.
    """
    cases: dict[str, ZooCase] = {}
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise InputError(f"no such file or folder: '{path}'")
        if path.is_dir():
            found = list(_walk(path))
        elif _data_sets(path.parent) and _folder_models(path.parent) == [path]:
            found = [ZooCase(_label(path.parent), str(path), FOLDER, _data_sets(path.parent))]
        else:
            found = [_file_case(path, _label(path))]
        for case in found:
            cases.setdefault(case.id, case)
    return list(cases.values())


def backend_data_dir() -> Path:
    """Where the installed onnx wheel keeps its backend test data."""
    import onnx.backend.test

    return Path(onnx.backend.test.__file__).parent / "data"


def backend_cases() -> list[ZooCase]:
    """The model cases shipped in the onnx wheel: light, pytorch-converted, pytorch-operator, simple."""
    root = backend_data_dir()
    out = []
    for path in sorted((root / "light").glob("light_*.onnx")):
        name = path.stem[len("light_"):]
        out.append(ZooCase(f"{BACKEND_PREFIX}/light/{name}", str(path), LIGHT,
                           (DataSet((), _numbered(path.parent, f"{path.stem}_output")),)))
    for kind in BACKEND_KINDS[1:]:
        for folder in sorted(d for d in (root / kind).glob("test_*") if d.is_dir()):
            out.append(ZooCase(f"{BACKEND_PREFIX}/{kind}/{folder.name}", str(folder / "model.onnx"),
                               FOLDER, _data_sets(folder)))
    return out


def _external_files(model_path: Path) -> list[Path]:
    """Files the model's external data points at, inside its folder (the others fail to load)."""
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # an unreadable model is reported by the load stage, not here
        return []
    root = model_path.resolve().parent
    found = set()
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {e.key: e.value for e in tensor.external_data}.get("location", "")
        target = (root / location).resolve()
        if location and root in target.parents and target.is_file():
            found.add(target)
    return sorted(found)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for g in attr.graphs:
                yield from _tensors(g)


def case_digest(case: ZooCase) -> str:
    """sha256 over the model, its external data and its test data (the cache key's content part)."""
    h = hashlib.sha256(case.layout.encode())
    model = Path(case.model)
    files = [model, *_external_files(model)]
    files += [Path(f) for ds in case.data_sets for f in (*ds.inputs, *ds.outputs)]
    for path in files:
        h.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
