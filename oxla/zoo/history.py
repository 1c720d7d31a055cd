"""The zoo history: one JSON line per run, read back for regressions and the pass-count trend."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oxla.zoo.results import PASS, ModelResult, Summary


def read_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every run recorded in `path`, oldest first ([] when the file does not exist yet).

    Lines that are not JSON objects (a run killed mid-write) are skipped.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("statuses"), dict):
            entries.append(entry)
    return entries


def previous_statuses(entries: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The last recorded status of each model path (later runs override earlier ones)."""
    out: dict[str, str] = {}
    for entry in entries:
        out.update(entry["statuses"])
    return out


def history_entry(results: Sequence[ModelResult], summary: Summary,
                  meta: Mapping[str, Any]) -> dict[str, Any]:
    """This run as one history record: when, which oxla, counts and every model's status."""
    return {"time": datetime.now(UTC).isoformat(timespec="seconds"), **meta,
            "counts": dict(summary.counts), "statuses": {r.path: r.status for r in results}}


def append_history(path: str | os.PathLike[str], entry: Mapping[str, Any]) -> None:
    """Append one line and fsync it: a killed CI job leaves whole lines behind."""
    p = Path(path)
    if p.parent != Path():
        p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def trend(entries: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, int]]:
    """(time, models passing, models run) per recorded run, oldest first."""
    out = []
    for entry in entries:
        statuses = entry["statuses"]
        passing = sum(1 for s in statuses.values() if s == PASS)
        out.append((str(entry.get("time", "")), passing, len(statuses)))
    return out
