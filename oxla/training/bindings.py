"""The training section of a model, checked: each TrainingInfoProto's graphs and bindings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from onnx import GraphProto, ModelProto, TensorProto, TrainingInfoProto, TypeProto, ValueInfoProto

from oxla.dtypes import type_name
from oxla.errors import TrainingError


@dataclass(frozen=True)
class Binding:
    """`key` (an initializer) is assigned the value named `value` (an output)."""

    key: str
    value: str
    where: str   # "training_info[0].update_binding" or "...initialization_binding"

    def describe(self) -> str:
        return f"{self.where} '{self.key}' <- '{self.value}'"


@dataclass(frozen=True)
class Stage:
    """One TrainingInfoProto: an algorithm step and an optional initialization."""

    index: int
    algorithm: GraphProto
    initialization: GraphProto | None
    updates: tuple[Binding, ...]
    inits: tuple[Binding, ...]


@dataclass(frozen=True)
class _TensorType:
    elem_type: int
    dims: tuple[int | None, ...] | None   # None: shape unknown; None dim: symbolic


def _initializer_type(t: TensorProto) -> _TensorType:
    return _TensorType(t.data_type, tuple(int(d) for d in t.dims))


def _declared_type(tp: TypeProto) -> _TensorType | None:
    if tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    dims = None
    if tt.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return _TensorType(tt.elem_type, dims)


def _describe(t: _TensorType) -> str:
    shape = "?" if t.dims is None else str(tuple("?" if d is None else d for d in t.dims))
    return f"{type_name(t.elem_type) if t.elem_type else '?'} {shape}"


def _compatible(want: _TensorType, got: _TensorType) -> bool:
    if want.elem_type and got.elem_type and want.elem_type != got.elem_type:
        return False
    if want.dims is None or got.dims is None:
        return True
    return len(want.dims) == len(got.dims) and all(
        a is None or b is None or a == b for a, b in zip(want.dims, got.dims))


def _initializers(graph: GraphProto) -> dict[str, TensorProto]:
    out = {t.name: t for t in graph.initializer}
    out.update({s.values.name: s.values for s in graph.sparse_initializer})
    return out


def _role(name: str, graphs: Sequence[GraphProto]) -> str:
    """What a non-initializer name is, for error messages."""
    for g in graphs:
        if any(i.name == name for i in g.input):
            return f"an input of graph '{g.name}'"
        for n in g.node:
            if name in n.output:
                return f"computed by node '{n.name or n.op_type}' of graph '{g.name}'"
    return "not defined anywhere in the model"


class _Checker:
    """Validates every binding of a model; raises TrainingError naming the first bad one."""

    def __init__(self, model: ModelProto) -> None:
        self.model = model
        self.inference = _initializers(model.graph)
        self.bound_update: dict[str, str] = {}
        self.owner: dict[str, str] = {name: "the inference graph" for name in self.inference}

    def stage(self, index: int, info: TrainingInfoProto) -> Stage:
        label = f"training_info[{index}]"
        algorithm_inits = _initializers(info.algorithm)
        for name in algorithm_inits:
            if name in self.owner:
                raise TrainingError(f"{label}.algorithm initializer '{name}' is also an "
                                    f"initializer of {self.owner[name]}; names must be unique")
            self.owner[name] = f"{label}.algorithm"
        inits = {**self.inference, **algorithm_inits}
        graphs = [self.model.graph, info.algorithm]
        outputs = {o.name: o for o in [*info.algorithm.output, *self.model.graph.output]}
        updates = self._bindings(f"{label}.update_binding", info.update_binding, inits, outputs,
                                 graphs, "an output of the algorithm graph or of the inference graph")
        for b in updates:
            if b.key in self.bound_update:
                raise TrainingError(f"{b.describe()}: '{b.key}' is already bound by "
                                    f"{self.bound_update[b.key]}; a variable is assigned once")
            self.bound_update[b.key] = b.where
        init_graph = info.initialization if info.HasField("initialization") else None
        init_outputs = {o.name: o for o in init_graph.output} if init_graph else {}
        if init_graph is not None and [i for i in init_graph.input if i.name not in _initializers(init_graph)]:
            raise TrainingError(f"{label}.initialization must have no inputs, it has "
                                f"{[i.name for i in init_graph.input]}")
        init_bindings = self._bindings(f"{label}.initialization_binding", info.initialization_binding,
                                       inits, init_outputs, [*graphs, *([init_graph] if init_graph else [])],
                                       "an output of the initialization graph")
        return Stage(index, info.algorithm, init_graph, updates, init_bindings)

    def _bindings(self, where: str, entries: Iterable, inits: dict[str, TensorProto],
                  outputs: dict[str, ValueInfoProto], graphs: Sequence[GraphProto],
                  value_kind: str) -> tuple[Binding, ...]:
        seen: set[str] = set()
        out = []
        for entry in entries:
            b = Binding(entry.key, entry.value, where)
            if not b.key or not b.value:
                raise TrainingError(f"{b.describe()}: key and value must both be names")
            if b.key in seen:
                raise TrainingError(f"{b.describe()}: '{b.key}' is bound twice in {where}")
            seen.add(b.key)
            if b.key not in inits:
                raise TrainingError(f"{b.describe()}: the key must be an initializer of the "
                                    f"inference graph or of this algorithm graph; '{b.key}' is "
                                    f"{_role(b.key, graphs)}")
            if b.value not in outputs:
                raise TrainingError(f"{b.describe()}: the value must be {value_kind}; "
                                    f"'{b.value}' is {_role(b.value, graphs)}")
            self._check_type(b, _initializer_type(inits[b.key]), outputs[b.value])
            out.append(b)
        return tuple(out)

    @staticmethod
    def _check_type(b: Binding, want: _TensorType, output: ValueInfoProto) -> None:
        got = _declared_type(output.type) if output.HasField("type") else None
        if got is not None and not _compatible(want, got):
            raise TrainingError(f"{b.describe()}: type mismatch, initializer '{b.key}' is "
                                f"{_describe(want)} but '{b.value}' is declared {_describe(got)}")


def parse_training(model: ModelProto) -> list[Stage]:
    """Every TrainingInfoProto of `model`, checked.

    Raises:
        TrainingError: a binding names an unknown or non-initializer key, binds a key twice,
            names a value that is not an output, or disagrees in type or shape.
    """
    checker = _Checker(model)
    return [checker.stage(i, info) for i, info in enumerate(model.training_info)]


def combined_model(model: ModelProto, stage: Stage) -> ModelProto:
    """The inference graph extended by the stage's algorithm graph (inputs, initializers, nodes,
    outputs concatenated in that order), as the IR defines a training step."""
    out = ModelProto()
    out.CopyFrom(model)
    del out.training_info[:]
    g, a = out.graph, stage.algorithm
    g.input.extend(a.input)
    g.initializer.extend(a.initializer)
    g.sparse_initializer.extend(a.sparse_initializer)
    g.node.extend(a.node)
    g.output.extend(a.output)
    g.value_info.extend(a.value_info)
    return out


def standalone_model(model: ModelProto, graph: GraphProto) -> ModelProto:
    """A model whose graph is `graph` (an initialization graph), with the model's opsets."""
    out = ModelProto()
    out.ir_version = model.ir_version
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.graph.CopyFrom(graph)
    return out
