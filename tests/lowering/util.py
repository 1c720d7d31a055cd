"""Shared helpers for per-family rule tests: one-node models checked against references."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

import oxla
from oxla.dtypes import to_onnx_type


def node_model(op_type: str, inputs: Mapping[str, np.ndarray | None], outputs: Sequence[str] = ("y",),
               *, opset: int | None = None, domain: str = "", **attrs: Any) -> onnx.ModelProto:
    """A model of one node; inputs given as None are left out (empty name)."""
    names = [n if v is not None else "" for n, v in inputs.items()]
    node = helper.make_node(op_type, names, list(outputs), domain=domain, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, to_onnx_type(v.dtype), v.shape)
                    for n, v in inputs.items() if v is not None]
    graph_outputs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    graph = helper.make_graph([node], f"{op_type}_test", graph_inputs, graph_outputs)
    version = opset or onnx.defs.onnx_opset_version()
    imports = [helper.make_opsetid("", version if domain in ("", "ai.onnx") else 21)]
    if domain not in ("", "ai.onnx"):
        imports.append(helper.make_opsetid(domain, opset or 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def run_oxla(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray | None]) -> list[Any]:
    sess = oxla.InferenceSession(model.SerializeToString())
    return sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray | None]) -> list[Any]:
    return list(ReferenceEvaluator(model).run(None, {k: v for k, v in feeds.items() if v is not None}))


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray | None]) -> list[Any]:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def strings_as_objects(values: Sequence[Any]) -> list[np.ndarray]:
    """Outputs with numpy str arrays (onnx.reference's) turned into object arrays (oxla's, ort's)."""
    out = []
    for v in values:
        v = np.asarray(v)
        out.append(v.astype(object) if v.dtype.kind == "U" else v)
    return out


def assert_close(got: Sequence[Any], want: Sequence[Any], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert len(got) == len(want), f"{len(got)} outputs, want {len(want)}"
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"shape {g.shape}, want {w.shape}"
        assert g.dtype == w.dtype, f"dtype {g.dtype}, want {w.dtype}"
        if w.dtype == object:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=atol)


def check_node(op_type: str, inputs: Mapping[str, np.ndarray | None], outputs: Sequence[str] = ("y",),
               *, opset: int | None = None, domain: str = "", ort: bool = True,
               reference: bool = True, rtol: float = 1e-5, atol: float = 1e-6, **attrs: Any) -> list[Any]:
    """Run a one-node model with oxla and compare with onnx.reference and onnxruntime."""
    model = node_model(op_type, inputs, outputs, opset=opset, domain=domain, **attrs)
    got = run_oxla(model, inputs)
    if reference:
        assert_close(got, run_reference(model, inputs), rtol, atol)
    if ort:
        assert_close(got, run_onnxruntime(model, inputs), rtol, atol)
    return got
