"""The same onnxruntime user code, run with `onnxruntime` and with `oxla` as the module: same results.

Each snippet is a function of the runtime module `rt`, written the way onnxruntime's own
documentation and user code write it; the test runs it under both and compares what it returns.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest

import oxla

MODELS = Path(__file__).resolve().parent.parent / "models"
RESNET = str(MODELS / "resnet_small.onnx")
IMAGE = np.random.default_rng(0).random((2, 3, 64, 64), np.float32)
OVERRIDABLE = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18], producer_name: "parity", model_version: 3,
     doc_string: "a model with an overridable weight">
    g (float[2] x, float[2] w) => (float[2] y) <float[2] w = {2.0, 3.0}> {
        y = Mul(x, w)
    }
""").SerializeToString()


def _close(a: Any, b: Any) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _close(x, y)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (a, b)
        for k in a:
            _close(a[k], b[k])
    else:
        assert a == b, (a, b)


def basic(rt: Any) -> Any:
    sess = rt.InferenceSession(RESNET, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    info = [(i.name, i.shape, i.type) for i in sess.get_inputs() + sess.get_outputs()]
    return info, sess.run(None, {name: IMAGE})


def session_options(rt: Any) -> Any:
    so = rt.SessionOptions()
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.add_session_config_entry("session.use_env_allocators", "1")
    sess = rt.InferenceSession(RESNET, so, providers=["CPUExecutionProvider"])
    entry = sess.get_session_options().get_session_config_entry("session.use_env_allocators")
    return entry, sess.run(["logits"], {"image": IMAGE})


def providers_and_device(rt: Any) -> Any:
    sess = rt.InferenceSession(RESNET, providers=[("CPUExecutionProvider", {})])
    return (sess.get_providers(), "CPUExecutionProvider" in rt.get_available_providers(),
            rt.get_device(), sess.get_provider_options())


def unknown_provider_falls_back_to_cpu(rt: Any) -> Any:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = rt.InferenceSession(RESNET, providers=["NoSuchExecutionProvider", "CPUExecutionProvider"])
    return sess.get_providers(), any("NoSuchExecutionProvider" in str(w.message) for w in caught)


def model_metadata(rt: Any) -> Any:
    meta = rt.InferenceSession(OVERRIDABLE).get_modelmeta()
    return (meta.producer_name, meta.graph_name, meta.description, meta.version,
            meta.custom_metadata_map)


def overridable_initializers(rt: Any) -> Any:
    sess = rt.InferenceSession(OVERRIDABLE)
    names = [(i.name, i.shape, i.type) for i in sess.get_overridable_initializers()]
    x = np.array([1.0, 1.0], np.float32)
    return names, sess.run(None, {"x": x}), sess.run(None, {"x": x, "w": np.array([5, 7], np.float32)})


def run_options(rt: Any) -> Any:
    ro = rt.RunOptions()
    ro.log_severity_level = 3
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return rt.InferenceSession(RESNET).run(None, {"image": IMAGE}, ro)


def list_feeds_are_cast(rt: Any) -> Any:
    sess = rt.InferenceSession(OVERRIDABLE)
    return sess.run(None, {"x": [1.5, 2.5]})


def misspelt_input_is_a_value_error(rt: Any) -> Any:
    try:
        rt.InferenceSession(RESNET).run(None, {"imgae": IMAGE})
    except ValueError:
        return "ValueError"
    return "no error"


def wrong_dtype_raises(rt: Any) -> Any:
    try:
        rt.InferenceSession(RESNET).run(None, {"image": IMAGE.astype(np.float64)})
    except Exception:
        return "raised"
    return "no error"


def run_async_calls_back(rt: Any) -> Any:
    sess = rt.InferenceSession(RESNET)
    done = threading.Event()
    got: dict[str, Any] = {}

    def callback(outputs: Any, user_data: Any, err: str) -> None:
        got.update(outputs=outputs, user_data=user_data, err=err)
        done.set()

    sess.run_async(None, {"image": IMAGE}, callback, "tag")
    assert done.wait(60)
    return got["outputs"], got["user_data"], got["err"]


SNIPPETS: list[Callable[[Any], Any]] = [
    basic, session_options, providers_and_device, unknown_provider_falls_back_to_cpu,
    model_metadata, overridable_initializers, run_options, list_feeds_are_cast,
    misspelt_input_is_a_value_error, wrong_dtype_raises, run_async_calls_back,
]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda f: f.__name__)
def test_same_code_same_results(snippet: Callable[[Any], Any]) -> None:
    _close(snippet(oxla), snippet(onnxruntime))


def test_device_outputs_stay_jax_arrays() -> None:
    import jax

    ro = oxla.RunOptions()
    ro.device_outputs = True
    (logits,) = oxla.InferenceSession(RESNET).run(None, {"image": IMAGE}, ro)
    assert isinstance(logits, jax.Array)


def test_thread_settings_warn_once_and_run() -> None:
    so = oxla.SessionOptions()
    so.intra_op_num_threads = 3
    with pytest.warns(UserWarning, match="XLA's thread pool"):
        sess = oxla.InferenceSession(RESNET, so)
    assert sess.run(None, {"image": IMAGE})[0].shape == (2, 10)


def test_one_intra_op_thread_runs_on_the_one_thread_client() -> None:
    """intra_op_num_threads = 1 is honoured: the session compiles for oxla's CPU client whose
    pool has one thread (no warning), with the same results up to float rounding (the default
    session runs this model on the pooled client, where XLA's library calls differ)."""
    import warnings

    from oxla import cpu_client

    so = oxla.SessionOptions()
    so.intra_op_num_threads = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sess = oxla.InferenceSession(RESNET, so)
    got = sess.run(None, {"image": IMAGE})[0]
    device = sess._compiled._executor.device
    assert device == cpu_client.single_thread_device() and device != cpu_client.inline_device()
    np.testing.assert_allclose(got, oxla.InferenceSession(RESNET).run(None, {"image": IMAGE})[0],
                               rtol=1e-5, atol=1e-6)


def test_optimized_model_filepath_writes_the_compiled_artifact(tmp_path: Path) -> None:
    so = oxla.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "resnet.oxla")
    sess = oxla.InferenceSession(RESNET, so)
    exported = oxla.load_exported(so.optimized_model_filepath)
    got = exported.run(None, {"image": IMAGE})[0]
    np.testing.assert_allclose(got, sess.run(None, {"image": IMAGE})[0], rtol=1e-5, atol=1e-6)


def test_optimized_model_filepath_of_a_graph_break_model_is_the_planned_onnx(tmp_path: Path) -> None:
    so = oxla.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "planned.onnx")
    detector = str(MODELS / "detector_nms.onnx")
    with pytest.warns(UserWarning, match="planned ONNX model"):
        oxla.InferenceSession(detector, so)
    planned = onnx.load(so.optimized_model_filepath)
    onnx.checker.check_model(planned)
    image = np.random.default_rng(1).random((1, 3, 64, 64), np.float32)
    got = onnxruntime.InferenceSession(so.optimized_model_filepath).run(None, {"image": image})
    want = onnxruntime.InferenceSession(detector).run(None, {"image": image})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
