"""Lint a model's operators: opset imports, unknown and deprecated ops, custom ops, tensors."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import onnx
import onnx.defs
from onnx import AttributeProto, FunctionProto, ModelProto, NodeProto, TensorProto

from oxla.lint.conventions import Attr, OpSignature, Param, check_domain, check_signature
from oxla.lint.graph import STANDARD_DOMAINS, Body, canonical, node_label
from oxla.lint.rules import Finding, Where, finding

# onnxruntime supports the default domain from opset 7 on.
OLDEST_SUPPORTED_OPSET = 7


def check_opsets(model: ModelProto, bodies: Sequence[Body]) -> list[Finding]:
    """opset-import-missing, opset-import-unused and deprecated-opset."""
    out = []
    used: set[str] = set()
    for body in bodies:
        for index, node in enumerate(body.nodes):
            domain = canonical(node.domain)
            used.add(domain)
            if domain not in body.opsets:
                where = Where(body.label, node_label(node, index), f"{domain or 'ai.onnx'}::{node.op_type}")
                out.append(finding("opset-import-missing", where, f"domain '{domain or 'ai.onnx'}' "
                                   "is not in opset_import", f"{body.label} {domain}"))
    for o in model.opset_import:
        if canonical(o.domain) not in used:
            out.append(finding("opset-import-unused", Where("main"), f"domain "
                               f"'{o.domain or 'ai.onnx'}' v{o.version} is imported but no node "
                               "uses it", f"main {canonical(o.domain)}"))
    top = {canonical(o.domain): o.version for o in model.opset_import}
    if "" in top and top[""] < OLDEST_SUPPORTED_OPSET:
        out.append(finding("deprecated-opset", Where("main"), f"default-domain opset {top['']} "
                           f"is older than {OLDEST_SUPPORTED_OPSET}", "main opset"))
    return out


def check_ops(model: ModelProto, bodies: Sequence[Body]) -> list[Finding]:
    """unknown-op and deprecated-op in ONNX domains; conventions on custom ops and local functions."""
    local = {(f.domain, f.name) for f in model.functions}
    out: list[Finding] = []
    custom: dict[str, Finding] = {}  # a custom op used by many nodes is reported once
    custom_domains: set[str] = set()
    for body in bodies:
        for index, node in enumerate(body.nodes):
            domain = canonical(node.domain)
            if (node.domain, node.op_type) in local or domain not in body.opsets:
                continue
            if domain in STANDARD_DOMAINS:
                out += _standard_op(body, index, node, body.opsets[domain])
            else:
                custom_domains.add(domain)
                for f in check_signature(custom_signature(node)):
                    custom.setdefault(f.key, f)
    out += custom.values()
    for fn in model.functions:
        custom_domains.add(fn.domain)
        out += check_signature(function_signature(fn))
    for domain in sorted(custom_domains):
        out += check_domain(domain, Where(op=f"{domain}::*"))
    return out


def _standard_op(body: Body, index: int, node: NodeProto, opset: int) -> list[Finding]:
    domain = canonical(node.domain)
    where = Where(body.label, node_label(node, index), f"{domain or 'ai.onnx'}::{node.op_type}")
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return [finding("unknown-op", where, f"{where.op} does not exist at opset {opset}",
                        f"{where.op} v{opset}")]
    if schema.deprecated:
        return [finding("deprecated-op", where, f"{where.op} is deprecated at opset {opset} "
                        f"(since v{schema.since_version})", f"{where.op} v{opset}")]
    return []


def custom_signature(node: NodeProto) -> OpSignature:
    """A custom op as the conventions see it: its name and attributes (types known, no docs)."""
    attrs = tuple(Attr(a.name, AttributeProto.AttributeType.Name(a.type)) for a in node.attribute)
    return OpSignature(canonical(node.domain), node.op_type, "custom op", attributes=attrs)


def function_signature(fn: FunctionProto) -> OpSignature:
    """A model-local function: formal inputs, outputs and attributes, and its doc string."""
    attrs = [Attr(name) for name in fn.attribute]
    attrs += [Attr(a.name, AttributeProto.AttributeType.Name(a.type)) for a in fn.attribute_proto]
    return OpSignature(fn.domain, fn.name, "function", tuple(Param(n) for n in fn.input),
                       tuple(Param(n) for n in fn.output), tuple(attrs), doc=fn.doc_string)


def _tensor_bytes(t: TensorProto) -> int:
    count = math.prod(t.dims)
    if t.data_type == TensorProto.STRING:
        return sum(len(s) for s in t.string_data)
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        itemsize = 1
    return count * itemsize


def check_constants(bodies: Sequence[Body], limit: int) -> list[Finding]:
    """large-constant: a Constant node whose tensor is over `limit` bytes."""
    out = []
    for body in bodies:
        for index, node in enumerate(body.nodes):
            if node.op_type != "Constant" or canonical(node.domain) != "":
                continue
            for attr in node.attribute:
                tensor = attr.t if attr.name == "value" else (
                    attr.sparse_tensor.values if attr.name == "sparse_value" else None)
                size = _tensor_bytes(tensor) if tensor is not None else 0
                if size > limit:
                    label = node_label(node, index)
                    out.append(finding("large-constant", Where(body.label, label, "Constant",
                                                               node.output[0] if node.output else ""),
                                       f"Constant holds {size} bytes inline (limit {limit})",
                                       f"{body.label} {label}"))
    return out


def _tensors(body: Body) -> Iterator[TensorProto]:
    graph = body.graph
    if graph is not None:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
    for node in body.nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices


def external_tensors(bodies: Sequence[Body]) -> Iterator[tuple[Body, TensorProto]]:
    """(body, tensor) for every tensor that keeps its data in an external file."""
    for body in bodies:
        for tensor in _tensors(body):
            if tensor.data_location == TensorProto.EXTERNAL:
                yield body, tensor


def check_external_data(bodies: Sequence[Body], base_dir: Path) -> list[Finding]:
    """external-data-outside and external-data-missing, without reading the data."""
    out = []
    root = base_dir.resolve()
    for body, tensor in external_tensors(bodies):
        problem = _external_problem(tensor, root)
        if problem is not None:
            rule, message = problem
            out.append(finding(rule, Where(body.label, tensor=tensor.name), message,
                               f"{body.label} {tensor.name}"))
    return out


def _external_problem(tensor: TensorProto, root: Path) -> tuple[str, str] | None:
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    target = (root / location).resolve()
    if not location or os.path.isabs(location) or (target != root and root not in target.parents):
        return "external-data-outside", f"external data location '{location}' is outside '{root}'"
    if not target.is_file():
        return "external-data-missing", f"external data file '{location}' does not exist"
    try:
        end = int(info.get("offset") or 0) + int(info.get("length") or 0)
    except ValueError:
        return "external-data-missing", "external data offset/length are not integers"
    if target.stat().st_size < end:
        return "external-data-missing", (f"external data file '{location}' has "
                                         f"{target.stat().st_size} bytes, the tensor needs {end}")
    return None
