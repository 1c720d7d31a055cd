"""Quantize the repo's small models with onnxruntime's own quantizers, into models/ort_quant/.

Run in oxla's venv (onnxruntime ships its quantization tools; no torch needed):

    .venv/bin/python scripts/export_ort_quantized.py [--out models/ort_quant]

What it writes, per source model: `quantize_dynamic` (ConvInteger / MatMulInteger /
DynamicQuantizeLSTM / QAttention), `quantize_static` in QDQ and QOperator formats (QLinearConv,
com.microsoft QLinearAdd, QGemm, QLinearSoftmax, ...) calibrated on a few seeded inputs, and
`MatMulNBitsQuantizer` (4-bit blockwise MatMulNBits, GatherBlockQuantized). The tiny LSTM and
attention models are built here with onnx.helper. Everything is seeded: a rerun writes the same
bytes for the same onnxruntime version.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")

Feeds = dict[str, np.ndarray]


def resnet_feeds(rng: np.random.Generator) -> Feeds:
    return {"image": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}


def digits_feeds(rng: np.random.Generator) -> Feeds:
    return {"image": rng.uniform(0, 16, (4, 64)).astype(np.float32)}


def transformer_feeds(rng: np.random.Generator) -> Feeds:
    return {"ids": rng.integers(0, 100, (1, 16)).astype(np.int64)}


def lstm_feeds(rng: np.random.Generator) -> Feeds:
    return {"x": rng.standard_normal((6, 2, 16)).astype(np.float32)}


def attention_feeds(rng: np.random.Generator) -> Feeds:
    return {"x": rng.standard_normal((2, 8, 32)).astype(np.float32)}


# name -> (source model, seeded feeds); calibration and the tests use the same feed builders
SOURCES: dict[str, tuple[str, Callable[[np.random.Generator], Feeds]]] = {
    "resnet_small": ("resnet_small.onnx", resnet_feeds),
    "digits_mlp": ("digits_mlp.onnx", digits_feeds),
    "transformer_encoder": ("transformer_encoder.onnx", transformer_feeds),
    "tiny_lstm": ("", lstm_feeds),
    "tiny_attention": ("", attention_feeds),
}


def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def tiny_lstm() -> onnx.ModelProto:
    """A one-layer bidirectional LSTM (hidden 24) followed by a MatMul head."""
    rng = np.random.default_rng(1)
    hidden, features = 24, 16
    inits = [_weight(rng, "W", (2, 4 * hidden, features), 0.3),
             _weight(rng, "R", (2, 4 * hidden, hidden), 0.3),
             _weight(rng, "B", (2, 8 * hidden), 0.1),
             _weight(rng, "head", (2 * hidden, 8), 0.3)]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=hidden,
                              direction="bidirectional"),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "flat"], ["yf"]),
             helper.make_node("MatMul", ["yf", "head"], ["out"])]
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat"))
    graph = helper.make_graph(
        nodes, "tiny_lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", features])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["seq", "batch", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def tiny_attention() -> onnx.ModelProto:
    """com.microsoft Attention (4 heads, hidden 32) between two MatMuls: quantize_dynamic -> QAttention."""
    rng = np.random.default_rng(2)
    hidden = 32
    inits = [_weight(rng, "qkv_w", (hidden, 3 * hidden), 0.2), _weight(rng, "qkv_b", (3 * hidden,), 0.1),
             _weight(rng, "proj", (hidden, hidden), 0.2)]
    nodes = [helper.make_node("Attention", ["x", "qkv_w", "qkv_b"], ["ctx"], domain="com.microsoft",
                              num_heads=4),
             helper.make_node("MatMul", ["ctx", "proj"], ["out"])]
    graph = helper.make_graph(
        nodes, "tiny_attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)], ir_version=9)


class SeededReader(CalibrationDataReader):
    """A few seeded inputs for quantize_static's MinMax calibration."""

    def __init__(self, feeds: Callable[[np.random.Generator], Feeds], count: int = 4) -> None:
        rng = np.random.default_rng(123)
        self._items: Iterator[Feeds] = iter([feeds(rng) for _ in range(count)])

    def get_next(self) -> Feeds | None:
        return next(self._items, None)


def source(name: str, tmp: str) -> str:
    """The float model's path (built into tmp for the hand-made ones)."""
    file, _ = SOURCES[name]
    if file:
        model = onnx.load(os.path.join(MODELS, file))
        # training sections (digits_mlp) mean nothing to the quantizers
        del model.training_info[:]
        keep = [o for o in model.opset_import if o.domain != "ai.onnx.preview.training"]
        del model.opset_import[:]
        model.opset_import.extend(keep)
    else:
        model = tiny_lstm() if name == "tiny_lstm" else tiny_attention()
    path = os.path.join(tmp, f"{name}.onnx")
    onnx.save(model, path)
    return path


def export(out: str) -> list[str]:
    os.makedirs(out, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (_, feeds) in SOURCES.items():
            src = source(name, tmp)

            def target(kind: str, name: str = name) -> str:
                written.append(os.path.join(out, f"{name}.{kind}.onnx"))
                return written[-1]

            quantize_dynamic(src, target("dynamic"), weight_type=QuantType.QInt8)
            if name in ("tiny_lstm", "tiny_attention"):
                continue  # their quantized ops exist only in the dynamic form
            for fmt, kind in ((QuantFormat.QDQ, "qdq"), (QuantFormat.QOperator, "qop")):
                quantize_static(src, target(kind), SeededReader(feeds), quant_format=fmt,
                                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                                per_channel=kind == "qdq")
            if name == "resnet_small":
                quantize_static(src, target("qdq16"), SeededReader(feeds), quant_format=QuantFormat.QDQ,
                                activation_type=QuantType.QUInt16, weight_type=QuantType.QInt8,
                                extra_options={"UseQDQContribOps": True})
            if name == "transformer_encoder":
                # imported here: it needs onnx_ir, which oxla's venv lacks (quantize_* do not)
                from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

                quant = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=False,
                                             op_types_to_quantize=("MatMul", "Gather"))
                quant.process()
                quant.model.save_model_to_file(target("nbits"))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(MODELS, "ort_quant"))
    for path in export(parser.parse_args().out):
        print(f"{os.path.getsize(path):8d}  {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
