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

from oxla.lowering.common import accum_dtype
from oxla.lowering.ops.contrib import MS, wide
from oxla.lowering.ops.linalg import HIGHEST
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


# --- RotaryEmbedding ------------------------------------------------------------------------


def rotate(x, cos, sin, interleaved: int):
    """x (..., H) with its first 2 * R features rotated by cos, sin (..., R), in float32."""
    half = cos.shape[-1]
    xw, c, s = wide(x), wide(cos), wide(sin)
    xr, rest = xw[..., :2 * half], xw[..., 2 * half:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    real, imag = x1 * c - x2 * s, x1 * s + x2 * c
    if interleaved:
        rotated = jnp.stack([real, imag], axis=-1).reshape(xr.shape)
    else:
        rotated = jnp.concatenate([real, imag], axis=-1)
    return jnp.concatenate([rotated, rest], axis=-1).astype(x.dtype)


def _rotary_heads(cx, x, cos_cache, num_heads, rotary_embedding_dim):
    """(B, N, S, H) of a 3-D (B, S, hidden) or 4-D (B, N, S, H) input, and the rotated width."""
    if x.ndim == 4:
        x4 = x
    elif x.ndim == 3:
        if num_heads:
            heads_n = num_heads
        else:  # the head size is the whole rotated width
            heads_n = x.shape[2] // (2 * cos_cache.shape[1])
        x4 = heads(cx, x, heads_n, "input")
    else:
        raise cx.fail(f"input must be 3-D or 4-D, got shape {tuple(x.shape)}")
    rot = rotary_embedding_dim or x4.shape[3]
    if rotary_embedding_dim and not num_heads and x.ndim == 3:
        raise cx.fail("rotary_embedding_dim needs num_heads for a 3-D input")
    if cos_cache.shape[1] * 2 != rot or rot > x4.shape[3]:
        raise cx.fail(f"cos_cache must be (max_sequence_length, {rot // 2}) for a rotated width of "
                      f"{rot} within the head size {x4.shape[3]}, got {tuple(cos_cache.shape)}")
    return x4


@rule("RotaryEmbedding", since=1, domain=MS)
def rotary_embedding(cx, x, position_ids, cos_cache, sin_cache, *, interleaved=0,
                     is_packed_batching=0, num_heads=0, rotary_embedding_dim=0, scale=1.0):
    """Rotate each head's first rotary_embedding_dim features by cos/sin at its position (v1)."""
    # scale is documented but onnxruntime's CPU kernel never reads it; neither does oxla
    if is_packed_batching:
        raise cx.fail("is_packed_batching (ragged batches) is not supported")
    x4 = _rotary_heads(cx, x, cos_cache, num_heads, rotary_embedding_dim)
    seq = x4.shape[2]
    if position_ids.ndim == 1 and position_ids.shape[0] == 1:  # an offset: positions p0 .. p0+S-1
        positions = position_ids[0] + jnp.arange(seq, dtype=position_ids.dtype)[None, :]
    elif position_ids.shape == (x4.shape[0], seq):
        positions = position_ids
    else:
        raise cx.fail(f"position_ids must be (1,) or ({x4.shape[0]}, {seq}), got "
                      f"{tuple(position_ids.shape)}")
    cos = jnp.take(cos_cache, positions, axis=0)[:, None]  # (B, 1, S, R)
    sin = jnp.take(sin_cache, positions, axis=0)[:, None]
    y = rotate(x4, cos, sin, interleaved)
    return y if x.ndim == 4 else unheads(y)


# --- GroupQueryAttention --------------------------------------------------------------------


def _gqa_qkv(cx, query, key, value, num_heads: int, kv_num_heads: int):
    """Q (B, N, S, H), K and V (B, N_kv, S, H) from separate or packed inputs."""
    cx.expect_rank("query", query, 3)
    if key is None and value is None:  # packed: (B, S, (N + 2 N_kv) H)
        width = num_heads + 2 * kv_num_heads
        if query.shape[2] % width:
            raise cx.fail(f"packed QKV width {query.shape[2]} is not (num_heads + 2 kv_num_heads) "
                          "times a head size")
        size = query.shape[2] // width
        query, key, value = jnp.split(
            query, [num_heads * size, (num_heads + kv_num_heads) * size], axis=2)
    elif key is None or value is None:
        raise cx.fail("key and value must be given together (or neither, for packed QKV)")
    q = heads(cx, query, num_heads, "query")
    k, v = heads(cx, key, kv_num_heads, "key"), heads(cx, value, kv_num_heads, "value")
    if k.shape[3] != q.shape[3] or k.shape[2] != q.shape[2]:
        raise cx.fail(f"key must have the head size and sequence length of query: "
                      f"{tuple(query.shape)} vs {tuple(key.shape)}")
    return q, k, v


def _gqa_unsupported(cx, k_quant_type, v_quant_type, k_scale, v_scale, query_seqlens,
                     sliding_window_cache, causal, local_window_size):
    if k_quant_type != "NONE" or v_quant_type != "NONE" or k_scale is not None or v_scale is not None:
        raise cx.fail("a quantized KV cache is not supported")
    if query_seqlens is not None or sliding_window_cache:
        raise cx.fail("query_seqlens and sliding_window_cache are not supported")
    if causal not in (0, 1) or (not causal and local_window_size != -1):
        raise cx.fail(f"causal must be 0 or 1, and local_window_size -1 without it; got causal="
                      f"{causal}, local_window_size={local_window_size}")


def _rms_heads(x, weight, epsilon):
    """Per-head RMS normalization of (B, N, S, H) by a (H,) weight, in float32."""
    xw = wide(x)
    ms = jnp.mean(xw * xw, axis=-1, keepdims=True)
    return (xw * jax.lax.rsqrt(ms + np.asarray(epsilon, xw.dtype)) * wide(weight)).astype(x.dtype)


def _gqa_cache(past, new, past_len, length: int):
    """present (B, N_kv, length, H): past rows [0, past_len[b]), the new rows after them, then 0."""
    batch, n, seq, size = new.shape
    rows = jnp.arange(length)[None, :]  # (1, L)
    start = past_len[:, None]            # (B, 1)
    if past is None:
        old = jnp.zeros((batch, n, length, size), new.dtype)
    else:
        old = jnp.pad(past.astype(new.dtype)[:, :, :length],
                      ((0, 0), (0, 0), (0, max(0, length - past.shape[2])), (0, 0)))
    index = jnp.clip(rows - start, 0, seq - 1)[:, None, :, None]  # (B, 1, L, 1)
    fresh = jnp.take_along_axis(new, jnp.broadcast_to(index, (batch, n, length, 1)), axis=2)
    from_past, from_new = rows < start, (rows >= start) & (rows < start + seq)
    out = jnp.where(from_new[:, None, :, None], fresh, jnp.zeros((), new.dtype))
    return jnp.where(from_past[:, None, :, None], old, out)


def _gqa_allowed(past_len, total_len, seq: int, keys: int, causal: int, window: int):
    """(B, 1, S, T) True where query row s may attend key j (the CPU kernel's limits)."""
    j = jnp.arange(keys)[None, None, :]
    pos = past_len[:, None, None] + jnp.arange(seq)[None, :, None]  # absolute query positions
    total = total_len[:, None, None]
    allowed = j < total  # keys past the valid length are never read, padding rows included
    if causal:
        allowed &= j <= pos
        if window > 0:  # the window holds `window` keys, the query's own included
            allowed &= j >= jnp.minimum(pos + 1, total) - window
    return allowed[:, None]


def _gqa_softmax(logits, allowed, head_sink, smooth):
    """softmax over the allowed keys; a head sink (or 0 with smooth_softmax) joins the sum."""
    lowest = np.asarray(np.finfo(logits.dtype).min, logits.dtype)
    masked = jnp.where(allowed, logits, lowest)
    if head_sink is None and smooth != 1:
        return jnp.where(allowed, jax.nn.softmax(masked, axis=-1), 0)
    sink = (jnp.zeros(logits.shape[1], logits.dtype) if head_sink is None
            else head_sink.astype(logits.dtype))[None, :, None, None]
    top = jnp.maximum(jnp.max(masked, axis=-1, keepdims=True), sink)
    e = jnp.where(allowed, jnp.exp(masked - top), 0)
    return e / (jnp.sum(e, axis=-1, keepdims=True) + jnp.exp(sink - top))


def _gqa_prologue(cx, q, k, positions, cos_cache, sin_cache, q_norm_weight, k_norm_weight,
                  epsilons, do_rotary, rotary_interleaved):
    """Q and K after the optional per-head RMS norms, then the rotary embedding."""
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise cx.fail("q_norm_weight and k_norm_weight must be given together")
    if q_norm_weight is not None:
        q, k = _rms_heads(q, q_norm_weight, epsilons[0]), _rms_heads(k, k_norm_weight, epsilons[1])
    if not do_rotary:
        return q, k
    if cos_cache is None or sin_cache is None:
        raise cx.fail("do_rotary needs cos_cache and sin_cache")
    if 2 * cos_cache.shape[1] > q.shape[3]:
        raise cx.fail(f"cos_cache {tuple(cos_cache.shape)} rotates more than the head size "
                      f"{q.shape[3]}")
    cos = jnp.take(cos_cache, positions, axis=0)[:, None]  # (B, 1, S, R)
    sin = jnp.take(sin_cache, positions, axis=0)[:, None]
    return rotate(q, cos, sin, rotary_interleaved), rotate(k, cos, sin, rotary_interleaved)


def _gqa_positions(position_ids, past_len, seq: int, first_prompt: bool):
    """Rotary positions (B, S): the cache frontier onwards, or position_ids as the kernel reads it."""
    steps = jnp.arange(seq)[None, :]
    if position_ids is None:
        return past_len[:, None] + steps
    if first_prompt:  # a first prompt reads only the first element and counts on from it
        return jnp.broadcast_to(position_ids.reshape(-1)[0] + steps, (past_len.shape[0], seq))
    return position_ids


def _gqa_scores(q, k, v, allowed, *, scale, softcap, attention_bias, head_sink, smooth):
    """(output (B, S, N H), logits, probs) of grouped heads: query head i reads kv head i // g."""
    batch, n, seq, size = q.shape
    kv = k.shape[1]
    qg = q.reshape(batch, kv, n // kv, seq, size)
    acc = accum_dtype(q.dtype)
    logits = jnp.einsum("bkgsh,bkth->bkgst", qg, k, precision=HIGHEST, preferred_element_type=acc)
    logits = logits.reshape(batch, n, seq, k.shape[2]) * np.asarray(scale, acc)
    if softcap > 0:
        logits = np.asarray(softcap, acc) * jnp.tanh(logits / np.asarray(softcap, acc))
    if attention_bias is not None:  # added after the softcap, as the CPU kernel does
        logits = logits + attention_bias.astype(acc)
    probs = _gqa_softmax(logits, allowed, head_sink, smooth)
    pg = probs.reshape(batch, kv, n // kv, seq, k.shape[2])
    out = jnp.einsum("bkgst,bkth->bkgsh", pg, wide(v), precision=HIGHEST)
    return unheads(out.reshape(batch, n, seq, size)).astype(q.dtype), logits, probs


@rule("GroupQueryAttention", since=1, domain=MS, static=("total_sequence_length",))
def group_query_attention(cx, query, key, value, past_key, past_value, seqlens_k,
                          total_sequence_length, cos_cache=None, sin_cache=None,
                          position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
                          v_scale=None, q_norm_weight=None, k_norm_weight=None,
                          query_seqlens=None, *, causal=1, do_rotary=0, k_norm_epsilon=None,
                          k_quant_type="NONE", kv_cache_bit_width=None, kv_num_heads=None,
                          local_window_size=-1, num_heads=None, q_norm_epsilon=None,
                          qk_norm_epsilon=1e-6, qk_output=0, rotary_interleaved=0, scale=None,
                          sliding_window_cache=0, smooth_softmax=-1, softcap=0.0,
                          v_quant_type="NONE"):
    """Y = softmax(cap(Q K^T scale) + bias) V, K V grouped heads over a BNSH cache (contrib v1)."""
    _gqa_unsupported(cx, k_quant_type, v_quant_type, k_scale, v_scale, query_seqlens,
                     sliding_window_cache, causal, local_window_size)
    q, k, v = _gqa_qkv(cx, query, key, value, num_heads or 0, kv_num_heads or 0)
    if num_heads % kv_num_heads:
        raise cx.fail(f"num_heads ({num_heads}) must be a multiple of kv_num_heads ({kv_num_heads})")
    total = cx.static_ints(total_sequence_length, "total_sequence_length")[0]
    seq = q.shape[2]
    total_len = seqlens_k.astype(jnp.int32) + 1
    first_prompt = seq == total  # a prompt that fills the cache from position 0
    past_len = jnp.zeros_like(total_len) if first_prompt else total_len - seq
    positions = _gqa_positions(position_ids, past_len, seq, first_prompt)
    eps = (qk_norm_epsilon if q_norm_epsilon is None else q_norm_epsilon,
           qk_norm_epsilon if k_norm_epsilon is None else k_norm_epsilon)
    q, k = _gqa_prologue(cx, q, k, positions, cos_cache, sin_cache, q_norm_weight,
                         k_norm_weight, eps, do_rotary, rotary_interleaved)
    length = max(total, 0 if past_key is None else past_key.shape[2])
    present_k = _gqa_cache(past_key, k, past_len, length)
    present_v = _gqa_cache(past_value, v, past_len, length)
    allowed = _gqa_allowed(past_len, total_len, seq, total, causal, local_window_size)
    y, logits, probs = _gqa_scores(
        q, present_k[:, :, :total], present_v[:, :, :total], allowed,
        scale=default_scale(scale, q.shape[3]), softcap=softcap, attention_bias=attention_bias,
        head_sink=head_sink, smooth=smooth_softmax)
    qk = jnp.where(allowed, logits, 0) if qk_output == 1 else probs
    return y, present_k, present_v, qk.astype(query.dtype)
