"""Models quantized by onnxruntime's own tools (models/ort_quant) run by oxla and onnxruntime.

onnxruntime runs at GraphOptimizationLevel.ORT_ENABLE_BASIC: its default level fuses QDQ groups
and DynamicQuantizeLinear + MatMulInteger into integer kernels whose results differ from the
graph as written; at the basic level it is deterministic. Wherever the computation between two
quantization points is integer arithmetic (or exact float products), oxla agrees bit for bit.
The tolerances below are for float ops in the graph, whose summation orders and approximations
oxla does not reproduce; each says which.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto

import oxla
from tests.ort_exact import reference as exact_reference

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models", "ort_quant")
DIMS = {"batch": 2, "N": 4, "seq": 8}  # sizes for symbolic input dimensions

# file -> (max |oxla - onnxruntime|, why it is not 0)
CASES: dict[str, tuple[float, str]] = {
    "digits_mlp.dynamic": (0.0, ""),
    "digits_mlp.qdq": (0.0, ""),
    "digits_mlp.qop": (0.0, ""),
    "digits_mlp.qdq16": (0.0, ""),
    "resnet_half.qdq": (0.0, ""),
    "resnet_half.qop": (0.0, ""),
    "tiny_transformer.qdq": (0.0, ""),
    "resnet_half.dynamic": (2e-7, "float ReduceMean (global pool) sums in another order"),
    "tiny_transformer.dynamic": (2e-6, "float attention (Softmax, MatMul) between quantized ops"),
    "tiny_transformer.qop": (2e-6, "float LayerNormalization and Gelu between quantized ops"),
    "tiny_transformer.nbits": (5e-6, "MatMulNBits sums dequantized float32 products"),
    "tiny_attention.dynamic": (3e-6, "QAttention's softmax and context product are float"),
    "tiny_lstm.dynamic": (3e-2, "float LSTM gates; each step re-quantizes H, so a last-bit "
                                "difference in a gate can move an H value by one step"),
}


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs: floats standard normal, token ids below 50 (the export script's)."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value or DIMS[d.dim_param] for d in t.shape.dim]
        if t.elem_type == TensorProto.INT64:
            out[vi.name] = rng.integers(0, 50, shape).astype(np.int64)
        else:
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def test_every_file_has_a_case() -> None:
    files = {f[: -len(".onnx")] for f in os.listdir(MODELS) if f.endswith(".onnx")}
    assert files == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_agrees_with_onnxruntime(name: str) -> None:
    import onnxruntime as ort

    tolerance, why = CASES[name]
    path = os.path.join(MODELS, f"{name}.onnx")
    model = onnx.load(path)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    reference = ort.InferenceSession(exact_reference(model).SerializeToString(), options,
                                     providers=["CPUExecutionProvider"])
    session = oxla.InferenceSession(path)
    for seed in range(3):
        feeds = _feeds(model, seed)
        want = reference.run(None, feeds)
        got = session.run(None, feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if tolerance == 0.0:
                np.testing.assert_array_equal(g, w, err_msg=f"{name}, seed {seed}")
            else:
                diff = float(np.max(np.abs(g.astype(np.float64) - w)))
                assert diff <= tolerance, f"{name}, seed {seed}: {diff:.3g} > {tolerance} ({why})"
