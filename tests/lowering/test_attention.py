"""Attention-family rules against onnx.reference (and onnxruntime where it has the op)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from onnx import TensorProto, helper

import oxla
from oxla.errors import LoweringError
from tests.lowering.util import check_node, node_model, run_oxla

RNG = np.random.default_rng(0)


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


Q4, K4, V4 = rand(2, 4, 3, 8), rand(2, 4, 5, 8), rand(2, 4, 5, 6)
KG, VG = rand(2, 2, 5, 8), rand(2, 2, 5, 6)  # 2 kv heads for 4 query heads
OUTS = ("y", "present_key", "present_value", "qk")


def attn(opset: int = 25, rtol: float = 1e-5, atol: float = 1e-6, reference: bool = True,
         **feeds_and_attrs):
    names = ("q", "k", "v", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen")
    feeds = {n: feeds_and_attrs.pop(n, None) for n in names}
    while feeds and feeds[next(reversed(feeds))] is None:
        feeds.popitem()
    outs = feeds_and_attrs.pop("outputs", ("y",))
    # onnxruntime 1.32 has no Attention past opset 24
    return check_node("Attention", feeds, outs, opset=opset, ort=opset <= 24, reference=reference,
                      rtol=rtol, atol=atol, **feeds_and_attrs)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_output_modes_with_softcap_and_mask(mode: int) -> None:
    # mode 0 is the raw QK product (spec and function body); onnx.reference returns it softcapped
    attn(opset=24, q=Q4, k=K4, v=V4, attn_mask=rand(3, 5), softcap=2.0, qk_matmul_output_mode=mode,
         outputs=OUTS, reference=mode != 0, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k, v", [(KG, VG), (KG[:, :1], VG[:, :1])], ids=["gqa", "mqa"])
def test_attention_grouped_heads_scaled(k: np.ndarray, v: np.ndarray) -> None:
    attn(q=Q4, k=k, v=v, scale=0.3)


def test_attention_3d_inputs_need_head_counts() -> None:
    q, k, v = rand(2, 3, 16), rand(2, 5, 8), rand(2, 5, 6)
    attn(q=q, k=k, v=v, q_num_heads=4, kv_num_heads=2, is_causal=1)
    with pytest.raises(LoweringError, match="3-D Q, K, V need the q_num_heads and kv_num_heads"):
        run_oxla(node_model("Attention", {"q": q, "k": k, "v": v}), {"q": q, "k": k, "v": v})


@pytest.mark.parametrize("opset", [23, 25])
def test_attention_past_and_present_causal_bool_mask(opset: int) -> None:
    mask = RNG.random((2, 1, 3, 7)) > 0.3
    mask[0, 0, 1] = False  # a fully masked row gives zeros, not NaN
    got = attn(opset=opset, q=Q4, k=KG[:, :, :2], v=VG[:, :, :2], attn_mask=mask,
               past_key=KG, past_value=VG, is_causal=1, outputs=OUTS)
    assert not np.isnan(got[0]).any() and np.all(got[0][0, :, 1] == 0)


def test_attention_short_float_mask_is_padded_with_neg_inf() -> None:
    attn(q=Q4, k=K4, v=V4, attn_mask=rand(4, 3, 3))


def test_attention_nonpad_kv_seqlen_causal_external_cache() -> None:
    lengths = np.array([4, 5], np.int64)
    attn(q=Q4, k=KG, v=VG, nonpad_kv_seqlen=lengths, is_causal=1, opset=24)


@pytest.mark.parametrize("left, right", [(1, 0), (2, 1), (-1, 1)])
def test_attention_sliding_windows(left: int, right: int) -> None:
    attn(q=Q4, k=K4, v=V4, left_window_size=left, right_window_size=right, is_causal=int(right == 0))


def test_attention_float16_softmax_precision() -> None:
    q, k, v = (x.astype(np.float16) for x in (Q4, K4, V4))
    attn(q=q, k=k, v=v, softmax_precision=TensorProto.FLOAT, qk_matmul_output_mode=3,
         outputs=OUTS, rtol=2e-3, atol=2e-3)


def test_attention_v25_rejects_head_counts_for_4d() -> None:
    feeds = {"q": Q4, "k": K4, "v": V4}
    with pytest.raises(LoweringError, match="must not be given for 4-D inputs"):
        run_oxla(node_model("Attention", feeds, q_num_heads=4), feeds)


def test_attention_gradient() -> None:
    compiled = oxla.compile(node_model("Attention", {"q": Q4, "k": K4, "v": V4}, is_causal=1))
    fn = jax.jit(lambda q: compiled.fn(compiled.params, {"q": q, "k": K4, "v": V4})["y"])
    check_grads(fn, (jnp.asarray(Q4, jnp.float64),), order=1, modes=("rev",), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rot_dim", [0, 4])
def test_rotary_embedding_4d_position_ids(interleaved: int, rot_dim: int) -> None:
    half = (rot_dim or 8) // 2
    feeds = {"x": Q4, "cos": rand(10, half), "sin": rand(10, half),
             "position_ids": RNG.integers(0, 10, (2, 3)).astype(np.int64)}
    check_node("RotaryEmbedding", feeds, interleaved=interleaved, rotary_embedding_dim=rot_dim)


def test_rotary_embedding_3d_without_position_ids() -> None:
    feeds = {"x": rand(2, 3, 16), "cos": rand(2, 3, 2), "sin": rand(2, 3, 2)}
    check_node("RotaryEmbedding", feeds, num_heads=4)


@pytest.mark.parametrize("rule, gated, delta", [("linear", False, False), ("gated", True, False),
                                                ("delta", False, True), ("gated_delta", True, True)])
def test_linear_attention_update_rules(rule: str, gated: bool, delta: bool) -> None:
    b, t, hq, hk, dk, dv = 2, 4, 4, 2, 3, 5
    feeds = {"query": rand(b, t, hq * dk), "key": rand(b, t, hk * dk) * 0.3,
             "value": rand(b, t, hk * dv), "past_state": rand(b, hk, dk, dv),
             "decay": -np.abs(rand(b, t, hk * dk)) if gated else None,
             "beta": RNG.random((b, t, hk)).astype(np.float32) if delta else None}
    # onnxruntime 1.32 has no LinearAttention
    check_node("LinearAttention", feeds, ("y", "state"), q_num_heads=hq, kv_num_heads=hk,
               update_rule=rule, ort=False, rtol=1e-4, atol=1e-5)


def test_linear_attention_rule_inputs_are_checked() -> None:
    feeds = {"query": rand(1, 2, 4), "key": rand(1, 2, 4), "value": rand(1, 2, 4)}
    with pytest.raises(LoweringError, match="update_rule 'gated_delta' needs decay"):
        run_oxla(node_model("LinearAttention", feeds, ("y", "s"), q_num_heads=1, kv_num_heads=1), feeds)


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state(activation: str, with_state: bool) -> None:
    feeds = {"x": rand(2, 3, 5), "w": rand(3, 1, 4), "bias": rand(3),
             "past": rand(2, 3, 3) if with_state else None}
    check_node("CausalConvWithState", feeds, ("y", "state"), activation=activation, ort=False)


def test_causal_conv_kernel_one_has_empty_state() -> None:
    feeds = {"x": rand(1, 2, 3), "w": rand(2, 1, 1)}
    got = check_node("CausalConvWithState", feeds, ("y", "state"), ort=False)
    assert got[1].shape == (1, 2, 0)


def test_flex_attention_gqa_with_score_mod() -> None:
    x = helper.make_tensor_value_info("s", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("t", TensorProto.FLOAT, None)
    score_mod = helper.make_graph([helper.make_node("Tanh", ["s"], ["t"])], "cap", [x], [y])
    feeds = {"q": Q4, "k": KG, "v": VG}
    check_node("FlexAttention", feeds, domain="ai.onnx.preview", opset=1, ort=False,
               score_mod=score_mod, scale=0.5)


def test_flex_attention_float64_computes_in_float64() -> None:
    feeds = {"q": Q4.astype(np.float64), "k": K4.astype(np.float64), "v": V4.astype(np.float64)}
    got = check_node("FlexAttention", feeds, domain="ai.onnx.preview", opset=1, ort=False, rtol=1e-10)
    assert got[0].dtype == np.float64


def test_jit_reuses_attention_compile() -> None:
    # the rule is pure jnp: it composes with the caller's jit. The caller's compile keeps XLA's
    # default fusions and oxla's does not (oxla.cpu_client): float32 rounding orders differ
    compiled = oxla.compile(node_model("Attention", {"q": Q4, "k": K4, "v": V4}))
    f = jax.jit(lambda q: compiled.fn(compiled.params, {"q": q, "k": K4, "v": V4})["y"])
    np.testing.assert_allclose(f(Q4), run_oxla(node_model("Attention", {"q": Q4, "k": K4, "v": V4}),
                                               {"q": Q4, "k": K4, "v": V4})[0], rtol=1e-5, atol=1e-6)


def test_attention_fully_masked_row_has_finite_gradient() -> None:
    mask = np.ones((3, 5), bool)
    mask[1] = False
    feeds = {"q": Q4, "k": K4, "v": V4, "attn_mask": mask}
    compiled = oxla.compile(node_model("Attention", feeds))
    loss = lambda q: compiled.fn(compiled.params, {**feeds, "q": q})["y"].sum()  # noqa: E731
    grad = np.asarray(jax.grad(loss)(jnp.asarray(Q4)))
    assert np.isfinite(grad).all() and np.all(grad[:, :, 1] == 0)
