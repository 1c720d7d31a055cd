"""`oxla zoo check`: run a model collection against its test data; JSON, HTML and history out."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from oxla.errors import InputError
from oxla.host import check_replaceable
from oxla.zoo.cache import DEFAULT_CACHE_DIR, ResultCache, oxla_commit
from oxla.zoo.cases import ZooCase, backend_cases, discover
from oxla.zoo.display import Progress, failing, summary_line, table
from oxla.zoo.history import append_history, history_entry, previous_statuses, read_history, trend
from oxla.zoo.html import render_html
from oxla.zoo.results import PASS, ModelResult, Summary, report_json, summarize
from oxla.zoo.runner import RunOptions, run_cases
from oxla.zoo.worker import WorkerOptions

EXIT_FAILED = 1

EPILOG = """\
A folder in the ONNX backend-test layout (model.onnx or one *.onnx, test_data_set_N/input_K.pb
and output_K.pb) is one model, checked against its data; a bare .onnx file is compared with
onnxruntime on seeded random inputs when onnxruntime is installed, else only run. Exit status 1
when a model that passed in the --history fails now, or with --strict when any model does not
pass; 2 on a usage error. See docs/zoo-ci.md.
"""


def add_zoo_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `zoo check` on an argparse subparsers object."""
    zoo = sub.add_parser("zoo", help="check a model collection against its test data (CI)")
    actions = zoo.add_subparsers(dest="zoo_command", required=True)
    p = actions.add_parser("check", help="run every model and compare with its expected outputs",
                           description=__doc__, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH", help="folders to search and .onnx files")
    p.add_argument("--onnx-backend-data", action="store_true",
                   help="add the model cases shipped in the onnx wheel (light, pytorch-*, simple)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the results as JSON")
    p.add_argument("--html", type=Path, metavar="OUT", help="write a self-contained HTML report")
    p.add_argument("--history", type=Path, metavar="FILE",
                   help="compare with the runs recorded here, then append this one (JSON lines)")
    p.add_argument("--jobs", type=int, default=2, help="models run at once (default 2)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="seconds per model before it is killed (default 300)")
    p.add_argument("--memory-mb", type=int, default=4096,
                   help="memory limit per model process (RLIMIT_DATA), MiB (default 4096; 0: none)")
    p.add_argument("--only", action="append", default=[], metavar="GLOB",
                   help="only models whose path matches (repeatable)")
    p.add_argument("--strict", action="store_true", help="exit 1 when any model does not pass")
    p.add_argument("--rtol", type=float, help="relative tolerance (default 1e-3)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default 1e-7; 1e-4 against "
                   "onnxruntime for bare models)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs for the latency (default 3)")
    p.add_argument("--no-cache", action="store_true", help="run every model, reuse no result")
    p.add_argument("--cache-dir", type=Path, default=Path(DEFAULT_CACHE_DIR),
                   help=f"where results are cached (default {DEFAULT_CACHE_DIR})")
    return p


def _cases(args: argparse.Namespace) -> list[ZooCase]:
    if not args.paths and not args.onnx_backend_data:
        raise InputError("zoo check needs a PATH or --onnx-backend-data")
    cases = discover(args.paths) + (backend_cases() if args.onnx_backend_data else [])
    if args.only:
        cases = [c for c in cases if any(fnmatch.fnmatch(c.id, g) for g in args.only)]
    if not cases:
        raise InputError("no models found" + (f" matching {args.only}" if args.only else ""))
    return cases


def _meta() -> dict[str, Any]:
    import jax
    import onnx

    import oxla

    return {"oxla_version": oxla.__version__, "commit": oxla_commit(),
            "onnx": onnx.__version__, "jax": jax.__version__}


def _options(args: argparse.Namespace) -> RunOptions:
    if args.jobs < 1 or args.timeout <= 0 or args.repeat < 0 or args.memory_mb < 0:
        raise InputError("--jobs must be >= 1, --timeout > 0, --repeat and --memory-mb >= 0")
    worker = WorkerOptions(args.rtol, args.atol, args.repeat, args.memory_mb)
    return RunOptions(args.jobs, args.timeout, worker)


def cmd_zoo(args: argparse.Namespace) -> int:
    """Run `oxla zoo check`; returns the exit status."""
    cases = _cases(args)
    options = _options(args)
    cache = None if args.no_cache else ResultCache(args.cache_dir, options.worker)
    entries = read_history(args.history) if args.history else []
    progress = Progress(len(cases), sys.stderr)
    start = time.perf_counter()
    try:
        results = run_cases(cases, options, cache=cache, on_result=progress)
    finally:
        progress.close()
    seconds = time.perf_counter() - start
    summary = summarize(results, previous_statuses(entries))
    _print(results, summary, seconds, progress.tty)
    _write_outputs(args, results, summary, entries)
    if summary.regressions:
        return EXIT_FAILED
    if args.strict and any(r.status != PASS for r in results):
        return EXIT_FAILED
    return 0


def _print(results: list[ModelResult], summary: Summary, seconds: float, tty: bool) -> None:
    if tty:  # the bar showed no rows: print them all
        print(table(results))
    elif failing(results):  # the log already has every row: repeat the ones that need a look
        print("\nnot passing:\n" + table(failing(results)))
    print(summary_line(results, summary, seconds))


def _write_outputs(args: argparse.Namespace, results: list[ModelResult], summary: Summary,
                   entries: list[dict[str, Any]]) -> None:
    meta = _meta()
    if args.json:
        _write_text(args.json, json.dumps(report_json(results, summary, meta), indent=1) + "\n")
    entry = history_entry(results, summary, meta)
    if args.html:
        points = trend([*entries, entry])
        _write_text(args.html, render_html(results, summary, meta, points))
    if args.history:
        append_history(args.history, entry)


def _write_text(path: Path, text: str) -> None:
    if path.parent != Path():
        path.parent.mkdir(parents=True, exist_ok=True)
    check_replaceable(path)  # an OSError: `oxla` reports it as one message
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
