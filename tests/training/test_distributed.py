"""Two processes on JAX's distributed runtime (127.0.0.1, gloo collectives on CPU), 2 CPU devices
each, train to the weights one process with 4 devices reaches: from `oxla train` and from the
Python API (`oxla.training.join`, then a TrainingSession). Each process sees only its own rows
(the CLI's others are NaN in its file, the API's are not in its file at all) and only process 0
writes files."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from oxla.errors import TrainingError
from oxla.training import join
from tests.training.distributed_worker import SIZES
from tests.training.models import mlp, mlp_weights

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # seconds for the whole group of processes
BATCH, STEPS, SEED = 32, 8, 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(devices: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}


def _run_together(commands: list[tuple[list[str], int]]) -> list[str]:
    """Start every (argv, device count) at once; their stdouts. Any failure or timeout kills the
    rest (a process left alone would wait for its peer until JAX's own 5-minute timeout)."""
    procs = [subprocess.Popen(argv, cwd=REPO, env=_env(devices), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv, devices in commands]
    deadline = time.monotonic() + TIMEOUT
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
            assert p.returncode == 0, f"{p.args[-8:]} exited {p.returncode}:\n{err[-3000:]}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return outs


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def _assert_same_trained_weights(got: Path, want: Path) -> None:
    got_w, want_w = _weights(got), _weights(want)
    initial = mlp_weights(SIZES)
    assert np.max(np.abs(want_w["w0"] - initial["w0"])) > 1e-3  # training moved the weights
    for name, value in want_w.items():
        assert np.all(np.isfinite(got_w[name])), name
        np.testing.assert_allclose(got_w[name], value, rtol=1e-4, atol=1e-6, err_msg=name)


def _digits(rows: int) -> tuple[np.ndarray, np.ndarray]:
    digits = np.load(REPO / "data" / "digits.npz")
    return digits["x_train"][:rows].astype(np.float32), digits["y_train"][:rows]


def _own_rows(process: int, rows: int) -> np.ndarray:
    """The rows `oxla train` feeds from `process` (of 2) in epoch 0: its half of every shuffled
    batch (docs/training.md: default_rng([seed, epoch]) shuffles, batches in process order)."""
    order = np.random.default_rng([SEED, 0]).permutation(rows)
    half = BATCH // 2
    return np.concatenate([order[i * BATCH + process * half:i * BATCH + (process + 1) * half]
                           for i in range(rows // BATCH)])


def test_cli_two_processes_of_two_devices_equal_one_process_of_four(tmp_path: Path) -> None:
    rows = BATCH * STEPS
    x, y = _digits(rows)
    np.savez(tmp_path / "data.npz", x_train=x, y_train=y)
    for p in range(2):  # every row this process must not read is NaN: reading one poisons the run
        poisoned = np.full_like(x, np.nan)
        poisoned[_own_rows(p, rows)] = x[_own_rows(p, rows)]
        np.savez(tmp_path / f"data{p}.npz", x_train=poisoned, y_train=y)
    model = tmp_path / "mlp.onnx"
    onnx.save(mlp(mlp_weights(SIZES)), model)
    common = [sys.executable, "-m", "oxla", "train", str(model), "--epochs", "1", "--batch-size",
              str(BATCH), "--quiet", "--optimizer", "adam", "--lr", "0.01", "--seed", str(SEED)]
    port = _free_port()
    one, *two = _run_together(
        [([*common, "--data", str(tmp_path / "data.npz"), "--devices", "4", "--out",
           str(tmp_path / "one.onnx")], 4)]
        + [([*common, "--data", str(tmp_path / f"data{p}.npz"), "--coordinator", f"127.0.0.1:{port}",
             "--num-processes", "2", "--process-id", str(p), "--out", str(tmp_path / f"two{p}.onnx")], 2)
           for p in range(2)])
    _assert_same_trained_weights(tmp_path / "two0.onnx", tmp_path / "one.onnx")
    assert (tmp_path / "two0.ckpt.onnx").exists()
    assert not (tmp_path / "two1.onnx").exists() and not (tmp_path / "two1.ckpt.onnx").exists()
    loss = re.compile(r"epoch 1/1: mean loss (\S+),")
    want = loss.findall(one)
    assert want and all(loss.findall(out) == want for out in two), (one, two)


def test_api_two_processes_of_two_devices_equal_one_process_of_four(tmp_path: Path) -> None:
    x, y = _digits(BATCH * STEPS)
    x, y = x.reshape(STEPS, BATCH, -1), y.reshape(STEPS, BATCH)
    np.savez(tmp_path / "all.npz", x=x, y=y)
    half = BATCH // 2
    for p in range(2):  # each process's file holds its rows of every batch and nothing else
        np.savez(tmp_path / f"part{p}.npz", x=x[:, p * half:(p + 1) * half], y=y[:, p * half:(p + 1) * half])
    worker = [sys.executable, "-m", "tests.training.distributed_worker"]
    port = _free_port()
    one, *two = _run_together(
        [([*worker, str(tmp_path / "all.npz"), str(tmp_path / "one.onnx"), "--devices", "4"], 4)]
        + [([*worker, str(tmp_path / f"part{p}.npz"), str(tmp_path / f"two{p}.onnx"), "--coordinator",
             f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(p)], 2) for p in range(2)])
    _assert_same_trained_weights(tmp_path / "two0.onnx", tmp_path / "one.onnx")
    assert not (tmp_path / "two1.onnx").exists()  # save() on process 1 writes nothing
    want = json.loads(one.strip().splitlines()[-1])
    assert (want["processes"], want["devices"]) == (1, 4)
    for p, out in enumerate(two):
        got = json.loads(out.strip().splitlines()[-1])
        assert (got["process"], got["processes"], got["devices"]) == (p, 2, 4)
        np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-4)


def test_join_refuses_a_process_id_out_of_range() -> None:
    with pytest.raises(TrainingError, match="process id 2 is out of range for 2 processes"):
        join("127.0.0.1:1", num_processes=2, process_id=2)
