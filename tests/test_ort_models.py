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
