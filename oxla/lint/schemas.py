"""Lint every schema registered in onnx.defs; a grandfather file keeps today's exceptions."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxla.errors import InputError
from oxla.lint.conventions import check_domain, check_signature, from_schema
from oxla.lint.rules import Finding, Where

GRANDFATHER = Path(__file__).parent / "grandfather.json"


def lint_schemas(domain: str | None = None, schemas: Iterable[Any] | None = None) -> list[Finding]:
    """The convention findings of every registered schema (all versions), one per key.

    Args:
        domain: only schemas of this domain ('ai.onnx' and '' both mean the default domain).
        schemas: OpSchema objects to check instead of everything onnx.defs has registered.

    Returns:
        Findings sorted by key; an op's versions share keys, reported once from the newest.
    """
    import onnx.defs

    if schemas is None:
        schemas = onnx.defs.get_all_schemas_with_history()
    wanted = None if domain is None else ("" if domain == "ai.onnx" else domain)
    found: dict[str, Finding] = {}
    domains = set()
    for schema in sorted(schemas, key=lambda s: (s.domain, s.name, -s.since_version)):
        if wanted is not None and schema.domain != wanted:
            continue
        domains.add(schema.domain)
        for f in check_signature(from_schema(schema)):
            found.setdefault(f.key, f)
    for d in sorted(domains):
        for f in check_domain(d, Where(op=f"{d}::*")):
            found.setdefault(f.key, f)
    return sorted(found.values(), key=lambda f: f.key)


@dataclass(frozen=True)
class Triage:
    """Findings split by a grandfather file: the new ones, the excused ones, and stale entries."""

    new: tuple[Finding, ...]
    grandfathered: tuple[Finding, ...]
    stale: tuple[str, ...]


def load_grandfather(path: str | os.PathLike[str] | None = None) -> frozenset[str]:
    """The finding keys a grandfather file excuses (default: the one shipped for onnx.defs).

    Raises:
        InputError: the file is missing or not a grandfather file.
    """
    p = Path(path) if path is not None else GRANDFATHER
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        exceptions = data["exceptions"]
        return frozenset(f"{rule}: {subject}" for rule, subjects in exceptions.items()
                         for subject in subjects)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise InputError(f"cannot read grandfather file '{p}': {e}") from None


def triage(findings: Sequence[Finding], excused: frozenset[str], *, complete: bool) -> Triage:
    """Split findings into new and grandfathered; list stale keys when the run saw everything.

    Args:
        findings: this run's findings.
        excused: keys from a grandfather file.
        complete: the run checked everything the file covers (no --domain filter), so an entry
            nothing matched is stale and the file can shrink.
    """
    keys = {f.key for f in findings}
    stale = tuple(sorted(excused - keys)) if complete else ()
    return Triage(tuple(f for f in findings if f.key not in excused),
                  tuple(f for f in findings if f.key in excused), stale)


def write_grandfather(path: str | os.PathLike[str], findings: Iterable[Finding], about: str) -> None:
    """Write a grandfather file excusing exactly `findings` (sorted, one subject per line)."""
    exceptions: dict[str, list[str]] = {}
    for f in findings:
        rule, subject = f.key.split(": ", 1)
        exceptions.setdefault(rule, []).append(subject)
    data = {"about": about, "exceptions": {r: sorted(s) for r, s in sorted(exceptions.items())}}
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, p)
