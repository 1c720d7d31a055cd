"""make_trainable / strip_training: a training section built from standard ONNX ops only
(a loss, Gradient, an optimizer op, a step counter), and the inference model back."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from onnx import (
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    ValueInfoProto,
    helper,
    numpy_helper,
)

from oxla.dtypes import is_float, to_numpy_dtype
from oxla.errors import TrainingError
from oxla.load import ModelSource, load_model
from oxla.lowering.registry import canonical_domain

TRAINING_DOMAIN = "ai.onnx.preview.training"
META = "oxla.training."
LOSSES = ("cross_entropy", "mse")


@dataclass(frozen=True)
class Adam:
    """Adam as ai.onnx.preview.training::Adam computes it (epsilon is added after the sqrt)."""

    lr: float = 1e-3
    alpha: float = 0.9
    beta: float = 0.999
    epsilon: float = 1e-6
    norm_coefficient: float = 0.0
    norm_coefficient_post: float = 0.0


@dataclass(frozen=True)
class Momentum:
    """SGD with momentum (nesterov=True: Nesterov's); alpha=0, beta=1 is plain SGD."""

    lr: float = 0.01
    alpha: float = 0.9
    beta: float = 1.0
    norm_coefficient: float = 0.0
    nesterov: bool = False


@dataclass(frozen=True)
class Adagrad:
    lr: float = 0.01
    decay_factor: float = 0.0
    epsilon: float = 1e-6
    norm_coefficient: float = 0.0


Optimizer = Adam | Momentum | Adagrad
OPTIMIZERS: dict[str, Optimizer] = {
    "adam": Adam(), "momentum": Momentum(), "nesterov": Momentum(nesterov=True),
    "adagrad": Adagrad(), "sgd": Momentum(alpha=0.0),
}


def optimizer_from(spec: str | Optimizer, lr: float | None = None) -> Optimizer:
    """An optimizer from a name in OPTIMIZERS or an instance, with `lr` overriding its rate."""
    if isinstance(spec, str):
        if spec not in OPTIMIZERS:
            raise TrainingError(f"unknown optimizer '{spec}'; choose one of {sorted(OPTIMIZERS)}")
        spec = OPTIMIZERS[spec]
    return spec if lr is None else replace(spec, lr=float(lr))


def _op_and_states(opt: Optimizer) -> tuple[str, tuple[str, ...], dict[str, Any]]:
    """(op type, optimizer state kinds per tensor, node attributes)."""
    attrs = {k: v for k, v in asdict(opt).items() if k not in ("lr", "nesterov")}
    if isinstance(opt, Adam):
        return "Adam", ("v", "h"), attrs
    if isinstance(opt, Momentum):
        return "Momentum", ("v",), {**attrs, "mode": "nesterov" if opt.nesterov else "standard"}
    return "Adagrad", ("h",), attrs


class _Names:
    """Fresh names that collide with nothing in the model."""

    def __init__(self, graph: GraphProto) -> None:
        self.used = {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
        self.used |= {t.name for t in graph.initializer} | {n for node in graph.node for n in node.output}

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            k += 1
            name = f"{base}.{k}"
        self.used.add(name)
        return name


def _value_info(name: str, elem: int, dims: Sequence[int | str | None]) -> ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(dims))


def _dims(info: ValueInfoProto) -> list[int | str | None]:
    shape = info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]


def default_trainable(model: ModelProto) -> list[str]:
    """Float initializers, except BatchNormalization's running mean and variance."""
    stats = {n.input[i] for n in model.graph.node if n.op_type == "BatchNormalization"
             for i in (3, 4) if len(n.input) > i}
    return [t.name for t in model.graph.initializer
            if is_float(to_numpy_dtype(t.data_type)) and t.name not in stats]


@dataclass
class _Plan:
    """What the algorithm graph is made of, accumulated while building it."""

    nodes: list[NodeProto]
    inits: list[TensorProto]
    inputs: list[ValueInfoProto]
    outputs: list[ValueInfoProto]
    bindings: list[tuple[str, str]]


def _loss_nodes(loss: str, out: ValueInfoProto, labels: str, names: _Names, plan: _Plan) -> str:
    elem = out.type.tensor_type.elem_type
    if not out.type.tensor_type.HasField("shape"):
        raise TrainingError(f"output '{out.name}' has no declared shape; the labels input needs one")
    dims = _dims(out)
    loss_name = names("loss")
    if loss == "cross_entropy":
        if len(dims) < 2:
            raise TrainingError(f"cross_entropy needs scores of shape (N, C, ...), output "
                                f"'{out.name}' has rank {len(dims)}")
        plan.inputs.append(_value_info(labels, TensorProto.INT64, [dims[0], *dims[2:]]))
        plan.nodes.append(helper.make_node("SoftmaxCrossEntropyLoss", [out.name, labels],
                                           [loss_name], reduction="mean", name=loss_name))
    else:  # mean squared error from primitive ops: there is no MSE op in ONNX
        plan.inputs.append(_value_info(labels, elem, dims))
        diff, square = names("loss.diff"), names("loss.square")
        plan.nodes += [helper.make_node("Sub", [out.name, labels], [diff], name=diff),
                       helper.make_node("Mul", [diff, diff], [square], name=square),
                       helper.make_node("ReduceMean", [square], [loss_name], keepdims=0, name=loss_name)]
    plan.outputs.append(_value_info(loss_name, elem, []))
    return loss_name


def _optimizer_nodes(opt: Optimizer, weights: Sequence[TensorProto], grads: Sequence[str],
                     names: _Names, plan: _Plan) -> tuple[str, str, list[tuple[str, TensorProto]]]:
    """The optimizer node and step counter; returns (lr name, counter name, [(state name, zeros)])."""
    op, kinds, attrs = _op_and_states(opt)
    wide = TensorProto.DOUBLE if all(w.data_type == TensorProto.DOUBLE for w in weights) else TensorProto.FLOAT
    lr, step, one = names("train.lr"), names("train.step"), names("train.one")
    plan.inits += [numpy_helper.from_array(np.array(opt.lr, to_numpy_dtype(wide)), lr),
                   numpy_helper.from_array(np.array(first_step(opt), np.int64), step),
                   numpy_helper.from_array(np.array(1, np.int64), one)]
    states: list[tuple[str, TensorProto]] = []
    for kind in kinds:
        for w in weights:
            zeros = np.zeros(tuple(w.dims), to_numpy_dtype(w.data_type))
            states.append((names(f"{w.name}.{kind}"), numpy_helper.from_array(zeros, "")))
    for name, zeros in states:
        zeros.name = name
        plan.inits.append(zeros)
    targets = [w.name for w in weights] + [s for s, _ in states]
    new = [names(f"{t}.new") for t in targets]
    plan.nodes.append(helper.make_node(op, [lr, step, *[w.name for w in weights], *grads,
                                            *[s for s, _ in states]], new, domain=TRAINING_DOMAIN,
                                       name=names("train.optimizer"), **attrs))
    step_new = names("train.step.new")
    plan.nodes.append(helper.make_node("Add", [step, one], [step_new], name=step_new))
    typed = [*weights, *[z for _, z in states]]
    plan.outputs += [_value_info(n, t.data_type, list(t.dims)) for n, t in zip(new, typed)]
    plan.outputs.append(_value_info(step_new, TensorProto.INT64, []))
    plan.bindings += [*zip(targets, new), (step, step_new)]
    return lr, step, states


def first_step(opt: Optimizer) -> int:
    """The step counter's first value: Momentum's T must be 0 on the first step (beta is then
    1); Adam counts from 1 so its bias correction is Kingma and Ba's (T = 0 would skip it)."""
    return 1 if isinstance(opt, Adam) else 0


def _initialization(step: str, start: int, states: Sequence[tuple[str, TensorProto]],
                    names: _Names) -> tuple[GraphProto, list[tuple[str, str]]]:
    """A graph that resets the optimizer state and the step counter (weights are kept)."""
    nodes, inits, outputs, bindings = [], [], [], []
    for state, zeros in states:
        shape, out = names(f"{state}.shape"), names(f"{state}.init")
        inits.append(numpy_helper.from_array(np.array(zeros.dims, np.int64), shape))
        value = numpy_helper.from_array(np.zeros((1,), to_numpy_dtype(zeros.data_type)), "value")
        nodes.append(helper.make_node("ConstantOfShape", [shape], [out], value=value, name=out))
        outputs.append(_value_info(out, zeros.data_type, list(zeros.dims)))
        bindings.append((state, out))
    step_init = names("train.step.init")
    nodes.append(helper.make_node("Constant", [], [step_init], name=step_init,
                                  value=numpy_helper.from_array(np.array(start, np.int64), "value")))
    outputs.append(_value_info(step_init, TensorProto.INT64, []))
    bindings.append((step, step_init))
    return helper.make_graph(nodes, "initialization", [], outputs, inits), bindings


def _check_request(model: ModelProto, loss: str, output: str, trainable: Sequence[str]) -> ValueInfoProto:
    if model.training_info:
        raise TrainingError("the model already has training_info; strip_training(model) first")
    if loss not in LOSSES:
        raise TrainingError(f"unknown loss '{loss}'; choose one of {', '.join(LOSSES)}")
    outs = {o.name: o for o in model.graph.output}
    if output not in outs or outs[output].type.WhichOneof("value") != "tensor_type":
        raise TrainingError(f"output '{output}' is not a tensor output of the model; outputs: {list(outs)}")
    inits = {t.name: t for t in model.graph.initializer}
    bad = [n for n in trainable if n not in inits or not is_float(to_numpy_dtype(inits[n].data_type))]
    if bad or not trainable:
        raise TrainingError(f"trainable tensors must be float initializers of the model; "
                            f"{bad or 'none given'} are not")
    opset = {canonical_domain(o.domain): o.version for o in model.opset_import}.get("", 0)
    if loss == "cross_entropy" and opset < 12:
        raise TrainingError(f"cross_entropy uses SoftmaxCrossEntropyLoss (opset >= 12); the model has opset {opset}")
    return outs[output]


def make_trainable(model: ModelSource, loss: str = "cross_entropy", optimizer: str | Optimizer = "adam",
                   *, lr: float | None = None, trainable: Iterable[str] | None = None,
                   output: str | None = None, labels: str = "labels") -> ModelProto:
    """A copy of `model` with a training_info built from standard ops only.

    The algorithm graph computes `loss` ("cross_entropy": SoftmaxCrossEntropyLoss over integer
    class labels; "mse": mean squared error from Sub, Mul, ReduceMean) of `output` against a new
    input `labels`, differentiates it with Gradient, and updates the weights with the optimizer
    op. The learning rate, the optimizer state and the step counter are initializers of the
    algorithm graph; the other hyper-parameters are the optimizer node's attributes. The
    initialization graph resets the optimizer state and the step counter. metadata_props
    summarise the recipe under the `oxla.training.` prefix.

    Args:
        model: the inference model (path, bytes or ModelProto).
        loss: "cross_entropy" or "mse".
        optimizer: "adam", "momentum", "nesterov", "adagrad", "sgd", or an Adam/Momentum/Adagrad.
        lr: the learning rate (overrides the optimizer's).
        trainable: initializer names to train; default every float initializer except
            BatchNormalization statistics.
        output: the graph output the loss applies to (default the first).
        labels: the name of the new labels input.

    Returns:
        The training model (the inference graph unchanged).

    Raises:
        TrainingError: an unknown loss or optimizer, a bad output or trainable name.
    """
    proto = load_model(model)
    opt = optimizer_from(optimizer, lr)
    weights = list(trainable) if trainable is not None else default_trainable(proto)
    out_info = _check_request(proto, loss, output or proto.graph.output[0].name, weights)
    names = _Names(proto.graph)
    labels = names(labels)
    plan = _Plan([], [], [], [], [])
    loss_name = _loss_nodes(loss, out_info, labels, names, plan)
    inits = {t.name: t for t in proto.graph.initializer}
    data = [i.name for i in proto.graph.input if i.name not in inits]
    grads = [names(f"{w}.grad") for w in weights]
    plan.nodes.append(helper.make_node("Gradient", [*weights, *data, labels], grads, xs=weights,
                                       zs=[*data, labels], y=loss_name, domain=TRAINING_DOMAIN,
                                       name=names("train.gradient")))
    lr_name, step, states = _optimizer_nodes(opt, [inits[w] for w in weights], grads, names, plan)
    algorithm = helper.make_graph(plan.nodes, "algorithm", plan.inputs, plan.outputs, plan.inits)
    init_graph, init_bindings = _initialization(step, first_step(opt), states, names)
    proto.training_info.append(helper.make_training_info(algorithm, plan.bindings, init_graph, init_bindings))
    _imports(proto)
    _summarise(proto, opt, loss, out_info.name, labels, lr_name, step, len(weights))
    return proto


def _imports(model: ModelProto) -> None:
    if not any(o.domain == TRAINING_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    model.ir_version = max(model.ir_version, 7)  # training_info exists from IR 7


def _summarise(model: ModelProto, opt: Optimizer, loss: str, output: str, labels: str,
               lr: str, step: str, count: int) -> None:
    op, _, attrs = _op_and_states(opt)
    props = {"optimizer": op if op != "Momentum" else attrs["mode"] + " momentum", "loss": loss,
             "output": output, "labels": labels, "learning_rate": lr, "step_counter": step,
             "hyperparameters": json.dumps({"lr": opt.lr, **attrs}), "trainable": str(count)}
    for key, value in props.items():
        model.metadata_props.add(key=META + key, value=value)


def strip_training(model: ModelSource) -> ModelProto:
    """The inference model: training_info, oxla.training metadata and an unused training
    opset import removed; initializers (the trained weights) kept."""
    out = load_model(model, check=False)
    del out.training_info[:]
    props = [(p.key, p.value) for p in out.metadata_props if not p.key.startswith(META)]
    del out.metadata_props[:]
    for key, value in props:
        out.metadata_props.add(key=key, value=value)
    used = {n.domain for n in out.graph.node} | {n.domain for f in out.functions for n in f.node}
    if TRAINING_DOMAIN not in used:
        keep = [o for o in out.opset_import if o.domain != TRAINING_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(keep)
    return out


def labels_type(model: ModelProto) -> np.dtype | None:
    """The dtype of the labels input a make_trainable model expects, if it is one."""
    meta = {p.key: p.value for p in model.metadata_props}
    name = meta.get(META + "labels")
    for info in model.training_info:
        for i in info.algorithm.input:
            if i.name == name:
                return to_numpy_dtype(i.type.tensor_type.elem_type)
    return None


__all__ = ["LOSSES", "OPTIMIZERS", "Adagrad", "Adam", "Momentum", "Optimizer", "default_trainable",
           "labels_type", "make_trainable", "optimizer_from", "strip_training"]
