"""Walk a model's graphs for lint: every body (graph, subgraph, function, training graph) in scope."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from onnx import AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto

STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training",
                              "ai.onnx.preview"})


def canonical(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


@dataclass(frozen=True)
class Body:
    """A list of nodes with its scope: a graph, a subgraph, a function or a training graph.

    `container` is the proto whose `node` field holds the nodes (GraphProto or FunctionProto),
    so fixes can rewrite it in place.
    """

    label: str
    container: GraphProto | FunctionProto
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    initializers: tuple[str, ...]
    outer: frozenset[str] = frozenset()
    opsets: Mapping[str, int] = field(default_factory=dict)
    kind: str = "graph"  # main, graph (a subgraph), function, training

    @property
    def nodes(self) -> Any:
        return self.container.node

    @property
    def graph(self) -> GraphProto | None:
        return self.container if isinstance(self.container, GraphProto) else None


def node_label(node: NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def subgraphs(node: NodeProto) -> Iterator[tuple[str, GraphProto]]:
    """(attribute name, graph) for each graph-valued attribute of a node."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            for g in attr.graphs:
                yield attr.name, g


def graph_defines(graph: GraphProto) -> set[str]:
    """Every name a graph defines: inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names |= {s.values.name for s in graph.sparse_initializer}
    return names | {o for n in graph.node for o in n.output if o}


def free_names(graph: GraphProto) -> set[str]:
    """Names a graph (or its subgraphs) reads from enclosing scopes."""
    reads: set[str] = set()
    for node in graph.node:
        reads |= node_reads(node)
    return reads - graph_defines(graph)


def node_reads(node: NodeProto) -> set[str]:
    """A node's inputs plus what its subgraphs read from outside themselves."""
    reads = {i for i in node.input if i}
    for _, g in subgraphs(node):
        reads |= free_names(g)
    return reads


def _opsets(imports: Any, base: Mapping[str, int] | None = None) -> dict[str, int]:
    out = dict(base or {})
    out.update({canonical(o.domain): o.version for o in imports})
    return out


def _graph_body(graph: GraphProto, label: str, outer: frozenset[str], opsets: Mapping[str, int],
                kind: str) -> Body:
    inits = tuple(t.name for t in graph.initializer) + tuple(
        s.values.name for s in graph.sparse_initializer)
    return Body(label, graph, tuple(i.name for i in graph.input),
                tuple(o.name for o in graph.output), inits, outer, opsets, kind)


def _with_subgraphs(body: Body) -> Iterator[Body]:
    yield body
    scope = body.outer | set(body.inputs) | set(body.initializers)
    scope |= {o for n in body.nodes for o in n.output if o}
    for index, node in enumerate(body.nodes):
        for attr, g in subgraphs(node):
            label = f"{body.label}/{node_label(node, index)}.{attr}"
            yield from _with_subgraphs(_graph_body(g, label, frozenset(scope), body.opsets, "graph"))


def bodies(model: ModelProto) -> list[Body]:
    """Every body of the model: main graph, subgraphs, local functions, training graphs."""
    top = _opsets(model.opset_import)
    main = _graph_body(model.graph, "main", frozenset(), top, "main")
    out = list(_with_subgraphs(main))
    for fn in model.functions:
        label = f"function {fn.domain}::{fn.name}"
        body = Body(label, fn, tuple(fn.input), tuple(fn.output), (), frozenset(),
                    _opsets(fn.opset_import, top), "function")
        out.extend(_with_subgraphs(body))
    main_names = frozenset(graph_defines(model.graph))
    for i, info in enumerate(model.training_info):
        # the algorithm extends the inference graph; initialization sees only the initializers
        inits = frozenset(t.name for t in model.graph.initializer)
        for name, g, outer in (("initialization", info.initialization, inits),
                               ("algorithm", info.algorithm, main_names)):
            if g.node or g.output:
                out.extend(_with_subgraphs(_graph_body(g, f"training_info[{i}].{name}", outer,
                                                       top, "training")))
    return out


def all_nodes(model: ModelProto) -> Iterator[tuple[Body, int, NodeProto]]:
    """(body, index, node) for every node of every body."""
    for body in bodies(model):
        for index, node in enumerate(body.nodes):
            yield body, index, node
