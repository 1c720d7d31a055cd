"""Attention ops: Attention (v23-v25), RotaryEmbedding, LinearAttention, CausalConvWithState,
and ai.onnx.preview FlexAttention."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.dtypes import to_numpy_dtype
from oxla.lowering.common import accum_dtype
from oxla.lowering.ops.elementwise import sigmoid
from oxla.lowering.registry import rule

_NEG_INF = -np.inf


def _heads(x, num_heads: int):
    """(B, S, H * D) -> (B, H, S, D)."""
    b, s, hidden = x.shape
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def _unheads(x):
    """(B, H, S, D) -> (B, S, H * D)."""
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def _repeat_kv(cx, x, q_heads: int):
    """Each key/value head serves q_heads / kv_heads consecutive query heads (GQA, MQA)."""
    kv_heads = x.shape[1]
    if kv_heads == q_heads:
        return x
    if kv_heads == 0 or q_heads % kv_heads:
        raise cx.fail(f"q_num_heads ({q_heads}) must be a multiple of kv_num_heads ({kv_heads})")
    return jnp.repeat(x, q_heads // kv_heads, axis=1)


# --- Attention ------------------------------------------------------------------------------


def _mask_bias(attn_mask, kv_len: int, dtype):
    """attn_mask as an additive bias (True/0 attends, False/-inf masks), padded to kv_len keys."""
    pad = kv_len - attn_mask.shape[-1]
    if attn_mask.dtype == np.bool_:
        if pad > 0:
            attn_mask = jnp.pad(attn_mask, [(0, 0)] * (attn_mask.ndim - 1) + [(0, pad)])
        # select, not (1 - mask) * -inf: 0 * -inf would be NaN at the attended positions
        return jnp.where(attn_mask, jnp.zeros((), dtype), jnp.asarray(_NEG_INF, dtype))
    bias = attn_mask.astype(dtype)
    if pad > 0:
        bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(0, pad)], constant_values=_NEG_INF)
    return bias


def _position_bias(q_len, kv_len, offset, is_causal, left, right, dtype):
    """Causal and sliding-window limits as a bias; query i sits at absolute position i + offset.

    `offset` is an int (past length or 0) or a (B,) array (nonpad_kv_seqlen - q_len); the bias is
    (q, kv) or (B, 1, q, kv).
    """
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    if isinstance(offset, int):
        diff = i + offset - j
    else:
        diff = (i + offset.reshape(-1, 1, 1, 1)) - j
    allowed = jnp.ones(jnp.shape(diff), bool)
    if is_causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.asarray(_NEG_INF, dtype))


def _attention_bias(cx, q_len, kv_len, batch, attn_mask, past_len, nonpad, is_causal, left,
                    right, dtype):
    """The additive bias of the mask, causal/window limits and kv padding, or None if none."""
    if past_len is not None and nonpad is not None:
        raise cx.fail("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    bias = None if attn_mask is None else _mask_bias(attn_mask, kv_len, dtype)
    if is_causal or left >= 0 or right >= 0:
        offset = past_len or 0
        if nonpad is not None:  # an external cache: the frontier is per batch
            offset = nonpad.astype(jnp.int64) - q_len
        limits = _position_bias(q_len, kv_len, offset, is_causal, left, right, dtype)
        bias = limits if bias is None else bias + limits
    if nonpad is not None:
        padded = jnp.arange(kv_len) < nonpad.astype(jnp.int64).reshape(batch, 1, 1, 1)
        pad_bias = jnp.where(padded, jnp.zeros((), dtype), jnp.asarray(_NEG_INF, dtype))
        bias = pad_bias if bias is None else bias + pad_bias
    return bias


def _attention_inputs(cx, q, k, v, past_key, past_value, q_num_heads, kv_num_heads):
    """Q, K, V as (B, H, S, D), with the past keys and values prepended to K and V."""
    if q.ndim == 3:
        if not q_num_heads or not kv_num_heads:
            raise cx.fail("3-D Q, K, V need the q_num_heads and kv_num_heads attributes")
        q, k, v = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
    elif not (q.ndim == k.ndim == v.ndim == 4):
        raise cx.shape_error(f"Q, K and V must all be 3-D or all 4-D, got shapes {tuple(q.shape)}, "
                      f"{tuple(k.shape)}, {tuple(v.shape)}")
    if (past_key is None) != (past_value is None):
        raise cx.fail("past_key and past_value must be given together")
    if past_key is not None:
        k = jnp.concatenate([past_key, k], axis=2)
        v = jnp.concatenate([past_value, v], axis=2)
    return q, k, v


def _attention(cx, q, k, v, attn_mask, past_key, past_value, nonpad, *, is_causal, kv_num_heads,
               q_num_heads, qk_matmul_output_mode, scale, softcap, softmax_precision,
               left_window_size=-1, right_window_size=-1):
    if qk_matmul_output_mode not in range(4):
        raise cx.fail(f"qk_matmul_output_mode must be 0, 1, 2 or 3, got {qk_matmul_output_mode}")
    three_d = q.ndim == 3
    q, k, v = _attention_inputs(cx, q, k, v, past_key, past_value, q_num_heads, kv_num_heads)
    present_k, present_v = k, v
    batch, heads, q_len, head_size = q.shape
    kv_len = k.shape[2]
    dtype = q.dtype
    s = np.sqrt(1 / np.sqrt(head_size) if scale is None else scale)
    s = jnp.asarray(s, dtype)  # Q and K are each scaled by sqrt(scale), in Q's type
    k, v = _repeat_kv(cx, k, heads), _repeat_kv(cx, v, heads)
    qk = jnp.einsum("bhqd,bhkd->bhqk", q * s, k * s)
    capped = qk if not softcap else softcap * jnp.tanh(qk / softcap)
    past_len = None if past_key is None else past_key.shape[2]
    bias = _attention_bias(cx, q_len, kv_len, batch, attn_mask, past_len, nonpad, is_causal,
                           left_window_size, right_window_size, dtype)
    logits = capped if bias is None else capped + bias
    sm_dtype = dtype if softmax_precision is None else to_numpy_dtype(softmax_precision)
    if bias is None:
        probs = jax.nn.softmax(logits.astype(sm_dtype), axis=-1)
    else:  # a row with every key masked attends nothing: zeros, not NaN (nor NaN gradients)
        masked_row = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
        safe = jnp.where(masked_row, jnp.zeros((), dtype), logits).astype(sm_dtype)
        probs = jnp.where(masked_row, jnp.zeros((), sm_dtype), jax.nn.softmax(safe, axis=-1))
    y = jnp.einsum("bhqk,bhkd->bhqd", probs.astype(dtype), v)
    if three_d:
        y = _unheads(y)
    debug = (qk, capped, jnp.broadcast_to(logits, qk.shape), probs)
    return y, present_k, present_v, debug[qk_matmul_output_mode].astype(dtype)


@rule("Attention", since=23)
def attention_v23(cx, q, k, v, attn_mask=None, past_key=None, past_value=None, *, is_causal=0,
                  kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None,
                  softcap=0.0, softmax_precision=None):
    """Y = softmax(softcap(Q K^T * scale) + mask) V with GQA and a kv cache (v23)."""
    return _attention(cx, q, k, v, attn_mask, past_key, past_value, None, is_causal=is_causal,
                      kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision)


@rule("Attention", since=24)
def attention_v24(cx, q, k, v, attn_mask=None, past_key=None, past_value=None,
                  nonpad_kv_seqlen=None, *, is_causal=0, kv_num_heads=None, q_num_heads=None,
                  qk_matmul_output_mode=0, scale=None, softcap=0.0, softmax_precision=None):
    """Attention v24: adds nonpad_kv_seqlen (an external cache with per-batch valid lengths)."""
    return _attention(cx, q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen,
                      is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision)


@rule("Attention", since=25)
def attention(cx, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None,
              *, is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
              scale=None, softcap=0.0, softmax_precision=None, left_window_size=-1,
              right_window_size=-1):
    """Attention v25+: adds left/right sliding windows; head counts only for 3-D inputs."""
    if q.ndim == 4 and (q_num_heads is not None or kv_num_heads is not None):
        raise cx.fail("q_num_heads and kv_num_heads must not be given for 4-D inputs")
    if left_window_size < -1 or right_window_size < -1:
        raise cx.fail(f"window sizes must be -1 or nonnegative, got left={left_window_size}, "
                      f"right={right_window_size}")
    return _attention(cx, q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen,
                      is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads,
                      qk_matmul_output_mode=qk_matmul_output_mode, scale=scale, softcap=softcap,
                      softmax_precision=softmax_precision, left_window_size=left_window_size,
                      right_window_size=right_window_size)


# --- FlexAttention --------------------------------------------------------------------------


@rule("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(cx, q, k, v, *, prob_mod=None, scale=None, score_mod=None,
                   softmax_precision=None):
    """Y = prob_mod(softmax(score_mod(Q K^T * scale))) V, 4-D inputs with GQA (preview v1)."""
    for name, x in (("Q", q), ("K", k), ("V", v)):
        cx.expect_rank(name, x, 4)
    head_size = q.shape[3]
    s = jnp.asarray(np.sqrt(np.float32(1 / np.sqrt(head_size) if scale is None else scale)), q.dtype)
    k, v = _repeat_kv(cx, k, q.shape[1]), _repeat_kv(cx, v, q.shape[1])
    if softmax_precision is not None:
        dtype = to_numpy_dtype(softmax_precision)
    else:  # float32 unless the inputs are double
        dtype = np.dtype(np.float64) if q.dtype == np.float64 else np.dtype(np.float32)
    scores = jnp.einsum("bhqd,bhkd->bhqk", q * s, k * s).astype(dtype)
    if score_mod is not None:
        scores = jnp.asarray(cx.run_graph(score_mod, [scores])[0]).astype(dtype)
    probs = jax.nn.softmax(scores, axis=-1)
    if prob_mod is not None:
        probs = jnp.asarray(cx.run_graph(prob_mod, [probs])[0]).astype(dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v.astype(dtype)).astype(v.dtype)


# --- RotaryEmbedding ------------------------------------------------------------------------


@rule("RotaryEmbedding", since=23)
def rotary_embedding(cx, x, cos_cache, sin_cache, position_ids=None, *, interleaved=0,
                     num_heads=None, rotary_embedding_dim=0):
    """Rotate the first rotary_embedding_dim features of each head by (cos, sin) (v23+)."""
    if x.ndim == 4:
        x4 = x.transpose(0, 2, 1, 3)  # (B, S, H, D)
    elif x.ndim == 3:
        if not num_heads:
            raise cx.fail("a 3-D input needs the num_heads attribute")
        x4 = x.reshape(x.shape[0], x.shape[1], num_heads, x.shape[2] // num_heads)
    else:
        raise cx.shape_error(f"X must be 3-D or 4-D, got shape {tuple(x.shape)}")
    rot = rotary_embedding_dim or x4.shape[3]
    if position_ids is not None:
        cos_cache = jnp.take(cos_cache, position_ids, axis=0)
        sin_cache = jnp.take(sin_cache, position_ids, axis=0)
    if cos_cache.shape[-1] != rot // 2 or sin_cache.shape[-1] != rot // 2:
        raise cx.fail(f"cos_cache and sin_cache must end in rotary_embedding_dim / 2 = {rot // 2}, "
                      f"got {tuple(cos_cache.shape)} and {tuple(sin_cache.shape)}")
    cos, sin = cos_cache[:, :, None, :], sin_cache[:, :, None, :]  # (B, S, 1, rot / 2)
    xr, rest = x4[..., :rot], x4[..., rot:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., : rot // 2], xr[..., rot // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = jnp.stack([real, imag], axis=-1).reshape(xr.shape)
    else:
        rotated = jnp.concatenate([real, imag], axis=-1)
    y = jnp.concatenate([rotated.astype(x.dtype), rest], axis=-1)
    return y.transpose(0, 2, 1, 3) if x.ndim == 4 else y.reshape(x.shape)


# --- LinearAttention ------------------------------------------------------------------------


_UPDATE_RULES = {"linear": (False, False), "gated": (True, False), "delta": (False, True),
                 "gated_delta": (True, True)}  # name -> (decay gate, delta correction)


def _linear_attention_inputs(cx, query, key, decay, beta, kv_num_heads, update_rule):
    """Check the update rule's optional inputs; decay and beta shaped (T, B, H_kv, 1 or d_k)."""
    if update_rule not in _UPDATE_RULES:
        raise cx.fail(f"update_rule must be one of {', '.join(_UPDATE_RULES)}, got '{update_rule}'")
    gated, delta = _UPDATE_RULES[update_rule]
    for name, x, wanted in (("decay", decay, gated), ("beta", beta, delta)):
        if wanted != (x is not None):
            raise cx.fail(f"update_rule '{update_rule}' {'needs' if wanted else 'forbids'} {name}")
    b, t = query.shape[:2]
    d_k = key.shape[2] // kv_num_heads

    def per_step(x, last_ok):
        if x is None:
            return None
        if x.ndim != 3 or x.shape[2] not in last_ok:
            raise cx.fail(f"decay / beta must be (B, T, one of {last_ok}), got {tuple(x.shape)}")
        heads = kv_num_heads if x.shape[2] >= kv_num_heads else 1
        return x.reshape(b, t, heads, -1).transpose(1, 0, 2, 3).astype(jnp.float32)

    return per_step(decay, (kv_num_heads, kv_num_heads * d_k)), per_step(beta, (kv_num_heads, 1))


@rule("LinearAttention", since=27)
def linear_attention(cx, query, key, value, past_state=None, decay=None, beta=None, *,
                     chunk_size=64, kv_num_heads=None, q_num_heads=None, scale=0.0,
                     update_rule="gated_delta"):
    """S_t = exp(g_t) S + k_t (beta_t (v_t - S^T k_t))^T; o_t = scale q_t S_t (v27+, float32 state)."""
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise cx.fail(f"q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads "
                      f"({kv_num_heads})")
    for name, x in (("query", query), ("key", key), ("value", value)):
        cx.expect_rank(name, x, 3)
    g, bt = _linear_attention_inputs(cx, query, key, decay, beta, kv_num_heads, update_rule)
    b, t, _ = query.shape
    d_k, d_v = query.shape[2] // q_num_heads, value.shape[2] // kv_num_heads
    group = q_num_heads // kv_num_heads
    steps = lambda x, h: x.reshape(b, t, h, -1).transpose(1, 0, 2, 3).astype(jnp.float32)  # noqa: E731
    q, k, v = steps(query, q_num_heads), steps(key, kv_num_heads), steps(value, kv_num_heads)
    q = q.reshape(t, b, kv_num_heads, group, d_k)  # query head h reads kv head h // group
    s = jnp.float32(scale if scale else 1 / math.sqrt(d_k))
    if past_state is None:
        state = jnp.zeros((b, kv_num_heads, d_k, d_v), jnp.float32)
    else:
        state = past_state.astype(jnp.float32)

    def step(state, xs):
        q_t, k_t, v_t, g_t, b_t = xs
        if g_t is not None:
            state = state * jnp.exp(g_t)[..., None]
        if b_t is not None:
            v_t = b_t * (v_t - jnp.einsum("bhdm,bhd->bhm", state, k_t))
        state = state + k_t[..., :, None] * v_t[..., None, :]
        return state, s * jnp.einsum("bhgd,bhdm->bhgm", q_t, state)

    state, out = lax.scan(step, state, (q, k, v, g, bt))
    out = out.reshape(t, b, q_num_heads * d_v).transpose(1, 0, 2).astype(query.dtype)
    return out, state.astype(query.dtype if past_state is None else past_state.dtype)


# --- CausalConvWithState --------------------------------------------------------------------


@rule("CausalConvWithState", since=27)
def causal_conv_with_state(cx, x, weight, bias=None, past_state=None, *, activation="none"):
    """Depthwise causal conv1d over [past_state, X]; present_state = its last k - 1 steps (v27+)."""
    if activation not in ("none", "silu", "swish"):
        raise cx.fail(f"activation must be 'none', 'silu' or 'swish', got '{activation}'")
    cx.expect_rank("input", x, 3)
    cx.expect_rank("weight", weight, 3)
    b, c, length = x.shape
    k = weight.shape[2]
    if past_state is None:
        past_state = jnp.zeros((b, c, k - 1), x.dtype)
    padded = jnp.concatenate([past_state.astype(x.dtype), x], axis=2)
    wide = accum_dtype(x.dtype)
    w = weight[:, 0, :].astype(wide)
    out = sum(padded[:, :, j:j + length].astype(wide) * w[None, :, j, None] for j in range(k))
    if bias is not None:
        out = out + bias.astype(wide)[None, :, None]
    out = out.astype(x.dtype)
    if activation != "none":  # silu and swish are one function; computed in float32
        f = out.astype(jnp.float32)
        out = (f * sigmoid(f)).astype(x.dtype)
    return out, padded[:, :, padded.shape[2] - (k - 1):]
