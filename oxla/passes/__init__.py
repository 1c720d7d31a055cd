"""Graph passes run before tracing, one per file."""

from __future__ import annotations

from onnx import ModelProto

from oxla.passes.classify import check_supported


def prepare(model: ModelProto) -> ModelProto:
    """Check every op is runnable (one error lists all gaps) and canonicalize the model."""
    check_supported(model)
    return model
