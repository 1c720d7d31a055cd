"""Model hygiene: node names and order, unused and unproduced values, types, training bindings."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import ModelProto, TypeProto

from oxla.lint.graph import Body, bodies, free_names, node_label, node_reads
from oxla.lint.ops import check_constants, check_external_data, check_ops, check_opsets
from oxla.lint.rules import Finding, Where, finding


@dataclass(frozen=True)
class LintOptions:
    """Thresholds: a Constant tensor larger than this many bytes is a `large-constant`."""

    large_constant_bytes: int = 64 * 1024


def lint_model(model: ModelProto, *, base_dir: str | os.PathLike[str] | None = None,
               options: LintOptions | None = None) -> list[Finding]:
    """Every model finding: hygiene, opsets and ops, custom-op and local-function conventions.

    Args:
        model: the model, loaded without its external data (onnx.load(..., load_external_data=False)).
        base_dir: the model's folder, for checking external data; None skips that check.
        options: thresholds.

    Returns:
        The findings, in the order the rules ran.
    """
    options = options or LintOptions()
    all_bodies = bodies(model)
    out: list[Finding] = []
    for body in all_bodies:
        out += check_node_names(body) + check_order(body) + check_outputs(body)
        if body.graph is not None:
            extra = training_reads(model) if body.kind in ("main", "training") else set()
            out += check_unused_initializers(body, extra)
    out += check_inputs(model) + check_value_info(model) + check_training(model)
    out += check_opsets(model, all_bodies) + check_ops(model, all_bodies)
    out += check_constants(all_bodies, options.large_constant_bytes)
    if base_dir is not None:
        out += check_external_data(all_bodies, Path(base_dir))
    return out


def check_node_names(body: Body) -> list[Finding]:
    """empty-node-name and duplicate-node-name."""
    out = []
    counts = Counter(n.name for n in body.nodes if n.name)
    for index, node in enumerate(body.nodes):
        where = Where(body.label, node_label(node, index), node.op_type)
        if not node.name:
            out.append(finding("empty-node-name", where, f"{node.op_type} node #{index} has no name",
                               f"{body.label} #{index}"))
    for name, count in sorted(counts.items()):
        if count > 1:
            out.append(finding("duplicate-node-name", Where(body.label, name),
                               f"{count} nodes are named '{name}'", f"{body.label} {name}"))
    return out


def check_order(body: Body) -> list[Finding]:
    """topological-order (a read of a later node's output) and undefined-value."""
    out = []
    available = set(body.outer) | set(body.inputs) | set(body.initializers)
    producer = {o: i for i, n in enumerate(body.nodes) for o in n.output if o}
    for index, node in enumerate(body.nodes):
        where = Where(body.label, node_label(node, index), node.op_type)
        reads = node_reads(node) - available
        late = sorted(n for n in reads if n in producer)
        if late:
            out.append(finding("topological-order", where, f"reads {late} before node "
                               f"#{producer[late[0]]} produces it", f"{body.label} {where.node}"))
        for name in sorted(reads - set(producer)):
            out.append(finding("undefined-value", Where(body.label, where.node, node.op_type, name),
                               f"reads '{name}', which nothing defines", f"{body.label} {name}"))
        available |= {o for o in node.output if o}
    return out


def check_outputs(body: Body) -> list[Finding]:
    """output-not-produced: an output no node, input, initializer or enclosing scope defines."""
    defined = set(body.outer) | set(body.inputs) | set(body.initializers)
    defined |= {o for n in body.nodes for o in n.output if o}
    return [finding("output-not-produced", Where(body.label, tensor=name),
                    f"output '{name}' is never produced", f"{body.label} {name}")
            for name in body.outputs if name and name not in defined]


def training_reads(model: ModelProto) -> set[str]:
    """Main-graph names the training section uses: graph reads and binding keys."""
    used: set[str] = set()
    for info in model.training_info:
        used |= free_names(info.initialization) | free_names(info.algorithm)
        used |= {b.key for b in info.initialization_binding} | {b.key for b in info.update_binding}
    return used


def _reads(body: Body) -> set[str]:
    used = set(body.outputs)
    for node in body.nodes:
        used |= node_reads(node)
    return used


def check_unused_initializers(body: Body, extra: set[str]) -> list[Finding]:
    """unused-initializer, for initializers that are not also graph inputs (those are inputs)."""
    used = _reads(body) | extra
    inputs = set(body.inputs)
    return [finding("unused-initializer", Where(body.label, tensor=name),
                    f"initializer '{name}' is never read", f"{body.label} {name}")
            for name in body.initializers if name not in used and name not in inputs]


def check_inputs(model: ModelProto) -> list[Finding]:
    """unused-input and initializer-as-input (main graph)."""
    graph = model.graph
    used = set(o.name for o in graph.output) | training_reads(model)
    for node in graph.node:
        used |= node_reads(node)
    inits = {t.name for t in graph.initializer}
    out = []
    for info in graph.input:
        where = Where("main", tensor=info.name)
        if info.name not in used:
            out.append(finding("unused-input", where, f"input '{info.name}' is never read",
                               f"main {info.name}"))
        if info.name in inits:
            out.append(finding("initializer-as-input", where, f"initializer '{info.name}' is also "
                               "a graph input", f"main {info.name}"))
    return out


def check_value_info(model: ModelProto) -> list[Finding]:
    """shape-inference-error and value-info-mismatch (declared types against onnx inference)."""
    graph = model.graph
    probe = ModelProto()
    probe.CopyFrom(model)
    del probe.graph.value_info[:]  # inferred from the inputs alone, then compared
    for o in probe.graph.output:
        o.ClearField("type")
    out = []
    try:
        onnx.shape_inference.infer_shapes(probe, check_type=True, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
        out.append(finding("shape-inference-error", Where("main"), "onnx shape inference fails: "
                           + " | ".join(lines[:5]), "main"))
    declared = {v.name: v.type for v in [*graph.value_info, *graph.output] if v.type.WhichOneof("value")}
    if not declared:
        return out
    try:
        inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return out  # the strict run above has reported why
    got = {v.name: v.type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for name, tp in declared.items():
        why = contradiction(tp, got[name]) if name in got else None
        if why:
            out.append(finding("value-info-mismatch", Where("main", tensor=name),
                               f"'{name}': {why}", f"main {name}"))
    return out


def contradiction(declared: TypeProto, inferred: TypeProto) -> str | None:
    """Why two types cannot both hold (element type, rank, a fixed dim), or None."""
    kind, other = declared.WhichOneof("value"), inferred.WhichOneof("value")
    if not kind or not other:
        return None
    if kind != other:
        return f"declared a {kind}, inferred a {other}"
    if kind in ("sequence_type", "optional_type"):
        return contradiction(getattr(declared, kind).elem_type, getattr(inferred, kind).elem_type)
    if kind != "tensor_type":
        return None
    d, i = declared.tensor_type, inferred.tensor_type
    if d.elem_type and i.elem_type and d.elem_type != i.elem_type:
        names = onnx.TensorProto.DataType.Name
        return f"declared element type {names(d.elem_type)}, inferred {names(i.elem_type)}"
    if not (d.HasField("shape") and i.HasField("shape")):
        return None
    if len(d.shape.dim) != len(i.shape.dim):
        return f"declared rank {len(d.shape.dim)}, inferred rank {len(i.shape.dim)}"
    for axis, (a, b) in enumerate(zip(d.shape.dim, i.shape.dim)):
        if a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value:
            return f"declared dim {axis} = {a.dim_value}, inferred {b.dim_value}"
    return None


def check_training(model: ModelProto) -> list[Finding]:
    """training-binding-unknown: keys name initializers, values outputs (onnx.proto's rules)."""
    main_inits = {t.name for t in model.graph.initializer}
    main_outputs = {o.name for o in model.graph.output}
    out = []
    for i, info in enumerate(model.training_info):
        # keys: ModelProto.graph.initializer or this algorithm's initializers (optimizer state)
        inits = main_inits | {t.name for t in info.algorithm.initializer}
        for kind, bindings, produced in (
                ("initialization_binding", info.initialization_binding,
                 {o.name for o in info.initialization.output}),
                ("update_binding", info.update_binding,
                 {o.name for o in info.algorithm.output} | main_outputs)):
            label = f"training_info[{i}].{kind}"
            for b in bindings:
                if b.key not in inits:
                    out.append(finding("training-binding-unknown", Where(label, tensor=b.key),
                                       f"binds '{b.key}', which is no initializer of the model "
                                       "or of the algorithm", f"{label} {b.key}"))
                if b.value not in produced:
                    out.append(finding("training-binding-unknown", Where(label, tensor=b.value),
                                       f"binds '{b.key}' to '{b.value}', which the graph does not "
                                       "output", f"{label} {b.key}={b.value}"))
    return out
