"""Terminal output of `oxla zoo check`: a progress bar on a terminal, plain lines in a log."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Sequence
from typing import TextIO

from oxla.zoo.results import PASS, STATUSES, ModelResult, Summary

BAR_WIDTH = 30


def _seconds(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "-"


def _millis(value: float | None) -> str:
    return f"{value:.2f} ms" if value is not None else "-"


def row(result: ModelResult, width: int = 200) -> str:
    """One table row: status, stage, first run, latency, model, message (cut to the width)."""
    cached = "*" if result.cached else " "
    head = (f"{result.status:7s}{cached} {result.stage or '-':8s} {_seconds(result.first_run_s):>9s} "
            f"{_millis(result.latency_ms):>11s}  {result.path}")
    message = " ".join(result.message.split())
    if message:
        room = max(20, width - len(head) - 3)
        head += "  " + (message if len(message) <= room else message[:room - 3] + "...")
    return head


def table(results: Sequence[ModelResult], width: int | None = None) -> str:
    """Every result, failures first; `*` marks a result taken from the cache."""
    width = width or shutil.get_terminal_size((160, 24)).columns
    order = {s: i for i, s in enumerate(reversed(STATUSES))}
    rows = sorted(results, key=lambda r: (order.get(r.status, 0), r.path))
    header = f"{'status':8s} {'stage':8s} {'first run':>9s} {'latency':>11s}  model"
    return "\n".join([header, *(row(r, width) for r in rows)])


def summary_line(results: Sequence[ModelResult], summary: Summary, seconds: float) -> str:
    counts = ", ".join(f"{summary.counts.get(s, 0)} {s}" for s in STATUSES)
    cached = sum(1 for r in results if r.cached)
    line = (f"{len(results)} models: {counts} ({cached} from the cache); "
            f"{len(summary.regressions)} regressions, {len(summary.fixed)} fixed; {seconds:.1f} s")
    for title, paths in (("regressions", summary.regressions), ("fixed", summary.fixed)):
        if paths:
            line += f"\n{title}:\n" + "\n".join(f"  {p}" for p in paths)
    return line


class Progress:
    """Shows results as they arrive: a redrawn bar on a terminal, one plain line each otherwise.

    Args:
        total: how many models the run has.
        stream: where to write (stderr for the bar keeps stdout clean for the table).
        tty: whether `stream` is a terminal (default: ask it).
    """

    def __init__(self, total: int, stream: TextIO, tty: bool | None = None) -> None:
        self.total = total
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.done = 0
        self.counts: Counter[str] = Counter()

    def __call__(self, result: ModelResult) -> None:
        self.done += 1
        self.counts[result.status] += 1
        if self.tty:
            filled = BAR_WIDTH * self.done // max(1, self.total)
            counts = " ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])
            text = f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} {counts}"
            width = shutil.get_terminal_size((120, 24)).columns
            self.stream.write(text[:width - 1].ljust(width - 1))
        else:
            digits = len(str(self.total))
            self.stream.write(f"[{self.done:>{digits}}/{self.total}] {row(result)}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()


def failing(results: Sequence[ModelResult]) -> list[ModelResult]:
    return [r for r in results if r.status != PASS]
