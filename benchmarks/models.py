"""Full-size benchmark models built with onnx.helper, laid out as PyTorch's exporter lays them out.

ResNet-50 (torchvision's Bottleneck [3, 4, 6, 3], BatchNorm folded into Conv as an eval-mode export
gives), BERT-base (12 layers, hidden 768, 12 heads, GELU as Erf, LayerNormalization) and an MLP.
Weights are random (seeded): latency does not depend on their values, and nothing is downloaded.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass
class _Builder:
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    count: int = 0

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count}"

    def weight(self, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        std = scale if scale is not None else (2.0 / max(fan_in, 1)) ** 0.5
        name = self.name("w")
        value = (self.rng.standard_normal(shape) * std).astype(np.float32)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def const(self, value: np.ndarray) -> str:
        name = self.name("c")
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: object) -> str:
        out = out or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="oxla-benchmarks")
        model.ir_version = 8
        return model


# --- ResNet-50 ------------------------------------------------------------------------------------

def _conv(b: _Builder, x: str, cin: int, cout: int, k: int, stride: int = 1, relu: bool = True) -> str:
    w = b.weight((cout, cin, k, k))
    bias = b.weight((cout,), scale=0.01)
    y = b.op("Conv", [x, w, bias], kernel_shape=[k, k], strides=[stride, stride],
             pads=[k // 2] * 4, dilations=[1, 1], group=1)
    return b.op("Relu", [y]) if relu else y


def _bottleneck(b: _Builder, x: str, cin: int, width: int, stride: int) -> tuple[str, int]:
    cout = width * 4
    y = _conv(b, x, cin, width, 1)
    y = _conv(b, y, width, width, 3, stride)
    y = _conv(b, y, width, cout, 1, relu=False)
    short = _conv(b, x, cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout else x
    return b.op("Relu", [b.op("Add", [y, short])]), cout


def resnet50(classes: int = 1000) -> onnx.ModelProto:
    """torchvision ResNet-50 v1.5 (stride on the 3x3 conv), eval export: BN folded into Conv."""
    b = _Builder()
    x = _conv(b, "input", 3, 64, 7, 2)
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for i in range(blocks):
            x, cin = _bottleneck(b, x, cin, width, 2 if i == 0 and stage > 0 else 1)
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])], axis=1)
    b.op("Gemm", [x, b.weight((classes, cin)), b.weight((classes,), 0.01)], out="logits", transB=1)
    return b.model("resnet50", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])


# --- BERT-base ------------------------------------------------------------------------------------

def _linear(b: _Builder, x: str, din: int, dout: int) -> str:
    return b.op("Add", [b.op("MatMul", [x, b.weight((din, dout), 0.02)]), b.weight((dout,), 0.02)])


def _layer_norm(b: _Builder, x: str, d: int) -> str:
    return b.op("LayerNormalization", [x, b.const(np.ones(d, np.float32)), b.const(np.zeros(d, np.float32))],
                axis=-1, epsilon=1e-12)


def _gelu(b: _Builder, x: str) -> str:
    """GELU as exporters write it without the Gelu op: x * 0.5 * (1 + erf(x / sqrt 2))."""
    erf = b.op("Erf", [b.op("Div", [x, b.const(np.array(np.sqrt(2.0), np.float32))])])
    one = b.op("Add", [erf, b.const(np.array(1.0, np.float32))])
    return b.op("Mul", [b.op("Mul", [x, one]), b.const(np.array(0.5, np.float32))])


def _attention(b: _Builder, h: str, mask: str, d: int, heads: int) -> str:
    hd = d // heads
    split = b.const(np.array([0, 0, heads, hd], np.int64))
    merge = b.const(np.array([0, 0, d], np.int64))
    q, k, v = (b.op("Reshape", [_linear(b, h, d, d), split]) for _ in range(3))
    q = b.op("Transpose", [q], perm=[0, 2, 1, 3])
    k = b.op("Transpose", [k], perm=[0, 2, 3, 1])
    v = b.op("Transpose", [v], perm=[0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k]), b.const(np.array(np.sqrt(hd), np.float32))])
    probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    return _linear(b, b.op("Reshape", [ctx, merge]), d, d)


def bert_base(layers: int = 12, d: int = 768, heads: int = 12, vocab: int = 30522, max_len: int = 512) -> onnx.ModelProto:
    """BERT-base encoder: embeddings + LayerNorm, 12 x (self-attention, GELU FFN), pooled output."""
    b = _Builder()
    words = b.op("Gather", [b.weight((vocab, d), 0.02), "input_ids"], axis=0)
    positions = b.op("Slice", [b.weight((max_len, d), 0.02), b.const(np.array([0], np.int64)),
                               b.op("Shape", ["input_ids"], start=1, end=2), b.const(np.array([0], np.int64))])
    h = _layer_norm(b, b.op("Add", [words, positions]), d)
    mask = b.op("Unsqueeze", [b.op("Cast", ["attention_mask"], to=TensorProto.FLOAT),
                              b.const(np.array([1, 2], np.int64))])
    mask = b.op("Mul", [b.op("Sub", [b.const(np.array(1.0, np.float32)), mask]),
                        b.const(np.array(-10000.0, np.float32))])
    for _ in range(layers):
        h = _layer_norm(b, b.op("Add", [h, _attention(b, h, mask, d, heads)]), d)
        ff = _linear(b, _gelu(b, _linear(b, h, d, 4 * d)), 4 * d, d)
        h = _layer_norm(b, b.op("Add", [h, ff]), d)
    first = b.op("Gather", [h, b.const(np.array(0, np.int64))], axis=1)
    b.op("Tanh", [_linear(b, first, d, d)], out="pooled")
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    am = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    return b.model("bert_base", [ids, am], [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", d])])


# --- MLP ------------------------------------------------------------------------------------------

def mlp(sizes: tuple[int, ...] = (784, 1024, 1024, 1024, 10)) -> onnx.ModelProto:
    """Gemm + Relu layers, as torch.nn.Linear exports."""
    b = _Builder()
    x = "input"
    last = len(sizes) - 2
    for i, (din, dout) in enumerate(itertools.pairwise(sizes)):
        x = b.op("Gemm", [x, b.weight((dout, din)), b.weight((dout,), 0.01)],
                 out="logits" if i == last else None, transB=1)
        if i < last:
            x = b.op("Relu", [x])
    return b.model("mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", sizes[0]])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", sizes[-1]])])
