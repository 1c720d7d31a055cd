"""oxla's native kernels: C++ reached from XLA through its FFI (custom calls).

`available()` builds the library on first use with the host's C++ compiler (c++, g++ or $CXX)
into a per-user cache, registers its targets with XLA, and says whether they can be used. It
returns False, and oxla keeps XLA's own kernels, when:
- OXLA_NATIVE=0 is set;
- the CPU has neither AVX-512F nor AVX2 with FMA (the library is built for the better of the
  two: kernels.cc's vector layer);
- no compiler is found or the build fails (the reason is kept in `unavailable_reason()`).

The build writes to a temporary file and renames it into place, so concurrent processes never
load a half-written library; the file name carries a hash of the source, the flags and the
jaxlib version, so an upgrade rebuilds.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import jax
import numpy as np

from oxla.host import has_avx2_fma, has_avx512

SOURCE = Path(__file__).with_name("kernels.cc")
COMMON_FLAGS = ("-O3", "-std=c++20", "-fPIC", "-shared", "-pthread")
AVX512_FLAGS = ("-mavx512f", "-mavx512vl", "-mfma")
AVX2_FLAGS = ("-mavx2", "-mfma")
NR = 32  # columns per packed panel; kernels.cc's NR
GEMM_TARGET = "oxla_sgemm"
CONV_TARGET = "oxla_sconv"
DEPTHWISE_TARGET = "oxla_sdwconv"
GRU_TARGET = "oxla_sgru"
LSTM_TARGET = "oxla_slstm"
STEM_TARGET = "oxla_sstem"
WINOGRAD_TARGET = "oxla_swino"
NMS_TARGET = "oxla_snms"

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def cache_dir() -> Path:
    """Where built libraries live: $OXLA_NATIVE_CACHE, else $XDG_CACHE_HOME/oxla/native, else
    ~/.cache/oxla/native."""
    given = os.environ.get("OXLA_NATIVE_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "oxla" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def isa() -> str | None:
    """The instruction set the library is built for on this CPU: "avx512", "avx2" or None."""
    if has_avx512():
        return "avx512"
    if has_avx2_fma():
        return "avx2"
    return None


def _flags() -> tuple[str, ...]:
    return (*COMMON_FLAGS, *(AVX512_FLAGS if isa() == "avx512" else AVX2_FLAGS))


def _build() -> Path:
    """The built library's path, building it if this source/flags/jaxlib has none yet."""
    cxx = _compiler()
    flags = _flags()
    if cxx is None:
        raise OSError("no C++ compiler (c++, g++, clang++ or $CXX) on PATH")
    include = jax.ffi.include_dir()
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join((cxx, *flags, jax.__version__)).encode()).hexdigest()
    target = cache_dir() / f"oxla_native_{key[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *flags, "-I", include, str(SOURCE), "-o", tmp],
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise OSError(f"{cxx} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load() -> None:
    if os.environ.get("OXLA_NATIVE", "1") == "0":
        raise OSError("OXLA_NATIVE=0")
    if isa() is None:
        raise OSError("the CPU has neither AVX-512F nor AVX2 with FMA")
    lib = ctypes.CDLL(str(_build()))
    jax.ffi.register_ffi_target(GEMM_TARGET, jax.ffi.pycapsule(lib.OxlaSgemm), platform="cpu")
    jax.ffi.register_ffi_target(CONV_TARGET, jax.ffi.pycapsule(lib.OxlaSconv), platform="cpu")
    jax.ffi.register_ffi_target(DEPTHWISE_TARGET, jax.ffi.pycapsule(lib.OxlaSdwconv),
                                platform="cpu")
    jax.ffi.register_ffi_target(GRU_TARGET, jax.ffi.pycapsule(lib.OxlaSgru), platform="cpu")
    jax.ffi.register_ffi_target(LSTM_TARGET, jax.ffi.pycapsule(lib.OxlaSlstm), platform="cpu")
    jax.ffi.register_ffi_target(STEM_TARGET, jax.ffi.pycapsule(lib.OxlaSstem), platform="cpu")
    jax.ffi.register_ffi_target(WINOGRAD_TARGET, jax.ffi.pycapsule(lib.OxlaSwino),
                                platform="cpu")
    jax.ffi.register_ffi_target(NMS_TARGET, jax.ffi.pycapsule(lib.OxlaSnms), platform="cpu")
    _STATE["lib"] = lib


def available() -> bool:
    """Whether the native kernels are built, loaded and registered (building them if needed)."""
    if "ok" not in _STATE:
        with _LOCK:
            if "ok" not in _STATE:
                try:
                    _load()
                    _STATE["ok"] = True
                except (OSError, subprocess.SubprocessError, AttributeError) as e:
                    _STATE["why"] = str(e)
                    _STATE["ok"] = False
    return bool(_STATE["ok"])


def unavailable_reason() -> str | None:
    """Why the native kernels cannot be used here (asking `available()` first); None when they
    can."""
    return None if available() else str(_STATE.get("why"))


def pack(w: np.ndarray) -> np.ndarray:
    """W (..., K, N) float32 as the kernel reads it: (..., ceil(N / 32), K, 32), zero padded (the
    leading axes: products packed one after another, as the Winograd kernel's 16)."""
    *lead, k, n = w.shape
    panels, whole = -(-n // NR), n // NR
    # written in place, panel by panel (through a zero-padded copy first, then moved: VGG-19's
    # 25088 x 4096 weight 2.78 s, this way 0.16)
    out = np.zeros((*lead, panels, k, NR), np.float32)
    if whole:
        out[..., :whole, :, :] = np.moveaxis(w[..., :whole * NR].reshape(*lead, k, whole, NR), -2, -3)
    if n % NR:
        out[..., whole, :, :n - whole * NR] = w[..., whole * NR:]
    return out
