"""Every schema version of the ONNX domains has a rule, a function body, or a recorded reason."""

from __future__ import annotations

import onnx.defs
import pytest

from oxla.lowering import ops, schemas  # noqa: F401
from oxla.lowering.registry import lookup
from oxla.lowering.unsupported import UNSUPPORTED

DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview")
SCHEMAS = [s for s in onnx.defs.get_all_schemas_with_history() if s.domain in DOMAINS and not s.deprecated]


def _covered(s: object) -> bool:
    return lookup(s.domain, s.name, s.since_version) is not None or schemas.has_body(s)  # type: ignore[attr-defined]


@pytest.mark.parametrize("s", SCHEMAS, ids=lambda s: f"{s.domain or 'ai.onnx'}::{s.name}-v{s.since_version}")
def test_schema_version_is_covered(s: onnx.defs.OpSchema) -> None:
    if (s.domain, s.name, s.since_version) in UNSUPPORTED:
        assert not _covered(s), "covered now: remove it from UNSUPPORTED"
        return
    assert _covered(s), "no rule, no function body and no UNSUPPORTED entry"


def test_unsupported_entries_are_real_schemas() -> None:
    known = {(s.domain, s.name, s.since_version) for s in SCHEMAS}
    assert set(UNSUPPORTED) <= known
