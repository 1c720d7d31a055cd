"""StaticInitializerPass: which initializers must be compile-time constants.

Derived from the inputs rules declare static (`@rule(..., static=(...))`): every value that
reaches such an input is followed back through the nodes that compute it; when it comes from
initializers only, those initializers are constants. Shape and Size read only the shape of their
input (always known while tracing), so the walk stops there. A value that also depends on a graph
input is data-dependent: the graph breaks there at run time, and no initializer is promoted for
it. Function bodies and subgraphs are followed too: a body's static inputs map to the node's.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnx import GraphProto, NodeProto

from oxla.graph import (
    canonical_domain,
    graph_free_names,
    model_opsets,
    node_reads,
    producers,
    subgraphs,
)
from oxla.passes.classify import NATIVE, DispatchTable

SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})

Demand = tuple[frozenset[str], bool]  # (names it comes from that no node here computes, foldable)


class _Analysis:
    def __init__(self, table: DispatchTable) -> None:
        self.table = table
        self.bodies: dict[tuple[str, str, int], frozenset[int]] = {}

    def slots(self, node: NodeProto, opsets: dict[str, int]) -> set[str]:
        """Names this node needs static: declared static inputs, and what its subgraphs need."""
        domain = canonical_domain(node.domain)
        key = (domain, node.op_type, opsets.get(domain, 0))
        found = self.table.get(*key)
        wanted: set[str] = set()
        if found.kind == NATIVE and found.rule is not None:
            rule = found.rule
            wanted |= {n for i, n in enumerate(node.input) if n and rule.static_position(i)}
        elif found.body is not None:
            positions = self.body_positions(key, found.body, opsets)
            wanted |= {node.input[i] for i in positions if i < len(node.input) and node.input[i]}
        for g in subgraphs(node):
            wanted |= self.free_demands(g, opsets)
        return wanted

    def body_positions(self, key: tuple[str, str, int], body: object, opsets: dict[str, int]) -> frozenset[int]:
        """Formal input positions of a function body that must be static."""
        if key in self.bodies:
            return self.bodies[key]
        self.bodies[key] = frozenset()  # no recursion in ONNX functions; guards a malformed model
        fn_opsets = {**opsets, **model_opsets(body.opset_import)}  # type: ignore[attr-defined]
        formals = list(body.input)  # type: ignore[attr-defined]
        needed: set[str] = set()
        for leaves, ok in self.demands(list(body.node), fn_opsets):  # type: ignore[attr-defined]
            if ok:
                needed |= leaves
        self.bodies[key] = frozenset(i for i, f in enumerate(formals) if f in needed)
        return self.bodies[key]

    def free_demands(self, graph: GraphProto, opsets: dict[str, int]) -> set[str]:
        """Outer names a subgraph needs static."""
        free = graph_free_names(graph)
        out: set[str] = set()
        for leaves, ok in self.demands(list(graph.node), opsets):
            if ok:
                out |= leaves & free
        return out

    def demands(self, nodes: Sequence[NodeProto], opsets: dict[str, int]) -> list[Demand]:
        """For each static need in `nodes`: the names it derives from that no node here computes."""
        made = producers(nodes)
        roots: list[str] = []
        for node in nodes:
            roots.extend(sorted(self.slots(node, opsets)))
        return [self.closure(root, nodes, made, opsets) for root in roots]

    def closure(self, root: str, nodes: Sequence[NodeProto], made: dict[str, int],
                opsets: dict[str, int]) -> Demand:
        leaves: set[str] = set()
        ok = True
        stack, seen = [root], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            index = made.get(name)
            if index is None:
                leaves.add(name)
                continue
            node = nodes[index]
            if node.op_type in SHAPE_ONLY_OPS and canonical_domain(node.domain) == "":
                continue
            domain = canonical_domain(node.domain)
            rule = self.table.get(domain, node.op_type, opsets.get(domain, 0)).rule
            if rule is not None and not rule.fold:  # random ops never fold to a constant
                ok = False
            stack.extend(node_reads(node))
        return frozenset(leaves), ok


def required_static(nodes: Sequence[NodeProto], opsets: dict[str, int], table: DispatchTable,
                    initializers: set[str], data: set[str]) -> frozenset[str]:
    """Initializers that must be constants: every static need they feed comes from no data.

    Args:
        nodes: the main graph's nodes.
        opsets: the model's opset imports.
        table: the dispatch table (which rule or body each op runs).
        initializers: the graph's initializer names.
        data: names whose values come from feeds (graph inputs that are not initializers, and
            initializers a caller may override with a feed).
    """
    out: set[str] = set()
    for leaves, ok in _Analysis(table).demands(nodes, opsets):
        if ok and not (leaves & data):
            out |= leaves & initializers
    return frozenset(out)
