"""onnx's light model zoo files (the ONNX model zoo's classic CNNs, opset 7-9) against onnxruntime.

    python -m benchmarks.light_zoo [--rounds 6] [--block 0.3] [--random-weights] [NAME ...]

NAME is a file's stem without `light_` (bvlc_alexnet, zfnet512, vgg19, resnet50, inception_v1,
inception_v2, densenet121, squeezenet, shufflenet); all of them by default. Each model runs in
this process at both runtimes' default threads: oxla's first call (session and first run), then
`--rounds` rounds of a `--block`-second block of calls of each runtime, every block started once
the other runtime's threads sleep (`benchmarks.run.wait_idle`), the two first calls of a block
not counted; a time is the median over rounds of a block's per-call time.

The files build every weight with ConstantOfShape fills of one value, so their outputs check
little. `--random-weights` replaces each fill by a random initializer of its shape and prints how far oxla's output is from onnxruntime's instead of timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

import oxla
from benchmarks.conv import _model_path
from benchmarks.run import wait_idle

NAMES = ("bvlc_alexnet", "zfnet512", "vgg19", "resnet50", "inception_v1", "inception_v2",
         "densenet121", "squeezenet", "shufflenet")


def path_of(name: str) -> Path:
    return Path(_model_path("light:" + name))


def _input(model: onnx.ModelProto) -> tuple[str, np.ndarray]:
    """The image input (the graph input that is no initializer) and a random image for it."""
    inits = {t.name for t in model.graph.initializer}
    info = next(v for v in model.graph.input if v.name not in inits)
    shape = [d.dim_value or 1 for d in info.type.tensor_type.shape.dim]
    return info.name, np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def random_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with each ConstantOfShape of an initializer's shape replaced by a random
    initializer: vectors (biases, batch-norm statistics, variances among them) in [0.5, 1.5],
    weights normal with variance 1 / fan-in."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    values = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    rng = np.random.default_rng(0)
    kept, added = [], []
    for node in out.graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in values:
            kept.append(node)
            continue
        shape = tuple(int(d) for d in values[node.input[0]])
        if len(shape) <= 1:
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = rng.standard_normal(shape) / np.sqrt(max(1, int(np.prod(shape[1:]))))
        added.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(added)
    out.ir_version = max(out.ir_version, 4)  # the new initializers are not listed as inputs
    return out


def agreement(name: str) -> str:
    model = random_weights(onnx.load(path_of(name)))
    data = model.SerializeToString()
    feed, x = _input(model)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {feed: x})[0]
    got = oxla.InferenceSession(data).run(None, {feed: x})[0]
    return (f"{name:14s} random weights: max |oxla - onnxruntime| {float(np.abs(got - want).max()):.1e}"
            f" (max |onnxruntime| {float(np.abs(want).max()):.1e}), same top class "
            f"{bool((got.argmax(-1) == want.argmax(-1)).all())}")


def timing(name: str, rounds: int, block: float) -> str:
    path = str(path_of(name))
    feed, x = _input(onnx.load(path))
    start = time.perf_counter()
    session = oxla.InferenceSession(path)
    got = session.run(None, {feed: x})[0]
    first = time.perf_counter() - start
    reference = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = reference.run(None, {feed: x})[0]
    calls: dict[str, Callable[[], Any]] = {"oxla": lambda: session.run(None, {feed: x}),
                                           "ort": lambda: reference.run(None, {feed: x})}
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            wait_idle()
            f()
            f()
            t, n = time.perf_counter(), 0
            while time.perf_counter() - t < block:
                f()
                n += 1
            times[k].append((time.perf_counter() - t) / n * 1e3)
    a, b = statistics.median(times["oxla"]), statistics.median(times["ort"])
    return (f"{name:14s} oxla {a:8.2f} ms  onnxruntime {b:8.2f} ms  {a / b:5.2f}x  "
            f"first call {first:.2f} s  max diff {float(np.abs(got - want).max()):.1e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(NAMES))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--block", type=float, default=0.3, help="seconds of calls per block")
    parser.add_argument("--random-weights", action="store_true")
    args = parser.parse_args(argv)
    for name in args.names:
        if name not in NAMES:
            parser.error(f"unknown model {name!r}; the light zoo has {', '.join(NAMES)}")
        print(agreement(name) if args.random_weights else timing(name, args.rounds, args.block),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
