"""com.microsoft attention ops onnxruntime's optimizers and exporters write: Attention (packed
QKV projection), MultiHeadAttention, RotaryEmbedding and GroupQueryAttention (contrib v1).

Semantics follow onnxruntime's CPU kernels: scores are computed in float32 (the 16-bit kernels
convert, or onnxruntime runs the float kernel between Casts), masks are additive
`mask_filter_value` biases and causal limits the lowest float, as the kernels write them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from oxla.lowering.ops.contrib import MS, wide
from oxla.lowering.ops.linalg import HIGHEST
from oxla.lowering.ops.nn import accum_dtype
from oxla.lowering.registry import rule

# --- shared pieces --------------------------------------------------------------------------


def heads(cx, x, num_heads: int, what: str):
    """(B, S, N * H) -> (B, N, S, H)."""
    b, s, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise cx.fail(f"the hidden size of {what} ({hidden}) must be a multiple of num_heads "
                      f"({num_heads})")
    return x.reshape(b, s, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def unheads(x):
    """(B, N, S, H) -> (B, S, N * H)."""
    b, n, s, h = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, n * h)


def default_scale(scale, head_size: int) -> float:
    # the kernels read a missing (or zero) scale as 1 / sqrt(head_size)
    return float(scale) if scale else 1 / float(np.sqrt(np.float32(head_size)))


def _mask_keep(cx, mask, batch: int, q_len: int, total: int):
    """mask_index / key_padding_mask as a boolean (B, 1, S or 1, T): True attends."""
    j = jnp.arange(total)
    if mask.ndim == 1:  # lengths: ends (B), or ends then starts (2B)
        if mask.shape[0] not in (batch, 2 * batch):
            raise cx.fail(f"a 1-D mask must have {batch} or {2 * batch} entries, got "
                          f"{mask.shape[0]} (the 3 * B + 2 format has only a CUDA kernel)")
        keep = j[None, :] < mask[:batch, None]
        if mask.shape[0] == 2 * batch:
            keep = keep & (j[None, :] >= jnp.minimum(mask[batch:], total)[:, None])
        return keep[:, None, None, :]
    if mask.ndim == 2 and mask.shape == (batch, total):
        return (mask > 0)[:, None, None, :]
    if mask.ndim == 3 and mask.shape == (batch, q_len, total):
        return (mask > 0)[:, None, :, :]
    raise cx.fail(f"the mask must have shape ({batch},), ({2 * batch},), ({batch}, {total}) or "
                  f"({batch}, {q_len}, {total}), got {tuple(mask.shape)} (onnxruntime's CPU "
                  "kernel has no 4-D mask either)")


def attention_logits(cx, q, k, *, scale, mask, attention_bias, causal, past_len, filter_value):
    """scale Q K^T + attention_bias + mask bias in float32 (B, N, S, T), causal limits applied."""
    acc = accum_dtype(q.dtype)
    logits = jnp.einsum("bnsh,bnth->bnst", q, k, precision=HIGHEST, preferred_element_type=acc)
    logits = logits * np.asarray(scale, acc)
    batch, _, q_len, total = logits.shape
    if mask is not None:
        keep = _mask_keep(cx, mask, batch, q_len, total)
        logits = logits + jnp.where(keep, np.asarray(0, acc), np.asarray(filter_value, acc))
    if attention_bias is not None:
        logits = logits + attention_bias.astype(acc)
    if causal and q_len > 1:  # a single query row sees the whole past: no limit to apply
        i = np.arange(q_len)[:, None] + past_len
        forbidden = np.arange(total)[None, :] > i
        logits = jnp.where(forbidden, np.asarray(np.finfo(acc).min, acc), logits)
    return logits


def attend(logits, v, out_dtype):
    """softmax(logits) V, (B, N, S, Hv) -> (B, S, N * Hv) in out_dtype."""
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bnst,bnth->bnsh", probs, wide(v), precision=HIGHEST)
    return unheads(out).astype(out_dtype)


# --- Attention (packed QKV projection) ------------------------------------------------------


def _qkv_sizes(cx, weights, qkv_hidden_sizes, num_heads):
    if qkv_hidden_sizes is None:
        if weights.shape[1] % 3:
            raise cx.fail(f"weights' second dimension ({weights.shape[1]}) must be divisible by 3 "
                          "when qkv_hidden_sizes is not given")
        sizes = (weights.shape[1] // 3,) * 3
    else:
        sizes = tuple(int(s) for s in qkv_hidden_sizes)
    if len(sizes) != 3 or sum(sizes) != weights.shape[1] or sizes[0] != sizes[1] or any(
            s <= 0 or s % num_heads for s in sizes):
        raise cx.fail(f"qkv_hidden_sizes {list(sizes)} must be 3 positive multiples of num_heads "
                      f"({num_heads}), Q and K equal, summing to {weights.shape[1]}")
    return sizes


@rule("Attention", since=1, domain=MS)
def attention(cx, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
              past_sequence_length=None, *, do_rotary=0, mask_filter_value=-10000.0,
              num_heads=None, past_present_share_buffer=0, qkv_hidden_sizes=None, scale=None,
              rotary_embedding_dim=0, unidirectional=0):
    """Y = softmax(Q K^T scale + masks) V, Q K V = X W + bias split; present = [K; V] (contrib v1)."""
    if do_rotary:
        raise cx.fail("do_rotary is not supported (nor by onnxruntime's CPU kernel): fuse the "
                      "model with MultiHeadAttention + RotaryEmbedding")
    if past_present_share_buffer:
        raise cx.fail("past_present_share_buffer is not supported (a CUDA decoding kernel)")
    cx.expect_rank("input", x, 3)
    cx.expect_rank("weights", weights, 2)
    sizes = _qkv_sizes(cx, weights, qkv_hidden_sizes, num_heads or 0)
    acc = accum_dtype(x.dtype)
    qkv = jnp.matmul(x, weights, precision=HIGHEST, preferred_element_type=acc)
    if bias is not None:
        qkv = qkv + bias.astype(acc)
    q, k, v = (heads(cx, t, num_heads, "Q, K and V") for t in
               jnp.split(qkv, [sizes[0], sizes[0] + sizes[1]], axis=2))
    past_len = 0
    if past is not None:
        if sizes[1] != sizes[2] or past.ndim != 5 or past.shape[0] != 2:
            raise cx.fail(f"past must be (2, B, N, P, H) with K and V of one size, got "
                          f"{tuple(past.shape)}")
        past_len = past.shape[3]
        k = jnp.concatenate([past[0].astype(k.dtype), k], axis=2)
        v = jnp.concatenate([past[1].astype(v.dtype), v], axis=2)
    logits = attention_logits(cx, q, k, scale=default_scale(scale, q.shape[3]), mask=mask_index,
                              attention_bias=attention_bias, causal=unidirectional,
                              past_len=past_len, filter_value=mask_filter_value)
    y = attend(logits, v, x.dtype)
    if not cx.output_used(1):
        return y
    if k.shape != v.shape:
        raise cx.fail("present needs K and V of one hidden size")
    return y, jnp.stack([k, v]).astype(x.dtype)


# --- MultiHeadAttention ---------------------------------------------------------------------


def _mha_packed(cx, query, key, value, num_heads):
    """Q, K, V (B, N, S, H) from packed QKV (B, S, N, 3, H) or packed KV (B, L, N, 2, H)."""
    if query.ndim == 5:
        if key is not None or value is not None or query.shape[3] != 3:
            raise cx.fail(f"packed QKV must be (B, S, N, 3, H) without key and value, got "
                          f"{tuple(query.shape)}")
        q, k, v = (query[:, :, :, i].transpose(0, 2, 1, 3) for i in range(3))
        return q, k, v
    if value is not None or key.shape[3] != 2 or key.shape[2] != num_heads:
        raise cx.fail(f"packed KV must be (B, L, num_heads, 2, H) without value, got "
                      f"{tuple(key.shape)}")
    q = heads(cx, query, num_heads, "query")
    return q, key[:, :, :, 0].transpose(0, 2, 1, 3), key[:, :, :, 1].transpose(0, 2, 1, 3)


def _mha_inputs(cx, query, key, value, bias, num_heads):
    """Q, K, V as (B, N, S, H) with the projection bias added where it applies."""
    if query.ndim == 5 or (key is not None and key.ndim == 5):
        if bias is not None:
            raise cx.fail("a bias with packed QKV / KV is not supported (CUDA-only formats)")
        return _mha_packed(cx, query, key, value, num_heads)
    cx.expect_rank("query", query, 3)
    if key is None or value is None:
        raise cx.fail("key and value are required unless query or key is packed")
    d = query.shape[2]
    acc = accum_dtype(query.dtype)
    qb, kb, vb = (None, None, None) if bias is None else (bias[:d], bias[d:2 * d], bias[2 * d:])
    add = (lambda t, b: t if b is None else wide(t) + b.astype(acc))  # noqa: E731
    q = heads(cx, add(query, qb), num_heads, "query")
    if key.ndim == 4:  # already projected, (B, N, L, H): the bias does not apply to it
        if value.ndim != 4:
            raise cx.fail("key and value must both be 3-D or both 4-D (B, N, L, H)")
        return q, key, value
    return q, heads(cx, add(key, kb), num_heads, "key"), heads(cx, add(value, vb), num_heads, "value")


@rule("MultiHeadAttention", since=1, domain=MS)
def multi_head_attention(cx, query, key=None, value=None, bias=None, key_padding_mask=None,
                         attention_bias=None, past_key=None, past_value=None,
                         past_sequence_length=None, cache_indirection=None, *,
                         mask_filter_value=-10000.0, num_heads=None, scale=None,
                         unidirectional=0):
    """Y = softmax(Q K^T scale + masks) V; present K, V with the past prepended; QK (contrib v1)."""
    if past_sequence_length is not None or cache_indirection is not None:
        raise cx.fail("past_sequence_length / cache_indirection (shared-buffer beam search) are "
                      "not supported")
    q, k, v = _mha_inputs(cx, query, key, value, bias, num_heads or 0)
    past_len = 0
    if (past_key is None) != (past_value is None):
        raise cx.fail("past_key and past_value must be given together")
    if past_key is not None:
        past_len = past_key.shape[2]
        k = jnp.concatenate([past_key.astype(k.dtype), k], axis=2)
        v = jnp.concatenate([past_value.astype(v.dtype), v], axis=2)
    logits = attention_logits(cx, q, k, scale=default_scale(scale, q.shape[3]),
                              mask=key_padding_mask, attention_bias=attention_bias,
                              causal=unidirectional, past_len=past_len,
                              filter_value=mask_filter_value)
    y = attend(logits, v, query.dtype)
    return y, k.astype(query.dtype), v.astype(query.dtype), logits.astype(query.dtype)
