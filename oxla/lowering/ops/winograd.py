"""oxla.winograd::Conv: a channels-last 3x3 convolution (stride 1, padding 1) by Winograd F(2x2, 3x3).

Each 2x2 block of Y is A^T [(G g G^T) * (B^T d B)] A for the 4x4 tile d of X around it: 16
products per output block instead of 36 multiply-adds. The kernel transform U = G g G^T is made
once, at load (WinogradPass); a call transforms the input tiles (adds and subtracts, one fused
loop), runs 16 batched dots (tiles x C) @ (C x M), and transforms back. XLA:CPU's convolution
runs these layers near the core's peak, so the product count is what is left to cut: at one
thread, C = M = 128 at 28x28 1.55 -> 0.86 ms, 256 at 14x14 1.41 -> 0.82 ms, 512 at 8x8 1.78 ->
1.22 ms, 128 at 40x40 3.03 -> 1.91 ms; 64 at 56x56 equal. The errors against a float64
reference are those of the direct convolution (about 3e-6 on unit-scale data).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from oxla.lowering.registry import rule

DOMAIN = "oxla.winograd"
# Above this many pixels per image the transformed tiles outgrow the caches: DBNet's 80x80 layers
# ran slower as Winograd inside the model (ResNet-50 at one thread, interleaved: 64.4 -> 60.9 ms
# with layers up to 56x56; the DBNet-style segmenter 100.2 -> 91.9 ms)
MAX_PIXELS = 56 * 56

# F(2x2, 3x3) (Lavin and Gray): input, kernel and output transforms
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)
# G's left inverse: g = P U P^T (rows 0 and 3 of U are g's rows 0 and 2, row 1 - row 2 is row 1)
P = np.array([[1, 0, 0, 0], [0, 1, -1, 0], [0, 0, 0, 1]], np.float64)


def kernel_transform(hwio: np.ndarray) -> np.ndarray:
    """U = G g G^T of a (3, 3, C, M) kernel, as (4, 4, C, M) float32 (computed in float64)."""
    return np.einsum("ij,jkcm,lk->ilcm", G, hwio.astype(np.float64), G).astype(np.float32)


def _combine(rows: np.ndarray, terms: list[Any]) -> list[Any]:
    """[sum_j rows[i, j] * terms[j] for each row i], with the +-1 and 0 coefficients as adds."""
    out = []
    for row in rows:
        acc = None
        for c, t in zip(row, terms):
            if c == 0:
                continue
            part = t if c == 1 else -t if c == -1 else t * t.dtype.type(c)
            acc = part if acc is None else acc + part
        out.append(acc)
    return out


def winograd_conv(x: Any, u: Any) -> Any:
    """Y (N, H, W, M) of X (N, H, W, C) and U (4, 4, C, M): the 3x3 convolution, zero padding 1."""
    n, h, w, c = x.shape
    m = u.shape[-1]
    th, tw = -(-h // 2), -(-w // 2)
    xp = lax.pad(x, jnp.zeros((), x.dtype),
                 [(0, 0, 0), (1, 1 + 2 * th - h, 0), (1, 1 + 2 * tw - w, 0), (0, 0, 0)])
    d = [[xp[:, i:i + 2 * th:2, j:j + 2 * tw:2, :] for j in range(4)] for i in range(4)]
    rows = [_combine(BT, [d[i][j] for i in range(4)]) for j in range(4)]   # rows[j][a]
    v = [_combine(BT, [rows[j][a] for j in range(4)]) for a in range(4)]  # v[a][b]
    tiles = jnp.stack([v[a][b] for a in range(4) for b in range(4)]).reshape(16, n * th * tw, c)
    prod = lax.dot_general(tiles, u.reshape(16, c, m), (((2,), (1,)), ((0,), (0,))))
    mm = prod.reshape(4, 4, n, th, tw, m)
    cols = [_combine(AT, [mm[i, j] for i in range(4)]) for j in range(4)]  # cols[j][a]
    y = [_combine(AT, [cols[j][a] for j in range(4)]) for a in range(2)]   # y[a][b]
    out = jnp.stack([jnp.stack(y[a], axis=3) for a in range(2)], axis=2)   # (n, th, 2, tw, 2, m)
    return out.reshape(n, 2 * th, 2 * tw, m)[:, :h, :w, :]


def kernel(u: Any) -> Any:
    """The (3, 3, C, M) kernel back from U: g = P U P^T."""
    return jnp.einsum("ij,jkcm,lk->ilcm", P.astype(np.float32), u, P.astype(np.float32))


@rule("Conv", since=1, domain=DOMAIN)
def conv(cx, x, u, b=None):
    """Y = the 3x3 convolution (stride 1, dilation 1, padding 1) of channels-last X with the
    kernel whose Winograd transform is U (4, 4, C, M), plus B. Images above MAX_PIXELS run XLA's
    convolution of the kernel made back from U."""
    cx.expect_rank("X", x, 4)
    cx.expect_rank("U", u, 4)
    if tuple(u.shape[:2]) != (4, 4) or u.shape[2] != x.shape[-1]:
        raise cx.fail(f"U of shape {tuple(u.shape)} does not fit X of shape {tuple(x.shape)}")
    y = convolve(x, u.astype(x.dtype))
    return y if b is None else y + b.astype(y.dtype)


def convolve(x: Any, u: Any) -> Any:
    """Winograd up to MAX_PIXELS per image; above, or where the image size is symbolic (a
    jax.export of model.fn), XLA's convolution of the kernel made back from U."""
    pixels = x.shape[1] * x.shape[2]
    if isinstance(pixels, int) and pixels <= MAX_PIXELS:
        return winograd_conv(x, u)
    return lax.conv_general_dilated(x, kernel(u), (1, 1), [(1, 1), (1, 1)],
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))
