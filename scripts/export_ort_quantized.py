"""Quantize small models with onnxruntime's own quantizers, into models/ort_quant/.

Run with onnxruntime and onnx_ir (MatMulNBitsQuantizer imports onnx_ir; oxla's venv lacks it,
a side venv with `pip install onnxruntime==1.32.0 onnx==1.23.2 onnx_ir numpy` has all):

    .venv-export/bin/python scripts/export_ort_quantized.py            # the committed set
    .venv-export/bin/python scripts/export_ort_quantized.py --full --out benchmarks/.cache/ort_quant

The committed set stays small (a few hundred KB): `resnet_half` is models/resnet_small.onnx with
every width halved (its own weights, channels sliced), `tiny_transformer`, `tiny_lstm` and
`tiny_attention` are built here with onnx.helper. `--full` also quantizes resnet_small and
transformer_encoder themselves (for benchmarks; not committed). Per model: `quantize_dynamic`
(ConvInteger, MatMulInteger, DynamicQuantizeLSTM, QAttention), `quantize_static` in QDQ and
QOperator formats (QLinearConv, com.microsoft QLinearAdd/QGemm/QLinearSoftmax...) calibrated on
seeded inputs, the com.microsoft 16-bit QDQ form, and `MatMulNBitsQuantizer` (MatMulNBits,
GatherBlockQuantized). Seeded throughout: a rerun writes the same models.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
Feeds = dict[str, np.ndarray]
# sizes for the symbolic dimensions of the models' inputs
DIMS = {"batch": 2, "N": 4, "seq": 8}


def feeds_for(model: onnx.ModelProto, rng: np.random.Generator) -> Feeds:
    """Seeded inputs for a model: floats standard normal, token ids below 50."""
    out = {}
    inits = {i.name for i in model.graph.initializer}
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


# --- source models ------------------------------------------------------------------------------

def _strip(model: onnx.ModelProto) -> onnx.ModelProto:
    """Without the exporter's per-node metadata (half of a small file's bytes)."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    del model.graph.value_info[:]
    return model


def resnet_half() -> onnx.ModelProto:
    """models/resnet_small.onnx at half width: every conv keeps its first half of channels."""
    model = _strip(onnx.load(os.path.join(MODELS, "resnet_small.onnx")))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for name, v in list(inits.items()):
        if v.ndim == 4:  # conv weights (M, C, k, k); the stem keeps its 3 input channels
            inputs = v.shape[1] if v.shape[1] == 3 else v.shape[1] // 2
            inits[name] = v[: v.shape[0] // 2, :inputs]
        elif name.endswith("weight_bias"):
            inits[name] = v[: v.shape[0] // 2]
    inits["fc.weight"] = inits["fc.weight"][:, :32]
    inits["val_232"] = np.array([-1, 32], np.int64)  # the Reshape before the classifier
    del model.graph.initializer[:]
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in inits.items())
    model.graph.name = "resnet_half"
    return model


def _weight(rng: np.random.Generator, name: str, shape: tuple[int, ...], scale: float) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def tiny_transformer() -> onnx.ModelProto:
    """One post-norm encoder layer (d 32, 2 heads, FFN 64, GELU) over a 50-token embedding."""
    rng = np.random.default_rng(3)
    d, heads, ffn = 32, 2, 64
    names = {"emb": (50, d), "wq": (d, d), "wk": (d, d), "wv": (d, d), "wo": (d, d),
             "w1": (d, ffn), "w2": (ffn, d)}
    inits = [_weight(rng, n, s, 0.3) for n, s in names.items()]
    inits += [_weight(rng, f"b{n}", (s[1],), 0.05) for n, s in names.items() if n != "emb"]
    inits += [numpy_helper.from_array(np.ones(d, np.float32), "g"),
              numpy_helper.from_array(np.zeros(d, np.float32), "beta"),
              numpy_helper.from_array(np.array([0, 0, heads, d // heads], np.int64), "split"),
              numpy_helper.from_array(np.array([0, 0, d], np.int64), "merge"),
              numpy_helper.from_array(np.array(np.sqrt(d // heads), np.float32), "root")]
    n = [helper.make_node("Gather", ["emb", "ids"], ["x"])]
    for p in ("q", "k", "v"):
        n += [helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}0"]),
              helper.make_node("Add", [f"{p}0", f"bw{p}"], [f"{p}1"]),
              helper.make_node("Reshape", [f"{p}1", "split"], [f"{p}2"]),
              helper.make_node("Transpose", [f"{p}2"], [p], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3])]
    n += [helper.make_node("MatMul", ["q", "k"], ["s0"]), helper.make_node("Div", ["s0", "root"], ["s1"]),
          helper.make_node("Softmax", ["s1"], ["a"], axis=-1), helper.make_node("MatMul", ["a", "v"], ["c0"]),
          helper.make_node("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
          helper.make_node("Reshape", ["c1", "merge"], ["c2"]),
          helper.make_node("MatMul", ["c2", "wo"], ["o0"]), helper.make_node("Add", ["o0", "bwo"], ["o1"]),
          helper.make_node("Add", ["x", "o1"], ["r1"]),
          helper.make_node("LayerNormalization", ["r1", "g", "beta"], ["n1"], axis=-1),
          helper.make_node("MatMul", ["n1", "w1"], ["f0"]), helper.make_node("Add", ["f0", "bw1"], ["f1"]),
          helper.make_node("Gelu", ["f1"], ["f2"]),
          helper.make_node("MatMul", ["f2", "w2"], ["f3"]), helper.make_node("Add", ["f3", "bw2"], ["f4"]),
          helper.make_node("Add", ["n1", "f4"], ["r2"]),
          helper.make_node("LayerNormalization", ["r2", "g", "beta"], ["out"], axis=-1)]
    graph = helper.make_graph(n, "tiny_transformer",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "seq", d])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def tiny_lstm() -> onnx.ModelProto:
    """A one-layer bidirectional LSTM (hidden 24) followed by a MatMul head."""
    rng = np.random.default_rng(1)
    hidden, features = 24, 16
    inits = [_weight(rng, "W", (2, 4 * hidden, features), 0.3),
             _weight(rng, "R", (2, 4 * hidden, hidden), 0.3),
             _weight(rng, "B", (2, 8 * hidden), 0.1),
             _weight(rng, "head", (2 * hidden, 8), 0.3),
             numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y"], hidden_size=hidden,
                              direction="bidirectional"),
             helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["yt", "flat"], ["yf"]),
             helper.make_node("MatMul", ["yf", "head"], ["out"])]
    graph = helper.make_graph(
        nodes, "tiny_lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", features])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["seq", "batch", 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def tiny_attention() -> onnx.ModelProto:
    """com.microsoft Attention (4 heads, hidden 32) then a MatMul: quantize_dynamic -> QAttention."""
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


def repo_model(file: str) -> onnx.ModelProto:
    """A model of models/, without its exporter metadata and training section."""
    model = _strip(onnx.load(os.path.join(MODELS, file)))
    # a training section (digits_mlp) means nothing to the quantizers
    del model.training_info[:]
    keep = [o for o in model.opset_import if o.domain != "ai.onnx.preview.training"]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    return model


# name -> (builder, what to write)
SMALL = {
    "resnet_half": (resnet_half, ("dynamic", "qdq", "qop")),
    "digits_mlp": (lambda: repo_model("digits_mlp.onnx"), ("dynamic", "qdq", "qop", "qdq16")),
    "tiny_transformer": (tiny_transformer, ("dynamic", "qdq", "qop", "nbits")),
    "tiny_lstm": (tiny_lstm, ("dynamic",)),
    "tiny_attention": (tiny_attention, ("dynamic",)),
}
FULL = {
    "resnet_small": (lambda: repo_model("resnet_small.onnx"), ("dynamic", "qdq", "qop")),
    "transformer_encoder": (lambda: repo_model("transformer_encoder.onnx"),
                            ("dynamic", "qdq", "qop", "nbits")),
}


class SeededReader(CalibrationDataReader):
    """A few seeded inputs for quantize_static's MinMax calibration."""

    def __init__(self, model: onnx.ModelProto, count: int = 8) -> None:
        rng = np.random.default_rng(123)
        self._items: Iterator[Feeds] = iter([feeds_for(model, rng) for _ in range(count)])

    def get_next(self) -> Feeds | None:
        return next(self._items, None)


def quantize(model: onnx.ModelProto, src: str, kind: str, target: str) -> None:
    """Write one quantized form of the model at src."""
    if kind == "dynamic":
        quantize_dynamic(src, target, weight_type=QuantType.QInt8)
    elif kind in ("qdq", "qop"):
        quantize_static(src, target, SeededReader(model),
                        quant_format=QuantFormat.QDQ if kind == "qdq" else QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=kind == "qdq")
    elif kind == "qdq16":  # 16-bit activations need the com.microsoft Q/DQ
        quantize_static(src, target, SeededReader(model), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt16, weight_type=QuantType.QInt8,
                        extra_options={"UseQDQContribOps": True})
    elif kind == "nbits":
        # imported here: it needs onnx_ir, which only the export venv has
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        quant = MatMulNBitsQuantizer(onnx.load(src), block_size=16, is_symmetric=False,
                                     op_types_to_quantize=("MatMul", "Gather"))
        quant.process()
        quant.model.save_model_to_file(target)
    else:
        raise ValueError(kind)


def export(out: str, full: bool) -> list[str]:
    """Write every quantized form into out; returns the paths."""
    os.makedirs(out, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (build, kinds) in {**SMALL, **(FULL if full else {})}.items():
            model = build()
            src = os.path.join(tmp, f"{name}.onnx")
            onnx.save(model, src)
            for kind in kinds:
                written.append(os.path.join(out, f"{name}.{kind}.onnx"))
                quantize(model, src, kind, written[-1])
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(MODELS, "ort_quant"))
    parser.add_argument("--full", action="store_true", help="also resnet_small and transformer_encoder")
    args = parser.parse_args()
    for path in export(args.out, args.full):
        print(f"{os.path.getsize(path):8d}  {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
