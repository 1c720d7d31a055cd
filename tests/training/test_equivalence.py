"""An MLP and a small CNN trained 50 steps by oxla from training_info equal an independent
reference (plain JAX forward and jax.grad, the optimizers written from the spec in numpy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxla.training import Adagrad, Adam, Momentum, TrainingSession, make_trainable
from oxla.training.make import Optimizer
from tests.training.models import batches, cnn, cnn_weights, mlp, mlp_weights

STEPS = 50
RTOL, ATOL = 1e-4, 1e-6
OPTIMIZERS = {
    "adam": Adam(lr=0.01, norm_coefficient=1e-3, norm_coefficient_post=1e-4),
    "momentum": Momentum(lr=0.05, alpha=0.9, beta=0.5, norm_coefficient=1e-3),
    "nesterov": Momentum(lr=0.05, alpha=0.9, beta=0.5, norm_coefficient=1e-3, nesterov=True),
    "adagrad": Adagrad(lr=0.05, decay_factor=0.01, epsilon=1e-6, norm_coefficient=1e-3),
}


# --- the reference ----------------------------------------------------------------------------

def mlp_forward(p: dict[str, Any], x: Any) -> Any:
    h = jnp.maximum(x @ p["w0"] + p["b0"], 0.0)
    return h @ p["w1"] + p["b1"]


def cnn_forward(p: dict[str, Any], x: Any) -> Any:
    def conv(h: Any, w: Any, b: Any, stride: int) -> Any:
        out = jax.lax.conv_general_dilated(h, w, (stride, stride), [(1, 1), (1, 1)],
                                           dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jnp.maximum(out + b[None, :, None, None], 0.0)

    h = conv(conv(x, p["conv1.w"], p["conv1.b"], 1), p["conv2.w"], p["conv2.b"], 2)
    return h.reshape(x.shape[0], -1) @ p["fc.w"] + p["fc.b"]


def cross_entropy(forward: Callable[..., Any]) -> Callable[..., Any]:
    def loss(p: dict[str, Any], x: Any, y: Any) -> Any:
        logp = jax.nn.log_softmax(forward(p, x), axis=1)
        return -jnp.mean(logp[jnp.arange(x.shape[0]), y])
    return loss


def reference_step(opt: Optimizer, p: dict, g: dict, state: dict, t: int) -> None:
    """One update of every tensor, from the pseudo-code of onnx/defs/training/defs.cc."""
    for k in p:
        x, gr = p[k], opt.norm_coefficient * p[k] + g[k]
        if isinstance(opt, Adam):
            v = opt.alpha * state["v"][k] + (1 - opt.alpha) * gr
            h = opt.beta * state["h"][k] + (1 - opt.beta) * gr * gr
            r = opt.lr * np.sqrt(1 - opt.beta ** t) / (1 - opt.alpha ** t) if t > 0 else opt.lr
            p[k] = (1 - opt.norm_coefficient_post) * (x - np.float32(r) * v / (np.sqrt(h) + opt.epsilon))
            state["v"][k], state["h"][k] = v, h
        elif isinstance(opt, Momentum):
            v = opt.alpha * state["v"][k] + (opt.beta if t > 0 else 1.0) * gr
            p[k] = x - opt.lr * (gr + opt.alpha * v if opt.nesterov else v)
            state["v"][k] = v
        else:
            h = state["h"][k] + gr * gr
            p[k] = x - np.float32(opt.lr / (1 + t * opt.decay_factor)) * gr / (np.sqrt(h) + opt.epsilon)
            state["h"][k] = h


def reference_train(opt: Optimizer, forward: Callable[..., Any], weights: dict[str, np.ndarray],
                    data: list) -> dict[str, np.ndarray]:
    grad = jax.jit(jax.grad(cross_entropy(forward)))
    p = {k: v.copy() for k, v in weights.items()}
    state = {kind: {k: np.zeros_like(v) for k, v in p.items()} for kind in ("v", "h")}
    t = 1 if isinstance(opt, Adam) else 0  # make_trainable's step counter starts here
    for x, y in data:
        g = {k: np.asarray(v) for k, v in grad(p, x, y).items()}
        reference_step(opt, p, g, state, t)
        p = {k: np.asarray(v, np.float32) for k, v in p.items()}
        t += 1
    return p


# --- the test ---------------------------------------------------------------------------------

ARCHITECTURES = {
    "mlp": (mlp, mlp_weights, mlp_forward, (8, 12)),
    "cnn": (cnn, cnn_weights, cnn_forward, (8, 1, 8, 8)),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_training_matches_reference(arch: str, optimizer: str) -> None:
    build, make_weights, forward, shape = ARCHITECTURES[arch]
    weights = make_weights()
    data = batches(shape, 5, STEPS)
    opt = OPTIMIZERS[optimizer]
    session = TrainingSession(make_trainable(build(weights), "cross_entropy", opt))
    session.initialize()
    losses = [float(session.step({"x": x, "labels": y}, outputs=["loss"])["loss"]) for x, y in data]
    assert np.mean(losses[-10:]) < np.mean(losses[:10]), "training did not reduce the loss"
    want = reference_train(opt, forward, weights, data)
    got = session.state
    for name, value in want.items():
        assert not np.allclose(value, weights[name]), f"{name} did not move"
        np.testing.assert_allclose(got[name], value, rtol=RTOL, atol=ATOL, err_msg=name)
    assert int(got["train.step"]) == STEPS + (1 if isinstance(opt, Adam) else 0)
