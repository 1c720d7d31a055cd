"""Training mode: a Conv/BatchNorm network trained by oxla equals PyTorch train() mode (weights
and running statistics, recorded in data/bn_torch.npz by torch_bn_reference.py); frozen
BatchNorm; ONNX's and PyTorch's running-variance conventions; seeded Dropout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from oxla.training import (
    Adam,
    AdamW,
    Momentum,
    Recipe,
    Schedule,
    TrainingSession,
    TrainMode,
    make_trainable,
)
from oxla.training.make import Optimizer
from tests.training.models import cnn_bn

REFERENCE = Path(__file__).with_name("data") / "bn_torch.npz"
RTOL, ATOL = 1e-3, 1e-5
CASES: dict[str, tuple[Optimizer, Recipe]] = {
    "sgd": (Momentum(lr=0.05, alpha=0.9, beta=1.0), Recipe()),
    "adam": (Adam(lr=0.01, epsilon=1e-8), Recipe()),
    "adamw": (AdamW(lr=0.01, epsilon=1e-8, weight_decay=0.05), Recipe()),
    # torch_bn_reference.warmup_cosine, epsilon 1e-12 (where ONNX's Adam and PyTorch's add it
    # differs, see there),, clip_grad_norm_(0.5), CrossEntropyLoss(label_smoothing=0.1)
    "recipe": (AdamW(lr=0.01, epsilon=1e-12, weight_decay=0.05),
               Recipe(Schedule("cosine", warmup=3, total=8, floor=0.1), clip_norm=0.5, label_smoothing=0.1)),
}


def _reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE) as f:
        return {k: f[k] for k in f.files}


def _initial(ref: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k.removeprefix("init/"): v for k, v in ref.items() if k.startswith("init/")}


def _train(model: onnx.ModelProto, xs: np.ndarray, ys: np.ndarray) -> TrainingSession:
    sess = TrainingSession(model)
    sess.initialize()
    for x, y in zip(xs, ys):
        sess.step({"x": x, "labels": y}, outputs=["loss"])
    return sess


@pytest.mark.parametrize("case", list(CASES))
def test_conv_batchnorm_training_equals_pytorch_train_mode(case: str) -> None:
    ref = _reference()
    initial = _initial(ref)
    opt, recipe = CASES[case]
    sess = _train(make_trainable(cnn_bn(initial), "cross_entropy", opt, recipe=recipe), ref["x"], ref["y"])
    state = sess.state
    for name in initial:  # every weight and both BatchNorms' running mean and variance
        assert not np.array_equal(state[name], initial[name]), name
        np.testing.assert_allclose(state[name], ref[f"{case}/{name}"], rtol=RTOL, atol=ATOL, err_msg=name)


def test_old_opset_batchnorm_trains_the_same() -> None:
    ref = _reference()
    initial = _initial(ref)
    opt, _ = CASES["sgd"]
    sess = _train(make_trainable(cnn_bn(initial, opset=13), "cross_entropy", opt), ref["x"], ref["y"])
    for name in initial:
        np.testing.assert_allclose(sess.state[name], ref[f"sgd/{name}"], rtol=RTOL, atol=ATOL, err_msg=name)


def test_frozen_batchnorm_keeps_statistics_and_uses_them() -> None:
    ref = _reference()
    initial = _initial(ref)
    model = make_trainable(cnn_bn(initial), "cross_entropy", Momentum(lr=0.0, alpha=0.0),
                           recipe=Recipe(mode=TrainMode(freeze_batch_norm=True)))
    sess = TrainingSession(model)
    sess.initialize()
    (logits,) = sess.run(None, {"x": ref["x"][0]})
    loss = float(sess.step({"x": ref["x"][0], "labels": ref["y"][0]}, outputs=["loss"])["loss"])
    shifted = logits - logits.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    assert loss == pytest.approx(-logp[np.arange(len(logp)), ref["y"][0]].mean(), rel=1e-5)
    assert all(np.array_equal(sess.state[f"bn{i}.{k}"], initial[f"bn{i}.{k}"]) for i in (1, 2) for k in ("mean", "var"))
    assert not {b.key for b in sess.bindings()} & {f"bn{i}.{k}" for i in (1, 2) for k in ("mean", "var")}


def test_running_variance_conventions() -> None:
    """ONNX's training outputs keep the population variance, PyTorch the unbiased one:
    (unbiased - var * m) = (population - var * m) * n / (n - 1), n values per channel."""
    ref = _reference()
    initial = _initial(ref)
    stats = {}
    for unbiased in (True, False):
        model = make_trainable(cnn_bn(initial), "cross_entropy", Momentum(lr=0.0, alpha=0.0),
                               recipe=Recipe(mode=TrainMode(unbiased_running_var=unbiased)))
        stats[unbiased] = _train(model, ref["x"][:1], ref["y"][:1]).state
    for i, n in ((1, 16 * 8 * 8), (2, 16 * 4 * 4)):
        kept = initial[f"bn{i}.var"] * np.float32(0.8)
        np.testing.assert_allclose(stats[True][f"bn{i}.var"] - kept,
                                   (stats[False][f"bn{i}.var"] - kept) * n / (n - 1), rtol=1e-4, atol=1e-7)
        np.testing.assert_array_equal(stats[True][f"bn{i}.mean"], stats[False][f"bn{i}.mean"])
        assert not np.allclose(stats[True][f"bn{i}.mean"], initial[f"bn{i}.mean"])


def _dropout_run(seed: int, steps: int = 4) -> tuple[dict[str, np.ndarray], list[float]]:
    ref = _reference()
    model = make_trainable(cnn_bn(_initial(ref), dropout=0.5), "cross_entropy", Adam(lr=0.01),
                           recipe=Recipe(seed=seed))
    sess = TrainingSession(model)
    sess.initialize()
    losses = [float(sess.step({"x": x, "labels": y}, outputs=["loss"])["loss"])
              for x, y in zip(ref["x"][:steps], ref["y"][:steps])]
    return sess.state, losses


def test_dropout_is_reproducible_from_the_recipe_seed() -> None:
    first, losses = _dropout_run(7)
    again, losses_again = _dropout_run(7)
    other, other_losses = _dropout_run(8)
    assert losses == losses_again and losses != other_losses
    for name in ("conv1.w", "fc.w", "bn2.mean"):
        np.testing.assert_array_equal(first[name], again[name])  # bit for bit
        assert not np.array_equal(first[name], other[name])


def _dropout_mask_loss(model_seed: int, ratio: float, steps: int) -> list[float]:
    """mean((dropout(x * w))^2) with x = w = 1 and labels 0: the kept fraction / (1 - ratio)^2."""
    w = onnx.numpy_helper.from_array(np.ones((100, 100), np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Mul", ["x", "w"], ["h"]),
         onnx.helper.make_node("Constant", [], ["r"], value=onnx.numpy_helper.from_array(np.array(ratio, np.float32))),
         onnx.helper.make_node("Dropout", ["h", "r"], ["y"], name="drop")],
        "drop", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [100, 100])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [100, 100])], [w])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    sess = TrainingSession(make_trainable(model, "mse", Momentum(lr=0.0, alpha=0.0), recipe=Recipe(seed=model_seed)))
    sess.initialize()
    feeds = {"x": np.ones((100, 100), np.float32), "labels": np.zeros((100, 100), np.float32)}
    return [float(sess.step(feeds, outputs=["loss"])["loss"]) for _ in range(steps)]


@pytest.mark.parametrize("ratio", [0.1, 0.5])
def test_dropout_mask_keeps_one_minus_ratio_and_changes_every_step(ratio: float) -> None:
    losses = _dropout_mask_loss(3, ratio, 4)
    kept = [loss * (1 - ratio) ** 2 for loss in losses]
    # 10000 Bernoulli draws: 4 standard deviations of the kept fraction is under 0.012
    assert all(abs(k - (1 - ratio)) < 0.012 for k in kept), kept
    assert len(set(losses)) == len(losses)


@pytest.mark.parametrize("opset", [13, 17])
def test_checker_accepts_training_mode_graphs(opset: int) -> None:
    from oxla.training.bindings import combined_model, parse_training

    recipe = Recipe(Schedule("step", warmup=2, step_size=3), clip_norm=1.0, l2=1e-4, label_smoothing=0.1)
    model = make_trainable(cnn_bn(_initial(_reference()), opset=opset, dropout=0.3), "cross_entropy",
                           AdamW(), recipe=recipe)
    onnx.checker.check_model(combined_model(model, parse_training(model)[0]), full_check=True)
    domains = {n.domain for n in model.training_info[0].algorithm.node}
    assert domains <= {"", "ai.onnx.preview.training"}


def test_trained_running_statistics_serve_inference_and_onnxruntime(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    ref = _reference()
    opt, _ = CASES["sgd"]
    sess = _train(make_trainable(cnn_bn(_initial(ref)), "cross_entropy", opt), ref["x"][:4], ref["y"][:4])
    sess.export_inference(tmp_path / "infer.onnx")
    x = ref["x"][5]
    (ours,) = sess.run(None, {"x": x})
    theirs = ort.InferenceSession(str(tmp_path / "infer.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(ours, theirs[0], rtol=1e-4, atol=1e-5)
    # the exported file holds the trained running statistics (inference reads them, not the batch's)
    assert not np.allclose(sess.state["bn1.mean"], _initial(ref)["bn1.mean"])


def test_dropout_ratio_must_be_constant() -> None:
    from oxla.errors import TrainingError

    model = cnn_bn(_initial(_reference()), dropout=0.5)
    node = next(n for n in model.graph.node if n.op_type == "Dropout")
    node.input[1] = "rate"
    model.graph.input.append(onnx.helper.make_tensor_value_info("rate", onnx.TensorProto.FLOAT, []))
    with pytest.raises(TrainingError, match="Dropout 'drop': the ratio must be a constant"):
        make_trainable(model, "cross_entropy", "sgd")


def _noise_model(op: str, **attrs: float) -> onnx.ModelProto:
    """y = x * w + noise, noise from a random op of h = x * w (w = 0: the loss against zero
    labels is the noise's mean square)."""
    h = onnx.helper
    noise = [h.make_node("Sigmoid", ["h"], ["p"]), h.make_node(op, ["p"], ["n"], name="noise")] \
        if op == "Bernoulli" else [h.make_node(op, ["h"], ["n"], name="noise", **attrs)]
    graph = h.make_graph([h.make_node("Mul", ["x", "w"], ["h"]), *noise, h.make_node("Add", ["h", "n"], ["y"])],
                         "noise", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [100, 100])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [100, 100])],
                         [onnx.numpy_helper.from_array(np.zeros((100, 100), np.float32), "w")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize(("op", "attrs", "mean_square"), [
    ("RandomNormalLike", {"mean": 0.0, "scale": 2.0}, 4.0),
    ("RandomUniformLike", {"low": -1.0, "high": 1.0}, 1 / 3),
    ("Bernoulli", {}, 0.5),
])
def test_random_ops_draw_from_the_recipe_seed(op: str, attrs: dict[str, float], mean_square: float) -> None:
    feeds = {"x": np.ones((100, 100), np.float32), "labels": np.zeros((100, 100), np.float32)}
    runs = []
    for seed in (1, 1, 2):
        sess = TrainingSession(make_trainable(_noise_model(op, **attrs), "mse", Momentum(lr=0.0, alpha=0.0),
                                              recipe=Recipe(seed=seed)))
        sess.initialize()
        runs.append([float(sess.step(feeds, outputs=["loss"])["loss"]) for _ in range(3)])
    assert runs[0] == runs[1] and runs[0] != runs[2] and len(set(runs[0])) == 3
    # 10000 draws: the mean square is within 5% of its expectation
    assert all(abs(v - mean_square) < 0.05 * mean_square for run in runs for v in run), runs
