"""Walks a graph in order and calls each node's rule; knows nothing about any particular op.

How each op runs (rule, function body, unsupported) comes from the plan's dispatch table; the
interpreter only binds inputs, calls, and binds outputs. It holds no per-call state, so several
threads may trace or run host steps through one interpreter at once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto

from oxla.errors import (
    LoweringError,
    NodeRef,
    OxlaError,
    ResourceError,
    describe_value,
    rule_failure,
    too_large,
    unsupported_ops,
)
from oxla.graph import attribute_value, canonical_domain, initializer_values, model_opsets
from oxla.host import machine_memory
from oxla.lowering import schemas
from oxla.lowering.common import DerivedTables, check_eager
from oxla.lowering.context import Context, NeedStatic, Options, Scope
from oxla.lowering.registry import Rule, known_versions
from oxla.lowering.typecheck import check_input_types
from oxla.lowering.values import Value, is_static, to_static, type_proto
from oxla.lru import LRU
from oxla.passes.classify import FUNCTION, LOCAL, NATIVE, DispatchTable

# Context-dependent function bodies are built per node and input types: keep this many.
BODY_CACHE = 256


class Interpreter:
    """Executes nodes; the executor runs it inside jax.jit (tracing) or eagerly (host steps)."""

    def __init__(self, dispatch: DispatchTable, options: Options | None = None) -> None:
        self.options = options or Options()
        self.memory_limit = self.options.memory_limit or machine_memory()
        self.dispatch = dispatch
        self._bodies: LRU[FunctionProto] = LRU(BODY_CACHE)
        self.ran: set[tuple[str, str, str, int]] = set()  # (kind, domain, op, opset) seen running
        self._local = threading.local()  # the checks of the trace this thread is running
        self.derived_tables = DerivedTables()  # rules' tables from attributes (Context.derived)

    # --- run-time checks ----------------------------------------------------------------------

    def begin_checks(self) -> None:
        """Collect the checks rules make while this thread traces a segment."""
        self._local.checks = []
        self._local.depth = 0

    def end_checks(self) -> list[tuple[Any, Any, str]]:
        checks = getattr(self._local, "checks", None) or []
        self._local.checks = None
        return checks

    def add_check(self, ok: Any, witness: Any, message: str) -> None:
        """A traced condition the segment must report; only at the segment's own trace level
        (a value from inside a loop body or a gradient cannot leave it)."""
        checks = getattr(self._local, "checks", None)
        if checks is not None and getattr(self._local, "depth", 0) == 0:
            checks.append((ok, witness, message))

    def run_nested(self, nodes: Sequence[NodeProto], scope: Scope, opsets: Mapping[str, int],
                   graph: Sequence[NodeProto]) -> None:
        """run_nodes for a rule that traces nodes inside its own JAX transformation."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            self.run_nodes(nodes, scope, opsets, graph)
        finally:
            self._local.depth -= 1

    # --- graphs -------------------------------------------------------------------------------

    def run_graph(self, graph: GraphProto, inputs: Sequence[Value], outer: Scope | None,
                  opsets: Mapping[str, int]) -> list[Value]:
        """Run a (sub)graph with positional inputs; returns its outputs in order."""
        if len(inputs) > len(graph.input):
            raise LoweringError(
                f"graph '{graph.name}' takes {len(graph.input)} inputs, got {len(inputs)}"
            )
        scope = Scope(outer, initializer_values(graph))
        for info, value in zip(graph.input, inputs):
            scope.set(info.name, value)
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            self.run_nodes(graph.node, scope, opsets)
        finally:
            self._local.depth -= 1
        return [_read(scope, o.name, graph.name) for o in graph.output]

    def run_nodes(self, nodes: Sequence[NodeProto], scope: Scope, opsets: Mapping[str, int],
                  graph: Sequence[NodeProto] | None = None) -> None:
        """Run `nodes` in order; `graph` is the node list rules see as their graph (default: nodes)."""
        seen = nodes if graph is None else graph
        for node in nodes:
            self.run_node(node, scope, opsets, seen)

    # --- nodes --------------------------------------------------------------------------------

    def run_node(self, node: NodeProto, scope: Scope, opsets: Mapping[str, int],
                 graph: Sequence[NodeProto] = ()) -> None:
        """Compute a node's outputs and bind them in `scope`."""
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain)
        ref = NodeRef(node.name, node.op_type, domain, opset or 0)
        where = node.name or node.op_type
        inputs = [_read(scope, n, where) for n in node.input]
        found = self.dispatch.get(domain, node.op_type, opset or 0)
        if opset is not None and found.kind != LOCAL:
            check_input_types(ref, inputs)
        if found.kind == LOCAL and found.body is not None:
            outputs = self.call_function(found.body, node, inputs, opsets, ref)
        elif opset is None:
            raise LoweringError(
                f"{ref.describe()}: the model imports no opset for domain '{domain or 'ai.onnx'}'"
            )
        elif found.kind == NATIVE and found.rule is not None:
            self.ran.add((NATIVE, domain, node.op_type, found.rule.since))
            outputs = self.call_rule(found.rule, node, inputs, scope, opsets, ref, graph or (node,))
        elif found.kind == FUNCTION:
            body = found.body or self._context_body(node, domain, opset, inputs)
            if body is None:
                raise self._no_rule(node, domain, opset)
            self.ran.add((FUNCTION, domain, node.op_type, opset))
            outputs = self.call_function(body, node, inputs, opsets, ref, found.defaults)
        else:
            raise self._no_rule(node, domain, opset)
        _bind(node, outputs, scope, ref)

    def host_call(self, node: NodeProto, opsets: Mapping[str, int], graph: Sequence[NodeProto]
                  ) -> Callable[[list[Value], Scope], tuple[Value, ...]] | None:
        """run_node for a node that runs again and again on concrete values (a host step), with
        what does not change between calls done once: the dispatch, the node's attributes.
        The call takes the node's inputs (and the scope its rule sees) and returns its outputs,
        one per name the node lists; it does what run_node does for a rule on static inputs
        (the input type check, the eager-size check, the rule, the output-size check), outside
        a trace. None where the node is not a plain rule (a function body, an unknown op):
        run_node then says what it says."""
        domain = canonical_domain(node.domain)
        opset = opsets.get(domain)
        if opset is None:
            return None
        found = self.dispatch.get(domain, node.op_type, opset)
        rule = found.rule
        if found.kind != NATIVE or rule is None \
                or (len(node.input) > len(rule.inputs) and not rule.variadic):
            return None
        ref = NodeRef(node.name, node.op_type, domain, opset)
        attrs = _rule_attributes(rule, node, ref)
        self.ran.add((NATIVE, domain, node.op_type, rule.since))
        named = len([n for n in node.output if n])

        def call(inputs: list[Value], scope: Scope) -> tuple[Value, ...]:
            check_input_types(ref, inputs)
            cx = Context(node, ref, inputs, opsets, self, scope, graph)
            out = self._apply(rule, cx, attrs, rule.fold, traced=False)
            outputs = out if isinstance(out, tuple) else (out,)
            if len(outputs) < named and len(outputs) < len(node.output):
                raise LoweringError(f"{ref.describe()}: the rule produced {len(outputs)} outputs, "
                                    f"the node names {len(node.output)}")
            return outputs

        return call

    def _no_rule(self, node: NodeProto, domain: str, opset: int) -> OxlaError:
        versions = known_versions(domain, node.op_type)
        if versions:
            return LoweringError(
                f"No lowering for {domain or 'ai.onnx'}::{node.op_type} at opset {opset} "
                f"(node '{node.name}'); known since-versions: {', '.join(map(str, versions))}."
            )
        return unsupported_ops([(domain, node.op_type, opset, node.name)])

    def call_rule(self, found: Rule, node: NodeProto, inputs: list[Value], scope: Scope,
                  opsets: Mapping[str, int], ref: NodeRef, graph: Sequence[NodeProto]) -> Any:
        attrs = _rule_attributes(found, node, ref)
        if len(inputs) > len(found.inputs) and not found.variadic:
            raise LoweringError(
                f"{ref.describe()}: takes at most {len(found.inputs)} inputs, got {len(inputs)}"
            )
        for i, v in enumerate(inputs):
            if v is not None and found.static_position(i) and not is_static(v):
                raise NeedStatic(ref, f"input {found.input_name(i)}", node.input[i])
        cx = Context(node, ref, inputs, opsets, self, scope, graph)
        return self._apply(found, cx, attrs, found.fold and all(is_static(v) for v in inputs),
                           traced=True)

    def _apply(self, found: Rule, cx: Context, attrs: Mapping[str, Any], fold: bool,
               traced: bool) -> Any:
        """The rule on cx's inputs, folded (its output numpy, after the eager-size check; inside
        jax.ensure_compile_time_eval where a trace may be running, `traced`) or not; a failure
        named by the node; the outputs' sizes checked."""
        inputs, ref = list(cx.inputs), cx.ref
        try:
            if fold:
                self._check_fold(cx, found, attrs, inputs)
                if traced:
                    with jax.ensure_compile_time_eval():
                        out = to_static(found.fn(cx, *inputs, **attrs))
                else:
                    out = to_static(found.fn(cx, *inputs, **attrs))
            else:
                out = found.fn(cx, *inputs, **attrs)
        except (NeedStatic, OxlaError):
            raise
        except MemoryError:
            raise ResourceError(f"{ref.describe()}: out of memory computing the node's outputs "
                                f"(inputs: {', '.join(describe_value(v) for v in inputs)})") from None
        except Exception as e:  # any failure inside a rule gets the node's context
            raise rule_failure(ref, inputs, e) from e
        self._check_sizes(ref, out)
        return out

    def _check_fold(self, cx: Context, found: Rule, attrs: Mapping[str, Any], inputs: list[Value]) -> None:
        """Before a rule folds static inputs eagerly: refuse an output over the memory limit
        (evaluated abstractly, only when a cheap bound says it could be over). The abstract
        evaluation traces the rule: its checks must not join the segment being compiled."""
        def abstract(*values: Any) -> Any:  # traced by check_eager only when its bound says so
            checks = getattr(self._local, "checks", None)
            self._local.checks = None
            try:
                return found.fn(cx, *values, **attrs)
            finally:
                self._local.checks = checks

        check_eager(cx, abstract, *inputs)

    def _check_sizes(self, ref: NodeRef, outputs: Any) -> None:
        """Refuse an output larger than the memory limit before anything allocates it."""
        limit = self.memory_limit
        for value in outputs if isinstance(outputs, tuple) else (outputs,):
            for leaf in value if isinstance(value, list) else (value,):
                if type(leaf) is np.ndarray:  # (a host step's output: its dims are ints)
                    if leaf.nbytes > limit:
                        raise too_large(ref.describe(), leaf.shape, leaf.dtype, leaf.nbytes, limit)
                    continue
                shape = getattr(leaf, "shape", None)
                if shape is None or not hasattr(leaf, "dtype") \
                        or not all(isinstance(d, int) for d in shape):  # symbolic (jax.export)
                    continue
                size = math.prod(shape) * np.dtype(leaf.dtype).itemsize
                if size > limit:
                    raise too_large(ref.describe(), shape, np.dtype(leaf.dtype), size, limit)

    # --- functions ----------------------------------------------------------------------------

    def _context_body(self, node: NodeProto, domain: str, opset: int,
                      inputs: Sequence[Value]) -> FunctionProto | None:
        """The body a context-dependent schema builds for this node and these input types."""
        types = tuple(type_proto(v).SerializeToString() for v in inputs)
        data = node.SerializeToString()
        key = (domain, node.op_type, opset, data, types)
        body = self._bodies.get(key)
        if body is None:
            schema = schemas.get_schema(node.op_type, opset, domain)
            built = schemas.context_body(schema, opset, data, list(types))
            if built is None:
                return None
            body = self._bodies.setdefault(key, built)
        return body

    def call_function(self, fn: FunctionProto, node: NodeProto, inputs: Sequence[Value],
                      opsets: Mapping[str, int], ref: NodeRef,
                      schema_defaults: Mapping[str, AttributeProto] | None = None) -> tuple[Value, ...]:
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
        fn_opsets = {**opsets, **model_opsets(fn.opset_import)}
        self.run_nodes([_substitute(n, given, defaults) for n in fn.node], scope, fn_opsets)
        return tuple(_read(scope, o, f"function {fn.name}") for o in fn.output)


def _read(scope: Scope, name: str, where: str) -> Value:
    if not name:
        return None
    try:
        return scope.get(name)
    except KeyError:
        raise LoweringError(f"value '{name}' is used in '{where}' but never defined") from None


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
