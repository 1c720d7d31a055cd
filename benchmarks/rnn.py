"""Recurrent layers (LSTM, GRU) through oxla.InferenceSession against onnxruntime, one node each.

    python -m benchmarks.rnn [--rounds 9] [--repeat 3] [--baseline DIR] [--write docs/benchmarks.md]

Realistic sizes (input 128, hidden 128-256, 50-100 steps, batch 1 and 8), forward and
bidirectional. Both runtimes at their default threads, timed in interleaved blocks of ~20 ms of
calls; a time is the median over rounds of a block's per-call mean. Each repeat is a fresh
process; --baseline DIR (a checkout of an earlier commit, e.g. `git worktree add` or `git
archive | tar -x`) runs the same layers with that tree's oxla in processes alternating with
this tree's, so that both meet the same load. Reported: the median over repeats of oxla /
onnxruntime measured in the same process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from benchmarks.run import write_results


@dataclass(frozen=True)
class Layer:
    op: str
    steps: int
    batch: int
    hidden: int
    direction: str = "forward"
    inputs: int = 128
    linear_before_reset: int = 0

    @property
    def name(self) -> str:
        extra = ", linear_before_reset" if self.linear_before_reset else ""
        return (f"{self.op} {self.direction} T={self.steps} batch={self.batch} "
                f"in={self.inputs} hidden={self.hidden}{extra}")


LAYERS = (
    Layer("LSTM", 100, 1, 256), Layer("LSTM", 100, 8, 256), Layer("LSTM", 50, 8, 128, "bidirectional"),
    Layer("LSTM", 50, 1, 128, "bidirectional"), Layer("GRU", 100, 8, 256),
    Layer("GRU", 100, 8, 256, linear_before_reset=1), Layer("GRU", 50, 1, 128, "bidirectional"),
)


def model(layer: Layer) -> bytes:
    """One LSTM/GRU node with W, R and B as initializers; outputs Y and Y_h."""
    dirs = 2 if layer.direction == "bidirectional" else 1
    gates = {"LSTM": 4, "GRU": 3}[layer.op] * layer.hidden
    rng = np.random.default_rng(0)

    def init(name: str, *shape: int) -> Any:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    attrs: dict[str, Any] = {"hidden_size": layer.hidden, "direction": layer.direction}
    if layer.op == "GRU":
        attrs["linear_before_reset"] = layer.linear_before_reset
    node = helper.make_node(layer.op, ["x", "W", "R", "B"], ["y", "y_h"], **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (layer.steps, layer.batch, layer.inputs))
    graph = helper.make_graph([node], "rnn", [x], [helper.make_empty_tensor_value_info("y"),
                                                   helper.make_empty_tensor_value_info("y_h")],
                              [init("W", dirs, gates, layer.inputs), init("R", dirs, gates, layer.hidden),
                               init("B", dirs, 2 * gates)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _block(fn: Callable[[], Any], calls: int) -> float:
    """Per-call ms over `calls` calls, after two that are not counted: right after the other
    runtime, its pool threads still spin on the cores for a while (as in benchmarks.suite)."""
    fn()
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def _interleaved(calls: dict[str, Callable[[], Any]], rounds: int, block_ms: float) -> dict[str, float]:
    """Median over rounds of each call's per-call time in a block of ~block_ms, blocks interleaved."""
    per_block = {k: max(1, int(block_ms / max(_block(f, 2), 1e-3))) for k, f in calls.items()}
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, f in calls.items():
            times[k].append(_block(f, per_block[k]))
    return {k: statistics.median(t) for k, t in times.items()}


def measure(layer: Layer, rounds: int) -> tuple[float, float, float]:
    """(onnxruntime ms, oxla ms, max |difference|) for one layer."""
    import onnxruntime as ort

    import oxla

    data = model(layer)
    feeds = {"x": np.random.default_rng(1).standard_normal(
        (layer.steps, layer.batch, layer.inputs)).astype(np.float32)}
    ort_sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    ox_sess = oxla.InferenceSession(data)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(ort_sess.run(None, feeds), ox_sess.run(None, feeds)))
    med = _interleaved({"ort": lambda: ort_sess.run(None, feeds), "oxla": lambda: ox_sess.run(None, feeds)},
                       rounds, 20.0)
    return med["ort"], med["oxla"], diff


ROOT = Path(__file__).resolve().parent.parent


class _Context:
    """What the recurrent rules ask of their context: two checks and the session's options."""

    def __init__(self) -> None:
        from oxla.cpu_client import cores
        from oxla.lowering.context import Options

        threads = cores()
        self.options = Options(native_threads=threads if threads > 1 else 0,
                               native_recurrent=threads if threads > 1 else 0)

    def expect_rank(self, name: str, value: Any, rank: int) -> None:
        if value.ndim != rank:
            raise ValueError(f"{name} must have rank {rank}")

    def fail(self, message: str) -> Exception:
        return ValueError(message)


def _rules_from(path: Path) -> Any:
    """A copy of an rnn.py (this tree's or an older one) whose rules stay out of the registry."""
    import types

    source = path.read_text().replace("from oxla.lowering.registry import rule",
                                      "rule = lambda *a, **k: (lambda f: f)  # noqa: E731")
    module = types.ModuleType(f"rnn_{abs(hash(str(path)))}")
    exec(compile(source, str(path), "exec"), module.__dict__)  # our own source file
    return module


def compare_rules(old: Path, rounds: int) -> str:
    """The rule functions of `old` and of this tree jitted side by side in one process."""
    import jax

    rules = {"before": _rules_from(old), "after": _rules_from(ROOT / "oxla/lowering/ops/rnn.py")}
    lines = ["| layer | before ms | after ms | after / before |", "|---|---|---|---|"]
    for layer in LAYERS:
        dirs = 2 if layer.direction == "bidirectional" else 1
        gates = {"LSTM": 4, "GRU": 3}[layer.op] * layer.hidden
        rng = np.random.default_rng(0)
        args = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in (
            (layer.steps, layer.batch, layer.inputs), (dirs, gates, layer.inputs),
            (dirs, gates, layer.hidden), (dirs, 2 * gates))]
        attrs: dict[str, Any] = {"hidden_size": layer.hidden, "direction": layer.direction}
        if layer.op == "GRU":
            attrs["linear_before_reset"] = layer.linear_before_reset
        fns = {k: jax.jit(functools.partial(getattr(m, layer.op.lower()), _Context(), **attrs))
               for k, m in rules.items()}
        med = _interleaved({k: lambda f=f, a=args: jax.block_until_ready(f(*a)) for k, f in fns.items()},
                           rounds, 20.0)
        lines.append(f"| {layer.name} | {med['before']:.3f} | {med['after']:.3f} | "
                     f"{med['after'] / med['before']:.2f}x |")
    return "\n".join(lines)


def _child(tree: Path, rounds: int) -> list[tuple[float, float, float]]:
    """One process with `tree`'s oxla: (ort ms, oxla ms, diff) per layer."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one", "--rounds", str(rounds)],
                          capture_output=True, text=True, env=env, cwd=tree, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tree} failed:\n{proc.stderr[-3000:]}")
    return [tuple(json.loads(line)) for line in proc.stdout.splitlines() if line.startswith("[")]


def table(runs: dict[str, list[list[tuple[float, float, float]]]]) -> str:
    trees = list(runs)
    lines = ["| layer | onnxruntime ms | " + " | ".join(f"oxla {t} ms | {t} / ort" for t in trees)
             + " | max abs diff |", "|---|---|" + "---|---|" * len(trees) + "---|"]
    for i, layer in enumerate(LAYERS):
        ort_ms = statistics.median(r[i][0] for rs in runs.values() for r in rs)
        cells = []
        for t in trees:
            cells.append(f"{statistics.median(r[i][1] for r in runs[t]):.3f} | "
                         f"{statistics.median(r[i][1] / r[i][0] for r in runs[t]):.2f}x")
        diff = max(r[i][2] for rs in runs.values() for r in rs)
        lines.append(f"| {layer.name} | {ort_ms:.3f} | " + " | ".join(cells) + f" | {diff:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per tree")
    parser.add_argument("--baseline", help="a checkout of an earlier commit to compare with")
    parser.add_argument("--write", help="write the table as a section of this markdown file")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        for layer in LAYERS:
            print(json.dumps(measure(layer, args.rounds)), flush=True)
        return 0
    load = os.getloadavg()[0]
    trees = {"after": ROOT, **({"before": Path(args.baseline).resolve()} if args.baseline else {})}
    runs: dict[str, list] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            runs[name].append(_child(tree, args.rounds))
    text = table(runs)
    if args.baseline:
        old = Path(args.baseline).resolve() / "oxla/lowering/ops/rnn.py"
        text += ("\n\nThe same layers' rule functions, the baseline's and this tree's, jitted side by side "
                 "in one process (no session, no onnxruntime):\n\n" + compare_rules(old, args.rounds))
    print(text)
    if args.write:
        write_results(args.write, "Recurrent layers", "rnn", argv,
                      f"Load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at "
                      "the end.", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
