"""What benchmarks/finetune.py (oxla) and benchmarks/finetune_torch.py (PyTorch) share: the
architecture's sizes, the recipe's numbers, the data and its order. numpy only, so that both
interpreters import it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
WIDTHS = (16, 32, 64, 128)  # ResNet-18's [2, 2, 2, 2] BasicBlocks at a quarter of its widths
SIDE = 64  # the 8x8 digits upsampled to 3x64x64
CLASSES = 10
LR, MOMENTUM, WARMUP = 0.05, 0.9, 5  # SGD momentum; linear warm-up, then cosine to 0
BN_MOMENTUM = 0.1  # PyTorch's convention (the ONNX file holds 0.9)


def lr_factor(t: int, total: int) -> float:
    """oxla's Schedule("cosine", warmup=WARMUP, total=total) at step t (docs/training.md)."""
    cosine = (1 + math.cos(math.pi * min(t, total) / total)) / 2
    return cosine * min(1.0, (t + 1) / WARMUP)


def digits() -> tuple[np.ndarray, np.ndarray]:
    data = np.load(REPO / "data" / "digits.npz")
    return data["x_train"], data["y_train"]


def order(rows: int, steps: int, batch: int, seed: int = 0) -> np.ndarray:
    """(steps, batch) row indices: a new permutation per epoch, partial batches dropped."""
    per_epoch = rows // batch
    rng = np.random.default_rng(seed)
    epochs = [rng.permutation(rows)[:per_epoch * batch].reshape(per_epoch, batch)
              for _ in range(-(-steps // per_epoch))]
    return np.concatenate(epochs)[:steps]


_TEXTURE = np.random.default_rng(1).standard_normal((3, SIDE, SIDE)).astype(np.float32) * 0.1


def images(x: np.ndarray) -> np.ndarray:
    """(n, 64) digits in [0, 1] -> (n, 3, SIDE, SIDE) float32: nearest upsampling, centred, plus
    a fixed texture. Without it the 8x8 blocks are flat and max-pool windows hold exact ties."""
    scale = SIDE // 8
    img = x.reshape(-1, 1, 8, 8).repeat(scale, axis=2).repeat(scale, axis=3)
    return ((img - 0.5) / 0.5 + _TEXTURE).astype(np.float32)
