"""`oxla lint`: operator conventions on onnx.defs schemas, hygiene and conventions on models."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from oxla.errors import InputError, InvalidModelError
from oxla.lint.fix import apply_fixes, save_atomically
from oxla.lint.graph import bodies
from oxla.lint.model import LintOptions, lint_model
from oxla.lint.ops import external_tensors
from oxla.lint.rules import ERROR, SEVERITIES, Finding
from oxla.lint.schemas import Triage, lint_schemas, load_grandfather, triage, write_grandfather

EXIT_FINDINGS = 1

EPILOG = """\
Exit status 1 when an error-level finding remains (one not excused by the grandfather file),
2 on a usage error or an unreadable model. --schemas checks every schema onnx.defs has registered
against ONNX's operator conventions, excusing the exceptions listed in oxla's grandfather file
(or --grandfather FILE), so only new violations fail. See docs/lint.md for the rules.
"""


def add_lint_parser(sub: Any) -> argparse.ArgumentParser:
    """Register `lint` on an argparse subparsers object."""
    p = sub.add_parser("lint", help="check operator conventions and model hygiene",
                       description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", metavar="MODEL", help=".onnx files to check")
    p.add_argument("--schemas", action="store_true",
                   help="check the schemas registered in onnx.defs instead of models")
    p.add_argument("--domain", metavar="D", help="with --schemas: only this domain")
    p.add_argument("--json", action="store_true", help='print {"findings": [...]} as JSON')
    p.add_argument("--grandfather", type=Path, metavar="FILE",
                   help="excuse the findings listed here (default with --schemas: oxla's file)")
    p.add_argument("--write-grandfather", type=Path, metavar="FILE",
                   help="write every current finding to FILE as the exceptions to excuse")
    p.add_argument("--fix", type=Path, metavar="OUT",
                   help="apply the safe fixes to the one MODEL and write OUT atomically")
    p.add_argument("--large-constant-bytes", type=int, default=LintOptions().large_constant_bytes,
                   help="a Constant larger than this is a large-constant (default 65536)")
    return p


def cmd_lint(args: argparse.Namespace) -> int:
    """Run `oxla lint`; returns the exit status."""
    if args.schemas == bool(args.models):
        raise InputError("lint takes MODEL... or --schemas (not both)")
    if args.fix and len(args.models) != 1:
        raise InputError("--fix takes exactly one MODEL")
    if args.schemas:
        findings = [("", f) for f in lint_schemas(args.domain)]
    else:
        findings = _lint_models(args)
    if args.write_grandfather:
        about = ("oxla lint --schemas: exceptions to ONNX's operator conventions that exist today; "
                 "only findings not listed here fail." if args.schemas else "oxla lint exceptions")
        write_grandfather(args.write_grandfather, [f for _, f in findings], about)
        print(f"wrote {len(findings)} exceptions to {args.write_grandfather}")
        return 0
    # --schemas always has a grandfather file (oxla's by default); models only when given one
    use_file = args.schemas or args.grandfather is not None
    excused = load_grandfather(args.grandfather) if use_file else frozenset()
    complete = args.schemas and args.domain is None
    result = triage([f for _, f in findings], excused, complete=bool(complete))
    new = {id(f) for f in result.new}
    shown = [(m, f) for m, f in findings if id(f) in new]
    _print(args, shown, result)
    return EXIT_FINDINGS if any(f.severity == ERROR for _, f in shown) else 0


def _load(path: str) -> onnx.ModelProto:
    try:
        # external data stays on disk: lint checks where it points, it never needs the bytes
        return onnx.load(path, load_external_data=False)
    except FileNotFoundError:
        raise InputError(f"no such model file: '{path}'") from None
    except Exception as e:
        raise InvalidModelError(f"{path}: not a valid ONNX model ({e})") from None


def _lint_models(args: argparse.Namespace) -> list[tuple[str, Finding]]:
    options = LintOptions(args.large_constant_bytes)
    out = []
    for path in args.models:
        model = _load(path)
        base = Path(path).resolve().parent
        if args.fix:
            model = _fix(model, base, args.fix)
            path = str(args.fix)
        out += [(path, f) for f in lint_model(model, base_dir=base, options=options)]
    return out


def _fix(model: onnx.ModelProto, base: Path, out: Path) -> onnx.ModelProto:
    has_external = any(True for _ in external_tensors(bodies(model)))
    if has_external and out.resolve().parent != base:
        raise InputError(f"the model keeps data in external files beside it; write --fix into "
                         f"the same folder ('{base}') so their relative locations still hold")
    report = apply_fixes(model)
    save_atomically(model, out)
    print(f"fixed: {len(report.sorted_bodies)} graph(s) re-sorted, "
          f"{len(report.dropped_initializers)} unused initializer(s) dropped, "
          f"{report.named_nodes} node(s) named; wrote {out}")
    return model


def _print(args: argparse.Namespace, shown: Sequence[tuple[str, Finding]], result: Triage) -> None:
    if args.json:
        docs = [({"model": m} if m else {}) | f.to_json() for m, f in shown]
        summary = {"counts": _counts(f for _, f in shown), "grandfathered": len(result.grandfathered),
                   "stale": list(result.stale)}
        print(json.dumps({"findings": docs, "summary": summary}, indent=1))
        return
    for model, f in shown:
        print(f"{model + ': ' if model else ''}{f.describe()}")
    counts = _counts(f for _, f in shown)
    print(f"{len(shown)} finding(s): " + ", ".join(f"{counts[s]} {s}" for s in SEVERITIES)
          + (f"; {len(result.grandfathered)} grandfathered" if result.grandfathered else ""))
    if result.stale:
        print(f"{len(result.stale)} grandfathered exception(s) no longer occur; regenerate the "
              "file with --write-grandfather to shrink it:\n  " + "\n  ".join(result.stale))


def _counts(findings: Any) -> dict[str, int]:
    c = Counter(f.severity for f in findings)
    return {s: c.get(s, 0) for s in SEVERITIES}
