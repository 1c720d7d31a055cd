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
