"""`oxla train`: training from the command line, per-epoch checkpoints that survive a kill in the
middle of being written, and --resume continuing to the same weights as an uninterrupted run."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from oxla.cli import main
from tests.training.models import mlp, mlp_weights

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

# Runs `oxla train` with the checkpoint writer replaced: the 3rd write (epoch 3) stops halfway,
# tells the test, and waits to be killed.
CRASHING = """
import os, sys, time
from oxla.training import checkpoint
from oxla.cli import main
marker, real, calls = sys.argv[1], checkpoint._write_all, []
def write(f, data):
    calls.append(1)
    if len(calls) == 3:
        f.write(data[: len(data) // 2]); f.flush(); os.fsync(f.fileno())
        open(marker, "w").close()
        time.sleep(600)
    real(f, data)
checkpoint._write_all = write
sys.exit(main(sys.argv[2:]))
"""


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    digits = np.load(REPO / "data" / "digits.npz")
    data = tmp_path / "data.npz"
    np.savez(data, x_train=digits["x_train"][:256], y_train=digits["y_train"][:256],
             x_test=digits["x_test"][:64], y_test=digits["y_test"][:64])
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(mlp_weights((64, 16, 10))), model)
    return model, data


def _train(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oxla", "train", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=600)


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def _epoch(path: Path) -> str:
    return {p.key: p.value for p in onnx.load(path).metadata_props}["oxla.training.epoch"]


def test_killed_while_writing_a_checkpoint_resumes_from_the_last_good_one(tmp_path: Path) -> None:
    model, data = _setup(tmp_path)
    common = ["--data", str(data), "--epochs", "4", "--batch-size", "32", "--seed", "3"]
    recipe = ["--optimizer", "adam", "--lr", "0.01"]
    ckpt, marker = tmp_path / "run.ckpt.onnx", tmp_path / "writing"
    child = subprocess.Popen([sys.executable, "-c", CRASHING, str(marker), "train", str(model), *common,
                              *recipe, "--out", str(tmp_path / "run.onnx"), "--checkpoint", str(ckpt),
                              "--quiet"], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert child.poll() is None, child.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "the child never reached its 3rd checkpoint"
        time.sleep(0.1)
    child.send_signal(signal.SIGKILL)
    child.wait()
    partial = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(partial) == 1 and partial[0].stat().st_size < ckpt.stat().st_size
    onnx.checker.check_model(onnx.load(ckpt))        # the last good checkpoint is intact
    assert _epoch(ckpt) == "2"

    resumed = _train(str(model), *common, "--resume", str(ckpt), "--out", str(tmp_path / "resumed.onnx"),
                     "--checkpoint", str(ckpt), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "epoch 3/4" in resumed.stdout and "epoch 1/4" not in resumed.stdout
    straight = _train(str(model), *common, *recipe, "--out", str(tmp_path / "straight.onnx"), "--quiet")
    assert straight.returncode == 0, straight.stderr
    want, got = _weights(tmp_path / "straight.onnx"), _weights(tmp_path / "resumed.onnx")
    assert not np.allclose(got["w0"], mlp_weights((64, 16, 10))["w0"])
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_train_shows_progress_evaluates_and_exports(tmp_path: Path) -> None:
    model, data = _setup(tmp_path)
    done = _train(str(model), "--data", str(data), "--epochs", "2", "--optimizer", "momentum",
                  "--lr", "0.05", "--out", str(tmp_path / "t.onnx"), "--export", str(tmp_path / "i.onnx"))
    assert done.returncode == 0, done.stderr
    assert "samples/s" in done.stderr and "loss" in done.stderr        # the progress bar
    assert "epoch 2/2: mean loss" in done.stdout and "test accuracy" in done.stdout
    trained = onnx.load(tmp_path / "t.onnx")
    meta = {p.key: p.value for p in trained.metadata_props}
    assert meta["oxla.training.optimizer"] == "standard momentum" and meta["oxla.training.epoch"] == "2"
    assert not onnx.load(tmp_path / "i.onnx").training_info


def test_train_refuses_bad_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, data = _setup(tmp_path)
    if importlib.util.find_spec("matplotlib") is None:
        assert main(["train", str(model), "--data", str(data), "--plot", str(tmp_path / "l.png")]) == 2
        assert "--plot needs matplotlib, which is not installed" in capsys.readouterr().err
    trainable = tmp_path / "trainable.onnx"
    assert main(["train", str(model), "--data", str(data), "--epochs", "0", "--out", str(trainable)]) == 0
    assert main(["train", str(trainable), "--data", str(data), "--optimizer", "adagrad"]) == 2
    assert "already has a training recipe" in capsys.readouterr().err
    assert main(["train", str(model), "--data", str(tmp_path / "none.npz")]) == 2
    assert "cannot read data file" in capsys.readouterr().err
    assert main(["train", str(model), "--data", str(data), "--out", str(tmp_path / "no" / "x.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(data.read_bytes()[:200])
    assert main(["train", str(model), "--data", str(truncated)]) == 2
    assert "cannot read data file" in capsys.readouterr().err
    scalars = tmp_path / "scalars.npz"
    np.savez(scalars, x=np.float32(1.0), y=np.int64(1))
    assert main(["train", str(model), "--data", str(scalars)]) == 2
    assert "must hold one row per sample" in capsys.readouterr().err
    assert main(["train", str(model), "--data", str(data), "--epochs", "0", "--out", str(tmp_path)]) == 2
    assert "it is a directory" in capsys.readouterr().err


RECIPE_FLAGS = ["--optimizer", "adamw", "--lr", "0.02", "--weight-decay", "0.05", "--schedule", "cosine",
                "--warmup", "2", "--min-lr-ratio", "0.1", "--clip-norm", "1.0", "--l2", "1e-4",
                "--label-smoothing", "0.1", "--seed", "5"]


def test_recipe_flags_write_the_recipe_the_python_api_writes(tmp_path: Path) -> None:
    from oxla.training import AdamW, Recipe, Schedule, TrainingSession, make_trainable

    model, data = _setup(tmp_path)
    out = tmp_path / "t.onnx"
    assert main(["train", str(model), "--data", str(data), "--epochs", "1", "--batch-size", "32",
                 *RECIPE_FLAGS, "--out", str(out), "--quiet"]) == 0
    meta = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert meta["oxla.training.optimizer"] == "AdamW" and meta["oxla.training.random_seed"] == "5"
    recipe = Recipe(Schedule("cosine", warmup=2, total=8, floor=0.1), clip_norm=1.0, l2=1e-4,
                    label_smoothing=0.1, seed=5)
    sess = TrainingSession(make_trainable(onnx.load(model), "cross_entropy",
                                          AdamW(lr=0.02, weight_decay=0.05), recipe=recipe))
    sess.initialize()
    arrays = np.load(data)
    order = np.random.default_rng([5, 0]).permutation(256)  # oxla train's shuffling, epoch 0
    for i in range(8):
        idx = order[i * 32:(i + 1) * 32]
        sess.step({"x": arrays["x_train"][idx], "labels": arrays["y_train"][idx]}, outputs=["loss.total"])
    got = _weights(out)
    for name in ("w0", "b0", "w1", "b1"):
        np.testing.assert_allclose(got[name], sess.state[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_recipe_flags_are_refused_where_they_cannot_apply(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    model, data = _setup(tmp_path)
    assert main(["train", str(model), "--data", str(data), "--weight-decay", "0.1"]) == 2
    assert "--weight-decay applies to --optimizer adamw" in capsys.readouterr().err
    trainable = tmp_path / "trainable.onnx"
    assert main(["train", str(model), "--data", str(data), "--epochs", "0", "--out", str(trainable)]) == 0
    assert main(["train", str(trainable), "--data", str(data), "--clip-norm", "1", "--freeze-bn"]) == 2
    assert "--clip-norm, --freeze-bn apply to models without one" in capsys.readouterr().err


def test_external_data_checkpoints_resume(tmp_path: Path) -> None:
    model, data = _setup(tmp_path)
    ckpt, out = tmp_path / "c.onnx", tmp_path / "o.onnx"
    common = ["--data", str(data), "--batch-size", "32", "--quiet"]
    external = [*common, "--checkpoint", str(ckpt), "--external-data", "--out", str(out)]
    assert main(["train", str(model), *external, "--epochs", "1"]) == 0
    names = sorted(p.name.split(".")[0] for p in tmp_path.iterdir() if p.name.endswith(".data"))
    assert names == ["c", "o"]  # one data file beside each model
    assert main(["train", str(model), *external, "--epochs", "2", "--resume", str(ckpt)]) == 0
    assert len([p for p in tmp_path.iterdir() if p.name.endswith(".data")]) == 2  # old ones removed
    straight = tmp_path / "s.onnx"
    assert main(["train", str(model), *common, "--epochs", "2", "--out", str(straight)]) == 0
    got = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for name, value in _weights(straight).items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_a_checkpoint_whose_epoch_is_not_a_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, data = _setup(tmp_path)
    out = tmp_path / "trained.onnx"
    assert main(["train", str(model), "--data", str(data), "--epochs", "1", "--out", str(out), "--quiet"]) == 0
    edited = onnx.load(out)
    for prop in edited.metadata_props:
        if prop.key == "oxla.training.epoch":
            prop.value = "three"
    onnx.save(edited, out)
    capsys.readouterr()
    assert main(["train", str(model), "--data", str(data), "--resume", str(out), "--epochs", "2", "--quiet"]) == 2
    assert "metadata 'oxla.training.epoch' is 'three', not a whole number" in capsys.readouterr().err
