"""The ONNX conformance suite (node cases and shipped model cases) through oxla.backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oxla import backend
from tests.conformance.cases import Case, all_cases, run_case
from tests.conformance.expected_failures import EXPECTED_FAILURES, MIN_PASSING

ROOT = Path(__file__).resolve().parent.parent.parent
CASES = all_cases()
NAMES = {c.name for c in CASES}


def _param(case: Case) -> object:
    reason = EXPECTED_FAILURES.get(case.name)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(case, id=f"{case.kind}-{case.name}", marks=marks)


# The light (model-zoo) cases run in a fresh process each. Open defect: after some earlier tests in
# the same process (the fuzzer's mutated models among them), light squeezenet sometimes computed
# NaN (about 1 full run in 3); it never did in a process of its own. See the closing note of the
# runtime-v2 session for the reproduction; remove this once the cause is found.
ISOLATED = {"light"}


def _in_child(case: Case) -> None:
    code = ("import sys; from oxla import backend; from tests.conformance.cases import all_cases, "
            f"run_case; run_case(next(c for c in all_cases() if c.name == {case.name!r}), backend)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr[-4000:])


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case(case: Case) -> None:
    if case.kind in ISOLATED:
        _in_child(case)
    else:
        run_case(case, backend)


def test_expected_failures_name_real_cases() -> None:
    unknown = sorted(set(EXPECTED_FAILURES) - NAMES)
    assert not unknown, f"expected-failure entries for cases that do not exist: {unknown}"
    assert all(reason.strip() for reason in EXPECTED_FAILURES.values())


def test_minimum_passing_ratchet() -> None:
    passing = len(CASES) - len(EXPECTED_FAILURES)
    assert passing >= MIN_PASSING, (
        f"{passing} cases may pass but MIN_PASSING is {MIN_PASSING}: the table grew")
