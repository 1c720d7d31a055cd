"""oxla's native GEMM kernel (oxla/native), its pass (NativeGemmPass) and its rule."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla import cpu_client, native, plan
from oxla.lowering.context import Options
from oxla.lowering.ops import native as native_rule
from oxla.lowering.ops.elementwise import sigmoid
from oxla.passes import native_gemm, winograd

RNG = np.random.default_rng(0)
needs_kernel = pytest.mark.skipif(not native.available(),
                                  reason=f"no native kernel here: {native.unavailable_reason()}")


@pytest.fixture(autouse=True)
def _depthwise_here(monkeypatch):
    """The depthwise pass's tests run on whatever instruction set the kernels were built for
    (the pass itself takes it only where it beats XLA's taps: `DEPTHWISE_ISAS`), and plan as for a
    model of large kernels (`small_kernels` is tested on its own); their 3x3 convolutions run on
    the implicit-GEMM kernel, not the Winograd one (tests/test_native_winograd.py)."""
    monkeypatch.setattr(native_gemm, "DEPTHWISE_ISAS", frozenset({native.isa()}))
    monkeypatch.setattr(plan, "small_kernels", lambda model: False)
    monkeypatch.setattr(native_gemm, "WINOGRAD", False)
    monkeypatch.setattr(winograd, "NATIVE_MIN_CHANNELS", winograd.MIN_CHANNELS)


def _reference(x, w, b, r, act, lo=0.0, hi=0.0):
    y = x.astype(np.float64) @ w.astype(np.float64) + b
    if r is not None:
        y = y + r
    return _act(y.astype(np.float32), act, lo, hi)


def _act(y, act, lo, hi):
    if act == "Relu":
        return np.maximum(y, 0)
    if act == "Clip":
        return np.clip(y, lo, hi)
    if act == "Silu":
        return y * np.asarray(sigmoid(jnp.asarray(y)))
    if act == "HardSwish":
        return y * np.clip(y / 6 + 0.5, 0, 1)
    return y


def _call(x, w, b, r, act, threads, device, lo=0.0, hi=0.0):
    out = jax.ShapeDtypeStruct((*x.shape[:-1], w.shape[1]), jnp.float32)
    residual = np.zeros((0,), np.float32) if r is None else r

    def f(x, wp, b, r):
        return jax.ffi.ffi_call(native.GEMM_TARGET, out)(
            x, wp, b, r, threads=np.int64(threads), act=np.int64(native_rule.ACTIVATIONS[act]),
            lo=np.float32(lo), hi=np.float32(hi))

    args = [jax.device_put(a, device) for a in (x, native.pack(w), b, residual)]
    return np.asarray(jax.jit(f)(*args))


@needs_kernel
@pytest.mark.parametrize("shape", [
    (1, 1, 1), (5, 3, 7), (13, 8, 16), (12, 33, 17), (25, 64, 31), (49, 96, 32), (50, 40, 33),
    (3, 2, 100), (100, 24, 144),
    (7, 600, 500),      # W over 1 MB: each thread packs its rows of X first
    (30, 50, 64),       # one pair of whole panels (AVX-512: tiles of 6 rows x 64 columns)
    (23, 700, 128),     # packed rows, pairs of whole panels
    (2, 0, 8),          # K = 0: the bias alone
])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_float64(shape: tuple[int, int, int], threads: int) -> None:
    m, k, n = shape
    x = RNG.standard_normal((m, k)).astype(np.float32)
    w = RNG.standard_normal((k, n)).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    got = _call(x, w, b, None, "", threads, cpu_client.inline_device())
    want = _reference(x, w, b, None, "")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1, k) ** 0.5)


@needs_kernel
@pytest.mark.parametrize("act", ["", "Relu", "Clip", "Silu", "HardSwish"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("n", [40, 72])  # a masked second panel; a pair of whole panels, then one
def test_epilogues(act: str, residual: bool, n: int) -> None:
    x = RNG.standard_normal((2, 9, 7, 48)).astype(np.float32)  # rows over several tiles
    w = (RNG.standard_normal((48, n)) / 5).astype(np.float32)
    b = RNG.standard_normal(n).astype(np.float32)
    r = RNG.standard_normal((2, 9, 7, n)).astype(np.float32) if residual else None
    for threads in (1, 2):
        got = _call(x, w, b, r, act, threads, cpu_client.inline_device(), lo=-0.5, hi=1.5)
        want = _reference(x, w, b, r, act, lo=-0.5, hi=1.5)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("act", ["", "Relu", "Clip", "Silu", "HardSwish"])
def test_epilogues_keep_nan(act: str) -> None:
    """A NaN in X stays NaN through every activation, as in onnxruntime and XLA (min and max take
    the value as their second operand: vmaxps returns it when either is NaN)."""
    x = RNG.standard_normal((3, 40, 16)).astype(np.float32)
    x[0, 5, 3] = x[2, 17, :] = np.nan
    w = RNG.standard_normal((16, 40)).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)
    for threads in (1, 2):
        got = _call(x, w, b, None, act, threads, cpu_client.inline_device(), lo=-0.5, hi=1.5)
        want = _reference(x, w, b, None, act, lo=-0.5, hi=1.5)
        assert np.isnan(want).any()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)  # NaN where want has NaN


@needs_kernel
def test_one_thread_client_runs_alone() -> None:
    """Asked for two threads on a client whose pool has one, the kernel still answers."""
    device = cpu_client.single_thread_device() or cpu_client.inline_device()
    x = RNG.standard_normal((300, 64)).astype(np.float32)
    w = RNG.standard_normal((64, 96)).astype(np.float32)
    b = np.zeros(96, np.float32)
    np.testing.assert_allclose(_call(x, w, b, None, "Relu", 2, device),
                               _reference(x, w, b, None, "Relu"), rtol=1e-5, atol=1e-4)


def _model(nodes: list[onnx.NodeProto], x_shape: tuple[int, ...], outputs: dict[str, tuple[int, ...]],
           inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    """An opset-17 model of these nodes on a float input x, with float outputs of these shapes."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, shape)
                               for n, shape in outputs.items()], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _agrees(model: onnx.ModelProto, planned: onnx.ModelProto, x: np.ndarray, tol: float = 1e-4) -> list[np.ndarray]:
    """The model's outputs from onnxruntime, after checking that a session, the planned model
    (its native ops' function bodies over standard ops) in onnxruntime, and those bodies in oxla
    give the same."""
    onnx.checker.check_model(planned)
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    bodies = onnx.ModelProto()
    bodies.CopyFrom(planned)
    for got in (oxla.InferenceSession(data).run(None, {"x": x}),
                ort.InferenceSession(planned.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x}),
                [np.asarray(v) for v in oxla.CompiledModel(bodies)({"x": x}).values()]):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return want


def _net(size: int = 28, *, se: bool = True) -> onnx.ModelProto:
    """1x1 convolutions followed by each epilogue the pass folds, and a squeeze-excitation branch
    that must stay XLA's."""
    c = 64

    def conv(name: str, x: str, cin: int, cout: int, bias: bool = True) -> list[onnx.NodeProto]:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32), f"{name}_w"))
        inputs = [x, f"{name}_w"]
        if bias:
            inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b"))
            inputs.append(f"{name}_b")
        return [helper.make_node("Conv", inputs, [name], kernel_shape=[1, 1])]

    inits: list[onnx.TensorProto] = [numpy_helper.from_array(np.float32(-1.0), "lo"),
                                     numpy_helper.from_array(np.float32(2.0), "hi")]
    nodes = [*conv("a", "x", 32, c), helper.make_node("Relu", ["a"], ["a_r"]),
             *conv("b", "a_r", c, c, bias=False), helper.make_node("Add", ["a_r", "b"], ["b_add"]),
             helper.make_node("Relu", ["b_add"], ["b_r"]),
             *conv("s", "b_r", c, 2 * c), helper.make_node("Sigmoid", ["s"], ["s_sig"]),
             helper.make_node("Mul", ["s", "s_sig"], ["s_silu"]),
             *conv("h", "s_silu", 2 * c, c), helper.make_node("HardSwish", ["h"], ["h_hs"]),
             *conv("k", "h_hs", c, c), helper.make_node("Clip", ["k", "lo", "hi"], ["y0"])]
    if se:
        nodes += [helper.make_node("GlobalAveragePool", ["y0"], ["p"]), *conv("e", "p", c, c),
                  helper.make_node("Sigmoid", ["e"], ["e_s"]), helper.make_node("Mul", ["y0", "e_s"], ["y"])]
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    return _model(nodes, (1, 32, size, size), {"y": (1, c, size, size)}, inits)


def _planned(model: onnx.ModelProto, threads: int = 2) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return oxla.CompiledModel(copy, Options(layout_weights=True, native_threads=threads)).model


@needs_kernel
def test_pass_folds_epilogues_and_agrees_with_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    model = _net()
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == ["GemmRelu", "GemmAddRelu", "GemmSilu", "GemmHardSwish", "GemmClip"]
    assert not any(n.op_type in ("Relu", "HardSwish", "Clip") for n in planned.graph.node)
    # the squeeze-excitation 1x1 convolution (one row per image) stays a convolution
    assert [n.op_type for n in planned.graph.node if n.op_type == "Conv"] == ["Conv"]
    _agrees(model, planned, RNG.standard_normal((1, 32, 28, 28)).astype(np.float32))


@needs_kernel
def test_small_products_stay_xla_and_one_core_sessions_plan_one_thread() -> None:
    # 2 * 784 * 32 * 64 flops: under MIN_FLOPS, over PLAIN_MIN_FLOPS (this net has no depthwise
    # convolution); at 6x6 (its largest, 2 * 36 * 64 * 128) under both
    assert native_gemm.PLAIN_MIN_FLOPS < 2 * 784 * 32 * 64 < native_gemm.MIN_FLOPS
    assert [n for n in _planned(_net(28)).graph.node if n.domain == native_rule.DOMAIN]
    assert not [n for n in _planned(_net(6)).graph.node if n.domain == native_rule.DOMAIN]
    assert [n for n in _planned(_net(112)).graph.node if n.domain == native_rule.DOMAIN]
    assert not [n for n in _planned(_net(112), threads=0).graph.node if n.domain == native_rule.DOMAIN]
    data = _net(112).SerializeToString()
    session = oxla.InferenceSession(data, ort.SessionOptions() if cpu_client.cores() > 1 else None)
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    single = oxla.InferenceSession(data, one)
    planned = [n for n in single.compiled.plan.nodes if n.domain == native_rule.DOMAIN]
    assert planned and single.compiled.options.native_threads == 0  # the kernels' one thread
    x = RNG.standard_normal((1, 32, 112, 112)).astype(np.float32)
    np.testing.assert_allclose(single.run(None, {"x": x})[0], session.run(None, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)
    if cpu_client.cores() > 1:
        assert [n for n in session.compiled.plan.nodes if n.domain == native_rule.DOMAIN]


def _mobile_block(size: int = 56) -> onnx.ModelProto:
    """1x1 expansion -> Relu -> 3x3 depthwise -> Relu -> 1x1 projection -> 1x1 head: only the
    head is beside no depthwise convolution."""
    inits: list[onnx.TensorProto] = []

    def conv(name: str, x: str, cin: int, cout: int, k: int = 1, group: int = 1) -> onnx.NodeProto:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin * k * k / group)
             ).astype(np.float32), f"{name}_w"))
        inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b"))
        return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], kernel_shape=[k, k],
                                pads=[k // 2] * 4, group=group)

    nodes = [conv("e", "x", 64, 192), helper.make_node("Relu", ["e"], ["e_r"]),
             conv("d", "e_r", 192, 192, 3, 192), helper.make_node("Relu", ["d"], ["d_r"]),
             conv("p", "d_r", 192, 64), conv("h", "p", 64, 128)]
    return _model(nodes, (1, 64, size, size), {"h": (1, 128, size, size)}, inits)


@needs_kernel
def test_one_core_keeps_convolutions_beside_a_depthwise_one_xla(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On one core a depthwise convolution goes to the kernel where DEPTHWISE_ISAS holds the
    instruction set, and the convolutions beside it with it; where it stays XLA's, so do the
    convolutions it reads or made. With several threads all four products are native."""
    model = _mobile_block()
    x = RNG.standard_normal((1, 64, 56, 56)).astype(np.float32)

    def one_core() -> onnx.ModelProto:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return oxla.CompiledModel(copy, Options(layout_weights=True, native_convs=True)).model

    monkeypatch.setattr(native_gemm, "DEPTHWISE_ISAS", frozenset())
    one = one_core()
    native_nodes = [n for n in one.graph.node if n.domain == native_rule.DOMAIN]
    assert len(native_nodes) == 1 and native_nodes[0].output[0].startswith("h_")
    _agrees(model, one, x)
    monkeypatch.setattr(native_gemm, "DEPTHWISE_ISAS", frozenset({native.isa()}))
    one = one_core()
    kinds = [n.op_type for n in one.graph.node if n.domain == native_rule.DOMAIN]
    assert len(kinds) == 4 and sum(k.startswith("Depthwise") for k in kinds) == 1, kinds
    _agrees(model, one, x)
    monkeypatch.setattr(native_gemm, "ONE_CORE_DEPTHWISE", False)
    assert len([n for n in one_core().graph.node if n.domain == native_rule.DOMAIN]) == 1
    assert len([n for n in _planned(model).graph.node
                if n.domain == native_rule.DOMAIN and not n.op_type.startswith("Depthwise")]) == 3


@needs_kernel
def test_residual_of_another_shape_is_broadcast(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Add whose other operand broadcasts is folded too; the rule adds it with XLA."""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    w = numpy_helper.from_array(RNG.standard_normal((16, 8, 1, 1)).astype(np.float32), "w")
    r = numpy_helper.from_array(RNG.standard_normal((1, 16, 1, 5)).astype(np.float32), "r")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]),
         helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 8, 4, 5))],
        [helper.make_empty_tensor_value_info("y")], [w, r])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    assert [n.op_type for n in _planned(model).graph.node if n.domain == native_rule.DOMAIN] == ["GemmAddRelu"]
    x = RNG.standard_normal((1, 8, 4, 5)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0],
                               want, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_rule_without_the_kernel_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planned with the kernel, traced where it cannot be used: the rule computes the same with
    XLA. (A planned model loaded again runs its ops' function bodies instead.)"""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    model = _net(20, se=False)
    x = RNG.standard_normal((1, 32, 20, 20)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = oxla.InferenceSession(model.SerializeToString())
    assert [n for n in session.compiled.plan.nodes if n.domain == native_rule.DOMAIN]
    monkeypatch.setattr(native, "available", lambda: False)  # before the first trace
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    again = oxla.CompiledModel(_planned(model))({"x": x})  # the bodies
    np.testing.assert_allclose(np.asarray(again["y"]), want, rtol=1e-4, atol=1e-4)


def test_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OXLA_NATIVE", "0")
    monkeypatch.setattr(native, "_STATE", {})
    assert not native.available()
    assert native.unavailable_reason() == "OXLA_NATIVE=0"
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    assert native_gemm.convs_to_native(_net()) == 0


def test_pack_layout() -> None:
    w = np.arange(3 * 35, dtype=np.float32).reshape(3, 35)
    p = native.pack(w)
    assert p.shape == (2, 3, 32)
    np.testing.assert_array_equal(p[0], w[:, :32])
    np.testing.assert_array_equal(p[1, :, :3], w[:, 32:])
    assert not p[1, :, 3:].any()


@needs_kernel
def test_wrong_channel_count_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A native product fed an input with other channels than its kernel reads fails naming the
    node (the declared channel dim is symbolic, so the feed check lets it through)."""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    model = _net(20, se=False)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[1].ClearField("dim_value")
    dims[1].dim_param = "C"
    session = oxla.InferenceSession(model.SerializeToString())
    assert [n for n in session.compiled.plan.nodes if n.domain == native_rule.DOMAIN]
    with pytest.raises(oxla.OxlaError, match="channels where the 1x1 kernel reads 32"):
        session.run(None, {"x": RNG.standard_normal((1, 16, 20, 20)).astype(np.float32)})


@needs_kernel
def test_executor_counts_the_kernels_flops() -> None:
    """XLA's cost analysis leaves custom calls out; the one-thread decision must see them."""
    from oxla.executor import _native_flops

    def f(x, w, b):
        return _call_traced(x, w, b) * 2

    def _call_traced(x, w, b):
        out = jax.ShapeDtypeStruct((1, 56, 56, 144), jnp.float32)
        return jax.ffi.ffi_call(native.GEMM_TARGET, out)(
            x, w, b, jnp.zeros((0,), jnp.float32), threads=np.int64(2), act=np.int64(0),
            lo=np.float32(0), hi=np.float32(0))

    lowered = jax.jit(f).lower(jnp.zeros((1, 56, 56, 24)), jnp.zeros((5, 24, 32)), jnp.zeros(144))
    assert _native_flops(lowered) == 2 * 56 * 56 * 24 * 144


# --- convolutions (oxla_sconv, Conv* ops) --------------------------------------------------------

def _conv_reference(x, hwio, b, r, act, strides, pads, dilations):
    with jax.enable_x64(True):
        y = np.asarray(jax.lax.conv_general_dilated(
            jnp.asarray(x, jnp.float64), jnp.asarray(hwio, jnp.float64), strides,
            [(pads[0], pads[2]), (pads[1], pads[3])], rhs_dilation=dilations,
            dimension_numbers=("NHWC", "HWIO", "NHWC")))
    y = y + b
    if r is not None:
        y = y + r
    return _act(y.astype(np.float32), act, -0.5, 1.5)


def _conv_call(x, hwio, b, r, act, threads, strides, pads, dilations):
    kh, kw, _, m = hwio.shape
    oh = (x.shape[1] + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (x.shape[2] + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    out = jax.ShapeDtypeStruct((x.shape[0], oh, ow, m), jnp.float32)
    residual = np.zeros((0,), np.float32) if r is None else r
    i64 = np.int64

    def f(x, wp, b, r):
        return jax.ffi.ffi_call(native.CONV_TARGET, out)(
            x, wp, b, r, threads=i64(threads), act=i64(native_rule.ACTIVATIONS[act]),
            lo=np.float32(-0.5), hi=np.float32(1.5), kh=i64(kh), kw=i64(kw), sh=i64(strides[0]),
            sw=i64(strides[1]), dh=i64(dilations[0]), dw=i64(dilations[1]), pt=i64(pads[0]),
            pl=i64(pads[1]), groups=i64(1))

    device = cpu_client.inline_device()
    args = [jax.device_put(a, device) for a in (x, native.pack(hwio.reshape(-1, m)), b, residual)]
    return np.asarray(jax.jit(f)(*args))


@needs_kernel
@pytest.mark.parametrize("case", [
    # (N, H, W, C, M, KH, KW, strides, pads (t, l, b, r), dilations)
    (1, 9, 11, 3, 16, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),     # an image stem
    (2, 7, 6, 17, 40, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),     # masked channels and panels
    (1, 12, 10, 8, 33, 5, 5, (2, 1), (1, 2, 2, 0), (1, 1)),    # uneven strides and pads
    (1, 13, 13, 16, 24, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),   # dilated
    (1, 6, 6, 4, 8, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1)),       # kernel wider than X
    (1, 5, 5, 8, 8, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1)),       # strided 1x1
    (1, 7, 7, 160, 200, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),   # W over 1 MB: rows held longer
    (1, 5, 6, 300, 45, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),    # K 2700: summed in K blocks
    (1, 3, 3, 5, 7, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1)),       # one output pixel
    (1, 4, 4, 0, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),       # no channels: the bias alone
])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_kernel_matches_float64(case: tuple, threads: int) -> None:
    n, h, w, c, m, kh, kw, strides, pads, dilations = case
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    hwio = RNG.standard_normal((kh, kw, c, m)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    got = _conv_call(x, hwio, b, None, "", threads, strides, pads, dilations)
    want = _conv_reference(x, hwio, b, None, "", strides, pads, dilations)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (kh * kw * c) ** 0.5)


@needs_kernel
@pytest.mark.parametrize("case", [
    # (N, H, W, C, M, group, KH, KW, strides, pads (t, l, b, r), dilations)
    (2, 9, 7, 64, 64, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),    # 4 a group, packed 4 at a time
    (1, 11, 9, 64, 128, 8, 3, 3, (2, 2), (1, 0, 1, 2), (1, 1)),   # 8 a group from 16 channels
    (2, 6, 8, 96, 96, 8, 5, 3, (1, 2), (2, 1, 2, 1), (2, 1)),     # 12 a group: masked lanes
    (1, 5, 5, 64, 64, 2, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),     # 32 a group: a whole panel
    (1, 4, 3, 40, 20, 4, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1)),     # 5 a group, kernel wider than X
    (1, 3, 3, 24, 48, 3, 3, 3, (1, 1), (0, 0, 0, 0), (1, 1)),     # one output pixel
    (2, 7, 6, 104, 104, 13, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),  # 13 groups of 8: one each
])
@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_conv_kernel_matches_float64(case: tuple, threads: int) -> None:
    """Grouped windows on the convolution kernel (each group's outputs at most one panel: X read
    in place at every tap, no im2col rows), with a residual and Relu."""
    _grouped_conv_case(case, threads)


@needs_kernel
@pytest.mark.parametrize("case", [
    (2, 9, 7, 64, 64, 16, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),
    (1, 12, 12, 48, 48, 12, 3, 3, (2, 2), (0, 1, 1, 0), (1, 1)),    # 3 blocks of 4 groups, strided
    (1, 6, 5, 32, 32, 8, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1)),       # 1x1
    (1, 5, 5, 128, 128, 32, 5, 5, (1, 1), (4, 4, 4, 4), (2, 2)),    # 8 blocks, parts split them
])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("quads", [True, False])
def test_groups_of_four_match_float64_as_quads_and_block_diagonal(
        monkeypatch: pytest.MonkeyPatch, case: tuple, threads: int, quads: bool) -> None:
    """Groups of 4 inputs and 4 outputs: each its own on tile_quads (4 to a block of 16 outputs),
    or (QUADS off) 4 at a time, W block-diagonal."""
    monkeypatch.setattr(native_gemm, "QUADS", quads)
    hwio = np.zeros((*case[6:8], 4, case[4]), np.float32)
    assert native_gemm.grouped_kernel(hwio, case[5]).shape[0] == (case[5] if quads else case[5] // 4)
    _grouped_conv_case(case, threads)


def _grouped_conv_case(case: tuple, threads: int) -> None:
    n, h, w, c, m, group, kh, kw, strides, pads, dilations = case
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    hwio = RNG.standard_normal((kh, kw, c // group, m)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    kernel = native_gemm.grouped_kernel(hwio, group)
    assert kernel is not None
    oh = (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    r = RNG.standard_normal((n, oh, ow, m)).astype(np.float32)
    packed = native.pack(kernel)
    out = jax.ShapeDtypeStruct((n, oh, ow, m), jnp.float32)
    i64 = np.int64

    def f(x, wp, b, r):
        return jax.ffi.ffi_call(native.CONV_TARGET, out)(
            x, wp, b, r, threads=i64(threads), act=i64(native_rule.ACTIVATIONS["Relu"]),
            lo=np.float32(0), hi=np.float32(0), kh=i64(kh), kw=i64(kw), sh=i64(strides[0]),
            sw=i64(strides[1]), dh=i64(dilations[0]), dw=i64(dilations[1]), pt=i64(pads[0]),
            pl=i64(pads[1]), groups=i64(kernel.shape[0]))

    device = cpu_client.inline_device()
    args = [jax.device_put(a, device) for a in (x, packed.reshape((-1, *packed.shape[2:])), b, r)]
    got = np.asarray(jax.jit(f)(*args))
    with jax.enable_x64(True):
        want = np.asarray(jax.lax.conv_general_dilated(
            jnp.asarray(x, jnp.float64), jnp.asarray(hwio, jnp.float64), strides,
            [(pads[0], pads[2]), (pads[1], pads[3])], rhs_dilation=dilations,
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=group))
    want = np.maximum(want + b + r, 0).astype(np.float32)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * (kh * kw * c / group) ** 0.5)


@needs_kernel
def test_conv_kernel_parts_by_panels_make_the_im2col_rows_once_a_call() -> None:
    """49 output pixels (5 blocks) by 512 channels (16 panels) on two threads: split by W's
    panels, every part covers every block, and a thread's later parts of one call reuse the
    im2col rows it made; the next call, on another X, makes its own."""
    hwio = (RNG.standard_normal((3, 3, 64, 512)) / 24).astype(np.float32)
    b = RNG.standard_normal(512).astype(np.float32)
    for _ in range(2):
        x = RNG.standard_normal((1, 7, 7, 64)).astype(np.float32)
        got = _conv_call(x, hwio, b, None, "Relu", 2, (1, 1), (1, 1, 1, 1), (1, 1))
        want = _conv_reference(x, hwio, b, None, "Relu", (1, 1), (1, 1, 1, 1), (1, 1))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@needs_kernel
@pytest.mark.parametrize("act", ["", "Relu", "Clip", "Silu", "HardSwish"])
@pytest.mark.parametrize("channels", [12, 290])  # 290: K 2610, the epilogue after the last K block
@pytest.mark.parametrize("m", [20, 80])  # 80: a pair of whole panels, then a masked one
def test_conv_epilogues(act: str, channels: int, m: int) -> None:
    x = RNG.standard_normal((1, 10, 9, channels)).astype(np.float32)
    hwio = (RNG.standard_normal((3, 3, channels, m)) / (3 * channels ** 0.5)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    r = RNG.standard_normal((1, 5, 5, m)).astype(np.float32)
    for threads in (1, 2):
        got = _conv_call(x, hwio, b, r, act, threads, (2, 2), (1, 1, 1, 1), (1, 1))
        want = _conv_reference(x, hwio, b, r, act, (2, 2), (1, 1, 1, 1), (1, 1))
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@needs_kernel
@pytest.mark.parametrize("native_stems", [True, False])
def test_large_stems_native_only_where_they_win(monkeypatch: pytest.MonkeyPatch, native_stems: bool) -> None:
    """A 7x7 stem over 3 channels (147 terms, more than STEM_TAPS_TERMS) becomes a native Conv on
    the instruction sets in STEM_ISAS (AVX-512) and stays XLA's elsewhere (AVX2)."""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "STEM_ISAS", frozenset({native.isa()} if native_stems else ()))
    w = numpy_helper.from_array((RNG.standard_normal((16, 3, 7, 7)) / 12).astype(np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3])
    model = _model([node, helper.make_node("Relu", ["y"], ["r"])], (1, 3, 32, 32), {"r": (1, 16, 16, 16)}, [w])
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == (["ConvRelu"] if native_stems else [])
    _agrees(model, planned, RNG.standard_normal((1, 3, 32, 32)).astype(np.float32))


def _conv_net(size: int = 20) -> onnx.ModelProto:
    """A 3-channel stem (XLA's), then 3x3 convolutions with each kind of epilogue, and a padded
    1x1 convolution (PadAheadPass's shape, XLA's)."""
    inits: list[onnx.TensorProto] = []

    def conv(name: str, x: str, cin: int, cout: int, k: int, bias: bool = True, **attrs) -> onnx.NodeProto:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32), f"{name}_w"))
        inputs = [x, f"{name}_w"]
        if bias:
            inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b"))
            inputs.append(f"{name}_b")
        return helper.make_node("Conv", inputs, [name], kernel_shape=[k, k], **attrs)

    nodes = [conv("stem", "x", 3, 16, 3, pads=[1, 1, 1, 1]), helper.make_node("Relu", ["stem"], ["s_r"]),
             conv("a", "s_r", 16, 32, 3, pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["a_r"]),
             conv("b", "a_r", 32, 48, 3, strides=[2, 2], pads=[1, 0, 1, 1]),
             helper.make_node("HardSwish", ["b"], ["b_hs"]),
             conv("c", "b_hs", 48, 48, 3, bias=False, pads=[2, 2, 2, 2], dilations=[2, 2]),
             helper.make_node("Add", ["c", "b_hs"], ["c_add"]), helper.make_node("Relu", ["c_add"], ["c_r"]),
             conv("d", "c_r", 48, 16, 1, pads=[1, 1, 1, 1])]
    half = (size - 1) // 2 + 1  # b's output, stride 2 (pads 1, 0, 1, 1)
    return _model(nodes, (1, 3, size, size), {"d": (1, 16, half + 2, half + 2)}, inits)


@needs_kernel
def test_pass_takes_convolutions_and_agrees_with_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    model = _conv_net()
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == ["ConvRelu", "ConvHardSwish", "ConvAddRelu"]
    # the stem (3 channels: XLA's fused taps) and the padded 1x1 (PadAheadPass's producer) stay
    assert len([n for n in planned.graph.node if n.op_type == "Conv"]) == 2
    b = next(n for n in planned.graph.node if n.op_type == "ConvHardSwish")
    assert {a.name: list(a.ints) if a.ints else a.i for a in b.attribute} == {
        "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1], "dilations": [1, 1],
        "group": 1}
    _agrees(model, planned, RNG.standard_normal((1, 3, 20, 20)).astype(np.float32))  # Conv between transposes


@needs_kernel
def test_small_convolutions_go_to_the_kernel_small_pointwise_ones_stay_xla() -> None:
    """Under MIN_FLOPS a 1x1 convolution stays XLA's dot (fused with its neighbours) while a 3x3
    one goes to the kernel at any size (CONV_MIN_FLOPS): XLA's forms of small ones cost more."""
    model = _conv_net()  # 20x20: every convolution far under 2e7 flops
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == ["ConvRelu", "ConvHardSwish", "ConvAddRelu"]
    assert [n.op_type for n in planned.graph.node if n.op_type == "Conv"] == ["Conv", "Conv"]
    _agrees(model, planned, RNG.standard_normal((1, 3, 20, 20)).astype(np.float32))


def same_without_kernel(monkeypatch: pytest.MonkeyPatch, model: onnx.ModelProto, x: np.ndarray,
                        op: str) -> None:
    """A session plans `op` for `model`; traced where the kernel cannot be used (it became
    unavailable before the first call) the rule computes what onnxruntime does."""
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = oxla.InferenceSession(model.SerializeToString())
    assert [n for n in session.compiled.plan.nodes if n.op_type == op]
    monkeypatch.setattr(native, "available", lambda: False)  # before the first trace
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_conv_rule_without_the_kernel_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    same_without_kernel(monkeypatch, _conv_net(16), RNG.standard_normal((1, 3, 16, 16)).astype(np.float32),
                        "ConvAddRelu")


@needs_kernel
def test_conv_node_without_its_window_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Conv* node not made by the planner (no function body, no attributes) fails naming it."""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    planned = _planned(_conv_net(16))
    del planned.functions[:]
    node = next(n for n in planned.graph.node if n.op_type == "ConvRelu")
    del node.attribute[:]
    x = RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)
    with pytest.raises(oxla.OxlaError, match="ConvRelu.*needs 2-D kernel_shape"):
        oxla.CompiledModel(planned)({"x": x})


@needs_kernel
def test_executor_counts_the_conv_kernels_flops() -> None:
    from oxla.executor import _native_flops

    def f(x, w, b):
        out = jax.ShapeDtypeStruct((1, 28, 28, 64), jnp.float32)
        i64 = np.int64
        return jax.ffi.ffi_call(native.CONV_TARGET, out)(
            x, w, b, jnp.zeros((0,), jnp.float32), threads=i64(2), act=i64(0), lo=np.float32(0),
            hi=np.float32(0), kh=i64(3), kw=i64(3), sh=i64(2), sw=i64(2), dh=i64(1), dw=i64(1),
            pt=i64(1), pl=i64(1), groups=i64(1)) + 1

    lowered = jax.jit(f).lower(jnp.zeros((1, 56, 56, 32)), jnp.zeros((2, 288, 32)), jnp.zeros(64))
    assert _native_flops(lowered) == 2 * 28 * 28 * 64 * 288


# --- depthwise convolutions (oxla_sdwconv, Depthwise* ops) ---------------------------------------

def _dw_call(x, w, b, act, threads, strides, pads, dilations, pre=None):
    """The kernel through the rule's call; `pre` = (pre_bias, pre_act): X read as
    pre_act(X + pre_bias), Clip's bounds -0.5 and 1.5 for both activations."""
    kh, kw, _ = w.shape
    oh = (x.shape[1] + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (x.shape[2] + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1

    def f(x, w, b, pb):
        return native_rule.depthwise(x, w, b, (oh, ow), strides, pads[:2], dilations, threads, act,
                                     -0.5, 1.5, None if pre is None else (pb, pre[1], -0.5, 1.5))

    device = cpu_client.inline_device()
    pb = np.zeros(0, np.float32) if pre is None else pre[0]
    return np.asarray(jax.jit(f)(*[jax.device_put(a, device) for a in (x, w, b, pb)]))


def _dw_reference(x, w, b, act, strides, pads, dilations, pre=None):
    if pre is not None:
        x = _act(x + pre[0], pre[1], -0.5, 1.5)
    with jax.enable_x64(True):
        y = np.asarray(jax.lax.conv_general_dilated(
            jnp.asarray(x, jnp.float64), jnp.asarray(w[:, :, None, :], jnp.float64), strides,
            [(pads[0], pads[2]), (pads[1], pads[3])], rhs_dilation=dilations,
            dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=x.shape[-1]))
    return _act((y + b).astype(np.float32), act, -0.5, 1.5)


@needs_kernel
@pytest.mark.parametrize("case", [
    # (N, H, W, C, KH, KW, strides, pads (t, l, b, r), dilations)
    (1, 20, 21, 96, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),    # reused pixels, a tail of 5
    (2, 17, 19, 40, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1)),    # strided, masked channels
    (1, 14, 14, 24, 5, 5, (1, 1), (2, 2, 2, 2), (1, 1)),
    (1, 15, 30, 17, 5, 5, (2, 2), (2, 1, 2, 3), (1, 1)),    # uneven pads
    (1, 7, 7, 33, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1)),      # one block narrower than 8 pixels
    (1, 13, 10, 32, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),    # dilated: one load per tap
    (1, 9, 12, 20, 3, 3, (3, 3), (0, 1, 2, 0), (1, 1)),     # stride 3
    (1, 6, 8, 16, 3, 5, (1, 2), (0, 0, 0, 0), (1, 1)),      # no pads, KH != KW
    (1, 2, 3, 8, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1)),       # X smaller than the kernel
])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_kernel_matches_float64(case: tuple, threads: int) -> None:
    n, h, w, c, kh, kw, strides, pads, dilations = case
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    k = RNG.standard_normal((kh, kw, c)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    got = _dw_call(x, k, b, "", threads, strides, pads, dilations)
    want = _dw_reference(x, k, b, "", strides, pads, dilations)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * kh * kw)


@needs_kernel
@pytest.mark.parametrize("case", [
    # (N, H, W, X's channels, multiplier, K, strides, pads (t, l, b, r), dilations, pre_act)
    (1, 20, 21, 32, 2, 3, (1, 1), (1, 1, 1, 1), (1, 1), None),    # the micro-benchmark's shape
    (2, 17, 19, 7, 3, 3, (2, 2), (1, 1, 1, 1), (1, 1), "Relu"),   # 3 does not divide a vector
    (1, 14, 14, 20, 4, 5, (1, 1), (2, 2, 2, 2), (1, 1), "HardSwish"),
    (1, 13, 10, 13, 5, 3, (1, 1), (2, 2, 2, 2), (2, 2), "Clip"),  # dilated, a masked last block
    (1, 9, 12, 3, 16, 3, (3, 3), (0, 1, 2, 0), (1, 1), None),     # one X channel a vector
    (1, 7, 7, 9, 7, 7, (1, 1), (3, 3, 3, 3), (1, 1), None),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_kernel_with_a_channel_multiplier(case: tuple, threads: int) -> None:
    """W's C output channels are C / X's channels of each input channel's (Keras's
    depth_multiplier; ONNX's group = X's channels): the kernel reads X's channel c / M for lane c,
    its producer's bias (one per X channel) alike."""
    n, h, w, cx, m, k, strides, pads, dilations, pre = case
    x = RNG.standard_normal((n, h, w, cx)).astype(np.float32)
    kernel = RNG.standard_normal((k, k, cx * m)).astype(np.float32)
    b = RNG.standard_normal(cx * m).astype(np.float32)
    before = None if pre is None else (RNG.standard_normal(cx).astype(np.float32), pre)
    for act in ("", "Relu"):
        got = _dw_call(x, kernel, b, act, threads, strides, pads, dilations, before)
        want = _dw_reference(x, kernel, b, act, strides, pads, dilations, before)
        assert got.shape == want.shape and got.shape[-1] == cx * m
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k * k)


@needs_kernel
@pytest.mark.parametrize("act", ["", "Relu", "Clip", "Silu", "HardSwish"])
@pytest.mark.parametrize("pre", [None, "Relu", "Clip", "HardSwish"])
def test_depthwise_epilogues(act: str, pre: str | None) -> None:
    x = RNG.standard_normal((1, 12, 13, 48)).astype(np.float32)
    k = (RNG.standard_normal((3, 3, 48)) / 3).astype(np.float32)
    b = RNG.standard_normal(48).astype(np.float32)
    before = None if pre is None else (RNG.standard_normal(48).astype(np.float32), pre)
    for threads in (1, 2):
        for strides, pads in (((1, 1), (1, 1, 1, 1)), ((2, 2), (1, 0, 2, 1))):  # borders read zero
            got = _dw_call(x, k, b, act, threads, strides, pads, (1, 1), before)
            want = _dw_reference(x, k, b, act, strides, pads, (1, 1), before)
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _dw_net(size: int = 24) -> onnx.ModelProto:
    """Depthwise convolutions followed by Relu, Clip and nothing, one with a channel multiplier
    of 2 and a grouped one (16 channels a group: the convolution kernel's)."""
    c = 32
    inits = [numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]

    def conv(name: str, x: str, cin: int, cout: int, k: int, group: int, bias: bool = True, **attrs) -> onnx.NodeProto:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin // group, k, k)) / k).astype(np.float32), f"{name}_w"))
        inputs = [x, f"{name}_w"]
        if bias:
            inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b"))
            inputs.append(f"{name}_b")
        return helper.make_node("Conv", inputs, [name], kernel_shape=[k, k], group=group, **attrs)

    nodes = [conv("a", "x", c, c, 3, c, pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["a_r"]),
             conv("b", "a_r", c, c, 5, c, bias=False, strides=[2, 2], pads=[2, 2, 2, 2]),
             helper.make_node("Clip", ["b", "lo", "hi"], ["b_c"]),
             conv("m", "b_c", c, 2 * c, 3, c, pads=[1, 1, 1, 1]),           # multiplier 2
             conv("g", "m", 2 * c, 2 * c, 3, 4, pads=[1, 1, 1, 1]),         # 4 groups
             conv("d", "g", 2 * c, 2 * c, 3, 2 * c, pads=[0, 1, 2, 1])]
    half = size // 2
    return _model(nodes, (1, c, size, size), {"d": (1, 2 * c, half, half)}, inits)


@needs_kernel
def test_depthwise_pass_agrees_with_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    model = _dw_net()
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == ["DepthwiseRelu", "DepthwiseClip", "Depthwise", "Conv", "Depthwise"]
    inits = {t.name: t for t in planned.graph.initializer}
    assert [({a.name: helper.get_attribute_value(a) for a in n.attribute}["group"],
             inits[n.input[1]].dims[-1]) for n in planned.graph.node
            if n.op_type.startswith("Depthwise")] == [(32, 32), (32, 32), (32, 64), (64, 64)]
    # the multiplier's group: X's 32 channels, W's 64 two of each
    assert not any(n.op_type == "Conv" and n.domain != native_rule.DOMAIN for n in planned.graph.node)
    x = RNG.standard_normal((1, 32, 24, 24)).astype(np.float32)
    want = _agrees(model, planned, x)
    data = model.SerializeToString()
    session = oxla.InferenceSession(data)
    if cpu_client.cores() > 1:  # a session plans native kernels where it may use several cores
        assert [n.op_type for n in session.compiled.plan.nodes if n.domain == native_rule.DOMAIN] == kinds
    # traced where the kernel cannot be used: the rule computes the same with XLA
    monkeypatch.setattr(native, "available", lambda: False)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


def _bounds_as_constant_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its scalar initializers (Clip's bounds) as Constant nodes, each just before
    its first reader, as torch exports ReLU6 and Hardtanh."""
    graph = model.graph
    scalars = {t.name: t for t in graph.initializer if not t.dims}
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for name in node.input:
            if name in scalars:
                nodes.append(helper.make_node("Constant", [], [name], value=scalars.pop(name)))
        nodes.append(node)
    assert not scalars
    kept = [t for t in graph.initializer if t.dims]
    del graph.initializer[:], graph.node[:]
    graph.initializer.extend(kept)
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model


@needs_kernel
def test_clip_bounds_from_constant_nodes_fold_like_initializers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clip whose bounds are Constant nodes (torch's ReLU6) folds into the GEMM and depthwise
    kernels' epilogues as with initializer bounds. (It did not: MobileNetV2 from torch, one
    thread, ran each ReLU6 as a pass of its own, 1.22x the time.)"""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    model = _bounds_as_constant_nodes(_net(se=False))
    planned = _planned(model)
    assert [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN] \
        == ["GemmRelu", "GemmAddRelu", "GemmSilu", "GemmHardSwish", "GemmClip"]
    assert not any(n.op_type == "Clip" for n in planned.graph.node)
    _agrees(model, planned, RNG.standard_normal((1, 32, 28, 28)).astype(np.float32))
    model = _bounds_as_constant_nodes(_dw_net())
    planned = _planned(model)
    assert [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN] \
        == ["DepthwiseRelu", "DepthwiseClip", "Depthwise", "Conv", "Depthwise"]
    assert not any(n.op_type == "Clip" for n in planned.graph.node)
    _agrees(model, planned, RNG.standard_normal((1, 32, 24, 24)).astype(np.float32))


def _hard_swish_as_its_body(model: onnx.ModelProto, alpha: float = 1 / 6) -> onnx.ModelProto:
    """The model at opset 13, each HardSwish as its function body: Mul(X, HardSigmoid(X) of alpha
    1/6 and beta 1/2), as torch writes HardSwish before opset 14 and onnxruntime's optimizer
    saves it inlined (another `alpha`: a gate that is no HardSwish)."""
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type == "HardSwish":
            gate = f"{node.output[0]}_gate"
            nodes += [helper.make_node("HardSigmoid", [node.input[0]], [gate], alpha=alpha, beta=0.5),
                      helper.make_node("Mul", [node.input[0], gate], [node.output[0]])]
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import[0].version = 13
    onnx.checker.check_model(model)
    return model


@needs_kernel
def test_hard_swish_as_its_function_body_folds_like_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """X * HardSigmoid(X) of alpha 1/6 and beta 1/2 folds as HardSwish into the GEMM's epilogue
    and the depthwise kernel's loads; a HardSigmoid of other parameters does not. (It did not:
    onnxruntime's optimized MobileNetV3-small kept 9 of them on XLA.)"""
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    model = _hard_swish_as_its_body(_expand_dw_net("HardSwish"))
    planned = _planned(model)
    assert [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN] \
        == ["HardSwishDepthwiseRelu", "Depthwise"]  # the second HardSwish is read twice
    assert [n.op_type for n in planned.graph.node if n.op_type == "HardSigmoid"] == ["HardSigmoid"]
    _agrees(model, planned, RNG.standard_normal((1, 8, 20, 20)).astype(np.float32))
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    model = _hard_swish_as_its_body(_net(se=False))
    planned = _planned(model)
    assert [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN] \
        == ["GemmRelu", "GemmAddRelu", "GemmSilu", "GemmHardSwish", "GemmClip"]
    assert not any(n.op_type in ("HardSigmoid", "Mul") for n in planned.graph.node)
    _agrees(model, planned, RNG.standard_normal((1, 32, 28, 28)).astype(np.float32))
    other = _planned(_hard_swish_as_its_body(_net(se=False), alpha=0.2))
    assert [n.op_type for n in other.graph.node if n.domain == native_rule.DOMAIN] \
        == ["GemmRelu", "GemmAddRelu", "GemmSilu", "Gemm", "GemmClip"]


@needs_kernel
@pytest.mark.parametrize("opset", [7, 9])
def test_models_before_opset_11_take_the_kernels(monkeypatch: pytest.MonkeyPatch, opset: int) -> None:
    """The ONNX model zoo's classic CNNs are opset 7-9: their convolutions take the kernels too
    (they had none: the light zoo's DenseNet-121 1.75x onnxruntime's time, 1.17x with them).
    The function bodies import opset 11 (Slice's bounds as inputs): oxla runs them by their own
    imports."""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    inits = [numpy_helper.from_array((RNG.standard_normal(shape) / 4).astype(np.float32), name)
             for name, shape in (("p_w", (32, 16, 1, 1)), ("d_w", (32, 1, 3, 3)), ("c_w", (24, 32, 3, 3)))]
    inits += [numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), name)
              for name, n in (("p_b", 32), ("d_b", 32), ("c_b", 24))]
    nodes = [helper.make_node("Conv", ["x", "p_w", "p_b"], ["p"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["p"], ["p_r"]),
             helper.make_node("Conv", ["p_r", "d_w", "d_b"], ["d"], kernel_shape=[3, 3], group=32, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["d_r"]),
             helper.make_node("Conv", ["d_r", "c_w", "c_b"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    model = _model(nodes, (1, 16, 20, 20), {"y": (1, 24, 20, 20)}, inits)
    model.opset_import[0].version = opset
    onnx.checker.check_model(model)
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert "GemmRelu" in kinds and "DepthwiseRelu" in kinds and len(kinds) == 3, kinds
    assert {(i.domain, i.version) for f in planned.functions if f.domain == native_rule.DOMAIN
            for i in f.opset_import} == {("", 11)}
    x = RNG.standard_normal((1, 16, 20, 20)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.asarray(oxla.CompiledModel(planned)({"x": x})["y"]), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0], want,
                               rtol=1e-4, atol=1e-4)


def _grouped_net(size: int) -> onnx.ModelProto:
    """Grouped convolutions of 4, 16, 32, 64 and 12 output channels per group (strided, padded,
    with Relu, Clip and a residual Add after them), one of 3 per group and one of one input
    channel per group (XLA's both)."""
    inits = [numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(1.5), "hi")]

    def conv(name: str, x: str, cin: int, cout: int, group: int, **attrs: Any) -> onnx.NodeProto:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin // group, 3, 3)) / np.sqrt(9 * cin / group)).astype(np.float32),
            f"{name}_w"))
        inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b"))
        return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], kernel_shape=[3, 3],
                                group=group, **attrs)

    same = {"pads": [1, 1, 1, 1]}
    nodes = [conv("a", "x", 64, 64, 16, **same), helper.make_node("Relu", ["a"], ["a_r"]),         # 4 a group
             conv("b", "a_r", 64, 128, 8, strides=[2, 2], pads=[1, 0, 1, 2]),                    # 8 from 16
             helper.make_node("Clip", ["b", "lo", "hi"], ["b_c"]),
             conv("c", "b_c", 128, 128, 8, **same), helper.make_node("Add", ["c", "b_c"], ["c_a"]),  # 16
             conv("d", "c_a", 128, 128, 4, **same),                                              # 32
             conv("e", "d", 128, 128, 2, dilations=[2, 2], pads=[2, 2, 2, 2]),                   # 64
             conv("f", "e", 128, 96, 8, **same),                                                 # 12
             conv("h", "f", 96, 96, 32, **same),                                                 # 3: XLA
             conv("g", "h", 96, 96, 96, **same)]                                                 # depthwise
    half = (size + 1) // 2
    return _model(nodes, (1, 64, size, size), {"g": (1, 96, half, half)}, inits)


@needs_kernel
def test_convolutions_whose_bias_is_an_identity_of_a_shared_one_run_on_the_kernels() -> None:
    """torch's export of torchvision's ResNeXt-50 reads every convolution's bias through an
    Identity of one shared zero initializer: those convolutions (grouped, dense, depthwise)
    run on the native kernels as they do with biases of their own."""
    zero = numpy_helper.from_array(np.zeros(64, np.float32), "zero")
    inits = [zero]
    nodes = []
    for name, x, group in (("a", "x", 1), ("b", "a_r", 16), ("c", "b_r", 64)):
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((64, 64 // group, 3, 3)) / np.sqrt(9 * 64 / group)).astype(np.float32), f"{name}_w"))
        nodes += [helper.make_node("Identity", ["zero"], [f"{name}_b"]),
                  helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], kernel_shape=[3, 3],
                                   pads=[1, 1, 1, 1], group=group),
                  helper.make_node("Relu", [name], [f"{name}_r"])]
    model = _model(nodes, (1, 64, 20, 20), {"c_r": (1, 64, 20, 20)}, inits)
    planned = _planned(model)
    assert sorted(n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN) \
        == ["ConvRelu", "ConvRelu", "DepthwiseRelu"]
    assert "Identity" not in [n.op_type for n in planned.graph.node]
    _agrees(model, planned, RNG.standard_normal((1, 64, 20, 20)).astype(np.float32))


@needs_kernel
@pytest.mark.parametrize("size", [6, 20])
def test_grouped_convolutions_run_on_the_conv_kernel_by_panels(monkeypatch: pytest.MonkeyPatch,
                                                               size: int) -> None:
    """Grouped convolutions on the convolution kernel, each of its groups W's panels of its own
    (the model's 8-channel groups packed 2 at a time; 4 (QUADS), 16, 32, 64 and 12 one each: a
    part panel)
    agree with onnxruntime, their function bodies too; at 6x6 the kernel's parts split W's
    panels, at 20x20 the rows."""
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 1e30)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 1e30)
    model = _grouped_net(size)
    planned = _planned(model)
    kinds = [(n.op_type, next(a.i for a in n.attribute if a.name == "group"))
             for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == [("ConvRelu", 16), ("ConvClip", 8), ("ConvAdd", 8), ("Conv", 4), ("Conv", 2),
                     ("Conv", 8)]
    assert [next(a.i for a in n.attribute if a.name == "group")
            for n in planned.graph.node if n.op_type == "Conv" and n.domain != native_rule.DOMAIN] == [32, 96]
    # the strided one pads in the kernel: PadAheadPass leaves its pads (its producer "a" would
    # be padded, and zero its border in a pass of its own)
    assert not [n for n in planned.graph.node if n.op_type == "ZeroBorder"]
    x = RNG.standard_normal((1, 64, size, size)).astype(np.float32)
    want = _agrees(model, planned, x)
    # traced where the kernel cannot be used: the rule computes the same with XLA
    session, available = oxla.InferenceSession(model.SerializeToString()), native.available
    if cpu_client.cores() > 1:  # on one core "f" beside "h" (XLA's grouped layer) stays XLA's
        assert [n.op_type for n in session.compiled.plan.nodes if n.domain == native_rule.DOMAIN] \
            == [k for k, _ in kinds]
    monkeypatch.setattr(native, "available", lambda: False)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(native, "available", available)
    monkeypatch.setattr(native_gemm, "GROUPED", False)
    planned = _planned(model)
    assert not [n for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert [n.op_type for n in planned.graph.node if n.op_type == "ZeroBorder"] == ["ZeroBorder"]


@needs_kernel
@pytest.mark.parametrize("size", [6, 20])
def test_grouped_pointwise_convolutions_read_x_in_place(monkeypatch: pytest.MonkeyPatch,
                                                       size: int) -> None:
    """ShuffleNet's grouped 1x1 convolutions (6 and 28 channels a group, with Relu and a residual
    Add) on the convolution kernel read X's rows in place, at stride CX; a padded one and a
    strided one build im2col rows as before. Two images: the rows run on from one into the next."""
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 0.0)
    inits: list[onnx.TensorProto] = []

    def conv(name: str, x: str, cin: int, cout: int, group: int, **attrs: Any) -> onnx.NodeProto:
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((cout, cin // group, 1, 1)) / np.sqrt(cin / group)).astype(np.float32),
            f"{name}_w"))
        inits.append(numpy_helper.from_array(RNG.standard_normal(cout).astype(np.float32), f"{name}_b"))
        return helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], kernel_shape=[1, 1],
                                group=group, **attrs)

    nodes = [conv("a", "x", 24, 112, 4), helper.make_node("Relu", ["a"], ["a_r"]),       # 6 a group
             conv("b", "a_r", 112, 112, 4), helper.make_node("Add", ["b", "a_r"], ["b_a"]),  # 28
             conv("c", "b_a", 112, 96, 4, pads=[1, 0, 0, 1]),                              # padded
             conv("d", "c", 96, 96, 4, strides=[2, 2])]                                     # strided
    out = (size + 1 + 1) // 2
    model = _model(nodes, (2, 24, size, size), {"d": (2, 96, out, out)}, inits)
    planned = _planned(model)
    kinds = [(n.op_type, next(a.i for a in n.attribute if a.name == "group"))
             for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == [("ConvRelu", 4), ("ConvAdd", 4), ("Conv", 4), ("Conv", 4)]
    _agrees(model, planned, RNG.standard_normal((2, 24, size, size)).astype(np.float32))


@needs_kernel
def test_small_depthwise_stay_xla_by_the_bound_of_their_cores() -> None:
    """_dw_net(size)'s four depthwise layers (one a multiplier's) do 576, 400, 288 and 288 x size^2
    flops: at 8 all under
    POOLED_DEPTHWISE_MIN_FLOPS (1e5), at 24 all over it and under DEPTHWISE_MIN_FLOPS (8e5, one
    core), at 64 all over both. Without native_threads or native_convs nothing is native."""
    def depthwise(size: int, **options: Any) -> int:
        copy = _dw_net(size)
        planned = oxla.CompiledModel(copy, Options(layout_weights=True, **options)).model
        return sum(n.domain == native_rule.DOMAIN and n.op_type.startswith("Depthwise")
                   for n in planned.graph.node)

    assert native_gemm.POOLED_DEPTHWISE_MIN_FLOPS == 1e5 and native_gemm.DEPTHWISE_MIN_FLOPS == 8e5
    assert (depthwise(8, native_threads=2), depthwise(24, native_threads=2)) == (0, 4)
    assert (depthwise(24, native_convs=True), depthwise(64, native_convs=True)) == (0, 4)
    assert depthwise(64) == 0


@needs_kernel
def test_a_model_of_small_kernels_has_every_depthwise_and_1x1_convolution_on_the_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`small_kernels` (what sends a convolutional model to the one-thread client, where oxla's
    kernels spin up helpers of their own) judges from shape inference before the passes, on
    float weights and fixed image sizes only; such a model has its
    depthwise convolutions on the kernel whatever DEPTHWISE_ISAS and the other bounds say,
    and its 1x1 ones whatever MIN_FLOPS says; results agree with onnxruntime."""
    monkeypatch.undo()  # this module plans as for large kernels; here the rule itself decides
    monkeypatch.setattr(native_gemm, "GROUPED", False)  # _dw_net's grouped layer: its own test
    monkeypatch.setattr(native_gemm, "DEPTHWISE_ISAS", frozenset())
    monkeypatch.setattr(native_gemm, "MIN_FLOPS", 1e30)
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 1e30)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 1e30)
    model = _dw_net(24)  # and a 1x1 convolution after it
    model.graph.node.append(helper.make_node("Conv", ["d", "p_w", "p_b"], ["e"], kernel_shape=[1, 1]))
    model.graph.output[0].name = "e"
    model.graph.initializer.extend([
        numpy_helper.from_array((RNG.standard_normal((64, 64, 1, 1)) / 8).astype(np.float32), "p_w"),
        numpy_helper.from_array(RNG.standard_normal(64).astype(np.float32), "p_b")])
    assert native_gemm.small_kernels(model)
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds.count("Gemm") == 1 and sum("Depthwise" in k for k in kinds) == 4, kinds
    monkeypatch.setattr(native_gemm, "SMALL_FLOPS", 0.0)  # nothing is small: XLA's
    assert not native_gemm.small_kernels(model)
    assert not [n for n in _planned(model).graph.node if n.domain == native_rule.DOMAIN]
    monkeypatch.setattr(native_gemm, "SMALL_FLOPS", 1e7)
    quantized = onnx.ModelProto()  # weights from a DequantizeLinear: nothing to count, not small
    quantized.CopyFrom(model)
    quantized.graph.node.insert(0, helper.make_node("Identity", ["p_w"], ["p_w_i"]))
    quantized.graph.node[-1].input[1] = "p_w_i"
    assert not native_gemm.small_kernels(quantized)
    dynamic = onnx.ModelProto()  # an image size left to run time: XLA's count on the shapes fed
    dynamic.CopyFrom(model)
    dynamic.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    assert not native_gemm.small_kernels(dynamic)
    x = RNG.standard_normal((1, 32, 24, 24)).astype(np.float32)
    _agrees(model, planned, x)


@needs_kernel
def test_depthwise_node_without_its_window_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    planned = _planned(_dw_net())
    del planned.functions[:]
    node = next(n for n in planned.graph.node if n.op_type == "DepthwiseRelu")
    del node.attribute[:]
    with pytest.raises(oxla.OxlaError, match="DepthwiseRelu.*needs a .KH, KW, C. kernel"):
        oxla.CompiledModel(planned)({"x": RNG.standard_normal((1, 32, 24, 24)).astype(np.float32)})


@needs_kernel
def test_executor_counts_the_depthwise_kernels_flops() -> None:
    from oxla.executor import _native_flops

    def f(x, w, b):
        return native_rule.depthwise(x, w, b, (28, 28), (2, 2), (1, 1), (1, 1), 2) + 1

    lowered = jax.jit(f).lower(jnp.zeros((1, 56, 56, 96)), jnp.zeros((3, 3, 96)), jnp.zeros(96))
    assert _native_flops(lowered) == 2 * 28 * 28 * 96 * 9


def _expand_dw_net(act: str) -> onnx.ModelProto:
    """A 1x1 expansion (small: XLA's dot) with its bias and `act`, read by a depthwise
    convolution alone; a second expansion whose activation has another reader too."""
    c, e, size = 8, 32, 20
    inits = [numpy_helper.from_array(np.float32(-0.5), "lo"), numpy_helper.from_array(np.float32(1.5), "hi")]
    for name, shape in [("p_w", (e, c, 1, 1)), ("d_w", (e, 1, 3, 3)), ("q_w", (e, c, 1, 1)), ("k_w", (e, 1, 3, 3))]:
        inits.append(numpy_helper.from_array((RNG.standard_normal(shape) / 3).astype(np.float32), name))
    for name in ("p_b", "d_b", "q_b", "k_b"):
        inits.append(numpy_helper.from_array(RNG.standard_normal(e).astype(np.float32), name))

    def activation(x: str, y: str) -> onnx.NodeProto:
        return helper.make_node(act, [x, "lo", "hi"] if act == "Clip" else [x], [y])

    nodes = [helper.make_node("Conv", ["x", "p_w", "p_b"], ["p"], kernel_shape=[1, 1]), activation("p", "p_a"),
             helper.make_node("Conv", ["p_a", "d_w", "d_b"], ["d"], kernel_shape=[3, 3], group=e, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["d_r"]),
             helper.make_node("Conv", ["x", "q_w", "q_b"], ["q"], kernel_shape=[1, 1]), activation("q", "q_a"),
             helper.make_node("Conv", ["q_a", "k_w", "k_b"], ["k"], kernel_shape=[3, 3], group=e, strides=[2, 2],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["d_r", "q_a"], ["y"])]
    return _model(nodes, (1, c, size, size), {"y": (1, e, size, size), "k": (1, e, size // 2, size // 2)}, inits)


@needs_kernel
@pytest.mark.parametrize("act", ["Relu", "Clip", "HardSwish"])
def test_depthwise_reads_its_producers_bias_and_activation(monkeypatch: pytest.MonkeyPatch, act: str) -> None:
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    model = _expand_dw_net(act)
    planned = _planned(model)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == [f"{act}DepthwiseRelu", "Depthwise"]  # the second activation is read twice
    fused = planned.graph.node[[n.op_type for n in planned.graph.node].index(f"{act}DepthwiseRelu")]
    product = next(n for n in planned.graph.node if fused.input[0] in n.output)
    assert product.op_type == "Conv" and len(product.input) == 2  # its bias moved to the kernel
    assert not [n for n in planned.graph.node if n.op_type == act and n.output[0] == "p_a"]
    x = RNG.standard_normal((1, 8, 20, 20)).astype(np.float32)
    want = _agrees(model, planned, x)
    # traced where the kernel cannot be used: the rule applies the bias and activation with XLA
    fallback = oxla.InferenceSession(model.SerializeToString())
    monkeypatch.setattr(native, "available", lambda: False)
    for g, w in zip(fallback.run(None, {"x": x}), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_depthwise_takes_an_explicit_pad_and_a_per_channel_affine(monkeypatch: pytest.MonkeyPatch) -> None:
    """tf2onnx's shape of a strided depthwise layer: Pad, the Conv without pads, its batch norm as
    Mul and Add by per-channel constants, Relu6 as Clip: one DepthwiseClip with the pads."""
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    c = 24
    inits = [numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array((RNG.standard_normal((c, c, 1, 1)) / 5).astype(np.float32), "e"),
             numpy_helper.from_array((RNG.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.uniform(0.5, 2, (1, c, 1, 1)).astype(np.float32), "scale"),
             numpy_helper.from_array(RNG.standard_normal((1, c, 1, 1)).astype(np.float32), "shift"),
             numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
    nodes = [helper.make_node("Conv", ["x", "e"], ["x1"], kernel_shape=[1, 1]),  # channels last from here
             helper.make_node("Pad", ["x1", "pads"], ["p"]),
             helper.make_node("Conv", ["p", "w"], ["d"], kernel_shape=[3, 3], group=c, strides=[2, 2]),
             helper.make_node("Mul", ["d", "scale"], ["m"]), helper.make_node("Add", ["m", "shift"], ["a"]),
             helper.make_node("Clip", ["a", "lo", "hi"], ["y"])]
    model = _model(nodes, (1, c, 16, 16), {"y": (1, c, 8, 8)}, inits)
    planned = _planned(model)
    assert [n.op_type for n in planned.graph.node if n.op_type in ("Pad", "Mul", "Add", "Clip", "DepthwiseClip")] \
        == ["DepthwiseClip"]
    dw = next(n for n in planned.graph.node if n.op_type == "DepthwiseClip")
    assert [list(a.ints) for a in dw.attribute if a.name == "pads"] == [[0, 0, 1, 1]]
    _agrees(model, planned, RNG.standard_normal((1, c, 16, 16)).astype(np.float32) * 3, tol=1e-5)


def _native_node(op: str, inits: dict[str, np.ndarray], x_shape: tuple[int, ...], **attrs) -> bytes:
    """A model of one oxla.native node on X and these initializers, not made by the planner."""
    node = helper.make_node(op, ["x", *inits], ["y"], domain=native_rule.DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(native_rule.DOMAIN, 1)],
                             ir_version=9).SerializeToString()


@pytest.mark.parametrize("op, inits, attrs, message", [
    ("ConvRelu", {"w": np.zeros((1, 144, 32), np.float32), "b": np.zeros(64, np.float32)},
     {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]},
     r"W \(1, 144, 32\) is not packed for the \(64,\) bias"),
    ("Conv", {"w": np.zeros((1, 144, 32), np.float32), "b": np.zeros(32, np.float32)},
     {"kernel_shape": [3, 3], "strides": [1, 0], "pads": [1, -2, 1, 1], "dilations": [1, 1]},
     r"strides \[1, 0\] .* must be at least 1"),
    ("DepthwiseRelu", {"w": np.zeros((3, 3, 16), np.float32), "b": np.zeros(17, np.float32)},
     {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 16},
     r"the bias \(17,\) is not \(16,\)"),
    ("ReluDepthwise", {"w": np.zeros((3, 3, 16), np.float32), "b": np.zeros(16, np.float32),
                       "pb": np.zeros(3, np.float32)},
     {"strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 16},
     r"pre-activation's bias \(3,\) is not \(16,\)"),
    ("Depthwise", {"w": np.zeros((3, 3, 16), np.float32), "b": np.zeros(16, np.float32)},
     {"strides": [0, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1], "group": 16},
     r"strides \[0, 1\] .* must be at least 1"),
    ("Depthwise", {"w": np.zeros((9, 9, 16), np.float32), "b": np.zeros(16, np.float32)},
     {"strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 16},
     r"X \(1, 8, 8, 16\) is smaller than the 9x9 kernel's window"),
])
def test_hostile_native_nodes_are_clear_errors(op: str, inits: dict, attrs: dict, message: str) -> None:
    """oxla.native nodes a file brings itself, with inconsistent shapes or windows: an error
    naming the node, never a crash in the kernel (with or without it)."""
    data = _native_node(op, inits, (1, 8, 8, 16), **attrs)
    with pytest.raises(oxla.OxlaError, match=message):
        oxla.InferenceSession(data).run(None, {"x": np.ones((1, 8, 8, 16), np.float32)})


@needs_kernel
def test_kernels_on_random_windows() -> None:
    """Both convolution kernels against float64 on random small windows: sizes from 1, kernels
    wider than X, strides and dilations up to 3 and 2, pads up to 5 on any side, every
    activation, pre-activations, one or two threads."""
    rng = np.random.default_rng(5)
    done = 0
    while done < 40:
        n, h, w, c = int(rng.integers(1, 3)), int(rng.integers(1, 12)), int(rng.integers(1, 12)), int(rng.integers(1, 40))
        kh, kw = int(rng.choice([1, 2, 3, 5, 7])), int(rng.choice([1, 2, 3, 5, 7]))
        strides = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        dilations = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        pads = tuple(int(v) for v in rng.integers(0, 6, 4))
        if (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) < 0 or (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) < 0:
            continue
        done += 1
        x = rng.standard_normal((n, h, w, c)).astype(np.float32)
        act, threads = str(rng.choice(["", "Relu", "Clip", "Silu", "HardSwish"])), int(rng.integers(1, 3))
        k, b = rng.standard_normal((kh, kw, c)).astype(np.float32), rng.standard_normal(c).astype(np.float32)
        pre = None if rng.random() < 0.5 else (rng.standard_normal(c).astype(np.float32),
                                               str(rng.choice(["Relu", "Clip", "HardSwish"])))
        case = (n, h, w, c, kh, kw, strides, pads, dilations, act, pre and pre[1])
        np.testing.assert_allclose(_dw_call(x, k, b, act, threads, strides, pads, dilations, pre),
                                   _dw_reference(x, k, b, act, strides, pads, dilations, pre),
                                   rtol=1e-4, atol=1e-4 * kh * kw, err_msg=str(case))
        m = int(rng.integers(1, 70))
        hwio, bias = rng.standard_normal((kh, kw, c, m)).astype(np.float32), rng.standard_normal(m).astype(np.float32)
        np.testing.assert_allclose(_conv_call(x, hwio, bias, None, act, threads, strides, pads, dilations),
                                   _conv_reference(x, hwio, bias, None, act, strides, pads, dilations),
                                   rtol=1e-4, atol=1e-4 * (kh * kw * c) ** 0.5, err_msg=str(case))


@needs_kernel
def test_depthwise_pass_only_where_it_wins(monkeypatch):
    """Where the kernel loses to XLA's taps (an instruction set not in DEPTHWISE_ISAS), the
    depthwise convolutions stay XLA's."""
    monkeypatch.setattr(native_gemm, "DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "POOLED_DEPTHWISE_MIN_FLOPS", 0.0)
    monkeypatch.setattr(native_gemm, "DEPTHWISE_ISAS", frozenset())
    planned = _planned(_dw_net())
    assert not [n for n in planned.graph.node if n.op_type.startswith("Depthwise")]


def _matmul_net(k: int, n: int, identity: bool = True) -> onnx.ModelProto:
    """x (64, k) @ W (k, n) + b, Relu; W read through an Identity as torch exports it."""
    w = numpy_helper.from_array((RNG.standard_normal((k, n)) * 0.05).astype(np.float32), "W")
    b = numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "b")
    nodes = ([helper.make_node("Identity", ["W"], ["W_i"])] if identity else []) + [
        helper.make_node("MatMul", ["x", "W_i" if identity else "W"], ["m"]),
        helper.make_node("Add", ["b", "m"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    return _model(nodes, (2, 64, k), {"y": (2, 64, n)}, [w, b])


@needs_kernel
@pytest.mark.parametrize("identity", [True, False])
def test_one_core_sessions_run_large_matmuls_on_the_kernel(identity: bool) -> None:
    model = _matmul_net(768, 1024, identity)
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    session = oxla.InferenceSession(model.SerializeToString(), one)
    assert [n.op_type for n in session.compiled.plan.nodes if n.domain == native_rule.DOMAIN] \
        == ["GemmRelu"]
    # the Identity and W go (W is only read packed now)
    assert [n.op_type for n in session.compiled.plan.nodes] == ["GemmRelu"]
    assert "W" not in {t.name for t in session.compiled.model.graph.initializer}
    x = RNG.standard_normal((2, 64, 768)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    planned = oxla.CompiledModel(model, Options(layout_weights=True, native_matmul=True)).model
    _agrees(model, planned, x)


@needs_kernel
def test_products_after_a_com_microsoft_op_count_their_ancestors_rows() -> None:
    """onnxruntime's transformer optimizer writes com.microsoft ops (Gelu, Attention,
    SkipLayerNormalization) between a model's products, and its Gemm between Reshapes; onnx's
    shape inference types nothing after such an op, so the Gemm counted as one row and stayed
    XLA's (ORT-optimized BERT-base 1.08-1.11x onnxruntime's time, 0.99x with them native). Such
    a product takes the rows of its nearest ancestor (through first inputs) whose rows are known."""
    w1 = numpy_helper.from_array((RNG.standard_normal((512, 512)) * 0.04).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((RNG.standard_normal((512, 512)) * 0.04).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(RNG.standard_normal(512).astype(np.float32), "b2")
    flat = numpy_helper.from_array(np.array([-1, 512], np.int64), "flat")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]),
             helper.make_node("Gelu", ["m"], ["g"], domain="com.microsoft"),
             helper.make_node("Reshape", ["g", "flat"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, 128, 512))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (128, 512))],
                              [w1, w2, b2, flat])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    planned = oxla.CompiledModel(copy, Options(layout_weights=True, native_matmul=True, native_threads=2)).model
    assert [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN] == ["Gemm", "Gemm"]
    x = RNG.standard_normal((1, 128, 512)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_exact_rows_leave_out_dims_shape_inference_could_not_compute() -> None:
    """In a model of small kernels a product whose rows shape inference could not compute (after
    ShuffleNetV2's Reshape-Transpose shuffles: unk__N dims) takes the rows of its nearest known
    ancestor, where elsewhere they count as 1; the graph inputs' symbolic dims count as 1."""
    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 8, 4] x, int64[3] shape) => (float[N, 8, 4] y) {
            s = Reshape(x, shape)
            y = Relu(x)
        }
    """)
    rows, exact = native_gemm._known_rows(model), native_gemm._known_rows(model, exact=True)
    assert rows["x"] == exact["x"] == 8 and rows["s"] == 1 and "s" not in exact
    producers = {o: n for n in model.graph.node for o in n.output}
    assert native_gemm._reaches(exact, "s", 10_000, 1e5, producers)  # x's 8 rows
    assert not native_gemm._reaches(rows, "s", 10_000, 1e5, producers)  # 1 row
    assert not native_gemm._reaches(exact, "s", 100, 1e5, producers)


@needs_kernel
def test_a_model_of_small_kernels_runs_its_classifier_on_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """MobileNetV3's head as torch exports it (Gemm with transB, HardSwish, Gemm): in a model of
    small kernels both products go to the kernel at any flops (the helpers split the
    matrix-vector products), C as the bias, the activation folded; a Gemm with alpha stays."""
    monkeypatch.setattr(plan, "small_kernels", lambda model: True)
    inits = [numpy_helper.from_array((RNG.standard_normal((1024, 576)) / 24).astype(np.float32), "w1"),
             numpy_helper.from_array(RNG.standard_normal(1024).astype(np.float32), "c1"),
             numpy_helper.from_array((RNG.standard_normal((1024, 1000)) / 32).astype(np.float32), "w2"),
             numpy_helper.from_array(RNG.standard_normal((1, 1000)).astype(np.float32), "c2"),
             numpy_helper.from_array((RNG.standard_normal((1000, 600)) / 32).astype(np.float32), "w3")]
    nodes = [helper.make_node("Gemm", ["x", "w1", "c1"], ["h"], transB=1),
             helper.make_node("HardSwish", ["h"], ["a"]),
             helper.make_node("Gemm", ["a", "w2", "c2"], ["z"]),
             helper.make_node("Gemm", ["z", "w3"], ["y"], alpha=0.5)]
    model = _model(nodes, (2, 576), {"y": (2, 600)}, inits)
    planned = _planned(model)
    assert [(n.domain, n.op_type) for n in planned.graph.node] == [
        (native_rule.DOMAIN, "GemmHardSwish"), (native_rule.DOMAIN, "Gemm"), ("", "Gemm")]
    _agrees(model, planned, RNG.standard_normal((2, 576)).astype(np.float32))


@needs_kernel
def test_small_matmuls_keep_xla_dots_and_pooled_sessions_take_384() -> None:
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    # K or N under MATMUL_MIN_DIM (ViT-S/16's 384) and N under WIDE_RATIO K: XLA's dot is as fast
    small = oxla.InferenceSession(_matmul_net(384, 1152).SerializeToString(), one)
    assert not [n for n in small.compiled.plan.nodes if n.domain == native_rule.DOMAIN]
    # a wide product (ViT-S/16's MLP, 384 -> 1536) goes to the kernel: Eigen's dot blocks it badly
    data = _matmul_net(384, 1536).SerializeToString()
    wide = oxla.InferenceSession(data, one)
    assert [n.op_type for n in wide.compiled.plan.nodes if n.domain == native_rule.DOMAIN] \
        == ["GemmRelu"]
    x = RNG.standard_normal((2, 64, 384)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(wide.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    # several cores: from POOLED_MATMUL_MIN_DIM (YNNPACK's dots lose), where measured
    if cpu_client.cores() > 1 and native.isa() in native_gemm.POOLED_MATMUL_ISAS:
        assert native_gemm.POOLED_MATMUL_MIN_DIM == 384
        data = _matmul_net(384, 1152).SerializeToString()
        pooled = oxla.InferenceSession(data)
        assert pooled.compiled.options.native_threads > 1
        assert [n.op_type for n in pooled.compiled.plan.nodes
                if n.domain == native_rule.DOMAIN] == ["GemmRelu"]
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(pooled.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
        narrow = oxla.InferenceSession(_matmul_net(256, 512).SerializeToString())
        assert not [n for n in narrow.compiled.plan.nodes if n.domain == native_rule.DOMAIN]
