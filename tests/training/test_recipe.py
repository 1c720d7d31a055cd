"""The recipe make_trainable writes (losses, learning-rate schedules, AdamW, clipping by global
norm, L2) against an independent numpy reference, on a linear model whose gradient numpy writes
by hand; and reproducibility from the recipe's seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oxla.errors import TrainingError
from oxla.training import AdamW, Momentum, Recipe, Schedule, TrainingSession, make_trainable
from tests.training.models import mlp, mlp_weights

N, D, C = 16, 6, 4


def _data(kind: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    if kind == "cross_entropy":
        return x, rng.integers(0, C, N).astype(np.int64)
    if kind == "bce_with_logits":
        return x, (rng.random((N, C)) < 0.5).astype(np.float32)
    return x, (rng.standard_normal((N, C)) * 2).astype(np.float32)


def _loss_and_dy(kind: str, y: np.ndarray, t: np.ndarray, smoothing: float = 0.0,
                 delta: float = 1.0) -> tuple[float, np.ndarray]:
    """The loss of outputs y against labels t and its gradient dL/dy, written out in float64."""
    y = y.astype(np.float64)
    if kind == "cross_entropy":
        logp = y - y.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        target = np.eye(C)[t] * (1 - smoothing) + smoothing / C
        return float(-(target * logp).sum(1).mean()), (np.exp(logp) - target) / len(y)
    d = y - t
    if kind == "mse":
        return float(np.mean(d * d)), 2 * d / d.size
    if kind == "l1":
        return float(np.mean(np.abs(d))), np.sign(d) / d.size
    if kind == "huber":
        a = np.abs(d)
        terms = np.where(a <= delta, 0.5 * d * d, delta * (a - 0.5 * delta))
        return float(terms.mean()), np.clip(d, -delta, delta) / d.size
    terms = np.maximum(y, 0) - y * t + np.log1p(np.exp(-np.abs(y)))  # bce_with_logits
    return float(terms.mean()), (1 / (1 + np.exp(-y)) - t) / y.size


LOSS_CASES = [("mse", {}), ("l1", {}), ("huber", {"huber_delta": 0.7}), ("bce_with_logits", {}),
              ("cross_entropy", {}), ("cross_entropy", {"label_smoothing": 0.2})]


@pytest.mark.parametrize(("kind", "options"), LOSS_CASES, ids=[f"{k}-{'-'.join(o) or 'plain'}" for k, o in LOSS_CASES])
def test_loss_and_one_sgd_step_equal_numpy(kind: str, options: dict[str, float]) -> None:
    w = mlp_weights((D, C))
    x, t = _data(kind)
    sess = TrainingSession(make_trainable(mlp(w), kind, Momentum(lr=0.1, alpha=0.0), recipe=Recipe(**options)))
    sess.initialize()
    loss = float(sess.step({"x": x, "labels": t}, outputs=["loss"])["loss"])
    want, dy = _loss_and_dy(kind, x.astype(np.float64) @ w["w0"] + w["b0"], t,
                            options.get("label_smoothing", 0.0), options.get("huber_delta", 1.0))
    assert loss == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(sess.state["w0"], w["w0"] - 0.1 * (x.T @ dy), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sess.state["b0"], w["b0"] - 0.1 * dy.sum(0), rtol=1e-5, atol=1e-6)


def _factor(s: Schedule, t: int) -> float:
    if s.kind == "step":
        f = s.gamma ** (t // s.step_size)
    elif s.kind == "cosine":
        f = s.floor + (1 - s.floor) * (1 + math.cos(math.pi * min(t, s.total) / s.total)) / 2
    else:
        f = 1.0
    return f * min(1.0, (t + 1) / s.warmup) if s.warmup else f


SCHEDULES = [Schedule("constant", warmup=4), Schedule("step", step_size=3, gamma=0.5),
             Schedule("step", warmup=2, step_size=4, gamma=0.1), Schedule("cosine", total=6),
             Schedule("cosine", warmup=3, total=8, floor=0.05)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.kind}-warmup{s.warmup}")
@pytest.mark.parametrize("optimizer", ["adamw", "momentum"])
def test_learning_rate_schedules_follow_the_step_counter(schedule: Schedule, optimizer: str) -> None:
    model = make_trainable(mlp(mlp_weights((D, C))), "mse", optimizer, lr=0.2, recipe=Recipe(schedule))
    name = {p.key: p.value for p in model.metadata_props}["oxla.training.scheduled_learning_rate"]
    sess = TrainingSession(model)
    sess.initialize()
    x, t = _data("mse")
    got = [float(sess.step({"x": x, "labels": t}, outputs=[name])[name]) for _ in range(10)]
    np.testing.assert_allclose(got, [0.2 * _factor(schedule, i) for i in range(10)], rtol=1e-6)


def test_adamw_with_clipping_l2_and_a_schedule_equals_numpy() -> None:
    """Gradient of mse + l2/2 |w|^2, clipped to a global norm, AdamW (ONNX Adam's formula, the
    decay applied first), the rate from a step schedule: 12 steps, each with new data."""
    w = mlp_weights((D, C))
    opt = AdamW(lr=0.05, alpha=0.8, beta=0.95, epsilon=1e-7, weight_decay=0.1)
    schedule, l2, clip = Schedule("step", warmup=2, step_size=4, gamma=0.5), 0.01, 0.3
    sess = TrainingSession(make_trainable(mlp(w), "mse", opt,
                                          recipe=Recipe(schedule, clip_norm=clip, l2=l2)))
    sess.initialize()
    p = {k: v.astype(np.float64) for k, v in w.items()}
    v = {k: np.zeros_like(a) for k, a in p.items()}
    h = {k: np.zeros_like(a) for k, a in p.items()}
    clipped = 0
    for step in range(12):
        x, t = _data("mse", seed=step)
        out = sess.step({"x": x, "labels": t}, outputs=["loss.total"])
        loss, dy = _loss_and_dy("mse", x @ p["w0"] + p["b0"], t)
        penalty = l2 / 2 * sum(float((a * a).sum()) for a in p.values())
        assert float(out["loss.total"]) == pytest.approx(loss + penalty, rel=1e-5)
        g = {"w0": x.T @ dy + l2 * p["w0"], "b0": dy.sum(0) + l2 * p["b0"]}
        norm = math.sqrt(sum(float((a * a).sum()) for a in g.values()))
        clipped += norm > clip
        lr = opt.lr * _factor(schedule, step)
        rate = lr * math.sqrt(1 - opt.beta ** (step + 1)) / (1 - opt.alpha ** (step + 1))
        for k in p:
            gk = g[k] * min(1.0, clip / (norm + 1e-6))
            v[k] = opt.alpha * v[k] + (1 - opt.alpha) * gk
            h[k] = opt.beta * h[k] + (1 - opt.beta) * gk * gk
            p[k] = p[k] * (1 - lr * opt.weight_decay) - rate * v[k] / (np.sqrt(h[k]) + opt.epsilon)
    assert clipped > 6  # the clipping is exercised, not just passed through
    for k in p:
        np.testing.assert_allclose(sess.state[k], p[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_same_seed_same_weights_bit_for_bit() -> None:
    from tests.training.models import cnn_bn
    from tests.training.test_batchnorm import _initial, _reference

    ref = _reference()
    recipe = Recipe(Schedule("cosine", warmup=2, total=6), clip_norm=1.0, l2=1e-3, seed=11)
    states = []
    for _ in range(2):
        model = make_trainable(cnn_bn(_initial(ref), dropout=0.2), "cross_entropy", AdamW(lr=0.01), recipe=recipe)
        sess = TrainingSession(model)
        sess.initialize()
        for x, y in zip(ref["x"][:5], ref["y"][:5]):
            sess.step({"x": x, "labels": y}, outputs=["loss.total"])
        states.append(sess.state)
    assert states[0].keys() == states[1].keys()
    for name in states[0]:
        np.testing.assert_array_equal(states[0][name], states[1][name], err_msg=name)


def test_recipe_errors() -> None:
    model = mlp(mlp_weights((D, C)))
    with pytest.raises(TrainingError, match="unknown schedule 'linear'"):
        make_trainable(model, "mse", recipe=Recipe(Schedule("linear")))
    with pytest.raises(TrainingError, match="label_smoothing .* needs the cross_entropy loss"):
        make_trainable(model, "mse", recipe=Recipe(label_smoothing=0.1))
    with pytest.raises(TrainingError, match="clip_norm must be positive"):
        make_trainable(model, "mse", recipe=Recipe(clip_norm=0.0))
    with pytest.raises(TrainingError, match="unknown loss 'hinge'"):
        make_trainable(model, "hinge")


def test_the_finetune_benchmarks_torch_schedule_is_oxlas() -> None:
    """benchmarks/finetune_torch.py gives PyTorch's LambdaLR finetune_common.lr_factor: it must
    be the rate oxla's Schedule("cosine", warmup=WARMUP, total=...) takes each step."""
    from benchmarks.finetune_common import LR, MOMENTUM, WARMUP, lr_factor

    total = 12
    recipe = Recipe(Schedule("cosine", warmup=WARMUP, total=total))
    model = make_trainable(mlp(mlp_weights((D, C))), "mse", Momentum(lr=LR, alpha=MOMENTUM), recipe=recipe)
    name = {p.key: p.value for p in model.metadata_props}["oxla.training.scheduled_learning_rate"]
    sess = TrainingSession(model)
    sess.initialize()
    x, t = _data("mse")
    got = [float(sess.step({"x": x, "labels": t}, outputs=[name])[name]) for _ in range(total + 2)]
    np.testing.assert_allclose(got, [LR * lr_factor(i, total) for i in range(total + 2)], rtol=1e-6)
