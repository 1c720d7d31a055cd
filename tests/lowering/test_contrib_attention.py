"""com.microsoft attention rules against onnxruntime (the oracle; onnx.reference lacks them)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.test_contrib import MS, check_ms, rand, tol
from tests.lowering.util import node_model, run_oxla

RNG = np.random.default_rng(1)
B, S, N, H = 2, 3, 2, 4
D = N * H

DTYPES = [np.float32, np.float16]
DT_IDS = ["f32", "f16"]


def att_tol(dtype: Any) -> dict[str, float]:
    return tol(dtype) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)


# --- Attention ------------------------------------------------------------------------------

MASKS: dict[str, Any] = {
    "none": None,
    "lengths": np.array([2, 3], np.int32),
    "ends-starts": np.array([3, 2, 1, 0], np.int32),
    "raw-2d": np.array([[1, 1, 0], [1, 0, 1]], np.int32),
    "raw-3d": (RNG.random((B, S, S)) > 0.3).astype(np.int32),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
@pytest.mark.parametrize("unidirectional", [0, 1], ids=["bidi", "causal"])
def test_attention_masks(dtype: Any, mask: str, unidirectional: int) -> None:
    x, w, b = rand(B, S, 6, dtype=dtype), rand(6, 3 * D, dtype=dtype), rand(3 * D, dtype=dtype)
    check_ms("Attention", {"x": x, "w": w, "b": b, "mask_index": MASKS[mask]}, ("y", "present"),
             num_heads=N, unidirectional=unidirectional, **att_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_attention_past_present_mask_scale(dtype: Any) -> None:
    past_len = 4
    x, w = rand(B, S, D, dtype=dtype), rand(D, 3 * D, dtype=dtype)
    inputs = {"x": x, "w": w, "b": rand(3 * D, dtype=dtype),
              "mask_index": (RNG.random((B, past_len + S)) > 0.2).astype(np.int32),
              "past": rand(2, B, N, past_len, H, dtype=dtype)}
    check_ms("Attention", inputs, ("y", "present"), num_heads=N, unidirectional=1, scale=0.3,
             mask_filter_value=-1000.0, **att_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("bias_shape", [(1, N, S, S), (B, 1, S, S)], ids=["1NST", "B1ST"])
def test_attention_bias_input(dtype: Any, bias_shape: tuple[int, ...]) -> None:
    # onnxruntime refuses past together with attention_bias
    x, w = rand(B, S, D, dtype=dtype), rand(D, 3 * D, dtype=dtype)
    inputs = {"x": x, "w": w, "b": rand(3 * D, dtype=dtype), "mask_index": MASKS["lengths"],
              "past": None, "attention_bias": rand(*bias_shape, dtype=dtype)}
    check_ms("Attention", inputs, num_heads=N, unidirectional=1, **att_tol(dtype))


def test_attention_decoding_step_with_past() -> None:
    x, w = rand(B, 1, D), rand(D, 3 * D)
    check_ms("Attention", {"x": x, "w": w, "b": None, "mask_index": None,
                           "past": rand(2, B, N, 5, H)}, ("y", "present"),
             num_heads=N, unidirectional=1, rtol=1e-4, atol=1e-5)


def test_attention_qkv_hidden_sizes_and_no_bias() -> None:
    x, w = rand(B, S, 5), rand(5, 2 * D + 2 * D)
    check_ms("Attention", {"x": x, "w": w}, num_heads=N, qkv_hidden_sizes=[D, D, 2 * D],
             rtol=1e-4, atol=1e-5)


def test_attention_errors() -> None:
    x, w = rand(B, S, D), rand(D, 3 * D)
    with pytest.raises(LoweringError, match="do_rotary is not supported"):
        run_oxla(node_model("Attention", {"x": x, "w": w}, domain=MS, num_heads=N, do_rotary=1),
                 {"x": x, "w": w})
    with pytest.raises(LoweringError, match="must be 3 positive multiples of num_heads"):
        run_oxla(node_model("Attention", {"x": x, "w": w}, domain=MS, num_heads=N,
                            qkv_hidden_sizes=[D, D + 1, D - 1]), {"x": x, "w": w})
    m4 = np.ones((B, 1, S, S), np.int32)
    with pytest.raises(LoweringError, match="no 4-D mask either"):
        run_oxla(node_model("Attention", {"x": x, "w": w, "b": None, "m": m4}, domain=MS,
                            num_heads=N), {"x": x, "w": w, "m": m4})


# --- MultiHeadAttention ---------------------------------------------------------------------

MHA_OUTS = ("y", "present_key", "present_value", "qk")


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("mask", ["none", "lengths", "raw-2d", "raw-3d"])
def test_multi_head_attention_cross_with_bias_and_masks(dtype: Any, mask: str) -> None:
    kv_len = 5
    masks = {"none": None, "lengths": np.array([3, 5], np.int32),
             "raw-2d": (RNG.random((B, kv_len)) > 0.3).astype(np.int32),
             "raw-3d": (RNG.random((B, S, kv_len)) > 0.3).astype(np.int32)}
    inputs = {"q": rand(B, S, D, dtype=dtype), "k": rand(B, kv_len, D, dtype=dtype),
              "v": rand(B, kv_len, 2 * D, dtype=dtype), "bias": rand(4 * D, dtype=dtype),
              "key_padding_mask": masks[mask]}
    check_ms("MultiHeadAttention", inputs, MHA_OUTS[:3], num_heads=N, **att_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
def test_multi_head_attention_self_with_past_causal_bias(dtype: Any) -> None:
    past_len = 4
    inputs = {"q": rand(B, S, D, dtype=dtype), "k": rand(B, S, D, dtype=dtype),
              "v": rand(B, S, D, dtype=dtype), "bias": None,
              "key_padding_mask": (RNG.random((B, past_len + S)) > 0.2).astype(np.int32),
              "attention_bias": rand(B, 1, S, past_len + S, dtype=dtype),
              "past_key": rand(B, N, past_len, H, dtype=dtype),
              "past_value": rand(B, N, past_len, H, dtype=dtype)}
    check_ms("MultiHeadAttention", inputs, MHA_OUTS[:3], num_heads=N, unidirectional=1,
             scale=0.5, **att_tol(dtype))


def test_multi_head_attention_qk_output() -> None:
    inputs = {"q": rand(B, S, D), "k": rand(B, S, D), "v": rand(B, S, D), "bias": rand(3 * D),
              "key_padding_mask": np.array([2, 3], np.int32)}
    check_ms("MultiHeadAttention", inputs, MHA_OUTS, num_heads=N, rtol=1e-4, atol=1e-4,
             output_types={"qk": np.float32})


def test_multi_head_attention_bnsh_key_value_skip_the_bias() -> None:
    inputs = {"q": rand(B, S, D), "k": rand(B, N, 5, H), "v": rand(B, N, 5, H), "bias": rand(3 * D)}
    check_ms("MultiHeadAttention", inputs, num_heads=N, rtol=1e-4, atol=1e-5)


def test_multi_head_attention_packed_formats_equal_separate_inputs() -> None:
    # onnxruntime implements packed QKV / KV only on CUDA: check them against the separate form
    q, k, v = rand(B, S, N, H), rand(B, S, N, H), rand(B, S, N, H)
    flat = {"q": q.reshape(B, S, D), "k": k.reshape(B, S, D), "v": v.reshape(B, S, D)}
    want = check_ms("MultiHeadAttention", flat, num_heads=N, unidirectional=1, rtol=1e-4,
                    atol=1e-5)[0]
    qkv = {"q": np.stack([q, k, v], axis=3)}
    got = run_oxla(node_model("MultiHeadAttention", qkv, domain=MS, num_heads=N, unidirectional=1),
                   qkv)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    kv = {"q": flat["q"], "k": np.stack([k, v], axis=3)}
    got = run_oxla(node_model("MultiHeadAttention", kv, domain=MS, num_heads=N, unidirectional=1),
                   kv)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# --- RotaryEmbedding ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("layout, positions, interleaved, rot_dim", [
    ("BSD", "offset", 0, 0), ("BSD", "BS", 1, 0), ("BNSH", "BS", 0, 0), ("BNSH", "offset", 1, 0),
    ("BSD", "BS", 0, 4), ("BNSH", "offset", 1, 4),
], ids=["bsd-offset", "bsd-interleaved", "bnsh", "bnsh-interleaved", "bsd-partial",
        "bnsh-partial"])
def test_rotary_embedding(dtype: Any, layout: str, positions: str, interleaved: int,
                          rot_dim: int) -> None:
    heads_n, size, seq = 2, 8, 3
    x = rand(B, seq, heads_n * size, dtype=dtype) if layout == "BSD" else \
        rand(B, heads_n, seq, size, dtype=dtype)
    pos = np.array([2], np.int64) if positions == "offset" else \
        RNG.integers(0, 10, (B, seq)).astype(np.int64)
    half = (rot_dim or size) // 2
    cos, sin = rand(12, half, dtype=dtype), rand(12, half, dtype=dtype)
    attrs: dict[str, Any] = {"interleaved": interleaved}
    if rot_dim:
        attrs.update(rotary_embedding_dim=rot_dim, num_heads=heads_n)
    elif layout == "BSD" and interleaved:
        attrs["num_heads"] = heads_n
    check_ms("RotaryEmbedding", {"x": x, "pos": pos, "cos": cos, "sin": sin}, **attrs,
             **att_tol(dtype))


# --- GroupQueryAttention --------------------------------------------------------------------

GN, GKV, GH = 4, 2, 16  # onnxruntime's CPU rotary needs a head size that is a multiple of 16
GQA_OUTS = ("y", "present_key", "present_value")


def gqa_inputs(seq: int, past: int, seqlens: list[int], total: int, dtype: Any = np.float32,
               batch: int = B, packed: bool = False, **extra: Any) -> dict[str, Any]:
    q, k, v = (rand(batch, seq, n * GH, dtype=dtype) for n in (GN, GKV, GKV))
    feeds: dict[str, Any] = {
        "q": np.concatenate([q, k, v], axis=2) if packed else q,
        "k": None if packed else k, "v": None if packed else v,
        "past_key": rand(batch, GKV, past, GH, dtype=dtype) if past else None,
        "past_value": rand(batch, GKV, past, GH, dtype=dtype) if past else None,
        "seqlens_k": np.array(seqlens, np.int32), "total": np.array(total, np.int32)}
    names = ("cos", "sin", "position_ids", "attention_bias", "head_sink")
    feeds.update({n: extra.get(n) for n in names})
    while feeds[next(reversed(feeds))] is None:
        feeds.popitem()
    return feeds


def gqa(feeds: dict[str, Any], dtype: Any = np.float32, outputs: tuple[str, ...] = GQA_OUTS,
        **attrs: Any) -> list[Any]:
    # present outputs always named: without them onnxruntime's CPU kernel ignores the past
    return check_ms("GroupQueryAttention", feeds, outputs, num_heads=GN, kv_num_heads=GKV,
                    **attrs, **att_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", ["prompt", "prompt-padded", "prompt-buffer", "decode",
                                  "decode-buffer", "continue", "packed"])
def test_group_query_attention_cache(dtype: Any, case: str) -> None:
    feeds = {
        "prompt": lambda: gqa_inputs(5, 0, [4, 4], 5, dtype),
        "prompt-padded": lambda: gqa_inputs(5, 0, [2, 4], 5, dtype),
        "prompt-buffer": lambda: gqa_inputs(5, 8, [4, 4], 5, dtype),
        "decode": lambda: gqa_inputs(1, 6, [6, 3], 7, dtype),
        "decode-buffer": lambda: gqa_inputs(1, 10, [6, 3], 7, dtype),
        "continue": lambda: gqa_inputs(3, 4, [6], 7, dtype, batch=1),  # ORT: batch 1 only
        "packed": lambda: gqa_inputs(1, 4, [4, 2], 5, dtype, packed=True),
    }[case]()
    got = gqa(feeds, dtype)
    if case == "decode":  # rows past batch 1's cache (3 + 1 tokens) stay zero
        assert np.all(got[1][1, :, 4:] == 0)


COS, SIN = rand(24, GH // 2), rand(24, GH // 2)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", ["prompt", "decode-interleaved", "continue",
                                  "position_ids-prompt", "position_ids-decode"])
def test_group_query_attention_rotary(dtype: Any, case: str) -> None:
    caches = {"cos": COS.astype(dtype), "sin": SIN.astype(dtype)}
    attrs: dict[str, Any] = {"do_rotary": 1}
    if case == "prompt":
        feeds = gqa_inputs(4, 0, [3, 2], 4, dtype, **caches)
    elif case == "decode-interleaved":
        feeds = gqa_inputs(1, 5, [5, 2], 6, dtype, **caches)
        attrs["rotary_interleaved"] = 1
    elif case == "continue":
        feeds = gqa_inputs(3, 4, [6], 7, dtype, batch=1, **caches)
    elif case == "position_ids-prompt":  # a first prompt reads only position_ids[0, 0]
        pos = np.array([[3, 7, 2, 9], [5, 1, 0, 4]], np.int64)
        feeds = gqa_inputs(4, 0, [3, 3], 4, dtype, position_ids=pos, **caches)
    else:
        pos = np.array([[9], [4]], np.int64)
        feeds = gqa_inputs(1, 5, [5, 3], 6, dtype, position_ids=pos, **caches)
    gqa(feeds, dtype, **attrs)


@pytest.mark.parametrize("dtype", DTYPES, ids=DT_IDS)
@pytest.mark.parametrize("case", ["window", "window-decode", "softcap-scale", "bias-softcap",
                                  "head_sink", "smooth", "bidirectional"])
def test_group_query_attention_scores(dtype: Any, case: str) -> None:
    attrs: dict[str, Any] = {}
    feeds = gqa_inputs(6, 0, [5, 5], 6, dtype)
    if case == "window":
        attrs["local_window_size"] = 3
    elif case == "window-decode":
        feeds = gqa_inputs(1, 7, [7, 4], 8, dtype)
        attrs["local_window_size"] = 2
    elif case == "softcap-scale":
        attrs.update(softcap=2.0, scale=0.7)
    elif case == "bias-softcap":
        feeds = gqa_inputs(4, 0, [3, 2], 4, dtype, attention_bias=rand(1, GN, 4, 4, dtype=dtype))
        attrs["softcap"] = 1.5
    elif case == "head_sink":
        feeds = gqa_inputs(1, 4, [4, 2], 5, dtype, head_sink=rand(GN, dtype=dtype))
    elif case == "smooth":
        attrs["smooth_softmax"] = 1
    else:
        feeds = gqa_inputs(3, 0, [2, 1], 3, dtype)
        attrs["causal"] = 0
    gqa(feeds, dtype, **attrs)


@pytest.mark.parametrize("mode", [1, 2])
def test_group_query_attention_qk_output(mode: int) -> None:
    feeds = gqa_inputs(1, 4, [4, 2], 5)
    gqa(feeds, np.float32, (*GQA_OUTS, "qk"), qk_output=mode, softcap=1.0)
    feeds = gqa_inputs(4, 0, [3, 2], 4, attention_bias=rand(B, 1, 4, 4))
    gqa(feeds, np.float32, (*GQA_OUTS, "qk"), qk_output=mode)


def test_group_query_attention_qk_norms_equal_a_separate_rms_norm() -> None:
    # onnxruntime runs q/k norm weights only on CUDA and WebGPU: the documented equivalent is a
    # per-head SimplifiedLayerNormalization ahead of the op
    feeds = gqa_inputs(4, 0, [3, 3], 4, cos=COS, sin=SIN)
    wq, wk = rand(GH), rand(GH)

    def rms(x: np.ndarray, w: np.ndarray, n: int) -> np.ndarray:
        h = x.reshape(B, 4, n, GH).astype(np.float64)
        return (h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * w).reshape(x.shape).astype(np.float32)

    normed = dict(feeds, q=rms(feeds["q"], wq, GN), k=rms(feeds["k"], wk, GKV))
    want = gqa(normed, np.float32, do_rotary=1)
    with_norms = dict(feeds, position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
                      v_scale=None, q_norm_weight=wq, k_norm_weight=wk)
    got = run_oxla(node_model("GroupQueryAttention", with_norms, GQA_OUTS, domain=MS,
                              num_heads=GN, kv_num_heads=GKV, do_rotary=1), with_norms)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_group_query_attention_refuses_a_quantized_cache() -> None:
    feeds = gqa_inputs(1, 4, [4, 2], 5)
    with pytest.raises(LoweringError, match="a quantized KV cache is not supported"):
        run_oxla(node_model("GroupQueryAttention", feeds, GQA_OUTS, domain=MS, num_heads=GN,
                            kv_num_heads=GKV, k_quant_type="PER_TENSOR"), feeds)
