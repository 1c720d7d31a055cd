"""`oxla zoo`: run every model of a collection against its own test data, in CI."""

from __future__ import annotations
