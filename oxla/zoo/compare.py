"""Compare outputs with expected values as onnx's backend runner does, and measure the gap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oxla.zoo.results import OutputDiff


@dataclass(frozen=True)
class _Gap:
    ok: bool
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    max_abs: float | None = None
    max_rel: float | None = None
    message: str = ""


def compare_outputs(names: Sequence[str], expected: Sequence[Sequence[Any]],
                    got: Sequence[Sequence[Any]], rtol: float, atol: float) -> list[OutputDiff]:
    """One OutputDiff per expected output, the worst over the data sets.

    Args:
        names: the model's output names, in order.
        expected: per data set, the expected outputs (output_K.pb), possibly fewer than names.
        got: per data set, what the model returned, in names' order.
        rtol, atol: |got - want| <= atol + rtol * |want| (bfloat16 gets at least two ULPs).

    Returns:
        The comparison of every output some data set has an expected value for.
    """
    n = max((len(w) for w in expected), default=0)
    out = []
    for k in range(n):
        name = names[k] if k < len(names) else f"output_{k}"
        gaps = []
        for i, (want, have) in enumerate(zip(expected, got)):
            if k >= len(want):
                continue
            if k >= len(have):
                gaps.append(_Gap(False, message=f"the model has no output {k}"))
                continue
            gap = compare_value(want[k], have[k], rtol, atol)
            gaps.append(gap if gap.ok or len(expected) == 1 else
                        _Gap(False, gap.shape, gap.dtype, gap.max_abs, gap.max_rel,
                             f"data set {i}: {gap.message}"))
        out.append(_worst(name, gaps))
    return out


def _worst(name: str, gaps: list[_Gap]) -> OutputDiff:
    bad = [g for g in gaps if not g.ok]
    first = bad[0] if bad else (gaps[0] if gaps else _Gap(True))
    abs_values = [g.max_abs for g in gaps if g.max_abs is not None]
    rel_values = [g.max_rel for g in gaps if g.max_rel is not None]
    return OutputDiff(name, not bad, first.shape, first.dtype,
                      max(abs_values) if abs_values else None,
                      max(rel_values) if rel_values else None, first.message)


def compare_value(want: Any, got: Any, rtol: float, atol: float) -> _Gap:
    """One expected value (tensor, sequence or optional) against what the model returned."""
    if want is None:
        ok = got is None
        return _Gap(ok, message="" if ok else f"expected an empty optional, got {_kind(got)}")
    if isinstance(want, list | tuple):
        if not isinstance(got, list | tuple):
            return _Gap(False, message=f"expected a sequence, got {_kind(got)}")
        if len(got) != len(want):
            return _Gap(False, message=f"sequence of {len(got)}, expected {len(want)}")
        gaps = [compare_value(w, g, rtol, atol) for w, g in zip(want, got)]
        worst = _worst("", gaps)
        return _Gap(worst.ok, None, "sequence", worst.max_abs, worst.max_rel, worst.message)
    if isinstance(want, dict):  # a map (ai.onnx.ml ZipMap and friends): same keys, close values
        if not isinstance(got, dict) or set(got) != set(want):
            return _Gap(False, message=f"expected a map with keys {sorted(map(str, want))[:5]}, got {_kind(got)}")
        gaps = [compare_value(want[k], got[k], rtol, atol) for k in want]
        worst = _worst("", gaps)
        return _Gap(worst.ok, None, "map", worst.max_abs, worst.max_rel, worst.message)
    return _compare_tensor(np.asarray(want), got, rtol, atol)


def _kind(value: Any) -> str:
    if value is None:
        return "an empty optional"
    if isinstance(value, list | tuple):
        return f"a sequence of {len(value)}"
    if isinstance(value, dict):
        return f"a map of {len(value)}"
    return f"a tensor of shape {np.shape(value)}"


def _compare_tensor(want: np.ndarray, got: Any, rtol: float, atol: float) -> _Gap:
    if got is None or isinstance(got, list | tuple | dict):
        return _Gap(False, want.shape, str(want.dtype), message=f"expected a tensor, got {_kind(got)}")
    have = np.asarray(got)
    shape, dtype = tuple(int(d) for d in have.shape), str(have.dtype)
    if have.shape != want.shape:
        return _Gap(False, shape, dtype, message=f"shape {shape}, expected {tuple(want.shape)}")
    if want.dtype == object or have.dtype == object:
        mismatched = int(np.sum(have != want)) if have.size else 0
        ok = mismatched == 0
        return _Gap(ok, shape, dtype, message="" if ok else f"{mismatched} of {have.size} strings differ")
    if have.dtype != want.dtype:
        return _Gap(False, shape, dtype, message=f"dtype {dtype}, expected {want.dtype}")
    if want.dtype.name == "bfloat16":
        rtol = max(rtol, 2**-6)  # two bfloat16 ULPs, as onnx's runner allows
    kind = np.complex128 if want.dtype.kind == "c" else np.float64
    g, w = have.astype(kind), want.astype(kind)
    close = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    max_abs, max_rel = _gaps(g, w)
    ok = bool(close.all())
    message = "" if ok else (f"{int(np.sum(~close))} of {close.size} values differ; max abs diff "
                             f"{max_abs:.3g}, max rel diff {max_rel:.3g} (rtol {rtol:g}, atol {atol:g})")
    return _Gap(ok, shape, dtype, max_abs, max_rel, message)


def _gaps(g: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Largest absolute and relative difference, over the positions where both are finite."""
    finite = np.isfinite(g) & np.isfinite(w)
    if not finite.any():
        return 0.0, 0.0
    diff = np.abs(g[finite] - w[finite])
    scale = np.abs(w[finite])
    rel = diff[scale > 0] / scale[scale > 0]
    return float(diff.max()), float(rel.max()) if rel.size else 0.0
