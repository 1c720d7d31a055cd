"""oxla vs onnxruntime on models quantized by onnxruntime's own tools: latency ratios in one run.

    python -m benchmarks.quantized [--models resnet_small,resnet50] [--runs 20] [--write docs/contrib-ops-quant.md]

resnet_small (models/) is quantized three ways (quantize_dynamic: ConvInteger/MatMulInteger;
quantize_static QDQ and QOperator: QLinearConv, com.microsoft QLinearAdd/QGemm), as are ResNet-50
(benchmarks.models, random weights) and models/transformer_encoder.onnx (MatMulInteger,
QLinearMatMul, QLinearSoftmax...), into benchmarks/.cache/ort_quant.
onnxruntime runs twice: at its default optimisation level (fused integer kernels: what a user
gets) and at ORT_ENABLE_BASIC (the graph as written: what oxla computes, bit for bit). Each
configuration runs in its own process, timed in alternating blocks after warm-up; medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run import SETTLE, model_path, wait_idle, write_results

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "benchmarks" / ".cache" / "ort_quant"
# model -> (source file, input name, input shape without batch, formats, batches)
MODELS: dict[str, tuple[Callable[[], Path], str, tuple[int, ...], tuple[str, ...], tuple[int, ...]]] = {
    "resnet_small": (lambda: ROOT / "models" / "resnet_small.onnx", "image", (3, 64, 64),
                     ("dynamic", "qdq", "qop"), (1, 8)),
    "resnet50": (lambda: model_path("resnet50"), "input", (3, 224, 224), ("dynamic", "qdq", "qop"), (1,)),
    "transformer_encoder": (lambda: ROOT / "models" / "transformer_encoder.onnx", "ids", (32,),
                            ("dynamic", "qdq", "qop"), (1, 8)),
}


def _input(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Token ids below 100 for "ids", standard normal floats otherwise."""
    if name == "ids":
        return rng.integers(0, 100, shape).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32)


class _Reader:
    """quantize_static's calibration data: a few seeded inputs."""

    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        rng = np.random.default_rng(123)
        self._items: Iterator[dict[str, np.ndarray]] = iter(
            [{name: _input(name, (1, *shape), rng)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)


def quantized_path(model: str, fmt: str) -> Path:
    """Quantize (once) and cache one format of a model, with onnxruntime.quantization."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    source, name, shape, _, _ = MODELS[model]
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"{model}.{fmt}.onnx"
    if path.exists():
        return path
    src = str(source())
    tmp = path.with_suffix(".tmp.onnx")
    if fmt == "dynamic":
        quantize_dynamic(src, str(tmp), weight_type=QuantType.QInt8)
    else:
        quantize_static(src, str(tmp), _Reader(name, shape),
                        quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=fmt == "qdq")
    os.replace(tmp, path)
    return path


@dataclass
class Result:
    model: str
    batch: int
    oxla_ms: float
    ort_ms: float
    ort_basic_ms: float
    oxla_first_s: float
    max_diff_basic: float
    max_diff_default: float

    @property
    def ratio(self) -> float:
        return self.oxla_ms / self.ort_ms

    @property
    def ratio_basic(self) -> float:
        return self.oxla_ms / self.ort_basic_ms


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench(model: str, fmt: str, batch: int, runs: int) -> Result:
    """One configuration: oxla, onnxruntime (default level) and onnxruntime basic, interleaved."""
    import onnxruntime as ort

    import oxla

    path = str(quantized_path(model, fmt))
    _, name, shape, _, _ = MODELS[model]
    feeds = {name: _input(name, (batch, *shape), np.random.default_rng(0))}
    sess = oxla.InferenceSession(path)
    got, first = _timed(lambda: sess.run(None, feeds))
    fused = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    basic = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    want = basic.run(None, feeds)
    want_default = fused.run(None, feeds)
    runners = [lambda: sess.run(None, feeds), lambda: fused.run(None, feeds), lambda: basic.run(None, feeds)]
    warm = [min(_timed(r)[1] for _ in range(3)) for r in runners]
    runs = max(runs, min(1000, int(1.0 / max(warm))))  # fast models: ~1 s of calls per side
    times: list[list[float]] = [[], [], []]
    block = max(3, runs // 8)  # blocks: onnxruntime's threads spin on after a call
    while len(times[0]) < runs:
        for i, r in enumerate(runners):
            # each block starts with the other runtimes' threads asleep, and its first SETTLE
            # calls run but are not counted, on every side
            wait_idle()
            times[i] += [_timed(r)[1] for _ in range(block + SETTLE)][SETTLE:]
    ms = [statistics.median(t) * 1e3 for t in times]
    return Result(f"{model}.{fmt}", batch, ms[0], ms[1], ms[2], first, _diff(got, want), _diff(got, want_default))


def _diff(got: list[Any], want: list[Any]) -> float:
    """The largest difference relative to the output's scale (random-weight logits can be large)."""
    return max(float(np.max(np.abs(np.asarray(g, np.float64) - w)) / max(np.max(np.abs(w)), 1e-30))
               for g, w in zip(got, want))


def _in_child(model: str, fmt: str, batch: int, runs: int) -> Result:
    cmd = [sys.executable, "-m", "benchmarks.quantized", "--runs", str(runs), "--one", model, fmt, str(batch)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark {model}.{fmt} b{batch} failed:\n{proc.stderr[-2000:]}")
    return Result(**json.loads(proc.stdout.strip().splitlines()[-1]))


def table(results: list[Result]) -> str:
    lines = ["| model (quantizer format) | batch | oxla ms | onnxruntime ms | ratio | onnxruntime basic ms "
             "| ratio vs basic | max diff / max abs vs basic | vs default | oxla first call s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.model} | {r.batch} | {r.oxla_ms:.2f} | {r.ort_ms:.2f} | {r.ratio:.2f}x | "
                     f"{r.ort_basic_ms:.2f} | {r.ratio_basic:.2f}x | {r.max_diff_basic:.1e} | {r.max_diff_default:.1e} | "
                     f"{r.oxla_first_s:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--write", help="write the table as a markdown section into this file")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "FORMAT", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a child process: one configuration, the result as JSON on the last line
        r = bench(args.one[0], args.one[1], int(args.one[2]), args.runs)
        print(json.dumps(dataclasses.asdict(r)))
        return 0
    results = []
    for model in args.models.split(","):
        for fmt in MODELS[model][3]:
            quantized_path(model, fmt)
            for batch in MODELS[model][4]:
                r = _in_child(model, fmt, batch, args.runs)
                results.append(r)
                print(f"{r.model} b{r.batch}: oxla {r.oxla_ms:.2f} ms, onnxruntime {r.ort_ms:.2f} ms "
                      f"({r.ratio:.2f}x), basic {r.ort_basic_ms:.2f} ms ({r.ratio_basic:.2f}x), "
                      f"max diff {r.max_diff_basic:.1e} (vs default {r.max_diff_default:.1e})", flush=True)
    text = table(results)
    print("\n" + text)
    if args.write:
        write_results(args.write, "Quantized models", "quantized", argv,
                      f"Medians of alternating blocks after warm-up, each block's first two calls not counted (at least {args.runs} calls, "
                      "~1 s per side for fast models).", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
