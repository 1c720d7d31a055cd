"""Runtime v2: the plan decided before any trace, the executor's caches, threads and x64 scope."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import oxla
from oxla.training import Momentum, TrainingSession, make_trainable

MODELS = Path(__file__).resolve().parent.parent / "models"

WIDE = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (int64[N] x) => (int64[N] big, double[N] tenth) {
        k = Constant<value = int64 {1099511627776}>()
        big = Mul(x, k)
        d = Cast<to = 11>(x)
        t = Constant<value = double {0.1}>()
        tenth = Mul(d, t)
    }
""")

# A float initializer feeds ConstantOfShape's static input through Cast: the plan must make it a
# constant before any trace (the old runtime found out by failing mid-call).
FLOAT_SHAPE = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N] x) => (float[4] y) <float[1] fshape = {4.0}> {
        shp = Cast<to = 7>(fshape)
        z = ConstantOfShape<value = float {1.0}>(shp)
        s = ReduceSum<keepdims = 0>(x)
        y = Add(z, s)
    }
""")

BREAK = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N] x) => (float[M] y, int64[1] n) {
        nz = NonZero(x)
        flat = Flatten<axis = 0>(nz)
        n = Shape(flat)
        picked = Gather(x, flat)
        y = Mul(picked, picked)
    }
""")


def _label_model() -> onnx.ModelProto:
    """string[3] -> LabelEncoder -> int64 -> times two: the strings must never be compiled in."""
    nodes = [helper.make_node("LabelEncoder", ["s"], ["ids"], domain="ai.onnx.ml",
                              keys_strings=[f"w{i}" for i in range(20)], values_int64s=list(range(20)),
                              default_int64=-1),
             helper.make_node("Add", ["ids", "ids"], ["y"])]
    graph = helper.make_graph(nodes, "labels", [helper.make_tensor_value_info("s", TensorProto.STRING, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("ai.onnx.ml", 3)])


def test_import_and_run_leave_the_users_jax_alone() -> None:
    before = (jax.config.jax_enable_x64, jnp.zeros(3).dtype, jnp.arange(3).dtype)
    sess = oxla.InferenceSession(WIDE.SerializeToString())
    sess.run(None, {"x": np.array([1, 2], np.int64)})
    oxla.compile(WIDE)({"x": np.array([1], np.int64)})
    assert (jax.config.jax_enable_x64, jnp.zeros(3).dtype, jnp.arange(3).dtype) == before
    assert before == (False, jnp.float32, jnp.int32)


def test_segments_run_on_oxlas_own_synchronous_client() -> None:
    """Small computations run in the calling thread (oxla.cpu_client), not on JAX's client,
    whose async-dispatch setting stays as the user has it; arrays cross between the two."""
    before = jax.config.values["jax_cpu_enable_async_dispatch"]
    model = oxla.compile(WIDE)
    executor = model._executor
    assert executor.device.client is not jax.devices("cpu")[0].client
    assert all(leaf.devices() == {executor.device} for leaf in executor._leaves)
    x = np.array([1, 2, 3], np.int64)
    with oxla.x64():
        users = jax.device_put(x)  # an array on the user's device, as a feed
        outs = model({"x": users})
        assert next(iter(outs["big"].devices())) == executor.device
        assert (np.asarray(outs["big"] + users) == x * 2**40 + x).all()
    assert jax.config.values["jax_cpu_enable_async_dispatch"] == before


def _matmul_model(n: int) -> onnx.ModelProto:
    """float[n, n] @ a weight initializer: 2 n^3 flops in one node."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [n, n], np.ones(n * n, np.float32))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _concat_model(n: int) -> onnx.ModelProto:
    """float[n, n] stacked on itself: no flops, 16 n^2 bytes moved."""
    graph = helper.make_graph([helper.make_node("Concat", ["x", "x"], ["y"], axis=0)], "cat",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2 * n, n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize(("make", "n", "cores", "single"), [
    (_matmul_model, 8, 2, True), (_matmul_model, 256, 2, False), (_matmul_model, 8, 1, False),
    (_concat_model, 8, 2, True), (_concat_model, 1024, 2, False)])
def test_small_kernels_move_to_the_one_thread_client(
        monkeypatch: pytest.MonkeyPatch, make: Callable[[int], onnx.ModelProto], n: int, cores: int,
        single: bool) -> None:
    """With several cores, a model XLA counts few flops and bytes per node for runs on oxla's
    one-thread client (decided before its first compile; its parameters follow); one with many
    flops or bytes per node stays on the pooled client, as does every model on one core."""
    from oxla import cpu_client

    monkeypatch.setattr(cpu_client, "cores", lambda: cores)
    model = oxla.compile(make(n))
    x = np.arange(n * n, dtype=np.float32).reshape(n, n) / (n * n)
    want = x @ np.ones((n, n), np.float32) if make is _matmul_model else np.concatenate([x, x])
    np.testing.assert_allclose(model({"x": x})["y"], want, rtol=1e-6)
    executor = model._executor
    assert (executor.device == cpu_client.single_thread_device()) is single
    assert (executor.device == cpu_client.inline_device()) is not single
    assert all(leaf.devices() == {executor.device} for leaf in executor._leaves)
    if single:  # what the one-thread client compiles: no YNNPACK fusions outside convolutions
        assert cpu_client.compiler_options(executor.device, ["MatMul"]).get(
            "xla_cpu_experimental_ynn_fusion_type") == ""


@pytest.mark.parametrize("cores", [1, 2])
def test_winograd_segments_get_ynnpack_dots(monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    """Convolving segments get YNNPACK's convolution only, unless they hold Winograd
    convolutions and the pool has several threads (their batched products run as YNNPACK dots);
    integer ones keep every kind."""
    from oxla import cpu_client

    monkeypatch.setattr(cpu_client, "cores", lambda: cores)
    device = cpu_client.inline_device()
    kinds = "xla_cpu_experimental_ynn_fusion_type"
    if cpu_client.YNN_FUSIONS:
        pytest.skip("OXLA_YNN_FUSIONS overrides the choice")
    assert cpu_client.compiler_options(device, ["Conv", "Relu"])[kinds] == cpu_client.CONV_ONLY
    winograd = ["Conv", "Relu", cpu_client.WINOGRAD_CONV]
    want = cpu_client.CONV_AND_DOTS if cores > 1 else cpu_client.CONV_ONLY
    assert cpu_client.compiler_options(device, winograd)[kinds] == want
    assert kinds not in cpu_client.compiler_options(device, ["ConvInteger", "Conv"])


@pytest.mark.parametrize("cores", [1, 2])
def test_segments_of_products_with_a_convolution_get_every_ynnpack_fusion(
        monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    """A vision transformer's segment (one patch-embedding Conv, many MatMuls) compiles as one
    without convolutions on a pooled client; a CNN's classifier Gemm does not change its own."""
    from oxla import cpu_client

    monkeypatch.setattr(cpu_client, "cores", lambda: cores)
    device = cpu_client.inline_device()
    kinds = "xla_cpu_experimental_ynn_fusion_type"
    if cpu_client.YNN_FUSIONS:
        pytest.skip("OXLA_YNN_FUSIONS overrides the choice")
    vit = ["Conv", "Reshape", "Transpose"] + ["MatMul", "Add", "Softmax"] * 8
    cnn = ["Conv", "Relu"] * 8 + ["GlobalAveragePool", "Gemm"]
    if cores > 1:
        assert kinds not in cpu_client.compiler_options(device, vit)
    else:
        assert cpu_client.compiler_options(device, vit)[kinds] == cpu_client.CONV_ONLY
    assert cpu_client.compiler_options(device, cnn)[kinds] == cpu_client.CONV_ONLY


def test_64_bit_models_are_exact() -> None:
    x = np.array([3, -7, 2**31 - 1, 2**40], np.int64)
    big, tenth = oxla.InferenceSession(WIDE.SerializeToString()).run(None, {"x": x})
    assert big.dtype == np.int64 and big.tolist() == (x * 2**40).tolist()
    assert tenth.dtype == np.float64 and tenth.tolist() == (x.astype(np.float64) * 0.1).tolist()


def test_fn_in_a_users_x64_off_context_is_exact_in_the_declared_types() -> None:
    model = oxla.compile(WIDE)
    x = np.array([3, -7, 2**31 - 1], np.int64)  # the user's jit narrows these to int32 on the way in
    out = jax.jit(model.fn)(model.params, {"x": x})
    assert out["big"].dtype == np.int64 and np.asarray(out["big"]).tolist() == (x * 2**40).tolist()
    assert out["tenth"].dtype == np.float64
    assert np.asarray(out["tenth"]).tolist() == (x.astype(np.float64) * 0.1).tolist()
    assert not jax.config.jax_enable_x64


def test_jit_of_fn_works_before_any_call() -> None:
    model = oxla.compile(FLOAT_SHAPE)
    assert "fshape" not in model.params and "fshape" in model.plan.required_static
    out = jax.jit(model.fn)(model.params, {"x": np.ones(3, np.float32)})
    assert np.asarray(out["y"]).tolist() == [4.0] * 4
    assert model({"x": np.ones(2, np.float32)})["y"].tolist() == [3.0] * 4
    assert "fshape" not in model.params  # nothing moved during the call


def test_cache_stays_at_its_bound_over_300_shapes() -> None:
    sess = oxla.InferenceSession(FLOAT_SHAPE.SerializeToString(), cache_size=16)
    for n in range(1, 301):
        (y,) = sess.run(None, {"x": np.ones(n, np.float32)})
        assert y.tolist() == [1.0 + n] * 4
    info = sess.compiled.cache_info()
    assert info.maxsize == 16 and info.size <= 16 and info.evictions >= 300 - 16


def test_different_string_feeds_compile_at_most_twice() -> None:
    sess = oxla.InferenceSession(_label_model().SerializeToString())
    rng = np.random.default_rng(0)
    for _ in range(20):
        words = rng.integers(0, 25, 3)
        (y,) = sess.run(None, {"s": np.array([f"w{i}" for i in words], object)})
        assert y.tolist() == [2 * int(i) if i < 20 else -2 for i in words]
    assert sess.compiled.stats.compiles <= 2


def test_overriding_a_parameter_does_not_recompile_per_value() -> None:
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[3] x, float[3] w) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> {
            y = Mul(x, w)
        }
    """)
    sess = oxla.InferenceSession(model.SerializeToString())
    x = np.ones(3, np.float32)
    assert sess.run(None, {"x": x})[0].tolist() == [1, 2, 3]
    for k in range(5):
        w = np.full(3, k, np.float32)
        assert sess.run(None, {"x": x, "w": w})[0].tolist() == [k] * 3
    assert sess.compiled.stats.compiles == 2


def _in_threads(fn: Callable[[int], None], n: int) -> None:
    """fn(0) ... fn(n - 1) at once on n threads; the first failure is raised here."""
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            fn(k)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def _threads_equal_serial(run: Callable[[int], list[np.ndarray]], count: int = 8, rounds: int = 6) -> None:
    serial = {i: run(i) for i in range(count)}
    results: dict[tuple[int, int], list[np.ndarray]] = {}
    start = threading.Barrier(count)

    def work(i: int) -> None:
        start.wait()
        for r in range(rounds):
            results[i, r] = run(i)

    _in_threads(work, count)
    for (i, _), got in results.items():
        for g, w in zip(got, serial[i]):
            np.testing.assert_array_equal(g, w)


def test_eight_threads_equal_serial_on_a_plain_model() -> None:
    sess = oxla.InferenceSession(str(MODELS / "resnet_small.onnx"))
    images = [np.random.default_rng(i).random((1 + i % 3, 3, 64, 64), np.float32) for i in range(8)]
    _threads_equal_serial(lambda i: sess.run(None, {"image": images[i]}))


def test_eight_threads_equal_serial_on_a_graph_break_model() -> None:
    sess = oxla.InferenceSession(BREAK.SerializeToString())
    feeds = [np.where(np.random.default_rng(i).random(5 + i) > 0.5, 1.0, 0.0).astype(np.float32) * (i + 1)
             for i in range(8)]
    _threads_equal_serial(lambda i: sess.run(None, {"x": feeds[i]}))
    assert sess.compiled.stats.host_steps > 0


def test_eight_threads_equal_serial_on_the_detector() -> None:
    sess = oxla.InferenceSession(str(MODELS / "detector_nms.onnx"))
    images = [np.random.default_rng(i).random((1, 3, 64, 64), np.float32) for i in range(8)]
    _threads_equal_serial(lambda i: sess.run(None, {"image": images[i]}), rounds=3)


def test_training_session_inference_neither_retraces_nor_rebuilds() -> None:
    from tests.training.models import mlp, mlp_weights

    model = make_trainable(mlp(mlp_weights()), "mse", Momentum(lr=0.1), labels="t")
    sess = TrainingSession(model)
    x = np.random.default_rng(0).random((4, 12), np.float32)
    t = np.random.default_rng(1).random((4, 5), np.float32)
    before = sess.run(None, {"x": x})[0]
    inference = sess._inference
    for _ in range(3):
        sess.step({"x": x, "t": t})
        after = sess.run(None, {"x": x})[0]
    assert sess._inference is inference and inference.stats.compiles == 1
    assert not np.allclose(before, after)
    expect = oxla.InferenceSession(sess.model()).run(None, {"x": x})[0]
    np.testing.assert_allclose(after, expect, rtol=1e-6)


@pytest.mark.parametrize("cache_size", [0, -1])
def test_cache_size_must_be_positive(cache_size: int) -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        oxla.compile(FLOAT_SHAPE, cache_size=cache_size)


def test_device_array_feeds_are_used_in_place() -> None:
    sess = oxla.InferenceSession(WIDE.SerializeToString())
    x = np.array([1, 2, 3], np.int64)
    with oxla.x64():
        dev = jax.device_put(x)
    for _ in range(2):  # the first call compiles through the general path, the second is fast
        big, tenth = sess.run(None, {"x": dev})
        assert big.tolist() == (x * 2**40).tolist()
        assert tenth.tolist() == (x * 0.1).tolist()


def test_training_step_and_run_from_two_threads() -> None:
    from tests.training.models import mlp, mlp_weights

    sess = TrainingSession(make_trainable(mlp(mlp_weights()), "mse", Momentum(lr=0.01), labels="t"))
    x = np.random.default_rng(0).random((4, 12), np.float32)
    t = np.random.default_rng(1).random((4, 5), np.float32)
    errors: list[BaseException] = []

    def steps() -> None:
        try:
            for _ in range(20):
                sess.step({"x": x, "t": t})
        except BaseException as e:  # reported below
            errors.append(e)

    def runs() -> None:
        try:
            for _ in range(20):
                assert np.isfinite(sess.run(None, {"x": x})[0]).all()
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=steps), threading.Thread(target=runs)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_softmax_reads_its_input_once() -> None:
    """Light squeezenet's logits are ~1e10; with XLA:CPU's YNNPACK fusions off, XLA computed the
    Softmax input twice in different orders (for the max, and inside exp(X - max)), exp overflowed
    and every output was NaN in every compile (with them on: in 1-15% of compiles). Softmax now
    reads X through an optimization barrier. In a child process: the flag is read at JAX start."""
    code = ("import numpy as np; from oxla import backend; from tests.conformance.cases import all_cases\n"
            "case = next(c for c in all_cases() if c.name == 'test_squeezenet')\n"
            "model, data, *_ = case.load(); ins, outs = data[0]\n"
            "got = backend.prepare(model, 'CPU').run(ins)[0]\n"
            "print('NAN' if np.isnan(got).any() else f'ok {float(np.abs(got - outs[0]).max()):.3g}')\n")
    env = {**os.environ, "XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ok") and float(last.split()[1]) < 1e-3, proc.stdout[-2000:]


# Feeds and results of every packable kind: 64-bit ints and floats, bool, float16, an output that
# is an input, one computed from nothing but a constant.
PACKABLE = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[2,3] x, int64[4] i, bool[3] b, float16[5] h, double[1] d)
        => (float[2,3] y, int64[4] j, bool[3] nb, float16[5] hh, double[1] dd, float[2,3] x, float[2] k) {
        two = Constant<value = float {2.0}>()
        y = Mul(x, two)
        one = Constant<value = int64 {1}>()
        j = Add(i, one)
        nb = Not(b)
        hh = Mul(h, h)
        dd = Add(d, d)
        k = Constant<value = float[2] {0.5, -1.5}>()
    }
""")


def _packable_feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.random((2, 3), np.float32), "i": rng.integers(-2**40, 2**40, 4),
            "b": rng.random(3) < 0.5, "h": rng.random(5).astype(np.float16),
            "d": rng.random(1)}


def _packable_expected(f: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [f["x"] * 2, f["i"] + 1, ~f["b"], f["h"] * f["h"], f["d"] * 2, f["x"],
            np.array([0.5, -1.5], np.float32)]


def _packed(sess: oxla.InferenceSession) -> list[object]:
    """The session's staged computations (oxla.executor.Packed), each once."""
    executor = sess.compiled._executor
    found = {id(slot.segment.packed): slot.segment.packed for slot in executor._cache._data.values()
             if slot.segment is not None and slot.segment.packed is not None}
    return list(found.values())


def test_small_models_take_feeds_and_give_results_in_one_buffer() -> None:
    """A small whole-graph computation runs from one staging buffer to one result buffer; every
    dtype comes back as it went in, results are read-only (as JAX's are) and stay valid after the
    next call, and the caller's feeds are untouched."""
    sess = oxla.InferenceSession(PACKABLE.SerializeToString())
    results = []
    for seed in range(3):  # the first call compiles through the general path, the others are fast
        feeds = _packable_feeds(seed)
        kept = {n: v.copy() for n, v in feeds.items()}
        got = sess.run(None, feeds)
        for name, value in feeds.items():
            np.testing.assert_array_equal(value, kept[name])
        for out, want in zip(got, _packable_expected(feeds), strict=True):
            assert out.dtype == want.dtype and out.shape == want.shape
            np.testing.assert_array_equal(out, want)
        results.append((feeds, got))
    (packed,) = _packed(sess)
    assert packed.results is not None  # the results come back in one buffer too
    assert all(not out.flags.writeable for out in results[-1][1][:5])  # the computed ones
    for feeds, got in results:  # earlier results are not overwritten by later calls
        for out, want in zip(got, _packable_expected(feeds), strict=True):
            np.testing.assert_array_equal(out, want)
    y, k = sess.run(["y", "k"], results[0][0])
    np.testing.assert_array_equal(y, results[0][0]["x"] * 2)
    assert k.tolist() == [0.5, -1.5]
    options = oxla.RunOptions()
    options.device_outputs = True  # the general path: JAX arrays, from the same computation
    device = sess.run(None, results[1][0], options)
    assert all(isinstance(out, jax.Array) for out in device[:5])
    for out, want in zip(device, _packable_expected(results[1][0]), strict=True):
        np.testing.assert_array_equal(np.asarray(out), want)
    assert sess.compiled.stats.compiles == 1


def test_packed_path_from_threads_and_with_device_feeds() -> None:
    """Callers racing for the staging buffer each get their own results (one takes the unpacked
    path while another holds it); device arrays as feeds skip the staging copy."""
    sess = oxla.InferenceSession(PACKABLE.SerializeToString())
    sess.run(None, _packable_feeds(0))

    def calls(seed: int) -> None:
        for n in range(200):
            feeds = _packable_feeds(seed * 1000 + n)
            for out, want in zip(sess.run(None, feeds), _packable_expected(feeds), strict=True):
                np.testing.assert_array_equal(out, want)

    _in_threads(calls, 3)
    feeds = _packable_feeds(7)
    with oxla.x64():
        device = {n: jax.device_put(v) for n, v in feeds.items()}
    for out, want in zip(sess.run(None, device), _packable_expected(feeds), strict=True):
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize(("x", "out", "n", "staged", "gathered"), [
    ("float[16]", "float[16] y, float[16] w", 16, True, True),
    ("float[N]", "float[N] y, float[N] w", 5, True, True),              # the trace decides
    ("float[N]", "float[N] y, float[N] w", 8192, False, False),         # feeds over PACK_MAX_BYTES
    ("float[8192]", "float[8192] y, float[8192] w", 8192, False, False),  # declared over it
    ("float[16]", "float[16] y", 16, False, False),                     # one result
])
def test_feeds_are_staged_only_where_several_small_results_are_declared(
        x: str, out: str, n: int, staged: bool, gathered: bool) -> None:
    """Alone, staging the feeds costs more than JAX's own copy (a model of one Add: 1.57x the
    time); with the results gathered into one buffer it gains."""
    names = [part.split()[1] for part in out.split(", ")]
    body = " ".join(f"{name} = {'Add' if i == 0 else 'Mul'}(x, z)" for i, name in enumerate(names))
    model = onnx.parser.parse_model(f"""
        <ir_version: 8, opset_import: ["" : 18]>
        g ({x} x, {x} z) => ({out}) {{ {body} }}
    """)
    sess = oxla.InferenceSession(model.SerializeToString())
    feeds = {"x": np.ones(n, np.float32), "z": np.full(n, 2.0, np.float32)}
    for _ in range(2):
        got = sess.run(None, feeds)
        assert got[0].tolist() == [3.0] * n and all(g.tolist() == [2.0] * n for g in got[1:])
    packed = _packed(sess)
    assert len(packed) == int(staged)
    assert all((p.results is not None) == gathered for p in packed)


@pytest.mark.parametrize("model", ["packable", "one result", "wide"])
def test_static_feeds_run_through_the_executors_host_runner(model: str) -> None:
    """A model whose inputs are all fixed-size, fed numpy arrays of exactly those, runs from the
    second call through one function of the executor's (InferenceSession.run, _run_lean): the
    same results as the general path, a graph output that is an input is the caller's array and a
    constant one is read-only, output names pick, other feeds take the checked path (and its
    errors), and its calls count as cache hits."""
    if model == "packable":
        sess = oxla.InferenceSession(PACKABLE.SerializeToString())
        feeds = _packable_feeds

        def expected(f: dict[str, np.ndarray], w: tuple[float, ...] = ()) -> list[np.ndarray]:
            return _packable_expected(f)
    else:
        text = ("g (float[3] x, float[3] z) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> "
                "{ s = Add(x, z) y = Mul(s, w) }" if model == "one result" else
                "g (int64[3] x, double[3] z) => (int64[3] y, double[3] v) <float[3] w = {1.0, 2.0, 3.0}> "
                "{ y = Add(x, x) wd = Cast<to = 11>(w) v = Mul(z, wd) }")
        sess = oxla.InferenceSession(onnx.parser.parse_model(
            '<ir_version: 8, opset_import: ["" : 18]>' + text).SerializeToString())
        rng = np.random.default_rng(0)

        def feeds(seed: int) -> dict[str, np.ndarray]:
            if model == "one result":
                return {"x": rng.random(3, np.float32), "z": rng.random(3, np.float32)}
            return {"x": rng.integers(-2**40, 2**40, 3), "z": rng.random(3)}

        def expected(f: dict[str, np.ndarray], w: tuple[float, ...] = (1.0, 2.0, 3.0)) -> list[np.ndarray]:
            if model == "one result":
                return [(f["x"] + f["z"]) * np.array(w, np.float32)]
            return [f["x"] * 2, f["z"] * np.array(w)]

    assert not sess._runner  # nothing compiled yet
    for seed in range(4):
        f = feeds(seed)
        got = sess.run(None, f)
        for out, want in zip(got, expected(f), strict=True):
            assert out.dtype == want.dtype and out.shape == want.shape
            np.testing.assert_allclose(out, want, rtol=1e-6)
        assert bool(sess._runner) == (seed > 0)
    if model == "packable":
        assert got[5] is f["x"]  # the input itself, as the general path gives it
        assert not got[6].flags.writeable
    hits = sess.compiled.cache_info().hits
    f = feeds(9)
    names = [o.name for o in sess.get_outputs()][::-1]
    for out, want in zip(sess.run(names, f), expected(f)[::-1], strict=True):
        np.testing.assert_allclose(out, want, rtol=1e-6)
    assert sess.compiled.cache_info().hits == hits + 1
    bad = dict(f)
    name = next(iter(bad))
    bad[name] = bad[name].astype(np.float64 if bad[name].dtype == np.float32 else np.float32)
    with pytest.raises(oxla.InputError, match=name):
        sess.run(None, bad)
    with pytest.raises(oxla.InputError, match="unknown input"):
        sess.run(None, {**f, "nope": np.ones(1, np.float32)})
    if model == "one result":  # small weights: compiled in as constants (plan.SMALL_WEIGHTS)
        assert "w" in sess.compiled.constants
        with pytest.raises(oxla.InputError, match=r"\['w'\] are compiled into the model as constants"):
            sess.compiled.set_parameters({"w": np.array([5.0, 6.0, 7.0], np.float32)})
    assert sess.compiled.stats.compiles == 1


def test_host_runner_from_threads() -> None:
    """Callers racing through the host runner each get their own results (one takes the checked
    path while another stages its feeds)."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[4] x, float[4] z) => (float[4] y, float[4] w) { y = Add(x, z) w = Mul(x, z) }
    """)
    sess = oxla.InferenceSession(model.SerializeToString())
    for _ in range(2):
        sess.run(None, {"x": np.ones(4, np.float32), "z": np.ones(4, np.float32)})
    assert sess._runner

    def calls(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(300):
            x, z = rng.random(4, np.float32), rng.random(4, np.float32)
            y, w = sess.run(None, {"x": x, "z": z})
            np.testing.assert_array_equal(y, x + z)
            np.testing.assert_array_equal(w, x * z)

    _in_threads(calls, 4)


def test_results_too_large_to_gather_come_back_one_by_one() -> None:
    """Small feeds, results that the declarations leave open and that turn out over
    PACK_MAX_BYTES: the feeds are staged, the results come back as JAX gives them."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 18]>
        g (float[1] x, float[1] z) => (float[M] y, float[M] w) {
            shape = Constant<value = int64[1] {10000}>()
            s = Add(x, z)
            y = Expand(s, shape)
            w = Neg(y)
        }
    """)
    sess = oxla.InferenceSession(model.SerializeToString())
    feeds = {"x": np.array([1.0], np.float32), "z": np.array([0.5], np.float32)}
    for _ in range(2):
        y, w = sess.run(None, feeds)
        assert y.shape == (10000,) and (y == 1.5).all() and (w == -1.5).all()
    (packed,) = _packed(sess)
    assert packed.results is None


def test_small_kernels_run_on_the_one_thread_client_its_kernels_on_spinning_helpers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A model of small kernels (the shipped mobilenet_small: under native_gemm.SMALL_FLOPS flops a
    node) has its 1x1 and depthwise convolutions on oxla's kernels and runs on the one-thread
    client whatever XLA counts, where the kernels split their parts with helpers of their own;
    results agree with onnxruntime, also with two callers at once (one of them then runs its
    kernels alone)."""
    from oxla import cpu_client, native
    from oxla.lowering.ops.native import DOMAIN
    from oxla.passes import native_gemm

    small = 25, 1.5e6
    assert cpu_client.prefers_one_thread(small[0], lambda: (17e6, small[1])) \
        == (cpu_client.cores() > 1)
    assert not cpu_client.prefers_one_thread(small[0], lambda: (1e9, small[1]))  # large kernels
    model = onnx.load(str(MODELS / "mobilenet_small.onnx"))
    assert native_gemm.small_kernels(model)
    if cpu_client.cores() <= 1 or not native.available():
        pytest.skip("one core or no native kernels: no helpers to spin")
    sess = oxla.InferenceSession(str(MODELS / "mobilenet_small.onnx"))
    ops = Counter(n.op_type for n in sess.compiled.model.graph.node if n.domain == DOMAIN)
    assert sum(n for op, n in ops.items() if "Depthwise" in op) > 0, ops
    assert sum(n for op, n in ops.items() if "Gemm" in op) > 0, ops
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(str(MODELS / "mobilenet_small.onnx"),
                               providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    images = [rng.standard_normal((b, 3, 64, 64)).astype(np.float32) for b in (1, 4, 2, 3)]
    want = [ref.run(None, {"image": x})[0] for x in images]
    for x, w in zip(images, want):
        np.testing.assert_allclose(sess.run(None, {"image": x})[0], w, rtol=1e-4, atol=1e-5)
    assert sess.compiled.plan.one_thread and cpu_client.is_single_thread(sess.compiled._executor.device)
    # its weights are small enough to be constants (plan.SMALL_WEIGHTS); kept as parameters the
    # model is still one of small kernels (the two decisions once shared a variable)
    assert not sess.compiled.params
    monkeypatch.setattr(oxla.session, "SMALL_WEIGHTS", 0)
    heavy = oxla.InferenceSession(str(MODELS / "mobilenet_small.onnx"))
    assert heavy.compiled.params and heavy.compiled.plan.one_thread
    np.testing.assert_allclose(heavy.run(None, {"image": images[0]})[0], want[0], rtol=1e-4, atol=1e-5)

    def caller(k: int) -> None:
        for i in range(20):
            j = (i + k) % len(images)
            np.testing.assert_allclose(sess.run(None, {"image": images[j]})[0], want[j],
                                       rtol=1e-4, atol=1e-5)

    _in_threads(caller, 2)
