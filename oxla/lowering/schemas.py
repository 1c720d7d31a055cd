"""The OpSchema function-body API in one place (onnx's type stubs do not describe it)."""

from __future__ import annotations

from functools import cache
from typing import Any

import onnx.defs
from onnx import AttributeProto, FunctionProto


def get_schema(op_type: str, opset: int, domain: str) -> Any:
    """The schema serving `op_type` at `opset`, or None."""
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def has_body(schema: Any) -> bool:
    """Whether the schema defines a function body (plain or context-dependent)."""
    return bool(schema.has_function or schema.has_context_dependent_function)


def is_context_dependent(schema: Any) -> bool:
    return bool(schema.has_context_dependent_function)


def plain_body(schema: Any, opset: int) -> FunctionProto | None:
    """The schema's fixed function body for `opset`, or None."""
    if not schema.has_function:
        return None
    data = schema.get_function_with_opset_version(opset)
    return FunctionProto.FromString(data) if data else None


def context_body(schema: Any, opset: int, node: bytes, input_types: list[bytes]) -> FunctionProto | None:
    """The body a context-dependent function builds for this node and these input types."""
    data = schema.get_context_dependent_function_with_opset_version(opset, node, input_types)
    return FunctionProto.FromString(data) if data else None


@cache
def attribute_defaults(op_type: str, opset: int, domain: str) -> dict[str, AttributeProto]:
    """The schema's attribute defaults (name -> AttributeProto named as the attribute)."""
    schema = get_schema(op_type, opset, domain)
    out: dict[str, AttributeProto] = {}
    if schema is None:
        return out
    for name, attr in schema.attributes.items():
        default = attr.default_value
        if default.type != AttributeProto.UNDEFINED:
            proto = AttributeProto()
            proto.CopyFrom(default)
            proto.name = name
            out[name] = proto
    return out
