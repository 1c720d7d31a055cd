"""Zoo results: one record per model, the run's summary, and their JSON form."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PASS = "pass"
FAIL = "fail"        # ran, outputs differ
ERROR = "error"      # a stage before compare failed
TIMEOUT = "timeout"
CRASH = "crash"
STATUSES = (PASS, FAIL, ERROR, TIMEOUT, CRASH)

STAGES = ("load", "check", "classify", "compile", "run", "compare")

# Results worth keeping across runs: a timeout or crash may be the machine's fault, so rerun those.
CACHEABLE = frozenset({PASS, FAIL, ERROR})

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class OutputDiff:
    """One output compared with its expected value (the worst over the data sets)."""

    name: str
    ok: bool
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok,
                "shape": list(self.shape) if self.shape is not None else None,
                "dtype": self.dtype, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "message": self.message}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> OutputDiff:
        shape = tuple(d["shape"]) if d.get("shape") is not None else None
        return OutputDiff(d["name"], bool(d["ok"]), shape, d.get("dtype", ""), d.get("max_abs"),
                          d.get("max_rel"), d.get("message", ""))


@dataclass(frozen=True)
class ModelResult:
    """What happened to one model: its status, the stage that failed and why, and timings."""

    path: str
    status: str
    stage: str = ""
    message: str = ""
    outputs: tuple[OutputDiff, ...] = ()
    first_run_s: float | None = None
    latency_ms: float | None = None
    ops: tuple[str, ...] = ()     # the ops a failure names (unsupported ops, the failing node's op)
    cached: bool = False
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "status": self.status, "stage": self.stage,
                "message": self.message, "outputs": [o.to_json() for o in self.outputs],
                "first_run_s": self.first_run_s, "latency_ms": self.latency_ms,
                "ops": list(self.ops), "cached": self.cached, "wall_s": round(self.wall_s, 3)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> ModelResult:
        return ModelResult(d["path"], d["status"], d.get("stage", ""), d.get("message", ""),
                           tuple(OutputDiff.from_json(o) for o in d.get("outputs", [])),
                           d.get("first_run_s"), d.get("latency_ms"), tuple(d.get("ops", [])),
                           bool(d.get("cached", False)), float(d.get("wall_s", 0.0)))


@dataclass(frozen=True)
class Summary:
    """Counts per status, and the changes against the history (model paths, sorted)."""

    counts: dict[str, int] = field(default_factory=dict)
    regressions: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "regressions": list(self.regressions),
                "fixed": list(self.fixed)}


def summarize(results: Iterable[ModelResult], previous: Mapping[str, str]) -> Summary:
    """Count statuses; list models that passed before and do not now, and the reverse.

    Args:
        results: this run's results.
        previous: the last known status of each model path (from the history).

    Returns:
        The summary; a model the history does not know is neither a regression nor fixed.
    """
    results = list(results)
    counts = Counter(r.status for r in results)
    regressions, fixed = [], []
    for r in results:
        before = previous.get(r.path)
        if before == PASS and r.status != PASS:
            regressions.append(r.path)
        elif before is not None and before != PASS and r.status == PASS:
            fixed.append(r.path)
    return Summary({s: counts.get(s, 0) for s in STATUSES}, tuple(sorted(regressions)),
                   tuple(sorted(fixed)))


def report_json(results: Iterable[ModelResult], summary: Summary,
                meta: Mapping[str, Any]) -> dict[str, Any]:
    """The `--json` document: {"version", "oxla", "models": [...], "summary": {...}}."""
    return {"version": SCHEMA_VERSION, "oxla": dict(meta),
            "models": [r.to_json() for r in results], "summary": summary.to_json()}
