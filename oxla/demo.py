"""`make run`: train the shipped digits MLP from its own TrainingInfoProto with oxla, strip the
training section, and run the trained model with oxla and onnxruntime side by side; then compile
the shipped ResNet and compare its inference with onnxruntime."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import oxla
from oxla.training import strip_training

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "resnet_small.onnx"
DIGITS_MODEL = REPO / "models" / "digits_mlp.onnx"
DIGITS_DATA = REPO / "data" / "digits.npz"
TARGET_ACCURACY = 0.95
TARGET_SECONDS = 60.0
IDLE_SECONDS = 0.07


def _median_ms(*fns: Callable[[], Any], runs: int) -> list[float]:
    """Median ms per call of each of `fns`, timed in alternating blocks of 5 calls, each block
    after 2 calls that are not counted (a runtime takes about two calls to settle after another
    one ran: benchmarks/run.py) and after IDLE_SECONDS of sleep (onnxruntime's pool threads spin
    on a core for 40-55 ms after its last call; the next block would run without that core), at
    least `runs` counted calls each."""
    times: list[list[float]] = [[] for _ in fns]
    while len(times[0]) < runs:
        for fn, spent in zip(fns, times):
            time.sleep(IDLE_SECONDS)
            for i in range(2 + 5):
                start = time.perf_counter()
                fn()
                if i >= 2:
                    spent.append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


# --- part 1: training from the ONNX file ----------------------------------------------------

def _train(session: oxla.TrainingSession, data: Any, epochs: int, batch: int) -> None:
    """Shuffled mini-batch epochs; prints loss, test accuracy and throughput per epoch."""
    x, y = data["x_train"], data["y_train"]
    steps = len(x) // batch
    for epoch in range(epochs):
        start = time.perf_counter()
        order = np.random.default_rng([0, epoch]).permutation(len(x))
        losses = []
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            losses.append(session.step_async({"image": x[idx], "label": y[idx]},
                                             outputs=["loss"])["loss"])
        mean = float(np.mean([float(v) for v in losses]))
        seconds = time.perf_counter() - start
        (logits,) = session.run(["logits"], {"image": data["x_test"]})
        accuracy = float(np.mean(logits.argmax(1) == data["y_test"]))
        print(f"  epoch {epoch + 1:2d}/{epochs}: loss {mean:.4f}  test accuracy {accuracy:6.2%}  "
              f"{steps * batch / seconds:8,.0f} samples/s")


def _side_by_side(model_bytes: bytes, data: Any, runs: int) -> bool:
    """The stripped model on the test set with oxla and onnxruntime: accuracy, agreement, speed."""
    x, y = data["x_test"], data["y_test"]
    sess = oxla.InferenceSession(model_bytes)
    (ours,) = sess.run(None, {"image": x})
    print(f"  oxla        test accuracy {np.mean(ours.argmax(1) == y):.2%}")
    try:
        import onnxruntime as ort
    except ImportError:
        print("  onnxruntime not installed: no comparison")
        return True
    ref_sess = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
    (ref,) = ref_sess.run(None, {"image": x})
    print(f"  onnxruntime test accuracy {np.mean(ref.argmax(1) == y):.2%}")
    agree = bool(np.allclose(ours, ref, rtol=1e-3, atol=1e-4))
    same = float(np.mean(ours.argmax(1) == ref.argmax(1)))
    print(f"  agreement: max abs logit diff {np.max(np.abs(ours - ref)):.2e} "
          f"({'ok' if agree else 'MISMATCH'}), same predicted digit for {same:.1%} of images")
    for batch in (1, len(x)):
        feed = {"image": x[:batch]}
        sess.run(None, feed)
        ours_ms, ort_ms = _median_ms(partial(sess.run, None, feed), partial(ref_sess.run, None, feed),
                                     runs=5 * runs)  # sub-ms calls: more runs
        print(f"  latency, batch {batch:3d}: oxla {ours_ms:.3f} ms, onnxruntime {ort_ms:.3f} ms "
              f"(ratio {ours_ms / ort_ms:.2f}x)")
    return agree


def run_training(epochs: int, batch: int, runs: int) -> int:
    """Train models/digits_mlp.onnx from its TrainingInfoProto, then compare inference."""
    start = time.perf_counter()
    data = dict(np.load(DIGITS_DATA))
    session = oxla.TrainingSession(str(DIGITS_MODEL))
    meta = session.metadata
    print(f"training {DIGITS_MODEL.name} from its TrainingInfoProto "
          f"({meta.get('oxla.training.optimizer', '?')}, {meta.get('oxla.training.loss', '?')}, "
          f"hyper-parameters {meta.get('oxla.training.hyperparameters', '?')})")
    print(f"  data: {len(data['x_train'])} training, {len(data['x_test'])} test 8x8 digits; "
          f"batch {batch}, {epochs} epochs; each step is one XLA computation")
    session.initialize()
    _train(session, data, epochs, batch)
    trained = strip_training(session.model()).SerializeToString()
    (logits,) = session.run(["logits"], {"image": data["x_test"]})
    accuracy = float(np.mean(logits.argmax(1) == data["y_test"]))
    seconds = time.perf_counter() - start
    met = accuracy >= TARGET_ACCURACY and seconds <= TARGET_SECONDS
    print(f"trained in {seconds:.1f} s (load, compile, {epochs} epochs, evaluation): test accuracy "
          f"{accuracy:.2%}; target >= {TARGET_ACCURACY:.0%} within {TARGET_SECONDS:.0f} s: "
          f"{'met' if met else 'NOT met'}")
    print("stripped the training section; the trained inference model side by side:")
    agree = _side_by_side(trained, data, runs)
    return 0 if met and agree else 1


# --- part 2: inference of a converter-exported ResNet ---------------------------------------

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
    try:
        import onnxruntime as ort
    except ImportError:
        (oxla_ms,) = _median_ms(lambda: sess.run(None, {"image": image}), runs=runs)
        print(f"oxla median latency {oxla_ms:.2f} ms (onnxruntime not installed: no comparison)")
        return 0
    ref_sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (ref,) = ref_sess.run(None, {"image": image})
    oxla_ms, ort_ms = _median_ms(lambda: sess.run(None, {"image": image}),
                                 lambda: ref_sess.run(None, {"image": image}), runs=runs)
    diff = float(np.max(np.abs(logits - ref)))
    agree = bool(np.allclose(logits, ref, rtol=1e-3, atol=1e-4))
    same_class = bool((logits.argmax(1) == ref.argmax(1)).all())
    print(f"onnxruntime agreement: max abs diff {diff:.2e} ({'ok' if agree else 'MISMATCH'}), "
          f"same predicted classes: {same_class}")
    print(f"median latency (alternating blocks, {runs}+ calls each): oxla {oxla_ms:.2f} ms, onnxruntime {ort_ms:.2f} ms "
          f"(ratio {oxla_ms / ort_ms:.2f}x)")
    return 0 if agree else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=15, help="digits training epochs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", type=Path, default=MODEL, help="the inference-comparison model")
    parser.add_argument("--batch", type=int, default=4, help="batch of the inference comparison")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--skip-inference", action="store_true", help="only the training demo")
    args = parser.parse_args(argv)
    try:
        print("== 1. training from the ONNX file ==")
        status = run_training(args.epochs, args.batch_size, args.runs)
        if not args.skip_inference:
            print("\n== 2. inference of a converter-exported model ==")
            status = max(status, run_inference(args.model, args.batch, args.runs))
        return status
    except oxla.OxlaError as e:
        print(f"oxla: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
