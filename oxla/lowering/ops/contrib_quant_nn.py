"""Quantized com.microsoft layers: DynamicQuantizeLSTM and QAttention (int8 products, float gates)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.ops import qmath
from oxla.lowering.ops.rnn import lstm_layer
from oxla.lowering.registry import rule

F32 = jnp.float32
MS = "com.microsoft"


def _per_direction(p, d: int):
    """Direction d of a [dirs] or [dirs, 4H] scale or zero point: a scalar or a per-column row."""
    return p.reshape(p.shape[0], -1)[d].reshape(-1) if p.ndim > 1 else p.reshape(-1)[d]


def _dynamic_product(x, w, w_scale, w_zero_point):
    """x @ w for float x and 8-bit w: x quantized to uint8 over all of it, int32 products,
    float(acc) * (x_scale * w_scale) as MLAS's scale-bias output processor."""
    xq, xs, xz = qmath.dynamic_quantize(x)
    acc = qmath.int_matmul(xq, w, xz, w_zero_point)
    return qmath.mul32(acc.astype(F32), qmath.mul32(xs, w_scale))


@rule("DynamicQuantizeLSTM", since=1, domain=MS)
def dynamic_quantize_lstm(cx, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None,
                          P=None, W_scale=None, W_zero_point=None, R_scale=None, R_zero_point=None,
                          *, activation_alpha=None, activation_beta=None, activations=None,
                          clip=None, direction="forward", hidden_size=None, input_forget=0):
    """LSTM with 8-bit W [dirs, input, 4H] and R [dirs, H, 4H]: X and each H_{t-1} are quantized
    to uint8 on the fly (per tensor) and multiplied in int32."""
    if W_scale is None or W_zero_point is None or R_scale is None or R_zero_point is None:
        raise cx.fail("W_scale, W_zero_point, R_scale and R_zero_point are required")
    cx.expect_rank("W", W, 3)
    cx.expect_rank("R", R, 3)
    gates = W.shape[2]

    def project(d: int, x):
        t, batch = x.shape[:2]
        xw = _dynamic_product(x.reshape(t * batch, -1), W[d], _per_direction(W_scale, d),
                              _per_direction(W_zero_point, d))
        if B is not None:
            xw = xw + B[d, :gates]
        return xw.reshape(t, batch, gates)

    def recur(d: int, h, _r):
        return _dynamic_product(h, R[d], _per_direction(R_scale, d), _per_direction(R_zero_point, d))

    # the shared driver checks shapes in the standard layout: W [dirs, 4H, input], R [dirs, 4H, H]
    return lstm_layer(cx, X, jnp.swapaxes(W, 1, 2), jnp.swapaxes(R, 1, 2), B, sequence_lens,
                      initial_h, initial_c, P, activation_alpha=activation_alpha,
                      activation_beta=activation_beta, activations=activations, clip=clip,
                      direction=direction, hidden_size=hidden_size, input_forget=input_forget,
                      layout=0, recur=recur, project=project)


def _attention_bias(cx, mask_index, batch: int, q_len: int, total: int, past: int,
                    unidirectional: int, fill: float):
    """The additive mask of QAttention: key lengths [B] (or ends and starts [2B]), a raw
    [B, total] 0/1 mask, and the causal mask; fill where masked, 0 elsewhere."""
    keys = jnp.arange(total)
    masked = jnp.zeros((batch, 1, q_len, total), bool)
    if mask_index is not None:
        if mask_index.ndim == 1 and mask_index.shape[0] in (batch, 2 * batch):
            end = mask_index[:batch].reshape(batch, 1, 1, 1)
            masked = masked | (keys >= end)
            if mask_index.shape[0] == 2 * batch:
                masked = masked | (keys < mask_index[batch:].reshape(batch, 1, 1, 1))
        elif mask_index.ndim == 2 and tuple(mask_index.shape) == (batch, total):
            masked = masked | (mask_index == 0)[:, None, None, :]
        else:
            raise cx.fail(f"mask_index of shape {tuple(mask_index.shape)} is not supported "
                          f"([B], [2B] or [B, total sequence])")
    if unidirectional:
        masked = masked | (keys[None, :] > jnp.arange(q_len)[:, None] + past)
    return jnp.where(masked, np.float32(fill), np.float32(0))


@rule("QAttention", since=1, domain=MS)
def q_attention(cx, input, weight, bias, input_scale, weight_scale, mask_index=None,
                input_zero_point=None, weight_zero_point=None, past=None, *, do_rotary=0,
                mask_filter_value=-10000.0, num_heads=None, past_present_share_buffer=0,
                scale=0.0, unidirectional=0):
    """Attention whose QKV projection is an int8 product: (input - zp) @ (weight - zp) *
    input_scale * weight_scale + bias, then softmax(Q K^T * scale + mask) V per head."""
    if num_heads is None:
        raise cx.fail("attribute num_heads is required")
    if do_rotary or past_present_share_buffer:
        raise cx.fail("do_rotary and past_present_share_buffer are not supported")
    cx.expect_rank("input", input, 3)
    batch, seq, _ = input.shape
    hidden = weight.shape[1] // 3
    head = hidden // num_heads
    acc = qmath.int_matmul(input, weight, input_zero_point, weight_zero_point)
    multiplier = qmath.mul32(input_scale.reshape(()), weight_scale.reshape(-1))
    qkv = qmath.mul32(acc.astype(F32), multiplier) + bias.astype(F32)
    q, k, v = (t.reshape(batch, seq, num_heads, head).transpose(0, 2, 1, 3)
               for t in jnp.split(qkv, 3, axis=-1))
    past_len = 0
    if past is not None:
        past_len = past.shape[3]
        k = jnp.concatenate([past[0].astype(F32), k], axis=2)
        v = jnp.concatenate([past[1].astype(F32), v], axis=2)
    total = k.shape[2]
    alpha = scale if scale else 1.0 / math.sqrt(head)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=lax.Precision.HIGHEST) * np.float32(alpha)
    scores = scores + _attention_bias(cx, mask_index, batch, seq, total, past_len,
                                      unidirectional, mask_filter_value)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bhkd->bhqd", probs, v, precision=lax.Precision.HIGHEST)
    out = out.transpose(0, 2, 1, 3).reshape(batch, seq, hidden).astype(bias.dtype)
    if cx.num_outputs > 1:
        return out, jnp.stack([k, v]).astype(bias.dtype)
    return out
