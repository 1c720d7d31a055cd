"""onnxruntime as an exact oracle for uint8 x int8 products on every x86 CPU.

On x86 CPUs without AVX-VNNI (AMD Zen 2 and 3, Intel before Cascade Lake) onnxruntime's integer
GEMM multiplies uint8 activations by int8 weights with `vpmaddubsw`, which adds each pair of
products in int16 with saturation: 255 * 127 * 2 > 32767, so MatMulInteger, QLinearConv, QGemm,
DynamicQuantizeMatMul, QAttention... there return sums the spec does not (ONNX asks for exact
int32 sums; oxla computes them). Its uint8 x uint8 and int8 x int8 kernels widen to int16 first
and are exact. onnxruntime's quantization docs name the issue ("U8S8 ... saturation") and tell
users to quantize with reduce_range there.

`reference(model)` is what the tests give onnxruntime: the model itself where onnxruntime is exact
on this CPU (`saturates()` probes it once), else a copy whose constant int8 weights read against
uint8 activations are re-expressed as uint8 (w + 128 with zero point + 128: w - zero point, and so
every product, is unchanged), which onnxruntime computes on its exact uint8 x uint8 kernels. oxla
always runs the model as given.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"

# (domain, op) -> ((activation input or None: quantized to uint8 inside, weight, weight zero point), ...)
WEIGHTS: dict[tuple[str, str], tuple[tuple[int | None, int, int], ...]] = {
    ("", "MatMulInteger"): ((0, 1, 3),),
    ("", "ConvInteger"): ((0, 1, 3),),
    ("", "QLinearConv"): ((0, 3, 5),),
    ("", "QLinearMatMul"): ((0, 3, 5),),
    (MS, "QLinearConv"): ((0, 3, 5),),
    (MS, "QGemm"): ((0, 3, 5),),
    (MS, "MatMulIntegerToFloat"): ((0, 1, 5),),
    (MS, "QAttention"): ((0, 1, 7),),
    (MS, "DynamicQuantizeMatMul"): ((None, 1, 3),),
    (MS, "DynamicQuantizeLSTM"): ((None, 1, 9), (None, 2, 11)),
}
# ops whose quantized output has the type of their input 0
PASS_THROUGH = frozenset({"MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
                          "Identity", "Slice", "Gather", "Pad", "Resize", "Split", "Concat",
                          "SpaceToDepth", "DepthToSpace", "Expand", "Tile"})


@functools.cache
def saturates() -> bool:
    """Whether onnxruntime's uint8 x int8 MatMulInteger saturates on this CPU."""
    import onnxruntime as ort

    w = numpy_helper.from_array(np.full((64, 16), 127, np.int8), "w")
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["x", "w"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.UINT8, [4, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = session.run(None, {"x": np.full((4, 64), 255, np.uint8)})[0]
    return int(y[0, 0]) != 255 * 127 * 64


def reference(model: onnx.ModelProto, *, force: bool = False) -> onnx.ModelProto:
    """`model` where onnxruntime is exact here (or nothing to change), else the uint8 form."""
    if not (force or saturates()):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    uint8_weights(out)
    return out


def uint8_weights(model: onnx.ModelProto) -> int:
    """Re-express constant int8 weights read against uint8 activations as uint8, in place.

    Covers the integer products of WEIGHTS and, for QDQ graphs that onnxruntime fuses, constant
    int8 DequantizeLinear inputs that feed a Conv, MatMul or Gemm whose data input is dequantized
    from uint8. Returns how many weights changed.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    types = _element_types(graph, inits)
    producer = {o: n for n in graph.node for o in n.output if o}
    changed = 0

    def shift(node: onnx.NodeProto, wi: int, zi: int, like: str = "") -> bool:
        """Point node's input `wi` (a constant int8 weight) and `zi` (its int8 zero point, or
        none: zero, shaped like initializer `like`, else a scalar) at new uint8 initializers."""
        name = node.input[wi]
        zp = node.input[zi] if len(node.input) > zi and node.input[zi] else None
        if name not in inits or inits[name].data_type != TensorProto.INT8:
            return False
        if zp and (zp not in inits or inits[zp].data_type != TensorProto.INT8):
            return False
        w = numpy_helper.to_array(inits[name]).astype(np.int16) + 128
        z = (numpy_helper.to_array(inits[zp]).astype(np.int16) + 128 if zp
             else np.full(tuple(inits[like].dims) if like in inits else (), 128, np.int16))
        new_w, new_z = f"{name}__uint8", f"{zp or name}__uint8_zero_point"
        for n, v in ((new_w, w), (new_z, z)):
            if n not in inits:
                inits[n] = numpy_helper.from_array(v.astype(np.uint8), n)
                graph.initializer.append(inits[n])
        while len(node.input) <= zi:
            node.input.append("")
        node.input[wi], node.input[zi] = new_w, new_z
        return True

    for node in graph.node:
        key = (node.domain if node.domain != "ai.onnx" else "", node.op_type)
        for act, wi, zi in WEIGHTS.get(key, ()):
            if act is not None and (len(node.input) <= act or types.get(node.input[act]) != TensorProto.UINT8):
                continue
            if len(node.input) > wi and shift(node, wi, zi):
                changed += 1
        if node.op_type in ("Conv", "MatMul", "Gemm") and key[0] == "" and len(node.input) > 1:
            x, w = (producer.get(node.input[0]), producer.get(node.input[1]))
            if x and w and x.op_type == w.op_type == "DequantizeLinear" \
                    and types.get(x.input[0]) == TensorProto.UINT8 and shift(w, 0, 2, like=w.input[1]):
                changed += 1
    return changed


def _element_types(graph: onnx.GraphProto, inits: Mapping[str, onnx.TensorProto]) -> dict[str, int]:
    """Element types of the graph's tensors, as far as quantized graphs need them."""
    types = {name: t.data_type for name, t in inits.items()}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        if vi.type.tensor_type.elem_type:
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    for node in graph.node:
        if not node.output or not node.output[0]:
            continue
        out = None
        if node.op_type == "QuantizeLinear":
            out = types.get(node.input[2], TensorProto.UINT8) if len(node.input) > 2 and node.input[2] \
                else TensorProto.UINT8
        elif node.op_type == "DynamicQuantizeLinear":
            out = TensorProto.UINT8
        elif node.domain == MS and node.op_type == "QLinearConcat":
            out = types.get(node.input[1])
        elif node.op_type in ("QLinearConv", "QLinearMatMul"):  # y_zero_point before the bias
            out = types.get(node.input[7]) if len(node.input) > 7 else None
        elif node.domain == MS and node.op_type.startswith("QLinear"):  # y_zero_point last
            out = types.get(node.input[-1])
        elif node.domain == MS and node.op_type == "QGemm" and len(node.input) > 8 and node.input[8]:
            out = types.get(node.input[8])
        elif node.op_type in PASS_THROUGH and node.domain in ("", "ai.onnx") and node.input:
            out = types.get(node.input[0])
        if out is not None:
            types.setdefault(node.output[0], out)
    return types
