"""Small ONNX models for the training tests (an MLP, a CNN) with their initial weights."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 17


def _model(name: str, nodes: list[onnx.NodeProto], x: onnx.ValueInfoProto, out_dims: list,
           weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    elem = helper.np_dtype_to_tensor_dtype(next(iter(weights.values())).dtype)
    graph = helper.make_graph(nodes, name, [x], [helper.make_tensor_value_info("logits", elem, out_dims)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    return model


def mlp_weights(sizes: tuple[int, ...] = (12, 16, 5), seed: int = 0,
                dtype: type = np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i, (din, dout) in enumerate(itertools.pairwise(sizes)):
        out[f"w{i}"] = (rng.standard_normal((din, dout)) * np.sqrt(2 / din)).astype(dtype)
        out[f"b{i}"] = (rng.standard_normal(dout) * 0.1).astype(dtype)
    return out


def mlp(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x[N, D] -> Gemm -> Relu -> ... -> Gemm -> logits."""
    layers = len(weights) // 2
    nodes, x = [], "x"
    for i in range(layers):
        out = "logits" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [out]))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [out], [f"r{i}"]))
            out = f"r{i}"
        x = out
    elem = helper.np_dtype_to_tensor_dtype(weights["w0"].dtype)
    din, dout = weights["w0"].shape[0], weights[f"w{layers - 1}"].shape[1]
    return _model("mlp", nodes, helper.make_tensor_value_info("x", elem, ["N", din]), ["N", dout], weights)


def cnn_weights(seed: int = 0, classes: int = 5, dtype: type = np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "conv1.w": (rng.standard_normal((4, 1, 3, 3)) * np.sqrt(2 / 9)).astype(dtype),
        "conv1.b": (rng.standard_normal(4) * 0.1).astype(dtype),
        "conv2.w": (rng.standard_normal((6, 4, 3, 3)) * np.sqrt(2 / 36)).astype(dtype),
        "conv2.b": (rng.standard_normal(6) * 0.1).astype(dtype),
        "fc.w": (rng.standard_normal((6 * 4 * 4, classes)) * np.sqrt(2 / 96)).astype(dtype),
        "fc.b": np.zeros(classes, dtype),
    }


def cnn(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """x[N, 1, 8, 8] -> Conv 3x3 -> Relu -> Conv 3x3 stride 2 -> Relu -> Flatten -> Gemm.

    Downsampling is a strided convolution: MaxPool and AveragePool are not differentiable in oxla
    yet (their reduce_window gets a traced init value, which JAX cannot differentiate).
    """
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Flatten", ["r2"], ["f"]),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"]),
    ]
    elem = helper.np_dtype_to_tensor_dtype(weights["conv1.w"].dtype)
    x = helper.make_tensor_value_info("x", elem, ["N", 1, 8, 8])
    return _model("cnn", nodes, x, ["N", weights["fc.b"].shape[0]], weights)


def batches(shape: tuple[int, ...], classes: int, steps: int, seed: int = 1,
            dtype: type = np.float32) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` random batches labelled by a fixed random linear teacher (a learnable task)."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((int(np.prod(shape[1:])), classes))
    out = []
    for _ in range(steps):
        x = rng.standard_normal(shape).astype(dtype)
        out.append((x, (x.reshape(shape[0], -1) @ teacher).argmax(1).astype(np.int64)))
    return out


def cnn_bn(weights: dict[str, np.ndarray], momentum: float = 0.8, opset: int = OPSET,
           dropout: float | None = None) -> onnx.ModelProto:
    """x[N, 1, 8, 8] -> Conv -> BatchNorm -> Relu -> Conv stride 2 -> BatchNorm -> Relu -> [Dropout]
    -> Flatten -> Gemm: tests/training/torch_bn_reference.py's network."""
    def bn(i: int, x: str, y: str) -> onnx.NodeProto:
        return helper.make_node("BatchNormalization", [x, f"bn{i}.scale", f"bn{i}.bias", f"bn{i}.mean",
                                                       f"bn{i}.var"], [y], momentum=momentum, name=f"bn{i}")
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w"], ["c1"], pads=[1, 1, 1, 1]),
        bn(1, "c1", "n1"), helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2.w"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        bn(2, "c2", "n2"), helper.make_node("Relu", ["n2"], ["r2"]),
    ]
    if dropout is not None:
        ratio = numpy_helper.from_array(np.array(dropout, np.float32), "ratio")
        nodes += [helper.make_node("Constant", [], ["ratio"], value=ratio),
                  helper.make_node("Dropout", ["r2", "ratio"], ["d2"], name="drop")]
    nodes += [helper.make_node("Flatten", ["d2" if dropout is not None else "r2"], ["f"]),
              helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"])]
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 1, 8, 8])
    model = _model("cnn_bn", nodes, x, ["N", weights["fc.b"].shape[0]], weights)
    model.opset_import[0].version = opset
    return model
