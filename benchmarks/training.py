"""Training step: oxla (TrainingSession from the model's training_info) vs PyTorch eager.

    python -m benchmarks.training [--models mlp,resnet18] [--rounds 5] [--steps 4] [--write docs/benchmarks.md]

Both sides train the same architecture with the same recipe: softmax cross-entropy and SGD with
momentum 0.9 (ONNX Momentum, standard mode, beta 1, is torch.optim.SGD's update). oxla runs the
step the model file describes, as one XLA computation; torch runs forward, backward and the
optimizer step eagerly. PyTorch does not install into oxla's Python 3.12 venv here, so its side
runs in another interpreter (--torch-python, default .venv-export/bin/python) as a subprocess; the
two are timed in alternating rounds so that load from other processes hits both alike. When no
torch is found the benchmark says so and reports oxla's timings alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks import models
from benchmarks.side import LineWorker

REPO = Path(__file__).resolve().parent.parent
TORCH_PYTHON = REPO / ".venv-export" / "bin" / "python"
BATCHES = {"mlp": 64, "resnet18": 8}
IMAGE = (3, 112, 112)


def resnet18(classes: int = 1000) -> onnx.ModelProto:
    """ResNet-18's layout (BasicBlock [2, 2, 2, 2], 64-512 channels, 11.7M parameters) with conv
    biases and no BatchNormalization; a stride-2 3x3 conv stands in for the stem's max-pool
    (MaxPool is not differentiable in oxla yet)."""
    b = models._Builder()

    def conv(x: str, cin: int, cout: int, k: int, stride: int) -> str:
        return b.op("Conv", [x, b.weight((cout, cin, k, k)), b.weight((cout,), 0.01)],
                    kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)

    x = b.op("Relu", [conv("input", 3, 64, 7, 2)])
    x = b.op("Relu", [conv(x, 64, 64, 3, 2)])
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for s in (stride, 1):
            h = conv(b.op("Relu", [conv(x, cin, cout, 3, s)]), cout, cout, 3, 1)
            short = x if s == 1 and cin == cout else conv(x, cin, cout, 1, s)
            x, cin = b.op("Relu", [b.op("Add", [h, short])]), cout
    flat = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    b.op("Gemm", [flat, b.weight((classes, 512)), b.weight((classes,), 0.01)], out="logits", transB=1)
    return b.model("resnet18", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *IMAGE])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])])


BUILDERS = {"mlp": models.mlp, "resnet18": resnet18}


def feeds(key: str, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (batch, 784) if key == "mlp" else (batch, *IMAGE)
    return {"input": rng.standard_normal(shape).astype(np.float32),
            "labels": rng.integers(0, 10, batch).astype(np.int64)}


class TorchWorker(LineWorker):
    """The torch side in its own interpreter, driven line by line (see torch_training.py)."""

    def __init__(self, python: Path) -> None:
        super().__init__([str(python), str(Path(__file__).with_name("torch_training.py"))])

    def steps(self, model: str, batch: int, steps: int) -> list[float]:
        return list(self.ask({"model": model, "batch": batch, "steps": steps})["ms"])


def start_torch(python: Path) -> tuple[TorchWorker | None, str]:
    """A torch worker, or None and the reason there is none."""
    if not python.exists():
        return None, f"no torch interpreter at {python}"
    try:
        return TorchWorker(python), ""
    except (OSError, RuntimeError, json.JSONDecodeError) as e:
        return None, f"torch not importable with {python} ({e})"


@dataclass
class Result:
    model: str
    batch: int
    params: int
    oxla_ms: float
    oxla_first_s: float
    torch_ms: float | None

    @property
    def ratio(self) -> float | None:
        return None if self.torch_ms is None else self.oxla_ms / self.torch_ms


def _oxla_session(key: str, batch: int) -> tuple[Any, dict[str, np.ndarray], float, int]:
    from oxla.training import Momentum, TrainingSession, make_trainable

    model = BUILDERS[key]()
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    sess = TrainingSession(make_trainable(model, "cross_entropy", Momentum(lr=0.01, alpha=0.9)))
    sess.initialize()
    data = feeds(key, batch)
    start = time.perf_counter()
    sess.step(data, outputs=["loss"])
    return sess, data, time.perf_counter() - start, params


def bench(key: str, rounds: int, steps: int, worker: TorchWorker | None) -> Result:
    batch = BATCHES[key]
    sess, data, first, params = _oxla_session(key, batch)
    if worker is not None:
        worker.steps(key, batch, 2)  # build and warm up
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds):
        for _ in range(steps):
            start = time.perf_counter()
            float(sess.step(data, outputs=["loss"])["loss"])
            ours.append((time.perf_counter() - start) * 1e3)
        if worker is not None:
            theirs += worker.steps(key, batch, steps)
    torch_ms = statistics.median(theirs) if theirs else None
    return Result(key, batch, params, statistics.median(ours), first, torch_ms)


def table(results: list[Result]) -> str:
    lines = ["| model | batch | parameters | oxla ms/step | torch eager ms/step | oxla/torch | oxla first step (compile) s |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        torch_ms = "n/a" if r.torch_ms is None else f"{r.torch_ms:.1f}"
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.2f}x"
        lines.append(f"| {r.model} | {r.batch} | {r.params / 1e6:.1f}M | {r.oxla_ms:.1f} | {torch_ms} | "
                     f"{ratio} | {r.oxla_first_s:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp,resnet18")
    parser.add_argument("--rounds", type=int, default=5, help="alternating oxla/torch rounds")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side per round")
    parser.add_argument("--torch-python", type=Path, default=TORCH_PYTHON)
    parser.add_argument("--write", type=Path, help="append the table to this markdown file")
    args = parser.parse_args(argv)
    worker, why = start_torch(args.torch_python)
    torch_line = (f"PyTorch {worker.info['torch']} eager, {worker.info['threads']} threads, via "
                  f"{args.torch_python}" if worker else f"PyTorch NOT AVAILABLE: {why}; oxla only")
    print(torch_line, flush=True)
    results = []
    try:
        for key in args.models.split(","):
            results.append(bench(key, args.rounds, args.steps, worker))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    finally:
        if worker is not None:
            worker.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (f"{table(results)}\n\n{torch_line}. {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, load average {load:.1f} when it finished; median over "
            f"{args.rounds * args.steps} steps per side.\n")
    print("\n" + text)
    if args.write:
        with args.write.open("a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
