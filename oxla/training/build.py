"""Building blocks for the graphs make_trainable writes: fresh names, the accumulating plan,
value infos and small constants."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import GraphProto, NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper


class Names:
    """Fresh names that collide with nothing in the model."""

    def __init__(self, graph: GraphProto) -> None:
        self.used = {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
        self.used |= {t.name for t in graph.initializer} | {n for node in graph.node for n in node.output}

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}.{k}"
        self.used.add(name)
        return name


@dataclass
class Plan:
    """What the algorithm graph is made of, accumulated while building it."""

    names: Names
    nodes: list[NodeProto] = field(default_factory=list)
    inits: list[TensorProto] = field(default_factory=list)
    inputs: list[ValueInfoProto] = field(default_factory=list)
    outputs: list[ValueInfoProto] = field(default_factory=list)
    value_infos: list[ValueInfoProto] = field(default_factory=list)
    bindings: list[tuple[str, str]] = field(default_factory=list)

    def node(self, op: str, inputs: Sequence[str], base: str, **attrs: Any) -> str:
        """Add a one-output node named after `base`; returns its output name."""
        out = self.names(base)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value: Any, base: str, dtype: Any = None) -> str:
        """Add an initializer holding `value`; returns its name."""
        name = self.names(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name


def value_info(name: str, elem: int, dims: Sequence[int | str | None]) -> ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(dims))


def dims_of(info: ValueInfoProto) -> list[int | str | None]:
    shape = info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]
