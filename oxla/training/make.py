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
    TensorProto,
    ValueInfoProto,
    helper,
    numpy_helper,
)

from oxla.dtypes import is_float, to_numpy_dtype
from oxla.errors import TrainingError
from oxla.load import ModelSource, load_model
from oxla.lowering.registry import canonical_domain
from oxla.training.build import Names, Plan, value_info
from oxla.training.modes import training_forward
from oxla.training.recipe import (
    LOSSES,
    Recipe,
    check_recipe,
    clip_nodes,
    l2_nodes,
    loss_nodes,
    schedule_nodes,
)

TRAINING_DOMAIN = "ai.onnx.preview.training"
META = "oxla.training."


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
class AdamW:
    """Adam with decoupled weight decay (Loshchilov and Hutter, PyTorch's AdamW): each weight
    is first scaled by 1 - lr * weight_decay, then the Adam op updates it."""

    lr: float = 1e-3
    alpha: float = 0.9
    beta: float = 0.999
    epsilon: float = 1e-6
    weight_decay: float = 0.01


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


Optimizer = Adam | AdamW | Momentum | Adagrad
OPTIMIZERS: dict[str, Optimizer] = {
    "adam": Adam(), "adamw": AdamW(), "momentum": Momentum(), "nesterov": Momentum(nesterov=True),
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
    attrs = {k: v for k, v in asdict(opt).items() if k not in ("lr", "nesterov", "weight_decay")}
    if isinstance(opt, Adam | AdamW):
        return "Adam", ("v", "h"), attrs
    if isinstance(opt, Momentum):
        return "Momentum", ("v",), {**attrs, "mode": "nesterov" if opt.nesterov else "standard"}
    return "Adagrad", ("h",), attrs


def default_trainable(model: ModelProto) -> list[str]:
    """Float initializers, except BatchNormalization's running mean and variance."""
    stats = {n.input[i] for n in model.graph.node if n.op_type == "BatchNormalization"
             for i in (3, 4) if len(n.input) > i}
    return [t.name for t in model.graph.initializer
            if is_float(to_numpy_dtype(t.data_type)) and t.name not in stats]


def _optimizer_nodes(opt: Optimizer, weights: Sequence[TensorProto], grads: Sequence[str], step: str,
                     recipe: Recipe, plan: Plan) -> tuple[str, str, list[tuple[str, TensorProto]]]:
    """The learning rate (scheduled), the optimizer node and step + 1; returns (base lr name,
    this step's lr name, [(state name, zeros)])."""
    op, kinds, attrs = _op_and_states(opt)
    wide = TensorProto.DOUBLE if all(w.data_type == TensorProto.DOUBLE for w in weights) else TensorProto.FLOAT
    lr = plan.const(opt.lr, "train.lr", to_numpy_dtype(wide))
    plan.inits.append(numpy_helper.from_array(np.array(first_step(opt), np.int64), step))
    rate = schedule_nodes(recipe.schedule, lr, step, first_step(opt), to_numpy_dtype(wide), plan)
    if rate != lr:
        plan.outputs.append(value_info(rate, wide, []))
    states: list[tuple[str, TensorProto]] = []
    for kind in kinds:
        for w in weights:
            zeros = numpy_helper.from_array(np.zeros(tuple(w.dims), to_numpy_dtype(w.data_type)), "")
            zeros.name = plan.names(f"{w.name}.{kind}")
            states.append((zeros.name, zeros))
            plan.inits.append(zeros)
    current = [w.name for w in weights]
    if isinstance(opt, AdamW):  # decoupled decay: w * (1 - lr * weight_decay), then Adam
        keep = plan.node("Sub", [plan.const(1.0, "train.onew", to_numpy_dtype(wide)), plan.node(
            "Mul", [rate, plan.const(opt.weight_decay, "train.weight_decay", to_numpy_dtype(wide))],
            "train.decay")], "train.keep")
        current = [plan.node("Mul", [w.name, plan.node("Cast", [keep], f"{w.name}.keep", to=w.data_type)],
                             f"{w.name}.decayed") for w in weights]
    targets = [w.name for w in weights] + [s for s, _ in states]
    new = [plan.names(f"{t}.new") for t in targets]
    plan.nodes.append(helper.make_node(op, [rate, step, *current, *grads, *[s for s, _ in states]], new,
                                       domain=TRAINING_DOMAIN, name=plan.names("train.optimizer"), **attrs))
    step_new = plan.node("Add", [step, plan.const(1, "train.one", np.int64)], "train.step.new")
    typed = [*weights, *[z for _, z in states]]
    plan.outputs += [value_info(n, t.data_type, list(t.dims)) for n, t in zip(new, typed)]
    plan.outputs.append(value_info(step_new, TensorProto.INT64, []))
    plan.bindings += [*zip(targets, new), (step, step_new)]
    return lr, rate, states


def first_step(opt: Optimizer) -> int:
    """The step counter's first value: Momentum's T must be 0 on the first step (beta is then
    1); Adam counts from 1 so its bias correction is Kingma and Ba's (T = 0 would skip it)."""
    return 1 if isinstance(opt, Adam | AdamW) else 0


def _initialization(step: str, start: int, states: Sequence[tuple[str, TensorProto]],
                    names: Names) -> tuple[GraphProto, list[tuple[str, str]]]:
    """A graph that resets the optimizer state and the step counter (weights are kept)."""
    nodes, inits, outputs, bindings = [], [], [], []
    for state, zeros in states:
        shape, out = names(f"{state}.shape"), names(f"{state}.init")
        inits.append(numpy_helper.from_array(np.array(zeros.dims, np.int64), shape))
        value = numpy_helper.from_array(np.zeros((1,), to_numpy_dtype(zeros.data_type)), "value")
        nodes.append(helper.make_node("ConstantOfShape", [shape], [out], value=value, name=out))
        outputs.append(value_info(out, zeros.data_type, list(zeros.dims)))
        bindings.append((state, out))
    step_init = names("train.step.init")
    nodes.append(helper.make_node("Constant", [], [step_init], name=step_init,
                                  value=numpy_helper.from_array(np.array(start, np.int64), "value")))
    outputs.append(value_info(step_init, TensorProto.INT64, []))
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
                   output: str | None = None, labels: str = "labels",
                   recipe: Recipe | None = None) -> ModelProto:
    """A copy of `model` with a training_info built from standard ops only.

    The algorithm graph runs the forward pass in training mode (BatchNormalization on batch
    statistics, its running statistics updated; Dropout dropping, its masks drawn from the
    recipe's seed, the node and the step counter), computes `loss` of `output` against a new
    input `labels` (plus the L2 penalty), differentiates it with Gradient, clips the gradients,
    and updates the weights with the optimizer op at the scheduled learning rate. The base
    learning rate, the seed, the optimizer state and the step counter are initializers of the
    algorithm graph; the other hyper-parameters are node attributes or constants. The
    initialization graph resets the optimizer state and the step counter. metadata_props
    summarise the recipe under the `oxla.training.` prefix.

    Args:
        model: the inference model (path, bytes or ModelProto).
        loss: one of LOSSES: "cross_entropy" (integer class labels), "mse", "l1", "huber",
            "bce_with_logits".
        optimizer: a name in OPTIMIZERS, or an Adam/AdamW/Momentum/Adagrad.
        lr: the base learning rate (overrides the optimizer's).
        trainable: initializer names to train; default every float initializer except
            BatchNormalization statistics.
        output: the graph output the loss applies to (default the first).
        labels: the name of the new labels input.
        recipe: schedule, clipping, L2, label smoothing, seed, training modes (Recipe()).

    Returns:
        The training model (the inference graph unchanged).

    Raises:
        TrainingError: an unknown loss or optimizer, a bad output or trainable name, a recipe
            value out of range.
    """
    proto = load_model(model)
    opt = optimizer_from(optimizer, lr)
    recipe = recipe or Recipe()
    weights = list(trainable) if trainable is not None else default_trainable(proto)
    out_info = _check_request(proto, loss, output or proto.graph.output[0].name, weights)
    check_recipe(recipe, loss)
    plan = Plan(Names(proto.graph))
    labels, step = plan.names(labels), plan.names("train.step")
    seed = plan.const(recipe.seed, "train.seed", np.int64)
    value = training_forward(proto, out_info.name, step, seed, plan, recipe.mode)
    loss_name = loss_nodes(loss, out_info, value, labels, recipe, plan)
    inits = {t.name: t for t in proto.graph.initializer}
    if recipe.l2:
        loss_name = _with_l2(loss_name, weights, recipe.l2, out_info, plan)
    data = [i.name for i in proto.graph.input if i.name not in inits]
    grads = [plan.names(f"{w}.grad") for w in weights]
    plan.nodes.append(helper.make_node("Gradient", [*weights, *data, labels], grads, xs=weights,
                                       zs=[*data, labels], y=loss_name, domain=TRAINING_DOMAIN,
                                       name=plan.names("train.gradient")))
    # Gradient has no type inference: declare dW's type for the nodes that read it
    plan.value_infos += [value_info(g, inits[w].data_type, list(inits[w].dims)) for g, w in zip(grads, weights)]
    if recipe.clip_norm is not None:
        grads = clip_nodes(grads, [inits[w].data_type for w in weights], recipe.clip_norm, plan)
    lr_name, rate, states = _optimizer_nodes(opt, [inits[w] for w in weights], grads, step, recipe, plan)
    algorithm = helper.make_graph(plan.nodes, "algorithm", plan.inputs, plan.outputs, plan.inits,
                                  value_info=plan.value_infos)
    init_graph, init_bindings = _initialization(step, first_step(opt), states, plan.names)
    proto.training_info.append(helper.make_training_info(algorithm, plan.bindings, init_graph, init_bindings))
    _imports(proto)
    _summarise(proto, opt, loss, out_info.name, labels, (lr_name, rate), step, len(weights), recipe, seed)
    return proto


def _with_l2(loss: str, weights: Sequence[str], l2: float, out: ValueInfoProto, plan: Plan) -> str:
    """The L2 penalty joins the loss output: the loss the step reports includes it."""
    total = l2_nodes(loss, weights, l2, to_numpy_dtype(out.type.tensor_type.elem_type), plan)
    plan.outputs[[o.name for o in plan.outputs].index(loss)] = value_info(
        total, out.type.tensor_type.elem_type, [])
    return total


def _imports(model: ModelProto) -> None:
    if not any(o.domain == TRAINING_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(TRAINING_DOMAIN, 1))
    model.ir_version = max(model.ir_version, 7)  # training_info exists from IR 7


def _summarise(model: ModelProto, opt: Optimizer, loss: str, output: str, labels: str,
               lr: tuple[str, str], step: str, count: int, recipe: Recipe, seed: str) -> None:
    op, _, attrs = _op_and_states(opt)
    name = {"Momentum": f"{attrs.get('mode')} momentum", "Adam": "AdamW" if isinstance(opt, AdamW) else "Adam"}
    extra = {"weight_decay": opt.weight_decay} if isinstance(opt, AdamW) else {}
    props = {"optimizer": name.get(op, op), "loss": loss,
             "output": output, "labels": labels, "learning_rate": lr[0], "step_counter": step,
             "hyperparameters": json.dumps({"lr": opt.lr, **attrs, **extra}), "trainable": str(count),
             "recipe": json.dumps(_recipe_summary(recipe)), "random_seed": str(recipe.seed),
             "seed_initializer": seed}
    if lr[1] != lr[0]:  # an algorithm output: the scheduled rate of each step
        props["scheduled_learning_rate"] = lr[1]
    for key, value in props.items():
        model.metadata_props.add(key=META + key, value=value)


def _recipe_summary(recipe: Recipe) -> dict[str, Any]:
    out = asdict(recipe)
    out.pop("seed")
    return out


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


__all__ = ["LOSSES", "OPTIMIZERS", "Adagrad", "Adam", "AdamW", "Momentum", "Optimizer", "default_trainable",
           "labels_type", "make_trainable", "optimizer_from", "strip_training"]
