"""Graph passes run before tracing, one per file."""

from __future__ import annotations

from onnx import ModelProto

from oxla.passes.classify import check_supported
from oxla.passes.constants import large_constants_to_initializers
from oxla.passes.weight_layout import conv_weights_to_hwio, gemm_weights_to_kn


def prepare(model: ModelProto, *, bake_weights: bool = False, layout_weights: bool = False) -> ModelProto:
    """Check every op is runnable (one error lists all gaps) and canonicalize the model.

    layout_weights stores conv kernels in the layout XLA:CPU computes with (parameters are then
    renamed, so it is for sessions, not for callers of CompiledModel.fn).
    """
    check_supported(model)
    if not bake_weights:
        large_constants_to_initializers(model)
        if layout_weights:
            conv_weights_to_hwio(model)
            gemm_weights_to_kn(model)
    return model
