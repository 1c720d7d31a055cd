"""Signal ops: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.dtypes import to_numpy_dtype
from oxla.lowering.common import check_size
from oxla.lowering.registry import register_rule, rule


def _complex(cx, x):
    """The signal as a complex array without the trailing [re] / [re, im] axis."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise cx.fail(f"the last axis must hold 1 (real) or 2 (real, imaginary) values, got {x.shape}")
    x = x.astype(jnp.float64)  # a float64 FFT rounded once to the input's type, as numpy computes
    if x.shape[-1] == 1:
        return x[..., 0]
    return lax.complex(x[..., 0], x[..., 1])


def _split(y, dtype):
    """A complex result as [..., 2] (real, imaginary) in the input's type."""
    return jnp.stack([jnp.real(y), jnp.imag(y)], axis=-1).astype(dtype)


def _dft(cx, x, dft_length, axis: int, inverse: int, onesided: int):
    rank = x.ndim
    if not (-rank <= axis <= -2 or 0 <= axis <= rank - 2):
        raise cx.fail(f"axis {axis} is out of range for input of rank {rank} (the last axis holds "
                      "the real and imaginary parts)")
    axis %= rank
    signal = _complex(cx, x)
    if dft_length is not None:
        n = cx.static_ints(dft_length, "dft_length")[0]
    else:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    if n < 1:
        raise cx.fail(f"dft_length must be positive, got {n}")
    if inverse and onesided:  # IRFFT: one-sided complex spectrum -> real signal
        return jnp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    if inverse:
        return _split(jnp.fft.ifft(signal, n=n, axis=axis), x.dtype)
    y = jnp.fft.fft(signal, n=n, axis=axis)
    if onesided:  # RFFT: only the non-redundant half of a real signal's spectrum
        y = jnp.take(y, jnp.arange(n // 2 + 1), axis=axis)
    return _split(y, x.dtype)


@rule("DFT", since=20, static=("dft_length", "axis"))
def dft(cx, input, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """y[k] = sum_n x[n] exp(-2 pi j k n / N) along axis (v20+: axis is an input, default -2)."""
    ax = -2 if axis is None else cx.static_ints(axis, "axis")[0]
    return _dft(cx, input, dft_length, ax, inverse, onesided)


@rule("DFT", since=17, static=("dft_length",))
def dft_v17(cx, input, dft_length=None, *, axis=1, inverse=0, onesided=0):
    """y[k] = sum_n x[n] exp(-2 pi j k n / N) along the axis attribute (v17-v19)."""
    return _dft(cx, input, dft_length, axis, inverse, onesided)


@rule("STFT", since=17, static=("frame_step", "frame_length"))
def stft(cx, signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """Y[b, f] = DFT(window * signal[b, f * frame_step : f * frame_step + frame_length]) (v17+)."""
    if signal.ndim != 3 or signal.shape[-1] not in (1, 2):
        raise cx.fail(f"signal must be (batch, length, 1 or 2), got {signal.shape}")
    step = cx.static_ints(frame_step, "frame_step")[0]
    if frame_length is not None:
        length = cx.static_ints(frame_length, "frame_length")[0]
    else:
        length = window.shape[0] if window is not None else signal.shape[1]
    if window is not None and window.shape != (length,):
        raise cx.fail(f"window must have shape ({length},), got {window.shape}")
    if step < 1 or not 0 < length <= signal.shape[1]:
        raise cx.fail(f"frame_step {step} and frame_length {length} do not fit a signal of "
                      f"length {signal.shape[1]}")
    if onesided and signal.shape[-1] == 2:
        raise cx.fail("onesided output needs a real signal")
    frames = (signal.shape[1] - length) // step + 1
    starts = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    x = _complex(cx, signal)[:, starts]  # (batch, frames, length)
    if window is not None:
        x = x * window.astype(x.real.dtype)
    y = jnp.fft.fft(x, axis=-1)
    if onesided:
        y = y[..., : length // 2 + 1]
    return _split(y, signal.dtype)


def _cosine_window(op: str, a0: float, a1: float, a2: float) -> None:
    def lower(cx, size, *, output_datatype=1, periodic=1):
        n = cx.static_ints(size, "size")[0]
        denominator = n if periodic else n - 1
        t = 2 * np.pi * np.arange(n) / max(denominator, 1)
        w = a0 - a1 * np.cos(t) + a2 * np.cos(2 * t)
        return w.astype(to_numpy_dtype(output_datatype))
    lower.__name__ = op.lower()
    lower.__doc__ = (f"{op}: w[n] = {a0:.4g} - {a1:.4g} cos(2 pi n / N) + {a2:.4g} cos(4 pi n / N), "
                     "N = size (periodic) or size - 1 (v17+).")
    register_rule(op, 17, lower, static=("size",))


_cosine_window("HannWindow", 0.5, 0.5, 0.0)
_cosine_window("HammingWindow", 25 / 46, 21 / 46, 0.0)
_cosine_window("BlackmanWindow", 0.42, 0.5, 0.08)


@rule("MelWeightMatrix", since=17, static=("*",))
def mel_weight_matrix(cx, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz,
                      *, output_datatype=1):
    """Triangular filters (peak 1) evenly spaced on mel(f) = 2595 log10(1 + f / 700), shaped
    [dft_length // 2 + 1, num_mel_bins] (v17+)."""
    bins, n_fft, rate = (int(np.asarray(v).reshape(-1)[0]) for v in (num_mel_bins, dft_length, sample_rate))
    low, high = (float(np.asarray(v).reshape(-1)[0]) for v in (lower_edge_hertz, upper_edge_hertz))
    if bins < 1 or n_fft < 1 or rate < 1:
        raise cx.fail(f"num_mel_bins, dft_length and sample_rate must be positive, got {bins}, {n_fft}, {rate}")
    check_size(cx, [n_fft // 2 + 1, bins], np.float64)
    mel_low, mel_high = (2595 * np.log10(1 + f / 700) for f in (low, high))
    mels = np.arange(bins + 2) * (mel_high - mel_low) / (bins + 2) + mel_low
    hertz = 700 * (10 ** (mels / 2595) - 1)
    edges = ((n_fft + 1) * hertz // rate).astype(np.int64)  # the FFT bin of each filter edge
    out = np.zeros((n_fft // 2 + 1, bins))
    for i in range(bins):
        left, center, right = edges[i:i + 3]
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return out.astype(to_numpy_dtype(output_datatype))
