"""Data parallel training over 4 CPU devices (a subprocess, so XLA_FLAGS applies) gives the same
weights as one device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import json, jax, numpy as np
from oxla.training import TrainingSession, make_trainable
from tests.training.models import batches, cnn, cnn_weights
model = make_trainable(cnn(cnn_weights()), "cross_entropy", "adam", lr=0.01)
data = batches((16, 1, 8, 8), 5, 20)
weights, shardings = {}, {}
for n in (1, 4):
    sess = TrainingSession(model, devices=n)
    sess.initialize()
    for x, y in data:
        loss = sess.step_async({"x": x, "labels": y}, outputs=["loss"])["loss"]
    shardings[n] = len(sess._state["fc.w"].sharding.device_set)
    weights[n] = sess.state
diff = max(float(np.max(np.abs(weights[1][k] - weights[4][k]) / (np.abs(weights[1][k]) + 1e-3)))
           for k in weights[1])
moved = float(np.max(np.abs(weights[4]["fc.w"] - cnn_weights()["fc.w"])))
try:
    TrainingSession(model, devices=4).step({"x": data[0][0][:6], "labels": data[0][1][:6]})
    error = ""
except Exception as e:
    error = str(e)
print(json.dumps({"devices": len(jax.devices()), "replicas": shardings, "diff": diff,
                  "moved": moved, "error": error}))
"""


def test_four_devices_give_the_weights_of_one() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["devices"] == 4
    assert result["replicas"] == {"1": 1, "4": 4}   # state replicated over the 4 devices
    assert result["moved"] > 1e-3
    assert result["diff"] < 1e-4, result
    assert "leading dimension 6, which does not split over 4 devices" in result["error"]
