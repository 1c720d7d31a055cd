"""onnx.backend.base.Backend for oxla: what the ONNX conformance runner drives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx
from onnx import ModelProto, NodeProto, helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType

from oxla.dtypes import to_onnx_type
from oxla.errors import InputError
from oxla.load import load_model
from oxla.session import InferenceSession


class OxlaRep(BackendRep):
    """A prepared model: run(inputs) with inputs positional (graph order) or by name.

    Feeds are checked as InferenceSession.run checks them (names, count, dtypes, shapes).
    """

    def __init__(self, session: InferenceSession) -> None:
        self.session = session
        self.compiled = session.compiled

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = self.compiled.input_names
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if not isinstance(inputs, list | tuple):
                raise InputError(f"inputs must be a list of arrays (graph order) or a dict of input "
                                 f"name -> array, got {type(inputs).__name__}; the model's inputs "
                                 f"are {names}")
            inputs = list(inputs)
            if len(inputs) > len(names):
                raise InputError(f"{len(inputs)} inputs given, the model takes {len(names)}: {names}")
            feeds = dict(zip(names, inputs))
        return tuple(self.session.run(None, feeds))


class OxlaBackend(Backend):
    """The oxla backend: prepare / run_model / run_node / supports_device."""

    @classmethod
    def is_compatible(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return True

    @classmethod
    def prepare(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> OxlaRep:
        proto = load_model(model)
        return OxlaRep(InferenceSession(proto, bake_weights=bool(kwargs.get("bake_weights", False))))

    @classmethod
    def run_model(cls, model: ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[Any, Any]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        values = list(inputs.values()) if isinstance(inputs, Mapping) else list(inputs)
        names = list(inputs.keys()) if isinstance(inputs, Mapping) else [n for n in node.input if n]
        graph_inputs = [
            helper.make_tensor_value_info(n, to_onnx_type(np.asarray(v).dtype), np.shape(v))
            for n, v in zip(names, values)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        domain = node.domain or ""
        imports = [helper.make_opsetid("", opset)]
        if domain not in ("", "ai.onnx"):
            imports.append(helper.make_opsetid(domain, 1))
        model = helper.make_model(graph, opset_imports=imports)
        rep = OxlaRep(InferenceSession(load_model(model, check=False)))
        return rep.run(dict(zip(names, values)))

    @classmethod
    def supports_device(cls, device: str) -> bool:
        kind = Device(device).type
        if kind == DeviceType.CPU:
            return True
        if kind == DeviceType.CUDA:
            return any(d.platform == "gpu" for d in jax.devices())
        return False


prepare = OxlaBackend.prepare
run_model = OxlaBackend.run_model
run_node = OxlaBackend.run_node
supports_device = OxlaBackend.supports_device
