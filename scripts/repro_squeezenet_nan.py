"""Loop fresh sessions of onnx's light squeezenet in one process and count those that compute NaN.

    .venv/bin/python scripts/repro_squeezenet_nan.py [--sessions 150]
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= .venv/bin/python scripts/repro_squeezenet_nan.py

Kept from chasing a fixed defect (FACTS.md): XLA:CPU computed Softmax's input twice in different
orders, exp(X - max) overflowed at logits of ~1e10, and 1-15% of compiles (all of them with
YNNPACK fusions off) were all-NaN; Softmax now reads X through an optimization barrier. The tool
finds fusion-dependent numerics: run it under an XLA flag or after changing a rule.
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oxla import backend
from tests.conformance.cases import all_cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=150)
    args = parser.parse_args()
    case = next(c for c in all_cases() if c.name == "test_squeezenet")
    model, data, *_ = case.load()
    inputs, _ = data[0]
    bad = 0
    for i in range(args.sessions):
        rep = backend.prepare(model, "CPU")
        first = rep.run(inputs)[0]
        gc.collect()
        nans = [int(np.isnan(first).sum())] + [int(np.isnan(rep.run(inputs)[0]).sum()) for _ in range(2)]
        if any(nans):
            bad += 1
            print(f"session {i}: NaN outputs per call {nans}", flush=True)
    print(f"{bad} of {args.sessions} sessions computed NaN")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
