"""Conformance cases oxla is known to fail, each with its reason; the ratchet only goes up."""

from __future__ import annotations

# Raise MIN_PASSING whenever more cases pass; never lower it.
MIN_PASSING = 0

EXPECTED_FAILURES: dict[str, str] = {}
