"""make_trainable / strip_training: standard ops only, accepted by onnx.checker, round trip through
a file and a fresh process, onnxruntime agreement after training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from oxla.errors import TrainingError
from oxla.training import Momentum, TrainingSession, make_trainable, strip_training
from oxla.training.bindings import combined_model, parse_training
from tests.training.models import cnn, cnn_weights, mlp, mlp_weights

REPO = Path(__file__).resolve().parents[2]
STANDARD = {"", "ai.onnx", "ai.onnx.preview.training"}


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("optimizer", ["adam", "momentum", "nesterov", "adagrad", "sgd"])
def test_checker_accepts_the_algorithm_joined_to_the_inference_graph(loss: str, optimizer: str) -> None:
    model = make_trainable(mlp(mlp_weights()), loss, optimizer, lr=0.01)
    onnx.checker.check_model(model, full_check=True)
    stage = parse_training(model)[0]
    onnx.checker.check_model(combined_model(model, stage), full_check=True)
    init = onnx.helper.make_model(model.training_info[0].initialization, opset_imports=model.opset_import)
    onnx.checker.check_model(init, full_check=True)
    domains = {n.domain for g in (model.graph, model.training_info[0].algorithm) for n in g.node}
    assert domains <= STANDARD


def test_recipe_is_stored_in_the_model_and_summarised() -> None:
    model = make_trainable(cnn(cnn_weights()), "cross_entropy", Momentum(lr=0.03, beta=0.5, nesterov=True))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["oxla.training.optimizer"] == "nesterov momentum"
    assert json.loads(meta["oxla.training.hyperparameters"]) == {
        "lr": 0.03, "alpha": 0.9, "beta": 0.5, "norm_coefficient": 0.0, "mode": "nesterov"}
    assert meta["oxla.training.trainable"] == "6"
    algorithm = model.training_info[0].algorithm
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in algorithm.initializer}
    assert float(inits[meta["oxla.training.learning_rate"]]) == pytest.approx(0.03)
    assert int(inits[meta["oxla.training.step_counter"]]) == 0
    (opt,) = [n for n in algorithm.node if n.op_type == "Momentum"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in opt.attribute}
    assert attrs["mode"] == b"nesterov" and attrs["beta"] == pytest.approx(0.5)


def test_strip_training_gives_the_inference_model_back() -> None:
    original = mlp(mlp_weights())
    stripped = strip_training(make_trainable(original, "mse", "adam"))
    assert stripped.graph == original.graph
    assert not stripped.training_info and not stripped.metadata_props
    assert "ai.onnx.preview.training" not in {o.domain for o in stripped.opset_import}


def test_mse_regression_trains() -> None:
    weights = mlp_weights((4, 8, 2))
    sess = TrainingSession(make_trainable(mlp(weights), "mse", "adam", lr=0.01))
    sess.initialize()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 4)).astype(np.float32)
    y = np.stack([x[:, 0] - x[:, 1], x[:, 2] * 0.5], axis=1).astype(np.float32)
    losses = [float(sess.step({"x": x, "labels": y}, outputs=["loss"])["loss"]) for _ in range(100)]
    assert losses[-1] < 0.2 * losses[0]
    (pred,) = sess.run(None, {"x": x})
    assert float(np.mean((pred - y) ** 2)) == pytest.approx(losses[-1], rel=0.2)


def test_make_trainable_errors() -> None:
    model = mlp(mlp_weights())
    with pytest.raises(TrainingError, match="unknown loss 'hinge'"):
        make_trainable(model, "hinge")
    with pytest.raises(TrainingError, match="unknown optimizer 'lbfgs'"):
        make_trainable(model, optimizer="lbfgs")
    with pytest.raises(TrainingError, match=r"\['nope'\] are not"):
        make_trainable(model, trainable=["nope"])
    with pytest.raises(TrainingError, match="output 'h0' is not a tensor output"):
        make_trainable(model, output="h0")
    with pytest.raises(TrainingError, match="already has training_info"):
        make_trainable(make_trainable(model))


CHILD = """
import sys, numpy as np
from oxla.training import TrainingSession, strip_training
from oxla.training.checkpoint import save_model
from tests.training.models import batches
sess = TrainingSession(sys.argv[1])
sess.initialize()
for x, y in batches((8, 1, 8, 8), 5, 20):
    sess.step({"x": x, "labels": y}, outputs=["loss"])
x = np.random.default_rng(7).standard_normal((6, 1, 8, 8)).astype(np.float32)
save_model(strip_training(sess.model()), sys.argv[2])
np.savez(sys.argv[3], x=x, logits=sess.run(None, {"x": x})[0], step=sess.state["train.step"])
"""


def test_saved_model_trains_in_a_fresh_process_and_agrees_with_onnxruntime(tmp_path: Path) -> None:
    weights = cnn_weights()
    path = tmp_path / "trainable.onnx"
    onnx.save(make_trainable(cnn(weights), "cross_entropy", "adam", lr=0.01), path)
    out, result = tmp_path / "trained_inference.onnx", tmp_path / "result.npz"
    subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), str(result)], cwd=REPO,
                   check=True, timeout=600, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    got = np.load(result)
    assert int(got["step"]) == 21  # Adam's counter starts at 1
    trained = onnx.load(out)
    assert not trained.training_info
    moved = onnx.numpy_helper.to_array(next(t for t in trained.graph.initializer if t.name == "fc.w"))
    assert not np.allclose(moved, weights["fc.w"])
    ref = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": got["x"]})[0]
    np.testing.assert_allclose(got["logits"], ref, rtol=1e-4, atol=1e-5)
