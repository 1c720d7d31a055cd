"""The ONNX conformance suite (node cases and shipped model cases) through oxla.backend."""

from __future__ import annotations

import pytest

from oxla import backend
from tests.conformance.cases import Case, all_cases, run_case
from tests.conformance.expected_failures import EXPECTED_FAILURES, MIN_PASSING

CASES = all_cases()
NAMES = {c.name for c in CASES}


def _param(case: Case) -> object:
    reason = EXPECTED_FAILURES.get(case.name)
    marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
    return pytest.param(case, id=f"{case.kind}-{case.name}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_case(case: Case) -> None:
    run_case(case, backend)


def test_expected_failures_name_real_cases() -> None:
    unknown = sorted(set(EXPECTED_FAILURES) - NAMES)
    assert not unknown, f"expected-failure entries for cases that do not exist: {unknown}"
    assert all(reason.strip() for reason in EXPECTED_FAILURES.values())


def test_minimum_passing_ratchet() -> None:
    passing = len(CASES) - len(EXPECTED_FAILURES)
    assert passing >= MIN_PASSING, (
        f"{passing} cases may pass but MIN_PASSING is {MIN_PASSING}: the table grew")
