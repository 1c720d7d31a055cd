"""Models rewritten by onnxruntime's transformer optimizer run in oxla as in onnxruntime.

The files come from scripts/export_ort_optimized.py (tiny BERT, GPT-2 with past, ViT, float32 and
float16, and a BERT rewritten by onnxruntime's own extended-level fusions).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import oxla

MODELS = Path(__file__).resolve().parent.parent / "models" / "ort"
FILES = sorted(MODELS.glob("*.onnx"))

# the fusions each file must hold, so a re-export that stops fusing cannot pass unnoticed
EXPECTED_OPS = {
    "bert_tiny": {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"},
    "gpt2_tiny_past": {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "FastGelu"},
    "vit_tiny": {"Attention", "SkipLayerNormalization", "BiasGelu"},
    "bert_tiny_ort_extended": {"FusedMatMul", "FusedGemm", "BiasGelu", "LayerNormalization"},
}


def _feeds(path: Path) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{path.stem.removesuffix('_fp16')}.npz") as data:
        return {k: data[k] for k in data.files}


def _fp16_tolerance(want: np.ndarray) -> float:
    """Two float16 ulps at the output's largest magnitude.

    Both runtimes round every fp16 op of the graph (a few dozen in a row here) and differ in
    where they accumulate in float32; measured, each is ~1e-3 (relative to the output's scale)
    from the float32 model and they are within 1.05 ulps of each other.
    """
    top = float(np.abs(want).max())
    return 2 * 2.0 ** (np.floor(np.log2(top)) - 10) if top else 1e-3


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_optimized_model_matches_onnxruntime(path: Path) -> None:
    import onnxruntime as ort

    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node if n.domain in ("com.microsoft", "", "ai.onnx")}
    assert EXPECTED_OPS[path.stem.removesuffix("_fp16")] <= ops
    assert any(n.domain == "com.microsoft" for n in model.graph.node)
    feeds = _feeds(path)
    got = oxla.InferenceSession(str(path)).run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    fp16 = path.stem.endswith("_fp16")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        if fp16:
            np.testing.assert_allclose(g, w, rtol=0, atol=_fp16_tolerance(w))
        else:
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)


def test_every_model_is_tested() -> None:
    assert {p.stem.removesuffix("_fp16") for p in FILES} == set(EXPECTED_OPS)
    assert len(FILES) == 7


# --- a decoder layer as onnxruntime-genai writes one, run for a prompt and a decoding step --

GN, GKV, GH, GD = 4, 2, 16, 64  # query heads, kv heads, head size, hidden


def _decoder_weights() -> list[onnx.TensorProto]:
    from onnx import numpy_helper

    rng = np.random.default_rng(3)
    angles = np.arange(32)[:, None] / 10 ** (np.arange(GH // 2) / 4)
    weights = {"w_norm": rng.uniform(0.5, 1.5, GD),
               "w_qkv": rng.standard_normal((GD, (GN + 2 * GKV) * GH)) * 0.2,
               "w_o": rng.standard_normal((GN * GH, GD)) * 0.2, "w_norm2": rng.uniform(0.5, 1.5, GD),
               "w_up": rng.standard_normal((GD, 2 * GD)) * 0.2,
               "w_down": rng.standard_normal((2 * GD, GD)) * 0.2,
               "cos": np.cos(angles), "sin": np.sin(angles)}
    tensors = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    return tensors + [numpy_helper.from_array(np.array([1], np.int64), n) for n in ("one", "axis1")]


def _decoder_layer() -> onnx.ModelProto:
    """RMSNorm -> packed QKV -> GroupQueryAttention (rotary, KV cache) -> SkipRMSNorm -> MLP."""
    from onnx import TensorProto, helper

    ms = "com.microsoft"
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["seqlens64"]),
        helper.make_node("Cast", ["seqlens64"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total64"], axis=0),
        helper.make_node("Squeeze", ["total64"], ["total_sq"]),
        helper.make_node("Cast", ["total_sq"], ["total"], to=TensorProto.INT32),
        helper.make_node("SimplifiedLayerNormalization", ["x", "w_norm"], ["normed"], epsilon=1e-6),
        helper.make_node("MatMul", ["normed", "w_qkv"], ["qkv"]),
        helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_key", "past_value", "seqlens_k",
                                                 "total", "cos", "sin"],
                         ["attn", "present_key", "present_value"], domain=ms, num_heads=GN,
                         kv_num_heads=GKV, do_rotary=1),
        helper.make_node("MatMul", ["attn", "w_o"], ["attn_out"]),
        helper.make_node("SkipSimplifiedLayerNormalization", ["attn_out", "x", "w_norm2"],
                         ["normed2", "", "", "residual"], domain=ms, epsilon=1e-6),
        helper.make_node("MatMul", ["normed2", "w_up"], ["up"]),
        helper.make_node("QuickGelu", ["up"], ["act"], domain=ms),
        helper.make_node("MatMul", ["act", "w_down"], ["down"]),
        helper.make_node("Add", ["down", "residual"], ["y"]),
    ]
    f32 = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f32, ["batch", "seq", GD]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"]),
              helper.make_tensor_value_info("past_key", f32, ["batch", GKV, "past", GH]),
              helper.make_tensor_value_info("past_value", f32, ["batch", GKV, "past", GH])]
    outputs = [helper.make_tensor_value_info("y", f32, ["batch", "seq", GD]),
               helper.make_tensor_value_info("present_key", f32, ["batch", GKV, "total", GH]),
               helper.make_tensor_value_info("present_value", f32, ["batch", GKV, "total", GH])]
    graph = helper.make_graph(nodes, "decoder_layer", inputs, outputs, _decoder_weights())
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid(ms, 1)])


def test_genai_style_decoder_layer_prompt_then_decode() -> None:
    import onnxruntime as ort

    data = _decoder_layer().SerializeToString()
    ours = oxla.InferenceSession(data)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    batch, prompt = 2, 5
    empty = np.zeros((batch, GKV, 0, GH), np.float32)
    state = {"ours": (empty, empty), "theirs": (empty, empty)}
    for step, seq in enumerate((prompt, 1, 1)):
        x = rng.standard_normal((batch, seq, GD)).astype(np.float32)
        mask = np.ones((batch, prompt + step), np.int64)
        got = ours.run(None, {"x": x, "attention_mask": mask, "past_key": state["ours"][0],
                              "past_value": state["ours"][1]})
        want = theirs.run(None, {"x": x, "attention_mask": mask, "past_key": state["theirs"][0],
                                 "past_value": state["theirs"][1]})
        for g, w in zip(got, want):  # each runtime feeds its own cache to the next step
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
        state = {"ours": (got[1], got[2]), "theirs": (want[1], want[2])}
    assert state["ours"][0].shape == (batch, GKV, prompt + 2, GH)
