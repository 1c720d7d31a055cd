"""Every rule's signature matches its OpSchema: attribute names and defaults, input count."""

from __future__ import annotations

import math

import onnx
import onnx.defs
import pytest
from onnx import AttributeProto

from oxla.lowering import ops  # noqa: F401
from oxla.lowering.interpreter import attribute_value
from oxla.lowering.registry import Rule, all_rules

RULES = sorted(all_rules(), key=lambda r: (r.domain, r.op_type, r.since))


def _schemas(r: Rule) -> list[onnx.defs.OpSchema]:
    """Every schema version this rule serves (from its since up to the next rule's since)."""
    later = [x.since for x in RULES if (x.domain, x.op_type) == (r.domain, r.op_type) and x.since > r.since]
    limit = min(later) if later else 10**6
    found = {}
    for version in range(r.since, min(limit, onnx.defs.onnx_opset_version() + 1)):
        try:
            s = onnx.defs.get_schema(r.op_type, version, r.domain)
        except onnx.defs.SchemaError:
            continue
        if s.since_version >= r.since or not found:
            found[s.since_version] = s
    return list(found.values())


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-7)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("r", RULES, ids=lambda r: f"{r.domain or 'ai.onnx'}::{r.op_type}-v{r.since}")
def test_signature_matches_schema(r: Rule) -> None:
    schemas = _schemas(r)
    if not schemas:
        pytest.skip("no schema in this onnx (custom or removed op)")
    for schema in schemas:
        names = set(schema.attributes)
        assert set(r.attrs) >= names, f"v{schema.since_version}: rule lacks attributes {names - set(r.attrs)}"
        for name, attr in schema.attributes.items():
            default = attr.default_value
            if default.type == AttributeProto.UNDEFINED:
                continue
            want = attribute_value(default)
            got = r.attrs[name]
            if isinstance(want, str) and got is None:
                continue
            assert _same(got, want), f"v{schema.since_version}: attribute {name} defaults to {got!r}, schema {want!r}"
        max_inputs = schema.max_input
        if not r.variadic and max_inputs < 2**31 - 1:
            assert len(r.inputs) >= schema.min_input, f"v{schema.since_version}: too few inputs"
