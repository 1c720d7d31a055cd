"""oxla's native GRU and LSTM loops (oxla/native/kernels.cc, Sgru and Slstm) and the rules' use
of them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla import cpu_client, native
from oxla.lowering.context import Options

needs_kernel = pytest.mark.skipif(not native.available(),
                                  reason=f"no native kernel here: {native.unavailable_reason()}")


def _gru(steps: int, batch: int, inputs: int, hidden: int, *, direction: str = "bidirectional",
         lbr: int = 1, lens: bool = False, clip: float | None = None, layout: int = 0,
         activations: list[str] | None = None, seed: int = 0, dtype: Any = np.float32,
         lstm: bool = False, peepholes: bool = False, input_forget: int = 0
         ) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """One GRU (or, with `lstm`, LSTM) node with W, R, B (and P) as initializers and X, the
    initial states (and sequence_lens) as inputs; feeds for it."""
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1
    gates = 4 if lstm else 3
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    shapes = [("W", (dirs, gates * hidden, inputs)), ("R", (dirs, gates * hidden, hidden)),
              ("B", (dirs, 2 * gates * hidden))] + ([("P", (dirs, 3 * hidden))] if peepholes else [])
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(dtype), n)
             for n, s in shapes]
    attrs: dict[str, Any] = {"direction": direction, "hidden_size": hidden}
    if lstm:
        attrs["input_forget"] = input_forget
    else:
        attrs["linear_before_reset"] = lbr
    if clip is not None:
        attrs["clip"] = clip
    if layout:
        attrs["layout"] = layout
    if activations:
        attrs["activations"] = activations
    states = ["h0", "c0"] if lstm else ["h0"]
    node = helper.make_node("LSTM" if lstm else "GRU",
                            ["X", "W", "R", "B", "lens" if lens else "", *states]
                            + (["P" if peepholes else ""] if lstm else []),
                            ["Y", "Y_h", "Y_c"] if lstm else ["Y", "Y_h"], **attrs)
    x_shape = (steps, batch, inputs) if layout == 0 else (batch, steps, inputs)
    h_shape = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    graph_inputs = [helper.make_tensor_value_info(n, elem, x_shape if n == "X" else h_shape)
                    for n in ("X", *states)]
    feeds = {n: rng.standard_normal(x_shape if n == "X" else h_shape).astype(dtype)
             for n in ("X", *states)}
    if lens:
        graph_inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, (batch,)))
        lengths = rng.integers(1, steps, batch).astype(np.int32)
        lengths[0], lengths[-1] = steps, 0  # a full sequence and an empty one
        feeds["lens"] = lengths
    graph = helper.make_graph([node], "rnn", graph_inputs,
                              [helper.make_empty_tensor_value_info(n) for n in node.output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), feeds


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int) -> list[np.ndarray]:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    out = oxla.CompiledModel(copy, Options(layout_weights=True, native_recurrent=threads))(feeds)
    return [np.asarray(out[n]) for n in model.graph.node[0].output]


@pytest.fixture
def ffi_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The targets of the FFI calls lowered while the test runs."""
    seen: list[str] = []
    real = jax.ffi.ffi_call

    def record(target: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(target)
        return real(target, *args, **kwargs)

    monkeypatch.setattr(jax.ffi, "ffi_call", record)
    return seen


CASES = [
    pytest.param(dict(steps=20, batch=1, inputs=16, hidden=256), id="bi-h256"),  # two threads
    pytest.param(dict(steps=9, batch=3, inputs=5, hidden=37, lbr=0), id="h37-two-stages"),
    pytest.param(dict(steps=9, batch=4, inputs=5, hidden=40, lens=True), id="lens"),
    pytest.param(dict(steps=9, batch=4, inputs=5, hidden=40, lens=True, lbr=0,
                      direction="reverse"), id="reverse-lens"),
    pytest.param(dict(steps=6, batch=2, inputs=5, hidden=300, clip=0.7, direction="forward"),
                 id="forward-clip-h300"),
    pytest.param(dict(steps=12, batch=40, inputs=8, hidden=64, lbr=0), id="batch40"),
    pytest.param(dict(steps=20, batch=1, inputs=16, hidden=256, lstm=True), id="lstm-bi-h256"),
    pytest.param(dict(steps=9, batch=4, inputs=5, hidden=40, lens=True, lstm=True, peepholes=True),
                 id="lstm-lens-peepholes"),
    pytest.param(dict(steps=9, batch=4, inputs=5, hidden=40, lens=True, lstm=True,
                      direction="reverse", input_forget=1), id="lstm-reverse-input-forget"),
    pytest.param(dict(steps=6, batch=2, inputs=5, hidden=300, clip=0.7, direction="forward",
                      lstm=True, peepholes=True), id="lstm-forward-clip-peepholes"),
]


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_native_loop_agrees_with_onnxruntime_and_the_scans(case: dict[str, Any],
                                                           ffi_calls: list[str]) -> None:
    model, feeds = _gru(**case)
    target = native.LSTM_TARGET if case.get("lstm") else native.GRU_TARGET
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    scans = _run(model, feeds, 0)
    assert target not in ffi_calls
    for threads in (2, 1):  # (one thread: batches only)
        got = _run(model, feeds, threads)
        assert target in ffi_calls
        for g, s, w in zip(got, scans, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
            np.testing.assert_allclose(g, s, rtol=1e-5, atol=2e-5)
        if case.get("lens"):  # past a sequence's end: zeros; an empty sequence ends in zeros
            lengths = feeds["lens"]
            assert not got[0][lengths[1]:, :, 1].any()
            assert all(not g[:, -1].any() for g in got[1:])


@needs_kernel
def test_batch_first_layout() -> None:
    # onnxruntime has no layout=1 GRU: the scans are the reference
    model, feeds = _gru(7, 3, 5, 24, layout=1)
    for g, s in zip(_run(model, feeds, 2), _run(model, feeds, 0)):
        assert g.shape == s.shape
        np.testing.assert_allclose(g, s, rtol=1e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("kind", ["activations", "lstm-activations", "float64", "small-batch-1"])
def test_layers_it_does_not_run_stay_scans(kind: str, ffi_calls: list[str]) -> None:
    if kind == "activations":
        model, feeds = _gru(5, 2, 4, 16, direction="forward", activations=["HardSigmoid", "Tanh"])
    elif kind == "lstm-activations":
        model, feeds = _gru(5, 2, 4, 16, direction="forward", lstm=True,
                            activations=["Sigmoid", "Tanh", "Relu"])
    elif kind == "small-batch-1":  # under NATIVE_MIN_MACS the kernel would run on one thread
        model, feeds = _gru(5, 1, 4, 64)
    else:
        model, feeds = _gru(5, 2, 4, 16, dtype=np.float64)
    got = _run(model, feeds, 2)
    assert native.GRU_TARGET not in ffi_calls and native.LSTM_TARGET not in ffi_calls
    if kind == "float64":  # onnxruntime has no float64 GRU: the same layer in float32
        model, feeds = _gru(5, 2, 4, 16)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


def _sgru(xw, wb, r, rb, h0, threads: int, device) -> list[np.ndarray]:
    steps, batch, dirs, hidden = xw.shape[0], h0.shape[1], r.shape[0], r.shape[-1]
    out = (jax.ShapeDtypeStruct((steps, dirs, batch, hidden), jnp.float32),
           jax.ShapeDtypeStruct((dirs, batch, hidden), jnp.float32))

    def f(xw, wb, r, rb, h0):
        return jax.ffi.ffi_call(native.GRU_TARGET, out)(
            jnp.reshape(xw, (steps * batch, -1)), wb, r[0], r[dirs - 1], rb, h0,
            jnp.zeros((0,), jnp.int32), threads=np.int64(threads),
            linear_before_reset=np.int64(1), reverse=np.int64(0), clip=np.float32(0))

    args = [jax.device_put(a, device) for a in (xw, wb, r, rb, h0)]
    return [np.asarray(v) for v in jax.jit(f)(*args)]


@needs_kernel
def test_threads_split_the_units_not_the_arithmetic() -> None:
    # each hidden unit is computed by one thread with the same operations whoever runs it: the
    # caller alone, the caller with a pool thread, or a pool with one thread give the same bits
    rng = np.random.default_rng(1)
    steps, batch, dirs, hidden = 30, 2, 2, 256
    args = (rng.standard_normal((steps, batch, dirs * 3 * hidden)).astype(np.float32),
            rng.standard_normal((dirs, 3 * hidden)).astype(np.float32),
            (rng.standard_normal((dirs, 3 * hidden, hidden)) * 0.1).astype(np.float32),
            rng.standard_normal((dirs, 3 * hidden)).astype(np.float32),
            rng.standard_normal((dirs, batch, hidden)).astype(np.float32))
    one = _sgru(*args, 1, cpu_client.inline_device())
    for threads, device in ((2, cpu_client.inline_device()),
                            (2, cpu_client.single_thread_device() or cpu_client.inline_device())):
        for _ in range(3):
            for a, b in zip(_sgru(*args, threads, device), one):
                np.testing.assert_array_equal(a, b)


@needs_kernel
@pytest.mark.parametrize("batch", [1, 4])
def test_one_core_sessions_use_it_for_batches_only(batch: int, ffi_calls: list[str]) -> None:
    model, feeds = _gru(6, batch, 8, 256)
    data = model.SerializeToString()
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    oxla.InferenceSession(data, one).run(None, feeds)
    assert (native.GRU_TARGET in ffi_calls) == (batch > 1)
    ffi_calls.clear()
    oxla.InferenceSession(data).run(None, feeds)
    assert (native.GRU_TARGET in ffi_calls) == (cpu_client.cores() > 1 or batch > 1)


@needs_kernel
@pytest.mark.parametrize("lstm", [False, True])
def test_sequence_lengths_out_of_range_match_the_scans(lstm: bool) -> None:
    # past T: the whole sequence; negative or zero: none of it (zero outputs and final states)
    model, feeds = _gru(6, 4, 5, 256, lens=True, lstm=lstm)
    feeds["lens"] = np.array([11, -3, 0, 2], np.int32)
    got = _run(model, feeds, 2)
    for g, s in zip(got, _run(model, feeds, 0)):
        np.testing.assert_allclose(g, s, rtol=1e-5, atol=2e-5)
    assert not got[0][:, :, 1:3].any() and all(not g[:, 1:3].any() for g in got[1:])
