"""Two processes on JAX's distributed runtime (127.0.0.1, gloo collectives on CPU) train to the
weights one process with the same total devices reaches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from tests.training.models import mlp, mlp_weights

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def test_two_processes_equal_one_process_with_two_devices(tmp_path: Path) -> None:
    digits = np.load(REPO / "data" / "digits.npz")
    data = tmp_path / "data.npz"
    np.savez(data, x_train=digits["x_train"][:256], y_train=digits["y_train"][:256])
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(mlp_weights((64, 16, 10))), model)
    common = [sys.executable, "-m", "oxla", "train", str(model), "--data", str(data), "--epochs", "2",
              "--batch-size", "32", "--quiet", "--optimizer", "adam", "--lr", "0.01", "--seed", "4"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    port = _free_port()
    workers = [subprocess.Popen([*common, "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
                                 "--process-id", str(i), "--out", str(tmp_path / "two.onnx")],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
    one = subprocess.run([*common, "--devices", "2", "--out", str(tmp_path / "one.onnx")], cwd=REPO,
                         env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
                         capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    for w in workers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err[-2000:]
        assert "epoch 2/2: mean loss" in out
    got, want = _weights(tmp_path / "two.onnx"), _weights(tmp_path / "one.onnx")
    assert not np.allclose(want["w0"], mlp_weights((64, 16, 10))["w0"])
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
