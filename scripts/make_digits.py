"""Write data/digits.npz from scikit-learn's bundled copy of the UCI 8x8 handwritten digits.

    .venv-export/bin/python scripts/make_digits.py   # needs scikit-learn; run once, commit the .npz

The digits (1797 images, 8x8, 10 classes) are "Optical Recognition of Handwritten Digits" from
the UCI Machine Learning Repository, CC BY 4.0 (see data/README.md). Pixels are scaled from
0..16 to 0..1; a seeded split stratified by class keeps 359 images (a fifth) for testing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TEST_SIZE = 360
SEED = 0


def split(labels: np.ndarray, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A stratified split: each class gives the same share of its images to the test set."""
    rng = np.random.default_rng(seed)
    test: list[np.ndarray] = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        test.append(members[: round(len(members) * test_size / len(labels))])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(len(labels)), test_idx)
    return rng.permutation(train_idx), test_idx


def main(argv: list[str] | None = None) -> int:
    from sklearn.datasets import load_digits

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "data" / "digits.npz")
    args = parser.parse_args(argv)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    train, test = split(y, TEST_SIZE, SEED)
    np.savez_compressed(args.out, x_train=x[train], y_train=y[train], x_test=x[test], y_test=y[test])
    print(f"wrote {args.out}: {len(train)} train, {len(test)} test images of 8x8 = 64 features")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
