"""Run conformance cases in worker processes and print (or save) a pass/fail report.

    python -m tests.conformance.report [-k SUBSTRING ...] [-j JOBS] [--json FILE] [--failures]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import signal
import sys
import time
import traceback

CASE_TIMEOUT_S = 300


def _init() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run(name: str) -> tuple[str, str, str, float]:
    from oxla import backend
    from tests.conformance.cases import all_cases, run_case

    cases = _run.__dict__.setdefault("cases", {c.name: c for c in all_cases()})
    start = time.perf_counter()
    try:
        signal.alarm(CASE_TIMEOUT_S)
        run_case(cases[name], backend)
        status, message = "pass", ""
    except AssertionError as e:
        status, message = "mismatch", str(e).strip().splitlines()[0:6]
        message = " | ".join(message)
    except Exception as e:  # a report: every failure is recorded, none stops the run
        status = "error"
        message = f"{type(e).__name__}: {str(e).strip()[:600]}"
        if not str(e).strip():
            message += " " + traceback.format_exc()[-600:]
    finally:
        signal.alarm(0)
    return name, status, message, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", action="append", default=[], help="substring of case names")
    parser.add_argument("-j", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--failures", action="store_true", help="print failing cases only")
    args = parser.parse_args(argv)
    from tests.conformance.cases import all_cases

    names = [c.name for c in all_cases() if not args.k or any(k in c.name for k in args.k)]
    results: list[tuple[str, str, str, float]] = []
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.j, initializer=_init, maxtasksperchild=200) as pool:
        for r in pool.imap_unordered(_run, names):
            results.append(r)
            if not args.failures or r[1] != "pass":
                print(f"{r[1]:8s} {r[0]} {r[2][:300]}", flush=True)
    counts = collections.Counter(r[1] for r in results)
    print(f"\n{counts['pass']}/{len(results)} pass; {dict(counts)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({r[0]: {"status": r[1], "message": r[2], "seconds": round(r[3], 2)}
                       for r in sorted(results)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
