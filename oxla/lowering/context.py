"""What a rule may see: its node, the opset, static values, subgraphs and the compile options."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import GraphProto, NodeProto

from oxla.errors import LoweringError, NodeRef, ShapeError, describe_value
from oxla.lowering.values import Value, is_static

if TYPE_CHECKING:
    from oxla.lowering.interpreter import Interpreter, Scope


@dataclass(frozen=True)
class Options:
    """Compile options that rules may consult."""

    bake_weights: bool = False       # initializers become HLO constants instead of parameters
    training: bool = False           # Dropout and friends in training mode when asked by inputs
    layout_weights: bool = False     # store conv kernels as HWIO (renames those parameters)


class NeedStatic(Exception):
    """A rule needs the concrete value of a traced input: the interpreter breaks the graph here."""

    def __init__(self, node: NodeRef, what: str, value_name: str | None) -> None:
        super().__init__(f"{node.describe()}: {what} must be known at compile time")
        self.node = node
        self.what = what
        self.value_name = value_name


@dataclass
class Context:
    """Passed as `cx` to every rule."""

    node: NodeProto
    ref: NodeRef
    interp: Interpreter
    scope: Scope
    opsets: dict[str, int]
    inputs: Sequence[Value]

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def opset(self) -> int:
        return self.ref.opset

    @property
    def options(self) -> Options:
        return self.interp.options

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    @property
    def graph_nodes(self) -> Sequence[NodeProto]:
        """The nodes of the graph (or function body) this node belongs to, in order."""
        return self.interp.graphs[-1] if self.interp.graphs else (self.node,)

    def output_used(self, index: int) -> bool:
        """Whether the node names output `index` (optional outputs may be left out)."""
        return index < len(self.node.output) and bool(self.node.output[index])

    @staticmethod
    def is_static(value: Value) -> bool:
        return is_static(value)

    def static(self, value: Value, what: str = "input") -> Any:
        """The numpy value of `value`; breaks the graph here when it is only known at run time."""
        if is_static(value):
            return value
        name = next((self.node.input[i] for i, v in enumerate(self.inputs) if v is value), None)
        raise NeedStatic(self.ref, what, name)

    def static_ints(self, value: Value, what: str = "input") -> tuple[int, ...]:
        """A static 0-D or 1-D integer input as a tuple of Python ints."""
        return tuple(int(v) for v in np.asarray(self.static(value, what)).reshape(-1))

    def run_graph(self, graph: GraphProto, inputs: Sequence[Value]) -> list[Value]:
        """Run a subgraph attribute (If/Loop/Scan body) with this node's scope as outer scope."""
        return self.interp.run_graph(graph, inputs, self.scope, self.opsets)

    def fail(self, message: str) -> LoweringError:
        """An error naming this node; the rule raises it."""
        return LoweringError(f"{self.ref.describe()}: {message}")

    def expect_rank(self, name: str, value: Value, rank: int | Sequence[int]) -> None:
        """Raise ShapeError unless `value` has one of the given ranks."""
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if len(value.shape) not in ranks:
            want = " or ".join(str(r) for r in ranks)
            raise ShapeError(
                f"{self.ref.describe()}: input {name} must have rank {want}, got {describe_value(value)}"
            )
