"""`make run`: compile a shipped model with oxla, run it, and compare with onnxruntime."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import oxla

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "resnet_small.onnx"


def _median_ms(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_inference(model: Path, batch: int, runs: int) -> int:
    """Compile and run `model` with oxla and onnxruntime; print outputs, latency, agreement."""
    rng = np.random.default_rng(0)
    image = rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)
    start = time.perf_counter()
    sess = oxla.InferenceSession(str(model))
    (logits,) = sess.run(None, {"image": image})
    first = time.perf_counter() - start
    print(f"model {model.name}: {len(sess.compiled.model.graph.node)} nodes, "
          f"{sum(int(np.prod(p.shape)) for p in sess.compiled.params.values()):,} parameters")
    print(f"oxla: load + compile + first run {first * 1e3:.0f} ms")
    for i, row in enumerate(logits):
        print(f"  image {i}: class {int(row.argmax())}  logits {np.array2string(row[:5], precision=3)}...")
    oxla_ms = _median_ms(lambda: sess.run(None, {"image": image}), runs)
    try:
        import onnxruntime as ort
    except ImportError:
        print(f"oxla median latency {oxla_ms:.2f} ms (onnxruntime not installed: no comparison)")
        return 0
    ref_sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (ref,) = ref_sess.run(None, {"image": image})
    ort_ms = _median_ms(lambda: ref_sess.run(None, {"image": image}), runs)
    diff = float(np.max(np.abs(logits - ref)))
    agree = bool(np.allclose(logits, ref, rtol=1e-3, atol=1e-4))
    same_class = bool((logits.argmax(1) == ref.argmax(1)).all())
    print(f"onnxruntime agreement: max abs diff {diff:.2e} ({'ok' if agree else 'MISMATCH'}), "
          f"same predicted classes: {same_class}")
    print(f"median latency over {runs} runs: oxla {oxla_ms:.2f} ms, onnxruntime {ort_ms:.2f} ms "
          f"(ratio {oxla_ms / ort_ms:.2f}x)")
    return 0 if agree else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        return run_inference(args.model, args.batch, args.runs)
    except oxla.OxlaError as e:
        print(f"oxla: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
