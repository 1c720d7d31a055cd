"""Latency of the converter-made models (models/converters) against onnxruntime, interleaved.

    .venv/bin/python -m benchmarks.converters [--repeat 200] [--steps 50] [--match paddle_]

`--without-run-ahead` also times oxla with the Loop run-ahead off (every tf2onnx RNN loop then
runs on the host), in the same process, interleaved with the others.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

import oxla
from oxla.lowering.ops import control_flow
from tests.test_converters import MODELS, _feed, _onnxruntime


def _feeds(model: onnx.ModelProto, steps: int) -> dict[str, Any]:
    feeds = {i.name: _feed(i) for i in model.graph.input}
    if "tokens" in feeds:  # a longer sentence than the tests use
        dtype = feeds["tokens"].dtype  # int32 from tf2onnx, int64 from paddle2onnx
        feeds["tokens"] = np.random.default_rng(0).integers(0, 50, (4, steps)).astype(dtype)
    return feeds


def _oxla(path: Path, feeds: dict[str, Any], run_ahead: bool) -> oxla.InferenceSession:
    """A session compiled (first run) with the run-ahead on or off."""
    saved = control_flow._run_ahead
    if not run_ahead:
        control_flow._run_ahead = lambda *args: None  # type: ignore[assignment]
    try:
        session = oxla.InferenceSession(str(path))
        session.run(None, feeds)
    finally:
        control_flow._run_ahead = saved  # type: ignore[assignment]
    return session


def _median_ms(runs: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeat):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {k: float(np.median(v)) * 1e3 for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--steps", type=int, default=50, help="tokens per sentence for text models")
    parser.add_argument("--without-run-ahead", action="store_true")
    parser.add_argument("--match", default="", help="only the models whose file name contains this")
    args = parser.parse_args()
    for path in sorted(p for p in MODELS.glob("*.onnx") if args.match in p.name):
        model = onnx.load(path)
        feeds = _feeds(model, args.steps)
        ref: ort.InferenceSession = _onnxruntime(model)
        runs: dict[str, Callable[[], Any]] = {
            "ort": partial(ref.run, None, feeds),
            "oxla": partial(_oxla(path, feeds, True).run, None, feeds),
        }
        if args.without_run_ahead:
            runs["no-run-ahead"] = partial(_oxla(path, feeds, False).run, None, feeds)
        ms = _median_ms(runs, args.repeat)
        extra = "".join(f"  {k} {v:8.3f} ms ({v / ms['ort']:5.1f}x)" for k, v in ms.items()
                        if k not in ("ort", "oxla"))
        print(f"{path.name:28s} ort {ms['ort']:8.3f} ms  oxla {ms['oxla']:8.3f} ms ({ms['oxla'] / ms['ort']:5.1f}x){extra}")


if __name__ == "__main__":
    main()
