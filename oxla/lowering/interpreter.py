"""Walks a graph in order and calls each node's rule; knows nothing about any particular op."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, numpy_helper

from oxla.errors import (
    LoweringError,
    NodeRef,
    OxlaError,
    rule_failure,
    unsupported_ops,
)
from oxla.lowering import schemas
from oxla.lowering.context import Context, NeedStatic, Options
from oxla.lowering.registry import Rule, canonical_domain, known_versions, lookup
from oxla.lowering.values import Value, is_static, to_static, type_proto


class Scope:
    """Name -> value, with the enclosing graph's scope as parent (subgraphs see outer values)."""

    def __init__(self, parent: Scope | None = None) -> None:
        self.values: dict[str, Value] = {}
        self.parent = parent

    def get(self, name: str) -> Value:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        raise KeyError(name)

    def __contains__(self, name: str) -> bool:
        try:
            self.get(name)
        except KeyError:
            return False
        return True

    def set(self, name: str, value: Value) -> None:
        self.values[name] = value


def attribute_value(attr: AttributeProto) -> Any:
    """An AttributeProto as a Python value: float, int, str, numpy array, graph, or a tuple."""
    t = attr.type
    A = AttributeProto
    if t == A.FLOAT:
        return float(attr.f)
    if t == A.INT:
        return int(attr.i)
    if t == A.STRING:
        return attr.s.decode("utf-8", errors="surrogateescape")
    if t == A.TENSOR:
        return numpy_helper.to_array(attr.t)
    if t == A.GRAPH:
        return attr.g
    if t == A.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor)
    if t == A.TYPE_PROTO:
        return attr.tp
    if t == A.FLOATS:
        return tuple(float(v) for v in attr.floats)
    if t == A.INTS:
        return tuple(int(v) for v in attr.ints)
    if t == A.STRINGS:
        return tuple(s.decode("utf-8", errors="surrogateescape") for s in attr.strings)
    if t == A.TENSORS:
        return tuple(numpy_helper.to_array(v) for v in attr.tensors)
    if t == A.GRAPHS:
        return tuple(attr.graphs)
    if t == A.TYPE_PROTOS:
        return tuple(attr.type_protos)
    raise LoweringError(f"attribute '{attr.name}' has unknown type {t}")


def _sparse_to_dense(sparse: onnx.SparseTensorProto) -> Any:
    import numpy as np

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(sparse.dims)
    dense = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        dense.reshape(-1)[indices] = values
    else:
        dense[tuple(indices.T)] = values
    return dense


def initializer_values(graph: GraphProto) -> dict[str, Any]:
    """A graph's initializers (dense and sparse) as numpy arrays."""
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for sparse in graph.sparse_initializer:
        values[sparse.values.name] = _sparse_to_dense(sparse)
    return values


def graph_free_names(graph: GraphProto) -> set[str]:
    """Names a graph reads from its enclosing scopes (used by nodes, defined nowhere inside)."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    free: set[str] = set()
    for node in graph.node:
        free |= {n for n in node_reads(node) if n not in defined}
        defined |= set(node.output)
    free |= {o.name for o in graph.output if o.name not in defined}
    return free


def node_reads(node: NodeProto) -> set[str]:
    """Every name a node reads: its inputs and the free names of its subgraphs."""
    reads = {n for n in node.input if n}
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            reads |= graph_free_names(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            for g in attr.graphs:
                reads |= graph_free_names(g)
    return reads


def model_opsets(opset_import: Iterable[onnx.OperatorSetIdProto]) -> dict[str, int]:
    return {canonical_domain(o.domain): int(o.version) for o in opset_import}


class Interpreter:
    """Executes nodes; the compile step runs it inside jax.jit (tracing) or eagerly (host steps)."""

    def __init__(self, model: ModelProto, options: Options | None = None) -> None:
        self.options = options or Options()
        self.opsets = model_opsets(model.opset_import)
        self.functions: dict[tuple[str, str], FunctionProto] = {
            (f.domain, f.name): f for f in model.functions
        }
        self._bodies: dict[Any, FunctionProto | None] = {}
        self.expanded: dict[tuple[str, str, int], int] = {}
        self.native: dict[tuple[str, str, int], int] = {}
        self.graphs: list[Sequence[NodeProto]] = []

    # --- graphs -------------------------------------------------------------------------------

    def run_graph(self, graph: GraphProto, inputs: Sequence[Value], outer: Scope | None,
                  opsets: dict[str, int]) -> list[Value]:
        """Run a (sub)graph with positional inputs; returns its outputs in order."""
        scope = Scope(outer)
        for name, value in initializer_values(graph).items():
            scope.set(name, value)
        if len(inputs) > len(graph.input):
            raise LoweringError(
                f"graph '{graph.name}' takes {len(graph.input)} inputs, got {len(inputs)}"
            )
        for info, value in zip(graph.input, inputs):
            scope.set(info.name, value)
        self.run_nodes(graph.node, scope, opsets)
        return [self._read(scope, o.name, graph.name) for o in graph.output]

    def run_nodes(self, nodes: Sequence[NodeProto], scope: Scope, opsets: dict[str, int]) -> None:
        with self.in_graph(nodes):
            for node in nodes:
                self.run_node(node, scope, opsets)

    @contextlib.contextmanager
    def in_graph(self, nodes: Sequence[NodeProto]) -> Iterator[None]:
        """Make `nodes` the graph rules see as `cx.graph_nodes` (Gradient needs its graph)."""
        self.graphs.append(nodes)
        try:
            yield
        finally:
            self.graphs.pop()

    @staticmethod
    def _read(scope: Scope, name: str, where: str) -> Value:
        if not name:
            return None
        try:
            return scope.get(name)
        except KeyError:
            raise LoweringError(f"value '{name}' is used in '{where}' but never defined") from None

    # --- nodes --------------------------------------------------------------------------------

    def run_node(self, node: NodeProto, scope: Scope, opsets: dict[str, int]) -> None:
        """Compute a node's outputs and bind them in `scope`."""
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain)
        ref = NodeRef(node.name, node.op_type, domain, opset or 0)
        where = node.name or node.op_type
        inputs = [self._read(scope, n, where) for n in node.input]
        local = self.functions.get((node.domain, node.op_type))
        if local is not None:
            outputs = self.call_function(local, node, inputs, opsets, ref)
        elif opset is None:
            raise LoweringError(
                f"{ref.describe()}: the model imports no opset for domain '{domain or 'ai.onnx'}'"
            )
        else:
            found = lookup(domain, node.op_type, opset)
            if found is not None:
                self.native[(domain, node.op_type, opset)] = found.since
                outputs = self.call_rule(found, node, inputs, scope, opsets, ref)
            else:
                body = self.schema_function(node, domain, opset, inputs)
                if body is None:
                    raise self._no_rule(node, domain, opset)
                self.expanded[(domain, node.op_type, opset)] = 1
                defaults = schemas.attribute_defaults(node.op_type, opset, domain)
                outputs = self.call_function(body, node, inputs, opsets, ref, defaults)
        self._bind(node, outputs, scope, ref)

    def _no_rule(self, node: NodeProto, domain: str, opset: int) -> OxlaError:
        versions = known_versions(domain, node.op_type)
        if versions:
            return LoweringError(
                f"No lowering for {domain or 'ai.onnx'}::{node.op_type} at opset {opset} "
                f"(node '{node.name}'); known since-versions: {', '.join(map(str, versions))}."
            )
        return unsupported_ops([(domain, node.op_type, opset, node.name)])

    @staticmethod
    def _bind(node: NodeProto, outputs: Any, scope: Scope, ref: NodeRef) -> None:
        if not isinstance(outputs, tuple):
            outputs = (outputs,)
        names = list(node.output)
        if len(outputs) < len([n for n in names if n]) and len(outputs) < len(names):
            raise LoweringError(
                f"{ref.describe()}: the rule produced {len(outputs)} outputs, the node names "
                f"{len(names)}"
            )
        for name, value in zip(names, outputs):
            if name:
                scope.set(name, value)

    def call_rule(self, found: Rule, node: NodeProto, inputs: list[Value], scope: Scope,
                  opsets: dict[str, int], ref: NodeRef) -> Any:
        attrs = self._rule_attributes(found, node, ref)
        if len(inputs) > len(found.inputs) and not found.variadic:
            raise LoweringError(
                f"{ref.describe()}: takes at most {len(found.inputs)} inputs, got {len(inputs)}"
            )
        for i, v in enumerate(inputs):
            if v is not None and found.static_position(i) and not is_static(v):
                raise NeedStatic(ref, f"input {found.input_name(i)}", node.input[i])
        cx = Context(node, ref, self, scope, opsets, inputs)
        try:
            if found.fold and all(is_static(v) for v in inputs):
                with jax.ensure_compile_time_eval():
                    return to_static(found.fn(cx, *inputs, **attrs))
            return found.fn(cx, *inputs, **attrs)
        except (NeedStatic, OxlaError):
            raise
        except Exception as e:  # any failure inside a rule gets the node's context
            raise rule_failure(ref, inputs, e) from e

    @staticmethod
    def _rule_attributes(found: Rule, node: NodeProto, ref: NodeRef) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        for attr in node.attribute:
            if attr.name not in found.attrs:
                raise LoweringError(
                    f"{ref.describe()}: unknown attribute '{attr.name}' "
                    f"(the op takes: {', '.join(found.attrs) or 'none'})"
                )
            if attr.ref_attr_name:
                raise LoweringError(
                    f"{ref.describe()}: attribute '{attr.name}' refers to '{attr.ref_attr_name}' "
                    "outside a function body"
                )
            attrs[attr.name] = attribute_value(attr)
        return attrs

    # --- functions ----------------------------------------------------------------------------

    def schema_function(self, node: NodeProto, domain: str, opset: int,
                        inputs: Sequence[Value]) -> FunctionProto | None:
        """The schema's function body for this node (plain or context-dependent), or None."""
        schema = schemas.get_schema(node.op_type, opset, domain)
        if schema is None or not schemas.has_body(schema):
            return None
        if schemas.is_context_dependent(schema):
            types = tuple(type_proto(v).SerializeToString() for v in inputs)
            key: Any = ("cd", domain, node.op_type, opset, node.SerializeToString(), types)
            if key not in self._bodies:
                self._bodies[key] = schemas.context_body(schema, opset, node.SerializeToString(),
                                                         list(types))
            return self._bodies[key]
        key = ("fn", domain, node.op_type, opset)
        if key not in self._bodies:
            self._bodies[key] = schemas.plain_body(schema, opset)
        return self._bodies[key]

    def call_function(self, fn: FunctionProto, node: NodeProto, inputs: Sequence[Value],
                      opsets: dict[str, int], ref: NodeRef,
                      schema_defaults: dict[str, AttributeProto] | None = None) -> tuple[Value, ...]:
        """Run a function body: formal inputs bound to the node's inputs, attributes substituted.

        Defaults come from the FunctionProto (model-local functions) or, for schema bodies, from
        the OpSchema's attribute defaults, which the generated bodies do not carry.
        """
        scope = Scope(None)
        for i, formal in enumerate(fn.input):
            scope.set(formal, inputs[i] if i < len(inputs) else None)
        given = {a.name: a for a in node.attribute}
        defaults = dict(schema_defaults or {})
        defaults.update({a.name: a for a in fn.attribute_proto})
        fn_opsets = dict(opsets)
        fn_opsets.update(model_opsets(fn.opset_import))
        self.run_nodes([_substitute(n, given, defaults) for n in fn.node], scope, fn_opsets)
        return tuple(self._read(scope, o, f"function {fn.name}") for o in fn.output)


def _substitute(node: NodeProto, given: dict[str, AttributeProto],
                defaults: dict[str, AttributeProto]) -> NodeProto:
    """A body node with attribute references replaced by the caller's values (or defaults)."""
    if not any(a.ref_attr_name for a in node.attribute):
        return node
    out = NodeProto()
    out.CopyFrom(node)
    del out.attribute[:]
    for attr in node.attribute:
        if not attr.ref_attr_name:
            out.attribute.append(attr)
            continue
        source = given.get(attr.ref_attr_name) or defaults.get(attr.ref_attr_name)
        if source is None:
            continue
        new = AttributeProto()
        new.CopyFrom(source)
        new.name = attr.name
        out.attribute.append(new)
    return out
