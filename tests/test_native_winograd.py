"""oxla's Winograd F(2x2, 3x3) kernel (kernels.cc: Swino) and the oxla.native::Wino* ops
NativeGemmPass makes of WinogradPass's layers."""

from __future__ import annotations

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
from oxla.lowering.ops.winograd import kernel_transform
from oxla.passes import native_gemm, winograd

RNG = np.random.default_rng(0)
needs_kernel = pytest.mark.skipif(not native.available(),
                                  reason=f"no native kernel here: {native.unavailable_reason()}")
ACTS = {"": lambda y: y, "Relu": lambda y: np.maximum(y, 0), "Clip": lambda y: np.clip(y, -0.5, 0.75),
        "Silu": lambda y: y / (1 + np.exp(-y)), "HardSwish": lambda y: y * np.clip(y / 6 + 0.5, 0, 1)}


@pytest.fixture(autouse=True)
def _large_kernels(monkeypatch):
    """Plan as for a model of large kernels (`small_kernels` has tests of its own)."""
    monkeypatch.setattr(plan, "small_kernels", lambda model: False)


def _packed(hwio: np.ndarray) -> np.ndarray:
    """U = G g G^T of a (3, 3, C, M) kernel as the kernel reads it: (16, panels, C, 32)."""
    return native.pack(kernel_transform(hwio).reshape(16, *hwio.shape[2:]))


def _call(x, hwio, b, r, act: str, threads: int, device) -> np.ndarray:
    lo, hi = (-0.5, 0.75) if act == "Clip" else (0.0, 0.0)
    shape = jax.ShapeDtypeStruct((*x.shape[:3], hwio.shape[3]), jnp.float32)

    def f(x, u, b, r):
        return jax.ffi.ffi_call(native.WINOGRAD_TARGET, shape)(
            x, u, b, r, threads=np.int64(threads), act=np.int64(native_rule.ACTIVATIONS[act]),
            lo=np.float32(lo), hi=np.float32(hi))

    args = [x, _packed(hwio), b, np.zeros((0,), np.float32) if r is None else r]
    return np.asarray(jax.jit(f)(*(jax.device_put(a, device) for a in args)))


def _reference(x, hwio, b, r, act: str) -> np.ndarray:
    y = np.asarray(jax.lax.conv_general_dilated(
        x.astype(np.float64), hwio.astype(np.float64), (1, 1), [(1, 1), (1, 1)],
        dimension_numbers=("NHWC", "HWIO", "NHWC"))) + b
    if r is not None:
        y = y + r
    return ACTS[act](y)


@needs_kernel
@pytest.mark.parametrize("n, h, w, c, m", [
    (1, 14, 14, 64, 64),    # whole tiles, a few blocks of MR
    (2, 9, 7, 20, 17),      # odd sizes (tiles over the edge), channels not a multiple of a vector
    (1, 1, 1, 8, 40),       # one pixel: one tile, its window mostly padding
    (3, 5, 6, 3, 33),       # a panel and one column
    (1, 30, 30, 48, 96),    # several tile blocks per part
    (1, 8, 8, 264, 264),    # U over 2 MiB (one part per thread) and over the block bound
])
@pytest.mark.parametrize("threads", [1, 2])
def test_kernel_matches_the_direct_convolution(n, h, w, c, m, threads) -> None:
    x = RNG.standard_normal((n, h, w, c)).astype(np.float32)
    hwio = (RNG.standard_normal((3, 3, c, m)) / np.sqrt(9 * c)).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32)
    r = RNG.standard_normal((n, h, w, m)).astype(np.float32)
    for act in ACTS:
        for res in (None, r):
            got = _call(x, hwio, b, res, act, threads, cpu_client.inline_device())
            np.testing.assert_allclose(got, _reference(x, hwio, b, res, act), rtol=1e-4, atol=1e-4,
                                       err_msg=f"act {act!r}, residual {res is not None}")


@needs_kernel
def test_kernel_on_the_one_thread_client_and_its_helpers() -> None:
    """On the one-thread client the kernel's parts go to oxla's spinning helpers: the same
    result as one thread."""
    x = RNG.standard_normal((1, 40, 40, 32)).astype(np.float32)
    hwio = (RNG.standard_normal((3, 3, 32, 32)) / 17).astype(np.float32)
    b = RNG.standard_normal(32).astype(np.float32)
    one = _call(x, hwio, b, None, "Relu", 1, cpu_client.inline_device())
    helped = _call(x, hwio, b, None, "Relu", 2, cpu_client.single_thread_device())
    np.testing.assert_array_equal(helped, one)


def _model(size: int = 12, channels: int = 24) -> onnx.ModelProto:
    """3x3 stride-1 convolutions with a Relu, a residual Add + Relu, a Clip and none after them,
    and a stride-2 one (not Winograd's)."""
    inits: list[onnx.TensorProto] = []

    def conv(name: str, x: str, bias: bool = True, **attrs) -> onnx.NodeProto:
        c = channels
        inits.append(numpy_helper.from_array(
            (RNG.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32), f"{name}_w"))
        inputs = [x, f"{name}_w"]
        if bias:
            inits.append(numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), f"{name}_b"))
            inputs.append(f"{name}_b")
        return helper.make_node("Conv", inputs, [name], kernel_shape=[3, 3], **attrs)

    inits += [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
              numpy_helper.from_array(np.array(1.0, np.float32), "hi")]
    nodes = [conv("a", "x", pads=[1, 1, 1, 1]), helper.make_node("Relu", ["a"], ["a_r"]),
             conv("b", "a_r", bias=False, auto_pad="SAME_UPPER"),
             helper.make_node("Add", ["b", "a_r"], ["b_add"]), helper.make_node("Relu", ["b_add"], ["b_r"]),
             conv("c", "b_r", pads=[1, 1, 1, 1]), helper.make_node("Clip", ["c", "lo", "hi"], ["c_c"]),
             conv("d", "c_c", pads=[1, 1, 1, 1]),
             conv("e", "d", pads=[1, 1, 1, 1], strides=[2, 2])]
    half = (size - 1) // 2 + 1
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (1, channels, size, size))],
        [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, (1, channels, half, half))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _planned(model: onnx.ModelProto, **options) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return oxla.CompiledModel(copy, Options(layout_weights=True, **options)).model


@needs_kernel
@pytest.mark.parametrize("options", [{"native_threads": 2}, {"native_threads": 0, "native_convs": True}])
def test_pass_makes_winograd_layers_native_and_agrees_with_onnxruntime(options) -> None:
    """Every 3x3 stride-1 layer of at least NATIVE_MIN_CHANNELS channels (24 here, under
    WinogradPass's MIN_CHANNELS for XLA's form) runs on the kernel, its epilogue folded, on
    several cores and on one; the stride-2 one on the implicit-GEMM kernel. The planned model
    (the ops' function bodies) gives onnxruntime's results in onnxruntime and in oxla."""
    model = _model()
    planned = _planned(model, **options)
    kinds = [n.op_type for n in planned.graph.node if n.domain == native_rule.DOMAIN]
    assert kinds == ["WinoRelu", "WinoAddRelu", "WinoClip", "Wino", "Conv"]
    assert not any(n.op_type in ("Relu", "Clip", "Add") for n in planned.graph.node)
    wino = next(n for n in planned.graph.node if n.op_type == "WinoRelu")
    packed = next(t for t in planned.graph.initializer if t.name == wino.input[1])
    assert list(packed.dims) == [16, 1, 24, native.NR]
    onnx.checker.check_model(planned)
    x = RNG.standard_normal((1, 24, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = [oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x}),
           ort.InferenceSession(planned.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x}),
           [np.asarray(v) for v in oxla.CompiledModel(planned)({"x": x}).values()]]
    for outputs in got:
        np.testing.assert_allclose(outputs[0], want[0], rtol=1e-4, atol=1e-4)


@needs_kernel
def test_without_native_kernels_narrow_layers_stay_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the plan runs no native kernels the 24-channel layers are XLA's convolutions (XLA's
    Winograd form starts at MIN_CHANNELS); with `native_gemm.WINOGRAD` off, WinogradPass's
    layers stay XLA's Winograd."""
    planned = _planned(_model(), native_threads=0)
    assert not [n for n in planned.graph.node if n.domain in (native_rule.DOMAIN, winograd.DOMAIN)]
    monkeypatch.setattr(native_gemm, "WINOGRAD", False)
    planned = _planned(_model(), native_threads=2)
    assert [n.op_type for n in planned.graph.node if n.domain == winograd.DOMAIN] == ["Conv"] * 4


@needs_kernel
def test_rule_without_the_kernel_computes_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Wino* node traced where the kernel cannot be used (it became unavailable before the first
    call) unpacks U and runs XLA's form: onnxruntime's results."""
    model = _model()
    x = RNG.standard_normal((1, 24, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    session = oxla.InferenceSession(model.SerializeToString())
    assert [n for n in session.compiled.plan.nodes if n.op_type == "WinoAddRelu"]
    monkeypatch.setattr(native, "available", lambda: False)  # before the first trace
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@needs_kernel
def test_a_wino_node_not_made_by_the_planner_is_a_clear_error() -> None:
    """A Wino* node reading a W that is not 16 packed products (no function body to fall back
    on) fails naming the node."""
    planned = _planned(_model(), native_threads=2)
    del planned.functions[:]
    wino = next(n for n in planned.graph.node if n.op_type == "WinoRelu")
    conv = next(n for n in planned.graph.node if n.op_type == "Conv" and n.domain == native_rule.DOMAIN)
    wino.input[1] = conv.input[1]  # the implicit-GEMM kernel's (panels, 9 C, 32)
    x = RNG.standard_normal((1, 24, 12, 12)).astype(np.float32)
    with pytest.raises(oxla.OxlaError, match="WinoRelu.*not a Winograd transform packed"):
        oxla.CompiledModel(planned)({"x": x})
