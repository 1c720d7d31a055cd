"""Every conv_forms form against XLA's native convolution: values, gradients and the rule's choice."""

from __future__ import annotations

import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from oxla.executor import x64
from oxla.lowering.ops import conv_forms as F


@pytest.fixture(autouse=True)
def _x64() -> Iterator[None]:
    """The float64 checks need 64-bit types: oxla's own scope (importing oxla changes nothing)."""
    with x64():
        yield

RNG = np.random.default_rng(0)
FORMS = {"taps": F.taps, "taps_flat": F.taps_flat, "dot": F.dot, "split": F.split}


def _case(nd: int, c: int, group: int, mult: int, k: int, s: int, d: int,
          pads: str) -> tuple[np.ndarray, np.ndarray, tuple, list, tuple]:
    sizes = (7, 6, 5)[:nd]
    if pads == "same":
        padding = [((k - 1) * d // 2, (k - 1) * d - (k - 1) * d // 2)] * nd
    elif pads == "none":
        padding = [(0, 0)] * nd
    else:  # uneven, and larger than the kernel reaches on the first axis
        padding = [(3, 0), (0, 1), (1, 2)][:nd]
    x = RNG.standard_normal((2, c, *sizes))
    w = RNG.standard_normal((group * mult, c // group, *(k,) * nd))
    return x, w, (s,) * nd, padding, (d,) * nd


# (spatial axes, C, group, output channels per group, kernel, stride, dilation, pads)
CASES = [
    (2, 4, 4, 1, 3, 1, 1, "same"), (2, 4, 4, 2, 3, 2, 1, "same"), (2, 4, 4, 1, 5, 1, 1, "same"),
    (2, 4, 4, 1, 5, 2, 1, "uneven"), (2, 4, 4, 3, 2, 1, 2, "uneven"), (2, 6, 3, 2, 3, 1, 2, "same"),
    (2, 8, 2, 3, 3, 3, 1, "none"), (2, 6, 2, 1, 1, 2, 1, "uneven"), (2, 5, 1, 4, 1, 1, 1, "none"),
    (2, 4, 1, 2, 3, 1, 1, "same"), (1, 4, 4, 2, 3, 1, 1, "same"), (1, 6, 2, 2, 3, 2, 2, "uneven"),
    (3, 2, 2, 1, 3, 1, 1, "same"), (3, 4, 2, 2, 2, 2, 1, "uneven"), (3, 3, 3, 1, 2, 1, 1, "none"),
    (2, 3, 1, 4, 3, 2, 1, "same"), (2, 6, 1, 2, 3, 2, 1, "uneven"),  # stems, im2col
]


def _ids(case: tuple) -> str:
    nd, c, g, m, k, s, d, p = case
    return f"{nd}d-c{c}-g{g}-m{m}-k{k}-s{s}-d{d}-{p}"


def _forms(x: np.ndarray, w: np.ndarray, s: tuple, padding: list, d: tuple) -> list[str]:
    fits = F.flat_fits(x.shape[2:], padding, w.shape[2:], s, d)
    return [name for name in FORMS if name != "taps_flat" or fits]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_forms_match_native(case: tuple) -> None:
    x, w, s, padding, d = _case(*case)
    group = case[2]
    want = np.asarray(F.native(x, w, s, padding, d, group))
    for name in _forms(x, w, s, padding, d):
        got = np.asarray(FORMS[name](x, w, s, padding, d, group))
        assert got.dtype == np.float64, name
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=name)


def test_forms_with_only_padding_under_some_taps() -> None:
    # a 1x5 input padded by 4 on the left: the taps past the data read nothing but zeros
    x, w = RNG.standard_normal((1, 2, 1, 5)), RNG.standard_normal((2, 1, 1, 3))
    padding, s, d = [(0, 0), (4, 0)], (1, 2), (1, 3)
    want = np.asarray(F.native(x, w, s, padding, d, 2))
    np.testing.assert_allclose(np.asarray(F.taps(x, w, s, padding, d, 2)), want, rtol=1e-12)


@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5], CASES[6], CASES[7], CASES[13]],
                         ids=_ids)
def test_forms_gradients_match_native(case: tuple) -> None:
    # training differentiates through Conv: every form must give native's gradients
    x, w, s, padding, d = _case(*case)
    group = case[2]
    r = RNG.standard_normal(np.asarray(F.native(x, w, s, padding, d, group)).shape)

    def loss(form, x, w):  # type: ignore[no-untyped-def]
        return jnp.sum(form(x, w, s, padding, d, group) * r)

    want = jax.grad(lambda x, w: loss(F.native, x, w), argnums=(0, 1))(x, w)
    for name in _forms(x, w, s, padding, d):
        got = jax.jit(jax.grad(lambda x, w, f=FORMS[name]: loss(f, x, w), argnums=(0, 1)))(x, w)
        for g, want_g in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-9, atol=1e-9,
                                       err_msg=name)


@pytest.mark.parametrize("dtype, big", [(jnp.float16, 2048.0), (jnp.bfloat16, 256.0)])
def test_half_types_accumulate_in_float32(dtype: object, big: float) -> None:
    # big + 1 rounds back to big in this type: only a float32 sum of the 9 taps gets big + 8
    x = jnp.ones((1, 2, 4, 4), dtype).at[:, :, 0, 0].set(big)
    w = jnp.ones((2, 1, 3, 3), dtype)
    got = F.taps(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), 2)
    assert got.dtype == dtype
    assert float(got[0, 0, 1, 1]) == big + 8


CHOICES = [  # (X spatial sizes, W shape, strides, pads, group) -> the form measured fastest
    ((56, 56), (96, 1, 3, 3), (1, 1), [(1, 1)] * 2, 96, "taps"),
    ((56, 56), (96, 1, 3, 3), (2, 2), [(1, 1)] * 2, 96, "taps"),
    ((28, 28), (144, 1, 5, 5), (1, 1), [(2, 2)] * 2, 144, "taps_flat"),
    ((56, 56), (144, 1, 5, 5), (2, 2), [(2, 2)] * 2, 144, "taps"),
    ((28, 28), (256, 8, 3, 3), (1, 1), [(1, 1)] * 2, 32, "taps_flat"),
    ((56, 56), (256, 8, 3, 3), (2, 2), [(1, 1)] * 2, 32, "split"),
    ((14, 14), (512, 16, 3, 3), (1, 1), [(1, 1)] * 2, 32, "split"),
    ((28, 28), (60, 80, 1, 1), (1, 1), [(0, 0)] * 2, 3, "dot"),
    ((56, 56), (24, 96, 1, 1), (1, 1), [(0, 0)] * 2, 1, "native"),  # dense 1x1: see conv_forms.choose
    ((56, 56), (64, 64, 3, 3), (1, 1), [(1, 1)] * 2, 1, "native"),
]


@pytest.mark.parametrize("sizes, w_shape, strides, padding, group, form", CHOICES,
                         ids=[f"{c[1]}-g{c[4]}-s{c[2][0]}" for c in CHOICES])
def test_choose(sizes: tuple, w_shape: tuple, strides: tuple, padding: list, group: int,
                form: str) -> None:
    assert F.choose(sizes, w_shape, strides, padding, (1, 1), group).__name__ == form


def test_every_form_is_reachable() -> None:
    chosen = {c[-1] for c in CHOICES}
    assert chosen == set(FORMS) | {"native"}


# --- channels last: X (N, *S, C), Y (N, *O, M) --------------------------------------------------

def _last_forms(w: np.ndarray, group: int) -> list[str]:
    names = ["native_last"]
    if group == 1 or math.prod(w.shape[2:]) == 1:
        names.append("dot_last")
    if w.shape[1] == 1:
        names.append("taps_last")
    if group == 1 and w.shape[1] <= F.STEM_CHANNELS:
        names.append("stem_taps_last")
    return names


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_channels_last_forms_match_native(case: tuple) -> None:
    x, w, s, padding, d = _case(*case)
    group = case[2]
    want = np.asarray(F.native(x, w, s, padding, d, group))
    xl = np.moveaxis(x, 1, -1)
    chosen = F.choose_last(x.shape[2:], w.shape, s, padding, d, group)
    for name, form in [(n, getattr(F, n)) for n in _last_forms(w, group)] + [("chosen", chosen)]:
        got = np.moveaxis(np.asarray(form(xl, w, s, padding, d, group)), -1, 1)
        assert got.dtype == np.float64, name
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=name)


@pytest.mark.parametrize("case", [CASES[0], CASES[1], CASES[3], CASES[8], CASES[9]], ids=_ids)
def test_channels_last_gradients_match_native(case: tuple) -> None:
    x, w, s, padding, d = _case(*case)
    group = case[2]
    xl = np.moveaxis(x, 1, -1)
    r = RNG.standard_normal(np.asarray(F.native_last(xl, w, s, padding, d, group)).shape)

    def loss(form, x, w):  # type: ignore[no-untyped-def]
        return jnp.sum(form(x, w, s, padding, d, group) * r)

    want = jax.grad(lambda x, w: loss(F.native_last, x, w), argnums=(0, 1))(xl, w)
    for name in _last_forms(w, group):
        form = getattr(F, name)
        got = jax.jit(jax.grad(lambda x, w, f=form: loss(f, x, w), argnums=(0, 1)))(xl, w)
        for g, want_g in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-9, atol=1e-9,
                                       err_msg=name)


LAST_CHOICES = [  # (X spatial sizes, W shape, strides, pads, group) -> the channels-last form
    ((16, 16), (96, 1, 3, 3), (1, 1), [(1, 1)] * 2, 96, "taps_last"),
    ((28, 28), (144, 1, 5, 5), (2, 2), [(2, 2)] * 2, 144, "taps_last"),
    ((28, 28), (256, 8, 3, 3), (1, 1), [(1, 1)] * 2, 32, "taps_flat_via_channels_first"),
    ((28, 28), (60, 80, 1, 1), (1, 1), [(0, 0)] * 2, 3, "dot_last"),
    ((32, 32), (64, 16, 1, 1), (1, 1), [(0, 0)] * 2, 1, "dot_last"),
    ((16, 16), (16, 8, 3, 3), (2, 2), [(1, 1)] * 2, 1, "dot_last"),
    ((56, 56), (64, 64, 3, 3), (1, 1), [(1, 1)] * 2, 1, "native_last"),
    ((64, 64), (8, 3, 7, 7), (2, 2), [(3, 3)] * 2, 1, "native_last"),
    ((320, 320), (32, 3, 3, 3), (2, 2), [(1, 1)] * 2, 1, "stem_taps_last"),  # an image stem
    ((224, 224), (16, 4, 5, 5), (2, 2), [(2, 2)] * 2, 1, "stem_taps_last"),
    ((224, 224), (64, 3, 7, 7), (2, 2), [(3, 3)] * 2, 1, "native_last"),
    ((320, 320), (32, 8, 3, 3), (2, 2), [(1, 1)] * 2, 1, "native_last"),
]


@pytest.mark.parametrize("sizes, w_shape, strides, padding, group, form", LAST_CHOICES,
                         ids=[f"{c[1]}-g{c[4]}-s{c[2][0]}" for c in LAST_CHOICES])
def test_choose_last(sizes: tuple, w_shape: tuple, strides: tuple, padding: list, group: int,
                     form: str) -> None:
    assert F.choose_last(sizes, w_shape, strides, padding, (1, 1), group).__name__ == form


@pytest.mark.parametrize("c, k, mult, rows", [(640, 5, 1, 1), (400, 3, 1, 2), (200, 3, 2, 2),
                                              (64, 5, 1, 5)])
def test_taps_last_row_groups_match_native(c: int, k: int, mult: int, rows: int) -> None:
    # wide channels: taps_last sums its taps in groups of kernel rows (one loop each, through an
    # optimization barrier); narrow ones in one loop of two chains
    row_bytes = 2 * k * c * mult * 8
    assert (max(1, F.TAPS_L1_BYTES // row_bytes) if row_bytes * k > F.TAPS_L1_BYTES else k) == rows
    x = RNG.standard_normal((1, 5, 6, c))
    w = RNG.standard_normal((c * mult, 1, k, k))
    s, padding, d = (1, 1), [(k // 2 + 1, 0), (0, k // 2)], (1, 1)
    want = np.asarray(F.native_last(x, w, s, padding, d, c))
    np.testing.assert_allclose(np.asarray(F.taps_last(x, w, s, padding, d, c)), want,
                               rtol=1e-10, atol=1e-10)
    r = RNG.standard_normal(want.shape)

    def loss(form, x, w):  # type: ignore[no-untyped-def]
        return jnp.sum(form(x, w, s, padding, d, c) * r)

    grads = jax.grad(lambda x, w: loss(F.native_last, x, w), argnums=(0, 1))(x, w)
    got = jax.jit(jax.grad(lambda x, w: loss(F.taps_last, x, w), argnums=(0, 1)))(x, w)
    for g, want_g in zip(got, grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-9, atol=1e-9)


def _dilated_transpose(x: np.ndarray, w: np.ndarray, group: int) -> jax.Array:
    """ConvTranspose without pads as conv.py lowers it in general: an lhs-dilated convolution."""
    c, mg, k = w.shape[0], w.shape[1], w.shape[2:]
    nd = len(k)
    wt = w.reshape((group, c // group, mg, *k)).swapaxes(1, 2).reshape((group * mg, c // group, *k))
    wt = jnp.flip(wt, tuple(range(2, nd + 2)))
    spec = jax.lax.ConvDimensionNumbers(*(tuple(range(nd + 2)),) * 3)
    return jax.lax.conv_general_dilated(x, wt, (1,) * nd, [(ki - 1, ki - 1) for ki in k],
                                        lhs_dilation=k, dimension_numbers=spec,
                                        feature_group_count=group)


@pytest.mark.parametrize("c, mg, k, group", [(4, 3, (2, 2), 1), (6, 2, (3, 2), 3), (3, 2, (4,), 1),
                                             (2, 3, (2, 1, 2), 2)])
def test_transposed_dot_matches_dilated_convolution(c: int, mg: int, k: tuple, group: int) -> None:
    x = RNG.standard_normal((2, c, *(5, 3, 2)[:len(k)]))
    w = RNG.standard_normal((c, mg, *k))
    want = np.asarray(_dilated_transpose(x, w, group))
    got = np.asarray(F.transposed_dot(x, w, group))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    last = F.transposed_dot(np.moveaxis(x, 1, -1), w, group, last=True)
    np.testing.assert_allclose(np.moveaxis(np.asarray(last), -1, 1), want, rtol=1e-10, atol=1e-10)
    r = RNG.standard_normal(want.shape)
    grads = jax.grad(lambda x, w: jnp.sum(_dilated_transpose(x, w, group) * r), (0, 1))(x, w)
    got_g = jax.jit(jax.grad(lambda x, w: jnp.sum(F.transposed_dot(x, w, group) * r), (0, 1)))(x, w)
    for g, want_g in zip(got_g, grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("m", [408, 1000])
def test_equal_output_channels_are_bit_equal(m: int) -> None:
    """Output channels with the same weights come out bit-equal from the 1x1 dot, as from
    onnxruntime's GEMM: XLA:CPU's own dot summed a last block of up to 8 columns in another order
    on AVX2 (light squeezenet's logits, see COLUMN_BLOCK; padded where at most 2% more columns).
    In a Conv-only segment XLA, not YNNPACK, runs the dots."""
    from onnx import TensorProto, helper, numpy_helper

    import oxla

    w = numpy_helper.from_array(np.full((m, 32, 1, 1), 0.02, np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 13, 13])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = (np.random.default_rng(1).random((1, 32, 13, 13)) * 1e6).astype(np.float32)
    y = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert y.shape == (1, m, 13, 13)
    np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1], y.shape))
