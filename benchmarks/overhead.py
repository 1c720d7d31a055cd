"""Per-call overhead: oxla's InferenceSession.run next to onnxruntime's on small models.

    python -m benchmarks.overhead [--seconds 1.0] [--write docs/benchmarks.md]

Models: one Add, 100 chained Adds reading 100 small initializers, the shipped digits MLP at
batch 1, the shipped transformer encoder (batch 1, seq 16), and the shipped detector with
NonMaxSuppression (a graph break). Each runs in its own process, twice: default threads, then
pinned to one core (`taskset -c 0`, onnxruntime with one intra-op thread). oxla and onnxruntime
are timed in alternating blocks after warm-up; the figure is the median of per-call times. The
`jax.jit(fn)` column times the model's pure function jitted by hand with feeds already on the
device (JAX's own floor for the same computation), where the model has no graph break.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent


def one_add() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"])], "add", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def chain_100() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(100):
        inits.append(numpy_helper.from_array(rng.standard_normal((1, 16)).astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node("Add", [prev, f"c{i}"], [f"t{i}"]))
        prev = f"t{i}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16])
    graph = helper.make_graph(nodes, "chain", [x], [y], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shipped(name: str) -> Callable[[], onnx.ModelProto]:
    return lambda: onnx.load(str(ROOT / "models" / f"{name}.onnx"))


rng = np.random.default_rng(0)
MODELS: dict[str, tuple[Callable[[], onnx.ModelProto], dict[str, np.ndarray]]] = {
    "one Add": (one_add, {"x": rng.standard_normal((1, 16)).astype(np.float32)}),
    "100 chained Adds": (chain_100, {"x": rng.standard_normal((1, 16)).astype(np.float32)}),
    "digits MLP b1": (_shipped("digits_mlp"), {"image": rng.random((1, 64)).astype(np.float32)}),
    "transformer encoder b1 s16": (_shipped("transformer_encoder"),
                                   {"ids": rng.integers(0, 100, (1, 16)).astype(np.int64)}),
    "detector + NMS": (_shipped("detector_nms"),
                       {"image": rng.random((1, 3, 64, 64)).astype(np.float32)}),
}


def time_block(fn: Callable[[], Any], n: int) -> list[float]:
    """Seconds of each of `n` calls of `fn`."""
    out = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def measure(name: str, seconds: float, threads: int) -> dict[str, Any]:
    """One model in this process: median per-call seconds of oxla, onnxruntime and jit(fn)."""
    import jax
    import onnxruntime as ort

    import oxla

    build, feeds = MODELS[name]
    data = build().SerializeToString()
    sess = oxla.InferenceSession(data)
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    ref = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    calls: dict[str, Callable[[], Any]] = {"oxla": lambda: sess.run(None, feeds),
                                           "ort": lambda: ref.run(None, feeds)}
    model = oxla.compile(data)
    with oxla.x64():
        dev = {k: jax.device_put(v) for k, v in feeds.items()}
        try:
            jitted = jax.jit(model.fn)
            jax.block_until_ready(jitted(model.params, dev))
            calls["jit(fn)"] = lambda: jax.block_until_ready(jitted(model.params, dev))
        except oxla.NotStaticError:
            pass
    for fn in calls.values():  # warm-up, and a first estimate of the per-call time
        time_block(fn, 20)
    per_call = max(statistics.median(time_block(fn, 50)) for fn in calls.values())
    block = max(10, int(0.05 / per_call))
    times: dict[str, list[float]] = {k: [] for k in calls}
    deadline = time.perf_counter() + seconds * len(calls)
    while time.perf_counter() < deadline or min(len(t) for t in times.values()) < 5 * block:
        for key, fn in calls.items():
            if key == "jit(fn)":
                with oxla.x64():
                    times[key] += time_block(fn, block)
            else:
                times[key] += time_block(fn, block)
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {"model": name, "threads": threads, **medians}


def _child(name: str, seconds: float, threads: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.overhead", "--one", name, "--seconds", str(seconds),
           "--threads", str(threads)]
    if threads == 1 and shutil.which("taskset"):
        cmd = ["taskset", "-c", "0", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark {name!r} failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | threads | oxla us | onnxruntime us | oxla/ORT | jax.jit(fn) us |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        jit = f"{r['jit(fn)'] * 1e6:.1f}" if "jit(fn)" in r else "graph break"
        lines.append(f"| {r['model']} | {'default' if not r['threads'] else r['threads']} | "
                     f"{r['oxla'] * 1e6:.1f} | {r['ort'] * 1e6:.1f} | {r['oxla'] / r['ort']:.2f}x | {jit} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per side and model")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    parser.add_argument("--write", help="write the table into this markdown file's Overhead section")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.seconds, args.threads)))
        return 0
    rows = []
    for name in args.models.split(","):
        for threads in (0, 1):
            row = _child(name, args.seconds, threads)
            rows.append(row)
            print(f"{name} ({'default threads' if not threads else 'one thread'}): oxla "
                  f"{row['oxla'] * 1e6:.1f} us, onnxruntime {row['ort'] * 1e6:.1f} us, "
                  f"{row['oxla'] / row['ort']:.2f}x", flush=True)
    text = table(rows)
    print("\n" + text)
    if args.write:
        from benchmarks.run import write_results

        write_results(args.write, "Per-call overhead", "overhead", argv,
                      "Per-call latency of `InferenceSession.run` with numpy feeds and outputs, "
                      "medians of alternating blocks; each model in its own process.", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
