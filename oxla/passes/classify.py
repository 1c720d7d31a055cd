"""Classify every op a model uses as native / expanded by a function body / unsupported."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from onnx import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto

from oxla.errors import unsupported_ops
from oxla.lowering import schemas, unsupported
from oxla.lowering.interpreter import model_opsets
from oxla.lowering.registry import canonical_domain, lookup

NATIVE = "native"
FUNCTION = "function"          # expanded from the schema's function body
LOCAL = "local-function"       # a FunctionProto shipped in the model
UNSUPPORTED = "unsupported"


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


def _walk(nodes: Iterable[NodeProto], opsets: dict[str, int]) -> Iterator[tuple[NodeProto, dict[str, int]]]:
    for node in nodes:
        yield node, opsets
        for attr in node.attribute:
            graphs: list[GraphProto] = []
            if attr.type == AttributeProto.GRAPH:
                graphs = [attr.g]
            elif attr.type == AttributeProto.GRAPHS:
                graphs = list(attr.graphs)
            for g in graphs:
                yield from _walk(g.node, opsets)


def _schema_body(op_type: str, domain: str, opset: int) -> tuple[bool, FunctionProto | None]:
    """(has a function body, the plain body when it needs no context)."""
    schema = schemas.get_schema(op_type, opset, domain)
    if schema is None or not schemas.has_body(schema):
        return False, None
    if schemas.is_context_dependent(schema):
        return True, None
    body = schemas.plain_body(schema, opset)
    return body is not None, body


def classify(model: ModelProto) -> list[OpUse]:
    """Every op the model uses (graph, subgraphs, local functions and expanded bodies)."""
    local = {(f.domain, f.name): f for f in model.functions}
    top = model_opsets(model.opset_import)
    uses: dict[tuple[str, str, int], list] = {}
    queue: list[tuple[NodeProto, dict[str, int]]] = list(_walk(model.graph.node, top))
    for fn in model.functions:
        queue.extend(_walk(fn.node, {**top, **model_opsets(fn.opset_import)}))
    seen_bodies: set[tuple[str, str, int]] = set()
    while queue:
        node, opsets = queue.pop(0)
        domain = canonical_domain(node.domain)
        if (node.domain, node.op_type) in local:
            key = (domain, node.op_type, opsets.get(domain, 0))
            uses.setdefault(key, [LOCAL, 0, node.name, None])[1] += 1
            continue
        opset = opsets.get(domain, 0)
        key = (domain, node.op_type, opset)
        entry = uses.get(key)
        if entry is None:
            found = lookup(domain, node.op_type, opset) if opset else None
            if found is not None:
                entry = [NATIVE, 0, node.name, found.since]
            else:
                has_body, body = _schema_body(node.op_type, domain, opset) if opset else (False, None)
                entry = [FUNCTION if has_body else UNSUPPORTED, 0, node.name, None]
                if body is not None and key not in seen_bodies:
                    seen_bodies.add(key)
                    queue.extend(_walk(body.node, {**opsets, **model_opsets(body.opset_import)}))
            uses[key] = entry
        entry[1] += 1
    return [OpUse(d, o, v, e[0], e[1], e[2], e[3]) for (d, o, v), e in sorted(uses.items())]


def _reason(use: OpUse) -> str:
    schema = schemas.get_schema(use.op_type, use.opset, use.domain) if use.opset else None
    return (unsupported.reason(use.domain, use.op_type, schema.since_version) or "") if schema else ""


def check_supported(model: ModelProto) -> list[OpUse]:
    """classify(), raising one UnsupportedOpError that lists every gap."""
    uses = classify(model)
    gaps = [(u.domain, u.op_type, u.opset, u.first_node, _reason(u)) for u in uses if u.kind == UNSUPPORTED]
    if gaps:
        raise unsupported_ops(gaps)
    return uses
