"""Fine-tuning a ResNet-18-class network with BatchNorm: oxla against PyTorch eager and
torch.compile, the same weights, data, order and recipe.

    python -m benchmarks.finetune [--batches 32,64] [--rounds 5] [--steps 4] [--curve-steps 120]
        [--torch-python PATH] [--plot docs/img/finetune_loss.png] [--write docs/benchmarks.md]

PyTorch (a side interpreter, --torch-python: it does not install into oxla's venv) exports the
network with its initial weights (benchmarks/finetune_torch.py: torchvision's BasicBlock layout
[2, 2, 2, 2] at a quarter of the widths, Conv+BatchNorm+ReLU, max-pool stem; BN kept in the
file). oxla makes it trainable (softmax cross-entropy, ONNX Momentum = SGD momentum 0.9, warm-up
cosine schedule, BatchNorm in training mode with its running statistics updated) and runs each
step as one XLA computation. Then:
- loss curves: both train --curve-steps steps at the curve batch over the digits upsampled to
  3x64x64, in the same order, from the same weights; drawn side by side (--plot, matplotlib in
  the torch interpreter);
- step time: oxla, eager and compiled PyTorch in alternating rounds of --steps steps, medians.
Every side uses its default threads.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from benchmarks.finetune_common import LR, MOMENTUM, REPO, WARMUP, WIDTHS, digits, images, order
from benchmarks.side import LineWorker

TORCH_SIDE = Path(__file__).with_name("finetune_torch.py")
TORCH_PYTHONS = (REPO / ".venv-export" / "bin" / "python", Path("/tmp/venv-torch/bin/python"))


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same network computing in float64 (weights, input and output)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in [*out.graph.input, *out.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    del out.graph.value_info[:]
    return out


def training_model(path: Path, total: int, dtype: str = "float32") -> onnx.ModelProto:
    from oxla.training import Momentum, Recipe, Schedule, make_trainable

    model = onnx.load(path)
    recipe = Recipe(Schedule("cosine", warmup=WARMUP, total=total))
    return make_trainable(model if dtype == "float32" else as_float64(model), "cross_entropy",
                          Momentum(lr=LR, alpha=MOMENTUM), recipe=recipe)


def session(path: Path, total: int, dtype: str = "float32") -> Any:
    from oxla.training import TrainingSession

    sess = TrainingSession(training_model(path, total, dtype))
    sess.initialize()
    return sess


def oxla_curve(path: Path, steps: int, batch: int, dtype: str = "float32") -> np.ndarray:
    """Per-step losses."""
    sess = session(path, steps, dtype)
    x, y = digits()
    return np.array([float(sess.step({"image": images(x[idx]).astype(dtype), "labels": y[idx]},
                                     outputs=["loss"])["loss"])
                     for idx in order(len(x), steps, batch)])


class TorchWorker(LineWorker):
    """finetune_torch.py serve, driven line by line."""

    def __init__(self, python: Path, init: Path, threads: int | None = None) -> None:
        extra = [str(threads)] if threads else []
        super().__init__([str(python), str(TORCH_SIDE), "serve", str(init), *extra])

    def steps(self, mode: str, batch: int, steps: int) -> list[float]:
        return list(self.ask({"mode": mode, "batch": batch, "steps": steps})["ms"])


class Timing:
    batch: int
    oxla_ms: float
    eager_ms: float
    compiled_ms: float
    oxla_first_s: float
    compile_first_s: float


def time_batch(path: Path, worker: TorchWorker, batch: int, rounds: int, steps: int) -> Timing:
    sess = session(path, 10_000)
    x, y = digits()
    idx = order(len(x), 1, batch)[0]
    feeds = {"image": images(x[idx]), "labels": y[idx]}
    start = time.perf_counter()
    sess.step(feeds, outputs=["loss"])
    oxla_first = time.perf_counter() - start
    worker.steps("eager", batch, 2)
    start = time.perf_counter()
    worker.steps("compile", batch, 2)  # inductor compiles forward and backward here
    compile_first = time.perf_counter() - start
    ours: list[float] = []
    eager: list[float] = []
    compiled: list[float] = []
    for _ in range(rounds):
        for _ in range(steps):
            start = time.perf_counter()
            float(sess.step(feeds, outputs=["loss"])["loss"])
            ours.append((time.perf_counter() - start) * 1e3)
        eager += worker.steps("eager", batch, steps)
        compiled += worker.steps("compile", batch, steps)
    return Timing(batch, statistics.median(ours), statistics.median(eager), statistics.median(compiled),
                  oxla_first, compile_first)


def table(rows: list[Timing]) -> str:
    lines = ["| batch | oxla ms/step | torch eager ms/step | torch.compile ms/step | oxla/eager | "
             "oxla/compile | oxla first step s | torch.compile first 2 steps s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.batch} | {r.oxla_ms:.1f} | {r.eager_ms:.1f} | {r.compiled_ms:.1f} | "
                     f"{r.oxla_ms / r.eager_ms:.2f}x | {r.oxla_ms / r.compiled_ms:.2f}x | "
                     f"{r.oxla_first_s:.1f} | {r.compile_first_s:.1f} |")
    return "\n".join(lines)


def _torch_python(given: Path | None) -> Path:
    for python in ([given] if given else TORCH_PYTHONS):
        if python.exists():
            return python
    raise SystemExit(f"no PyTorch interpreter at {given or ' or '.join(map(str, TORCH_PYTHONS))}; "
                     "this benchmark compares with PyTorch, pass --torch-python")


def curves(python: Path, init: Path, work: Path, steps: int, batch: int, steps64: int,
           plot: Path | None) -> str:
    """Both sides' loss curves in float32 (and float64 over the first `steps64` steps)."""
    found: dict[str, Any] = {"batch": batch}
    for dtype, count, key in (("float32", steps, ""), ("float64", steps64, "64")):
        if not count:
            continue
        found[f"oxla{key}"] = oxla_curve(init, count, batch, dtype)
        subprocess.run([str(python), str(TORCH_SIDE), "curve", str(init), str(count), str(batch),
                        str(work / "torch.npz"), dtype], check=True)
        found[f"torch{key}"] = np.load(work / "torch.npz")["losses"]
    np.savez(work / "curves.npz", **found)
    if plot:
        subprocess.run([str(python), str(TORCH_SIDE), "plot", str(work / "curves.npz"), str(plot)], check=True)
    ours, theirs = found["oxla"], found["torch"]
    gap = np.abs(ours - theirs)
    text = (f"Loss curves, {steps} steps at batch {batch}, float32: oxla {ours[0]:.4f} -> "
            f"{ours[-1]:.4f} (mean of the last 10 {ours[-10:].mean():.4f}), PyTorch eager "
            f"{theirs[0]:.4f} -> {theirs[-1]:.4f} ({theirs[-10:].mean():.4f}); |difference| "
            f"{_gaps(gap)}")
    if steps64:
        text += (f"; float64, {steps64} steps: |difference| "
                 f"{_gaps(np.abs(found['oxla64'] - found['torch64']))}; PyTorch float32 against "
                 f"PyTorch float64: {_gaps(np.abs(theirs[:steps64] - found['torch64']))}")
    return text + "."


def _gaps(gap: np.ndarray) -> str:
    marks = [i for i in (1, 2, 3, 5, 10, 20) if i <= len(gap)]
    return ", ".join(f"step {i} {gap[i - 1]:.1e}" for i in marks) + f", largest {gap.max():.1e}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="32,64")
    parser.add_argument("--rounds", type=int, default=5, help="alternating oxla/eager/compile rounds")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per side per round")
    parser.add_argument("--curve-steps", type=int, default=120, help="0: step times only")
    parser.add_argument("--curve-batch", type=int, default=32)
    parser.add_argument("--curve64-steps", type=int, default=20, help="also compare in float64 "
                        "over this many steps (0: no)")
    parser.add_argument("--torch-python", type=Path)
    parser.add_argument("--torch-threads", type=int, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--plot", type=Path, help="draw the two loss curves here (PNG)")
    parser.add_argument("--write", type=Path, help="append the results to this markdown file")
    args = parser.parse_args(argv)
    python = _torch_python(args.torch_python)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init = work / "resnet18_bn.onnx"
        subprocess.run([str(python), str(TORCH_SIDE), "export", str(init)], check=True)
        params = sum(int(np.prod(t.dims)) for t in onnx.load(init).graph.initializer)
        print(f"ResNet-18-class, widths {WIDTHS}, BatchNorm, 3x64x64: {params / 1e6:.2f}M parameters", flush=True)
        curve_line = ""
        if args.curve_steps:
            curve_line = curves(python, init, work, args.curve_steps, args.curve_batch,
                                args.curve64_steps, args.plot)
            print(curve_line, flush=True)
        worker = TorchWorker(python, init, args.torch_threads)
        rows = []
        try:
            for batch in map(int, args.batches.split(",")):
                rows.append(time_batch(init, worker, batch, args.rounds, args.steps))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
        finally:
            worker.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (f"{table(rows)}\n\nPyTorch {worker.info['torch']}, {worker.info['threads']} threads "
            f"(eager and torch.compile), via {python}. {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} CPUs, load average {load:.1f} when it finished; median over "
            f"{args.rounds * args.steps} steps per side. {curve_line}\n")
    print("\n" + text)
    if args.write:
        with args.write.open("a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
