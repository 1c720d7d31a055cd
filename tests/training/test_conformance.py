"""The ONNX conformance cases of the training ops, through oxla.backend."""

from __future__ import annotations

import pytest

from oxla import backend
from tests.conformance.cases import GRADIENT_CASES, all_cases, run_case

NAMES = ("test_adagrad", "test_adagrad_multiple", "test_adam", "test_adam_multiple",
         "test_momentum", "test_momentum_multiple", "test_nesterov_momentum", *GRADIENT_CASES)
CASES = {c.name: c for c in all_cases() if c.name in NAMES}


def test_every_case_exists() -> None:
    assert sorted(CASES) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_case(name: str) -> None:
    run_case(CASES[name], backend)
