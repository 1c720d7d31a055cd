"""`oxla lint --fix`: the safe fixes (node order, unused initializers, node names), saved atomically."""

from __future__ import annotations

import heapq
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onnx import ModelProto

from oxla.host import check_replaceable
from oxla.lint.graph import Body, bodies, node_reads
from oxla.lint.model import check_unused_initializers, training_reads


@dataclass(frozen=True)
class FixReport:
    """What --fix changed: bodies re-sorted, initializers dropped, nodes named."""

    sorted_bodies: tuple[str, ...]
    dropped_initializers: tuple[str, ...]
    named_nodes: int


def apply_fixes(model: ModelProto) -> FixReport:
    """Apply every safe fix to `model` in place.

    Safe: the model computes the same outputs from the same inputs afterwards. Nodes are sorted
    topologically (stable: ready nodes keep their order; a cycle stays as it was), initializers
    nothing reads (and that are not graph inputs) are dropped, empty node names are filled with
    `<OpType>_<n>`, unique across the model.

    Args:
        model: the model, changed in place.

    Returns:
        What changed.
    """
    all_bodies = bodies(model)
    resorted = tuple(b.label for b in all_bodies if _sort(b))
    dropped = []
    for body in all_bodies:
        if body.graph is None:
            continue
        extra = training_reads(model) if body.kind in ("main", "training") else set()
        names = {f.where.tensor for f in check_unused_initializers(body, extra)}
        graph = body.graph
        for i in reversed(range(len(graph.initializer))):  # by index: no copy of the tensors
            if graph.initializer[i].name in names:
                dropped.append(f"{body.label} {graph.initializer[i].name}")
                del graph.initializer[i]
    return FixReport(resorted, tuple(sorted(dropped)), _name_nodes(all_bodies))


def _sort(body: Body) -> bool:
    """Kahn's algorithm, smallest original index first; True when the order changed."""
    nodes = list(body.nodes)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[r] for r in node_reads(n) if r in producer} - {i} for i, n in enumerate(nodes)]
    users: list[list[int]] = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    pending = [len(ds) for ds in deps]
    ready = [i for i, p in enumerate(pending) if p == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, u)
    placed = set(order)
    order += [i for i in range(len(nodes)) if i not in placed]  # a cycle: leave it in place
    if order == list(range(len(nodes))):
        return False
    rank = {id(nodes[i]): r for r, i in enumerate(order)}
    # sort in place: the nodes (and the subgraphs in their attributes) are not copied
    body.nodes.sort(key=lambda n: rank[id(n)])
    return True


def _name_nodes(all_bodies: list[Body]) -> int:
    taken = {n.name for b in all_bodies for n in b.nodes if n.name}
    count = 0
    for body in all_bodies:
        for node in body.nodes:
            if node.name:
                continue
            n = 0
            while f"{node.op_type}_{n}" in taken:
                n += 1
            node.name = f"{node.op_type}_{n}"
            taken.add(node.name)
            count += 1
    return count


def save_atomically(model: ModelProto, path: str | os.PathLike[str]) -> None:
    """Write the model to `path` through a temp file in the same folder, fsync, rename.

    A crash leaves either the old file or the new one, never half of one.
    """
    target = Path(path)
    check_replaceable(target)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)
