"""Models written by converters (skl2onnx, onnxmltools, tf2onnx, paddle2onnx) against onnxruntime.

The files in models/converters/ come from scripts/export_converters.py (each converter in its own
environment); no converter is needed here. Tolerance: labels and strings exactly; floats to
rtol 1e-4 / atol 1e-5, because float32 sums run in another order (XLA's reductions and fused
RNN steps against onnxruntime's loops, tree leaves added per class in another order).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import oxla

MODELS = Path(__file__).resolve().parent.parent / "models" / "converters"
FILES = sorted(p.name for p in MODELS.glob("*.onnx"))
RNG = np.random.default_rng(1)
WORDS = ["the cat sat", "dogs and cats, living together!", "unseen words only", "", "the the the",
         "a quick brown fox; the lazy dog."]
CATEGORIES = np.array([["red", "small"], ["blue", "large"], ["purple", "small"], ["green", "tiny"]],
                      dtype=object)


def _feed(info: onnx.ValueInfoProto) -> np.ndarray:
    """A value for one graph input: 4 rows, other unknown lengths 7; strings and small codes."""
    t = info.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else (4 if i == 0 else 7)
             for i, d in enumerate(t.shape.dim)]
    if t.elem_type == onnx.TensorProto.STRING:
        if shape[-1] == 2:
            return CATEGORIES
        return np.array(WORDS[:shape[0]], dtype=object).reshape(shape)
    if t.elem_type in (onnx.TensorProto.INT32, onnx.TensorProto.INT64):
        # codes past what the encoders saw (unknown categories, padding id 0 of an embedding)
        dtype = np.int32 if t.elem_type == onnx.TensorProto.INT32 else np.int64
        return RNG.integers(0, 7, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))


def _same(got: Any, want: Any, where: str) -> None:
    if isinstance(want, list):  # ZipMap: a sequence of maps label -> probability
        assert isinstance(got, list) and len(got) == len(want), where
        for g, w in zip(got, want):
            assert g.keys() == w.keys(), where
            np.testing.assert_allclose([g[k] for k in w], [w[k] for k in w], rtol=1e-4, atol=1e-5,
                                       err_msg=where)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, f"{where}: {got.shape} {got.dtype}, want {want.shape} {want.dtype}"
    if want.dtype.kind in "fc":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def _onnxruntime(model: onnx.ModelProto) -> ort.InferenceSession:
    """onnxruntime on the model, StringNormalizer's locale (skl2onnx leaves the default, en_US.UTF-8,
    which this machine lacks, and onnxruntime refuses to load then) set to C.UTF-8; oxla needs no locale."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type == "StringNormalizer":
            kept = [a for a in node.attribute if a.name != "locale"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("locale", "C.UTF-8")])
    return ort.InferenceSession(copy.SerializeToString(), providers=["CPUExecutionProvider"])


def test_the_converter_models_are_there() -> None:
    assert {"skl_tfidf_linearsvc.onnx", "skl_random_forest.onnx", "lgbm_classifier.onnx",
            "keras_bigru_text.onnx", "paddle_cnn_se.onnx", "paddle_bigru_text.onnx"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_converter_model_agrees_with_onnxruntime(name: str) -> None:
    path = MODELS / name
    model = onnx.load(path)
    reference, sess = _onnxruntime(model), oxla.InferenceSession(str(path))
    for call in ("first call", "second call"):  # the second on the fast path where one was made
        feeds = {i.name: _feed(i) for i in model.graph.input}
        want = reference.run(None, feeds)
        got = sess.run(None, feeds)
        for out, g, w in zip(model.graph.output, got, want):
            _same(g, w, f"{name} output {out.name}, {call}")


def test_a_small_stem_is_computed_once_not_per_read() -> None:
    """XLA's stem form (multiply-adds over a few input channels) ends in an optimization barrier:
    fused into the Keras model's MaxPool and Resizes it was recomputed for every read (0.82 ms a
    call against 0.13 ms; conv_forms.STEM_BARRIER)."""
    import jax

    model = oxla.InferenceSession(str(MODELS / "keras_cnn_upsampling.onnx")).compiled
    feeds = {"x": RNG.standard_normal((4, 8, 8, 3)).astype(np.float32)}
    with oxla.x64():
        text = jax.jit(model.fn).lower(model.params, feeds).as_text()
    # both convolutions take that form: the 3x3 over 3 channels and the 1x1 over 4 (1.3e4 flops
    # an image: under native_gemm.SMALL_MIN_FLOPS in this model of small kernels); the third
    # barrier is the channels-last MaxPool's own (channels_last.max_pool)
    assert text.count("optimization_barrier") == 3
