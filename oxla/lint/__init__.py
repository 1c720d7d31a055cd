"""`oxla lint`: ONNX operator conventions on schemas and custom ops, and model hygiene."""

from __future__ import annotations
