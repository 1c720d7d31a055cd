"""`--html`: one self-contained page (sortable table, failures by stage and op, pass-count trend)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from oxla.zoo.results import PASS, STAGES, STATUSES, ModelResult, Summary

_COLORS = {"pass": "#2e7d32", "fail": "#c62828", "error": "#ef6c00", "timeout": "#6a1b9a",
           "crash": "#37474f"}

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;width:100%}th,td{border-bottom:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top}th{cursor:pointer;background:#f4f4f4;user-select:none}
td.num{text-align:right;font-variant-numeric:tabular-nums}.badge{color:#fff;padding:1px 6px;
border-radius:3px;font-size:12px}.msg{font-family:monospace;font-size:12px;white-space:pre-wrap;
max-width:60em}details{margin:.3em 0}h2{margin-top:1.6em}
"""

# Click a header to sort by it; a second click reverses. Numbers sort as numbers, '-' last.
_SCRIPT = """
document.querySelectorAll('table.sortable th').forEach(function(th, col){
  th.addEventListener('click', function(){
    var body = th.closest('table').tBodies[0];
    var rows = Array.from(body.rows);
    var dir = th.dataset.dir === 'asc' ? -1 : 1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
    function key(r){ var v = r.cells[col].dataset.sort || r.cells[col].textContent;
      var n = parseFloat(v); return isNaN(n) ? v : n; }
    rows.sort(function(a, b){ var x = key(a), y = key(b);
      if (typeof x !== typeof y) return (typeof x === 'number' ? -1 : 1) * dir;
      return (x < y ? -1 : x > y ? 1 : 0) * dir; });
    rows.forEach(function(r){ body.appendChild(r); });
  });
});
"""


def _badge(status: str) -> str:
    return f'<span class="badge" style="background:{_COLORS.get(status, "#555")}">{escape(status)}</span>'


def _num(value: float | None, digits: int) -> str:
    if value is None:
        return '<td class="num" data-sort="-">-</td>'
    return f'<td class="num" data-sort="{value}">{value:.{digits}f}</td>'


def _worst_abs(result: ModelResult) -> float | None:
    values = [o.max_abs for o in result.outputs if o.max_abs is not None]
    return max(values) if values else None


def _table(results: Sequence[ModelResult]) -> str:
    order = {s: i for i, s in enumerate(STATUSES)}
    rows = []
    for r in results:
        rows.append(
            f'<tr id="{escape(r.path)}"><td>{escape(r.path)}</td>'
            f'<td data-sort="{order.get(r.status, 9)}">{_badge(r.status)}{" (cached)" if r.cached else ""}</td>'
            f'<td>{escape(r.stage or "-")}</td>{_num(r.first_run_s, 3)}{_num(r.latency_ms, 3)}'
            f'{_num(_worst_abs(r), 6)}<td class="msg">{escape(r.message)}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("model", "status", "stage", "first run (s)",
                                             "latency (ms)", "max abs diff", "message"))
    return f'<table class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _groups(title: str, groups: Mapping[str, list[ModelResult]]) -> str:
    if not groups:
        return f"<h2>{title}</h2><p>none</p>"
    parts = [f"<h2>{title}</h2>"]
    for name, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        items = "".join(f'<li><a href="#{escape(r.path)}">{escape(r.path)}</a> {_badge(r.status)} '
                        f'<span class="msg">{escape(r.message[:300])}</span></li>' for r in members)
        parts.append(f"<details><summary><b>{escape(name)}</b>: {len(members)}</summary>"
                     f"<ul>{items}</ul></details>")
    return "".join(parts)


def _by_stage(results: Sequence[ModelResult]) -> dict[str, list[ModelResult]]:
    groups: dict[str, list[ModelResult]] = defaultdict(list)
    for r in results:
        if r.status != PASS:
            groups[r.stage or r.status].append(r)
    rank = {s: i for i, s in enumerate(STAGES)}
    return dict(sorted(groups.items(), key=lambda kv: rank.get(kv[0], len(rank))))


def _by_op(results: Sequence[ModelResult]) -> dict[str, list[ModelResult]]:
    groups: dict[str, list[ModelResult]] = defaultdict(list)
    for r in results:
        if r.status != PASS:
            for op in r.ops or ("(no op named)",):
                groups[op].append(r)
    return groups


def _trend(points: Sequence[tuple[str, int, int]]) -> str:
    """An inline SVG line of pass counts (and models run) per recorded run."""
    if len(points) < 2:
        return "<p>Needs two runs recorded with --history.</p>"
    w, h, pad = 640, 180, 30
    top = max(total for _, _, total in points) or 1
    step = (w - 2 * pad) / (len(points) - 1)

    def line(values: list[int], color: str) -> str:
        xy = " ".join(f"{pad + i * step:.1f},{h - pad - v / top * (h - 2 * pad):.1f}"
                      for i, v in enumerate(values))
        return f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{xy}"/>'

    dots = "".join(f'<circle cx="{pad + i * step:.1f}" cy="{h - pad - p / top * (h - 2 * pad):.1f}" '
                   f'r="3" fill="#2e7d32"><title>{escape(t)}: {p}/{n} pass</title></circle>'
                   for i, (t, p, n) in enumerate(points))
    labels = (f'<text x="2" y="{pad}" font-size="11">{top}</text>'
              f'<text x="2" y="{h - pad}" font-size="11">0</text>'
              f'<text x="{pad}" y="{h - 8}" font-size="11">{escape(points[0][0])}</text>'
              f'<text x="{w - pad}" y="{h - 8}" font-size="11" text-anchor="end">'
              f'{escape(points[-1][0])}</text>')
    return (f'<svg width="{w}" height="{h}" role="img" aria-label="pass count per run">'
            f'{line([n for _, _, n in points], "#bbb")}{line([p for _, p, _ in points], "#2e7d32")}'
            f"{dots}{labels}</svg><p>green: models passing; grey: models run.</p>")


def render_html(results: Sequence[ModelResult], summary: Summary, meta: Mapping[str, Any],
                trend_points: Sequence[tuple[str, int, int]]) -> str:
    """The whole report page; it loads nothing from anywhere.

    Args:
        results: this run's results.
        summary: counts, regressions, fixed.
        meta: oxla version and commit, shown in the header.
        trend_points: (time, passing, run) per history entry, this run last.

    Returns:
        The HTML text.
    """
    counts = " ".join(f"{_badge(s)} {summary.counts.get(s, 0)}" for s in STATUSES)
    about = ", ".join(f"{escape(str(k))} {escape(str(v))}" for k, v in meta.items())
    changes = "".join(
        f"<p><b>{title}</b>: {', '.join(escape(p) for p in paths) or 'none'}</p>"
        for title, paths in (("Regressions", summary.regressions), ("Fixed", summary.fixed)))
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>oxla zoo report</title>"
            f"<style>{_STYLE}</style></head><body><h1>oxla zoo report</h1><p>{about}</p>"
            f"<p>{len(results)} models: {counts}</p>{changes}<h2>Pass count per run</h2>"
            f"{_trend(trend_points)}{_groups('Failures by stage', _by_stage(results))}"
            f"{_groups('Failures by op', _by_op(results))}<h2>All models</h2>{_table(results)}"
            f"<script>{_SCRIPT}</script></body></html>")
