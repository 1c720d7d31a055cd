"""Training-mode forward pass: the inference nodes downstream of BatchNormalization, Dropout and
random ops, copied into the algorithm graph with batch statistics and seeded random values."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from oxla.dtypes import to_numpy_dtype
from oxla.errors import TrainingError
from oxla.graph import inferred_types
from oxla.lowering.registry import canonical_domain
from oxla.training.build import Plan
from oxla.training.randomness import RANDOM_OPS, Seeded


@dataclass(frozen=True)
class TrainMode:
    """How the training step's forward pass differs from inference.

    freeze_batch_norm: keep BatchNormalization in inference mode (stored statistics, never
        updated), as when fine-tuning a head on a frozen backbone.
    unbiased_running_var: update the running variance with the unbiased batch variance
        (PyTorch's convention); False uses the population variance ONNX's training-mode
        outputs define.
    dropout: Dropout drops (a mask from the recipe's seed, the node and the step counter).

    RandomUniform, RandomNormal (and *Like) and Bernoulli always draw from the recipe's seed
    in the training step, as Dropout does.
    """

    freeze_batch_norm: bool = False
    unbiased_running_var: bool = True
    dropout: bool = True


@dataclass(frozen=True)
class Facts:
    """What the copy needs to know about the inference graph."""

    opset: int
    tensors: dict[str, TensorProto]   # initializers and Constant values, read when needed
    elem: dict[str, int]              # element types the shape inference found

    def static(self, name: str) -> np.ndarray | None:
        return numpy_helper.to_array(self.tensors[name]) if name in self.tensors else None


def _graph_facts(model: ModelProto) -> Facts:
    opset = {canonical_domain(o.domain): o.version for o in model.opset_import}.get("", 0)
    tensors = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            tensors[n.output[0]] = n.attribute[0].t
    inferred = inferred_types(model)
    elem = {v.name: v.type.tensor_type.elem_type
            for v in [*inferred.input, *inferred.value_info, *inferred.output]}
    elem.update({t.name: t.data_type for t in model.graph.initializer})
    return Facts(opset, tensors, elem)


def training_forward(model: ModelProto, output: str, step: str, seed: str, plan: Plan,
                     mode: TrainMode) -> str:
    """Copy the nodes between the mode-dependent ones and `output` into `plan` in training mode.

    Returns:
        The name of `output`'s training-mode value (`output` itself when nothing changes).

    Raises:
        TrainingError: a Dropout ratio that is not a constant.
    """
    facts = _graph_facts(model)
    renamed: dict[str, str] = {}
    for index, node in enumerate(model.graph.node):
        changes = _changes_mode(node, mode)
        if not changes and not any(i in renamed for i in node.input):
            continue
        inputs = [renamed.get(i, i) for i in node.input]
        outputs = {o: plan.names(f"{o}.train") for o in node.output if o}
        if changes and node.op_type == "BatchNormalization":
            _batch_norm(node, inputs, outputs, facts, plan, mode)
        elif changes:
            Seeded(step, seed, index, plan).replace(node, inputs, outputs, facts)
        else:
            copy = NodeProto()
            copy.CopyFrom(node)
            copy.name = plan.names(f"{node.name or node.op_type}.train")
            copy.input[:] = inputs
            copy.output[:] = [outputs.get(o, o) for o in node.output]
            plan.nodes.append(copy)
        renamed.update(outputs)
    return renamed.get(output, output)


def _changes_mode(node: NodeProto, mode: TrainMode) -> bool:
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "BatchNormalization":
        return not mode.freeze_batch_norm
    if node.op_type == "Dropout":
        return mode.dropout
    return node.op_type in RANDOM_OPS


def _batch_norm(node: NodeProto, inputs: list[str], outputs: dict[str, str], facts: Facts,
                plan: Plan, mode: TrainMode) -> None:
    """BatchNormalization with batch statistics; the running statistics are bound as updates."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    momentum = float(attrs.get("momentum", 0.9))
    y = outputs[node.output[0]]
    mean_new, var_new = plan.names(f"{inputs[3]}.batch"), plan.names(f"{inputs[4]}.batch")
    if facts.opset >= 14:
        attrs["training_mode"] = 1
    elif facts.opset < 7:
        attrs["is_test"] = 0
    # before opset 14 the training outputs exist when named; either way Y uses the batch's
    # statistics and running = stored * momentum + batch * (1 - momentum)
    # opsets 7-13 allow 1 or 5 outputs: the last two (the batch's statistics) go unused
    saved = [plan.names(f"{inputs[3]}.saved"), plan.names(f"{inputs[4]}.saved")] if facts.opset < 14 else []
    plan.nodes.append(helper.make_node("BatchNormalization", inputs[:5], [y, mean_new, var_new, *saved],
                                       name=plan.names(f"{node.name or 'bn'}.train"), **attrs))
    if mode.unbiased_running_var:
        var_new = _unbiased(inputs[0], inputs[4], var_new, momentum, facts, plan)
    for key, value in ((inputs[3], mean_new), (inputs[4], var_new)):
        if key not in facts.tensors:
            raise TrainingError(f"BatchNormalization '{node.name}': running statistic '{key}' "
                                f"is not an initializer, so it cannot be updated")
        elem = facts.elem.get(key, TensorProto.FLOAT)
        shape = list(facts.tensors[key].dims)
        plan.outputs.append(helper.make_tensor_value_info(value, elem, shape))
        plan.bindings.append((key, value))


def _unbiased(x: str, var: str, onnx_var: str, momentum: float, facts: Facts, plan: Plan) -> str:
    """var * m + (onnx_var - var * m) * n / (n - 1): the population variance ONNX's running_var
    holds, rescaled to the unbiased one PyTorch keeps (n values per channel)."""
    dtype = to_numpy_dtype(facts.elem.get(var, TensorProto.FLOAT))
    size = plan.node("Size", [x], f"{x}.size")
    channels = plan.node("Gather", [plan.node("Shape", [x], f"{x}.shape"),
                                    plan.const(1, "train.one.index", np.int64)], f"{x}.channels")
    n = plan.node("Cast", [plan.node("Div", [size, channels], f"{x}.count")], f"{x}.countf",
                  to=helper.np_dtype_to_tensor_dtype(dtype))
    factor = plan.node("Div", [n, plan.node("Sub", [n, plan.const(1, "train.onef", dtype)], f"{x}.count1")],
                       f"{x}.bessel")
    kept = plan.node("Mul", [var, plan.const(momentum, "train.momentum", dtype)], f"{var}.kept")
    added = plan.node("Mul", [plan.node("Sub", [onnx_var, kept], f"{var}.added"), factor], f"{var}.unbiased")
    return plan.node("Add", [kept, added], f"{var}.running")
