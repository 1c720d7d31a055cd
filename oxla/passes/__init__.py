"""Graph passes run before tracing, one per file."""

from __future__ import annotations

from onnx import ModelProto

from oxla.passes.classify import check_supported
from oxla.passes.constants import large_constants_to_initializers


def prepare(model: ModelProto, *, bake_weights: bool = False) -> ModelProto:
    """Check every op is runnable (one error lists all gaps) and canonicalize the model."""
    check_supported(model)
    if not bake_weights:
        large_constants_to_initializers(model)
    return model
