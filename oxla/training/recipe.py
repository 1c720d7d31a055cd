"""The parts of a training recipe make_trainable writes as standard ops in the algorithm graph:
losses, the learning-rate schedule, L2 regularisation and gradient clipping by global norm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, ValueInfoProto

from oxla.dtypes import to_numpy_dtype
from oxla.errors import TrainingError
from oxla.training.build import Plan, dims_of, value_info
from oxla.training.modes import TrainMode

LOSSES = ("cross_entropy", "mse", "l1", "huber", "bce_with_logits")
SCHEDULES = ("constant", "step", "cosine")


@dataclass(frozen=True)
class Schedule:
    """The learning rate at step t (t counts from 0), times the base rate.

    kind: "constant" (1), "step" (gamma ** floor(t / step_size)), "cosine"
        (floor + (1 - floor) * (1 + cos(pi * min(t, total) / total)) / 2).
    warmup: over the first `warmup` steps the factor is multiplied by (t + 1) / warmup.
    """

    kind: str = "constant"
    warmup: int = 0
    step_size: int = 1
    gamma: float = 0.1
    total: int = 1
    floor: float = 0.0


@dataclass(frozen=True)
class Recipe:
    """Everything make_trainable writes besides the loss and the optimizer.

    schedule: the learning-rate schedule, computed from the step counter.
    clip_norm: clip the gradients to this global L2 norm (PyTorch's clip_grad_norm_).
    l2: adds l2 / 2 * sum of squared trainable weights to the loss (gradient l2 * w).
    label_smoothing: cross_entropy's smoothing (PyTorch's CrossEntropyLoss label_smoothing).
    huber_delta: where the huber loss turns from quadratic to linear.
    seed: drives every random op of the training step (with the node and the step counter).
    mode: training-mode BatchNormalization and Dropout.
    """

    schedule: Schedule = Schedule()
    clip_norm: float | None = None
    l2: float = 0.0
    label_smoothing: float = 0.0
    huber_delta: float = 1.0
    seed: int = 0
    mode: TrainMode = field(default_factory=TrainMode)


def check_recipe(recipe: Recipe, loss: str) -> None:
    """Raises TrainingError for values no recipe can use."""
    s = recipe.schedule
    if s.kind not in SCHEDULES:
        raise TrainingError(f"unknown schedule '{s.kind}'; choose one of {', '.join(SCHEDULES)}")
    if s.warmup < 0 or s.step_size < 1 or s.total < 1:
        raise TrainingError(f"schedule needs warmup >= 0, step_size >= 1 and total >= 1, got {s}")
    if recipe.clip_norm is not None and recipe.clip_norm <= 0:
        raise TrainingError(f"clip_norm must be positive, got {recipe.clip_norm}")
    if not 0 <= recipe.label_smoothing < 1 or (recipe.label_smoothing and loss != "cross_entropy"):
        raise TrainingError(f"label_smoothing must be in [0, 1) and needs the cross_entropy loss, "
                            f"got {recipe.label_smoothing} with {loss}")
    if recipe.huber_delta <= 0:
        raise TrainingError(f"huber_delta must be positive, got {recipe.huber_delta}")


def loss_nodes(loss: str, out: ValueInfoProto, value: str, labels: str, recipe: Recipe,
               plan: Plan) -> str:
    """Add the labels input and the loss of `value` (typed like `out`); returns the loss name."""
    if not out.type.tensor_type.HasField("shape"):
        raise TrainingError(f"output '{out.name}' has no declared shape; the labels input needs one")
    elem, dims = out.type.tensor_type.elem_type, dims_of(out)
    dtype = to_numpy_dtype(elem)
    if loss == "cross_entropy":
        if len(dims) < 2:
            raise TrainingError(f"cross_entropy needs scores of shape (N, C, ...), output "
                                f"'{out.name}' has rank {len(dims)}")
        plan.inputs.append(value_info(labels, TensorProto.INT64, [dims[0], *dims[2:]]))
        name = _cross_entropy(value, labels, recipe.label_smoothing, dtype, plan)
    else:
        plan.inputs.append(value_info(labels, elem, dims))
        terms = _elementwise_loss(loss, value, labels, recipe.huber_delta, dtype, plan)
        name = plan.node("ReduceMean", [terms], "loss", keepdims=0)
    plan.outputs.append(value_info(name, elem, []))
    return name


def _cross_entropy(value: str, labels: str, smoothing: float, dtype: np.dtype, plan: Plan) -> str:
    if not smoothing:
        return plan.node("SoftmaxCrossEntropyLoss", [value, labels], "loss", reduction="mean")
    # (1 - eps) * NLL + eps * mean over classes of -log p, as PyTorch's label_smoothing
    logp = plan.node("LogSoftmax", [value], "loss.logp", axis=1)
    nll = plan.node("NegativeLogLikelihoodLoss", [logp, labels], "loss.nll", reduction="mean")
    uniform = plan.node("Neg", [plan.node("ReduceMean", [logp], "loss.mean_logp", keepdims=0)], "loss.uniform")
    return plan.node("Add", [plan.node("Mul", [nll, plan.const(1 - smoothing, "loss.keep", dtype)], "loss.nll_part"),
                             plan.node("Mul", [uniform, plan.const(smoothing, "loss.eps", dtype)], "loss.smooth")],
                     "loss")


def _elementwise_loss(loss: str, value: str, labels: str, delta: float, dtype: np.dtype, plan: Plan) -> str:
    """The per-element loss terms (their mean is the loss); mse, l1 and huber from primitive ops
    (ONNX has none of them), bce_with_logits as max(x, 0) - x * y + softplus(-|x|)."""
    if loss == "bce_with_logits":
        product = plan.node("Mul", [value, labels], "loss.xy")
        soft = plan.node("Softplus", [plan.node("Neg", [plan.node("Abs", [value], "loss.abs")], "loss.nabs")],
                         "loss.softplus")
        return plan.node("Add", [plan.node("Sub", [plan.node("Relu", [value], "loss.relu"), product],
                                           "loss.linear"), soft], "loss.terms")
    diff = plan.node("Sub", [value, labels], "loss.diff")
    if loss == "mse":
        return plan.node("Mul", [diff, diff], "loss.square")
    size = plan.node("Abs", [diff], "loss.abs")
    if loss == "l1":
        return size
    if loss != "huber":
        raise TrainingError(f"unknown loss '{loss}'; choose one of {', '.join(LOSSES)}")
    # 0.5 * q^2 + delta * (|d| - q) with q = min(|d|, delta): quadratic inside, linear outside
    q = plan.node("Min", [size, plan.const(delta, "loss.delta", dtype)], "loss.q")
    half = plan.node("Mul", [plan.node("Mul", [q, q], "loss.q2"), plan.const(0.5, "loss.half", dtype)], "loss.quad")
    linear = plan.node("Mul", [plan.node("Sub", [size, q], "loss.excess"), plan.const(delta, "loss.delta", dtype)],
                       "loss.lin")
    return plan.node("Add", [half, linear], "loss.terms")


def l2_nodes(loss: str, weights: Sequence[str], l2: float, dtype: np.dtype, plan: Plan) -> str:
    """loss + l2 / 2 * sum of squared weights (its gradient adds l2 * w)."""
    sums = [plan.node("ReduceSumSquare", [w], f"{w}.sumsq", keepdims=0) for w in weights]
    total = sums[0] if len(sums) == 1 else plan.node("Sum", sums, "loss.l2.sum")
    penalty = plan.node("Mul", [plan.node("Cast", [total], "loss.l2.cast", to=_elem(dtype)),
                                plan.const(l2 / 2, "loss.l2.half", dtype)], "loss.l2")
    return plan.node("Add", [loss, penalty], "loss.total")


def clip_nodes(grads: Sequence[str], elems: Sequence[int], max_norm: float, plan: Plan) -> list[str]:
    """Every gradient times min(1, max_norm / (norm + 1e-6)), norm the global L2 norm (as
    torch.nn.utils.clip_grad_norm_), computed in float64."""
    wide = TensorProto.DOUBLE
    sums = [plan.node("Cast", [plan.node("ReduceSumSquare", [g], f"{g}.sumsq", keepdims=0)], f"{g}.sumsq64",
                      to=wide) for g in grads]
    total = sums[0] if len(sums) == 1 else plan.node("Sum", sums, "train.grad.sumsq")
    norm = plan.node("Sqrt", [total], "train.grad.norm")
    ratio = plan.node("Div", [plan.const(max_norm, "train.clip", np.float64),
                              plan.node("Add", [norm, plan.const(1e-6, "train.clip.eps", np.float64)],
                                        "train.grad.norm_eps")], "train.clip.ratio")
    factor = plan.node("Min", [ratio, plan.const(1.0, "train.clip.one", np.float64)], "train.clip.factor")
    return [plan.node("Mul", [g, plan.node("Cast", [factor], f"{g}.factor", to=elem)], f"{g}.clipped")
            for g, elem in zip(grads, elems)]


def _elem(dtype: np.dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def schedule_nodes(schedule: Schedule, lr: str, step: str, start: int, dtype: np.dtype, plan: Plan) -> str:
    """The learning rate of this step: lr * factor(step - start); returns its name."""
    if schedule.kind == "constant" and not schedule.warmup:
        return lr
    t = plan.node("Cast", [plan.node("Sub", [step, plan.const(start, "train.start", np.int64)], "train.t")],
                  "train.tf", to=TensorProto.DOUBLE)
    factor = None
    if schedule.kind == "step":
        periods = plan.node("Floor", [plan.node("Div", [t, plan.const(float(schedule.step_size), "train.period",
                                                                      np.float64)], "train.periods")], "train.k")
        factor = plan.node("Pow", [plan.const(schedule.gamma, "train.gamma", np.float64), periods], "train.decay")
    elif schedule.kind == "cosine":
        total = plan.const(float(schedule.total), "train.total", np.float64)
        angle = plan.node("Mul", [plan.node("Div", [plan.node("Min", [t, total], "train.t_capped"), total],
                                            "train.progress"), plan.const(np.pi, "train.pi", np.float64)],
                          "train.angle")
        half = plan.node("Mul", [plan.node("Add", [plan.node("Cos", [angle], "train.cos"),
                                                   plan.const(1.0, "train.onef64", np.float64)], "train.cos1"),
                                 plan.const((1 - schedule.floor) / 2, "train.cos_scale", np.float64)], "train.cos_half")
        factor = plan.node("Add", [half, plan.const(schedule.floor, "train.floor", np.float64)], "train.cosine")
    if schedule.warmup:
        ramp = plan.node("Div", [plan.node("Add", [t, plan.const(1.0, "train.onef64", np.float64)], "train.t1"),
                                 plan.const(float(schedule.warmup), "train.warmup", np.float64)], "train.ramp")
        ramp = plan.node("Min", [ramp, plan.const(1.0, "train.onef64", np.float64)], "train.warm")
        factor = ramp if factor is None else plan.node("Mul", [factor, ramp], "train.factor")
    if factor is None:
        return lr
    scaled = plan.node("Cast", [factor], "train.factor.cast", to=_elem(dtype))
    return plan.node("Mul", [lr, scaled], "train.lr.now")
