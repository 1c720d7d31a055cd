"""Random values of a training step in standard ops: a counter-based hash of (the recipe's
seed, the step counter, the node, the element), so the same seed gives the same values."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import NodeProto, TensorProto, helper

from oxla.dtypes import to_numpy_dtype
from oxla.errors import TrainingError
from oxla.training.build import Plan

if TYPE_CHECKING:
    from oxla.training.modes import Facts

# splitmix64's constants; xor is replaced by add (as good a mix for masks and samples, and
# BitwiseXor needs opset 18 while Add, Mul and BitShift on uint64 exist from opset 11)
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
STREAM = 0xD6E8FEB86659FD93
RANDOM_OPS = ("RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Bernoulli")


class Seeded:
    """Replaces one node (its index in the inference graph) by its seeded training form."""

    def __init__(self, step: str, seed: str, index: int, plan: Plan) -> None:
        self.step, self.seed, self.index, self.plan = step, seed, index, plan

    def replace(self, node: NodeProto, inputs: list[str], outputs: dict[str, str], facts: Facts) -> None:
        if node.op_type == "Dropout":
            self._dropout(node, inputs, outputs, facts)
        else:
            self._random(node, inputs, outputs[node.output[0]], facts)

    def uniform(self, shape: str, base: str, stream: int = 0) -> str:
        """float32 values uniform on [0, 1) of the (runtime) shape `shape`: 24 bits of
        splitmix64(key + position * GOLDEN), key from seed, step, node and stream."""
        p, u64 = self.plan, TensorProto.UINT64
        key = p.node("Add", [
            p.node("Mul", [p.node("Cast", [self.seed], "train.seed.u64", to=u64),
                           p.const(MIX1, "train.mix1", np.uint64)], "train.seed.mixed"),
            p.node("Mul", [p.node("Cast", [self.step], "train.step.u64", to=u64),
                           p.const(MIX2, "train.mix2", np.uint64)], "train.step.mixed")], f"{base}.key")
        salt = ((self.index + 1) * GOLDEN + stream * STREAM) % 2**64
        key = p.node("Add", [key, p.const(salt, f"{base}.node", np.uint64)], f"{base}.key")
        count = p.node("Squeeze", [p.node("ReduceProd", [shape], f"{base}.count", keepdims=1)], f"{base}.count0")
        position = p.node("Range", [p.const(0, "train.zero", np.int64), count, p.const(1, "train.one", np.int64)],
                          f"{base}.position")
        z = p.node("Mul", [p.node("Cast", [position], f"{base}.position.u64", to=u64),
                           p.const(GOLDEN, "train.golden", np.uint64)], f"{base}.hash")
        z = p.node("Add", [z, key], f"{base}.hash")
        for shift, mul in ((30, MIX1), (27, MIX2), (31, None)):
            z = p.node("Add", [z, p.node("BitShift", [z, p.const(shift, f"train.shift{shift}", np.uint64)],
                                         f"{base}.hash", direction="RIGHT")], f"{base}.hash")
            if mul is not None:
                z = p.node("Mul", [z, p.const(mul, f"train.mul{shift}", np.uint64)], f"{base}.hash")
        top = p.node("BitShift", [z, p.const(40, "train.shift40", np.uint64)], f"{base}.bits", direction="RIGHT")
        flat = p.node("Mul", [p.node("Cast", [top], f"{base}.bitsf", to=TensorProto.FLOAT),
                              p.const(2.0 ** -24, "train.ulp24", np.float32)], f"{base}.uniform")
        return p.node("Reshape", [flat, shape], f"{base}.uniform")

    def _dropout(self, node: NodeProto, inputs: list[str], outputs: dict[str, str], facts: Facts) -> None:
        """Y = X * keep / (1 - ratio), keep = uniform >= ratio."""
        p, x, ratio = self.plan, inputs[0], _ratio(node, inputs, facts)
        elem = facts.elem.get(node.input[0], TensorProto.FLOAT)
        uniform = self.uniform(p.node("Shape", [x], f"{x}.shape"), x)
        keep = p.node("Not", [p.node("Less", [uniform, p.const(ratio, f"{x}.ratio", np.float32)],
                                     f"{x}.drop")], f"{x}.keep")
        scale = p.node("Mul", [p.node("Cast", [keep], f"{x}.scale", to=elem),
                               p.const(1 / (1 - ratio) if ratio < 1 else 0.0, f"{x}.inv_keep",
                                       to_numpy_dtype(elem))], f"{x}.scale")
        p.nodes.append(helper.make_node("Mul", [x, scale], [outputs[node.output[0]]],
                                        name=p.names(f"{node.name or 'dropout'}.train")))
        if len(node.output) > 1 and node.output[1]:
            p.nodes.append(helper.make_node("Cast", [keep], [outputs[node.output[1]]], name=p.names(f"{x}.mask"),
                                            to=TensorProto.BOOL if facts.opset >= 10 else elem))

    def _random(self, node: NodeProto, inputs: list[str], out: str, facts: Facts) -> None:
        """RandomUniform/RandomNormal(Like) and Bernoulli from seeded uniforms (Box-Muller for
        the normal); the attributes (shape, dtype, low/high, mean/scale) keep their meaning."""
        p = self.plan
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if inputs:
            shape = p.node("Shape", [inputs[0]], f"{out}.shape")
            elem = attrs.get("dtype") or facts.elem.get(node.input[0], TensorProto.FLOAT)
        else:
            shape = p.const(list(attrs.get("shape", [])), f"{out}.shape", np.int64)
            elem = attrs.get("dtype", TensorProto.FLOAT)
        u = self.uniform(shape, out)
        if node.op_type == "Bernoulli":
            probability = p.node("Cast", [inputs[0]], f"{out}.p", to=TensorProto.FLOAT)
            value = p.node("Less", [u, probability], f"{out}.draw")
        elif node.op_type.startswith("RandomUniform"):
            low, high = float(attrs.get("low", 0.0)), float(attrs.get("high", 1.0))
            value = _affine(p, u, high - low, low, out)
        else:  # sqrt(-2 ln(1 - u1)) * cos(2 pi u2): 1 - u1 is in (0, 1], its log finite
            radius = p.node("Sqrt", [p.node("Mul", [p.node("Log", [p.node("Sub", [
                p.const(1.0, "train.one32", np.float32), u], f"{out}.u1")], f"{out}.log"),
                p.const(-2.0, "train.minus2", np.float32)], f"{out}.r2")], f"{out}.radius")
            angle = _affine(p, self.uniform(shape, out, stream=1), 2 * np.pi, 0.0, f"{out}.angle")
            normal = p.node("Mul", [radius, p.node("Cos", [angle], f"{out}.cos")], f"{out}.normal")
            value = _affine(p, normal, float(attrs.get("scale", 1.0)), float(attrs.get("mean", 0.0)), out)
        p.nodes.append(helper.make_node("Cast", [value], [out], name=p.names(f"{node.name or out}.train"),
                                        to=elem))


def _affine(p: Plan, x: str, scale: float, shift: float, base: str) -> str:
    return p.node("Add", [p.node("Mul", [x, p.const(scale, f"{base}.scale", np.float32)], f"{base}.scaled"),
                          p.const(shift, f"{base}.shift", np.float32)], f"{base}.affine")


def _ratio(node: NodeProto, inputs: list[str], facts: Facts) -> float:
    if facts.opset >= 12:
        if len(inputs) < 2 or not inputs[1]:
            return 0.5
        ratio = facts.static(inputs[1])
        if ratio is None:
            raise TrainingError(f"Dropout '{node.name}': the ratio must be a constant or an "
                                f"initializer to train with dropout; '{inputs[1]}' is computed")
        return float(ratio)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return float(attrs.get("ratio", 0.5))
