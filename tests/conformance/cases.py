"""The ONNX conformance cases: node cases from onnx's generators, model cases from its wheel."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
from onnx import numpy_helper
from onnx.backend.test.runner import Runner

from oxla.zoo.worker import read_pb

DATA_DIR = os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")
MODEL_KINDS = ("light", "pytorch-converted", "pytorch-operator", "simple")
# The two gradient cases of data/simple need the ai.onnx.preview.training Gradient op (issue 3).
GRADIENT_CASES = ("test_gradient_of_add", "test_gradient_of_add_and_mul")


@dataclass(frozen=True)
class Case:
    """One conformance case: a model, its data sets and the tolerances to compare with."""

    name: str
    kind: str
    load: Callable[[], tuple[onnx.ModelProto, list[tuple[list[Any], list[Any]]], float, float]]


def _normalize(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value


@cache
def _node_testcases() -> dict[str, Any]:
    import onnx.backend.test.case.node as node_cases

    return {c.name: c for c in node_cases.collect_testcases()}


def node_cases() -> list[Case]:
    """The 1884 node cases of the pinned onnx."""
    def loader(name: str) -> Callable[[], Any]:
        def load() -> Any:
            c = _node_testcases()[name]
            data = [([_normalize(v) for v in i], [_normalize(v) for v in o]) for i, o in c.data_sets]
            return c.model, data, c.rtol, c.atol
        return load
    return [Case(name, "node", loader(name)) for name in sorted(_node_testcases())]


def _folder_loader(model_dir: str) -> Callable[[], Any]:
    def load() -> Any:
        model = onnx.load(os.path.join(model_dir, "model.onnx"))
        inits = {t.name for t in model.graph.initializer}
        real_inputs = [i for i in model.graph.input if i.name not in inits] or list(model.graph.input)
        data = []
        for ds in sorted(glob.glob(os.path.join(model_dir, "test_data_set*"))):
            n_in = len(glob.glob(os.path.join(ds, "input_*.pb")))
            n_out = len(glob.glob(os.path.join(ds, "output_*.pb")))
            ins = [read_pb(os.path.join(ds, f"input_{i}.pb"), model.graph.input[i].type
                               if i < len(model.graph.input) else real_inputs[i].type)
                   for i in range(n_in)]
            outs = [read_pb(os.path.join(ds, f"output_{i}.pb"), model.graph.output[i].type)
                    for i in range(n_out)]
            data.append((ins, outs))
        return model, data, 1e-3, 1e-7
    return load


def _light_loader(path: str, name: str) -> Callable[[], Any]:
    def load() -> Any:
        model = onnx.load(path)
        inits = {t.name for t in model.graph.initializer}
        ins = [Runner.generate_dummy_data(x, seed=0, name=name, random=False)
               for x in model.graph.input if x.name not in inits]
        prefix = os.path.splitext(path)[0]
        outs = [read_pb(f"{prefix}_output_{i}.pb", o.type) for i, o in enumerate(model.graph.output)]
        return model, [(ins, outs)], 1e-3, 1e-7
    return load


def model_cases() -> list[Case]:
    """The shipped model cases: light (9), pytorch-converted (82), pytorch-operator (35), simple."""
    out = []
    for path in sorted(glob.glob(os.path.join(DATA_DIR, "light", "*.onnx"))):
        name = "test_" + os.path.basename(path)[len("light_"):-len(".onnx")]
        out.append(Case(name, "light", _light_loader(path, name)))
    for kind in MODEL_KINDS[1:]:
        for model_dir in sorted(glob.glob(os.path.join(DATA_DIR, kind, "test_*"))):
            out.append(Case(os.path.basename(model_dir), kind, _folder_loader(model_dir)))
    return out


def run_case(case: Case, backend: Any) -> None:
    """Run a case through `backend` and compare as onnx's runner does (AssertionError on mismatch)."""
    model, data_sets, rtol, atol = case.load()
    rep = backend.prepare(model, "CPU")
    for inputs, expected in data_sets:
        outputs = list(rep.run(inputs))
        assert_similar(expected, outputs, rtol, atol)


def assert_similar(expected: list[Any], outputs: list[Any], rtol: float, atol: float) -> None:
    """onnx's Runner.assert_similar_outputs, with sequences compared element by element.

    onnx's runner recurses into a sequence with bare tensors instead of lists, so it calls len()
    on a 0-d element and raises TypeError (test_loop16_seq_none): compare each element instead.
    """
    assert len(outputs) == len(expected), f"{len(outputs)} outputs, expected {len(expected)}"
    for want, got in zip(expected, outputs):
        if want is None:  # an empty optional
            assert got is None, f"expected an empty optional, got {type(got).__name__}"
        elif isinstance(want, list | tuple):
            assert isinstance(got, list | tuple), f"expected a sequence, got {type(got).__name__}"
            assert len(got) == len(want), f"sequence of {len(got)}, expected {len(want)}"
            for w, g in zip(want, got):
                Runner.assert_similar_outputs([w], [g], rtol=rtol, atol=atol)
        else:
            Runner.assert_similar_outputs([want], [got], rtol=rtol, atol=atol)


def op_types(case: Case) -> set[str]:
    model = case.load()[0]
    return {n.op_type for n in model.graph.node}


def all_cases() -> list[Case]:
    return node_cases() + model_cases()


def as_numpy(value: Any) -> Any:
    return np.asarray(value)
