"""ClassifyPass: how every op a model uses runs: native rule, function body, or unsupported.

The result is the dispatch table the interpreter uses: decided once, before any trace. Ops that
only appear inside a context-dependent function body (built from the real input types while
tracing) are resolved the same way the first time they are met.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from onnx import AttributeProto, FunctionProto, ModelProto, NodeProto

from oxla.errors import unsupported_ops
from oxla.graph import canonical_domain, model_opsets, subgraphs
from oxla.lowering import schemas, unsupported
from oxla.lowering.registry import Rule, lookup

NATIVE = "native"
FUNCTION = "function"          # expanded from the schema's function body
LOCAL = "local-function"       # a FunctionProto shipped in the model
UNSUPPORTED = "unsupported"

OpKey = tuple[str, str, int]   # (canonical domain, op_type, opset)


@dataclass(frozen=True, eq=False)
class Dispatch:
    """How one (domain, op, opset) runs."""

    kind: str
    rule: Rule | None = None
    body: FunctionProto | None = None           # plain schema body or model-local function
    context: bool = False                       # schema body built per node and input types
    defaults: Mapping[str, AttributeProto] = field(default_factory=dict)  # schema attr defaults
    reason: str = ""                            # why unsupported


@dataclass(frozen=True)
class OpUse:
    """One (domain, op, opset) the model uses, how oxla runs it, and how often."""

    domain: str
    op_type: str
    opset: int
    kind: str
    count: int
    first_node: str
    rule_since: int | None = None


def resolve(domain: str, op_type: str, opset: int,
            local: Mapping[tuple[str, str], FunctionProto]) -> Dispatch:
    """The dispatch of one op: a model-local function, a native rule, a schema body, or none."""
    fn = local.get((domain, op_type))
    if fn is not None:
        return Dispatch(LOCAL, body=fn)
    found = lookup(domain, op_type, opset) if opset else None
    if found is not None:
        return Dispatch(NATIVE, rule=found)
    schema = schemas.get_schema(op_type, opset, domain) if opset else None
    if schema is not None and schemas.has_body(schema):
        defaults = schemas.attribute_defaults(op_type, opset, domain)
        if schemas.is_context_dependent(schema):
            return Dispatch(FUNCTION, context=True, defaults=defaults)
        body = schemas.plain_body(schema, opset)
        if body is not None:
            return Dispatch(FUNCTION, body=body, defaults=defaults)
    why = (unsupported.reason(domain, op_type, schema.since_version) or "") if schema else ""
    return Dispatch(UNSUPPORTED, reason=why)


class DispatchTable:
    """(domain, op, opset) -> Dispatch, filled by classify(); read by the interpreter."""

    def __init__(self, local: Mapping[tuple[str, str], FunctionProto]) -> None:
        self.local = dict(local)
        self._table: dict[OpKey, Dispatch] = {}
        self._lock = threading.Lock()

    def get(self, domain: str, op_type: str, opset: int) -> Dispatch:
        key = (domain, op_type, opset)
        found = self._table.get(key)
        if found is None:  # an op met only inside a context-dependent body
            found = resolve(domain, op_type, opset, self.local)
            with self._lock:
                found = self._table.setdefault(key, found)
        return found

    def items(self) -> Iterable[tuple[OpKey, Dispatch]]:
        return list(self._table.items())


def _walk(nodes: Iterable[NodeProto], opsets: dict[str, int]) -> Iterator[tuple[NodeProto, dict[str, int]]]:
    for node in nodes:
        yield node, opsets
        for g in subgraphs(node):
            yield from _walk(g.node, opsets)


def _local_functions(model: ModelProto) -> dict[tuple[str, str], FunctionProto]:
    return {(canonical_domain(f.domain), f.name): f for f in model.functions}


def build_dispatch(model: ModelProto) -> tuple[DispatchTable, list[OpUse]]:
    """Every op the model uses (graph, subgraphs, local functions and plain bodies), resolved."""
    table = DispatchTable(_local_functions(model))
    top = model_opsets(model.opset_import)
    queue: list[tuple[NodeProto, dict[str, int]]] = list(_walk(model.graph.node, top))
    for fn in model.functions:
        queue.extend(_walk(fn.node, {**top, **model_opsets(fn.opset_import)}))
    counts: dict[OpKey, list] = {}
    while queue:
        node, opsets = queue.pop(0)
        domain = canonical_domain(node.domain)
        key = (domain, node.op_type, opsets.get(domain, 0))
        if key in counts:
            counts[key][0] += 1
            continue
        found = table.get(*key)
        counts[key] = [1, node.name]
        if found.kind == FUNCTION and found.body is not None:
            queue.extend(_walk(found.body.node, {**opsets, **model_opsets(found.body.opset_import)}))
    uses = [OpUse(d, o, v, table.get(d, o, v).kind, c[0], c[1],
                  r.since if (r := table.get(d, o, v).rule) is not None else None)
            for (d, o, v), c in sorted(counts.items())]
    return table, uses


def classify(model: ModelProto) -> list[OpUse]:
    """Every op the model uses and how oxla runs it."""
    return build_dispatch(model)[1]


def check_supported(model: ModelProto) -> DispatchTable:
    """build_dispatch(), raising one UnsupportedOpError that lists every gap."""
    table, uses = build_dispatch(model)
    gaps = [(u.domain, u.op_type, u.opset, u.first_node, table.get(u.domain, u.op_type, u.opset).reason)
            for u in uses if u.kind == UNSUPPORTED]
    if gaps:
        raise unsupported_ops(gaps)
    return table
