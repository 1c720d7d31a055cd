"""oxla vs onnxruntime on the same machine, in one run: latency ratios, compile and first-call time.

    python -m benchmarks.run [--models resnet50,bert,mlp] [--runs 20] [--write docs/benchmarks.md]

Each configuration runs in its own process and is timed in alternating blocks of oxla and onnxruntime calls (after warm-up) so
that load from other processes hits both alike; the reported latency is the median of --runs calls (or ~1 s worth, if more).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from benchmarks import models

CACHE = Path(__file__).resolve().parent / ".cache"
# Calls run but not counted at the start of each interleaved block (benchmarks.suite, .quantized):
# right after the other runtime has run, each takes two calls to settle (QDQ ResNet-50 in oxla:
# 18.1 ms alone; 23.9, 22.8, 18.6, 18.2 ms for the calls after onnxruntime's; onnxruntime 8.6 ms
# alone, 10.4, 9.4, 8.9, 8.7 after oxla's)
SETTLE = 2
# That is not all: onnxruntime's pool threads spin on after its last call, one core busy for 40-55
# ms (this process's other threads used 38-57 ms of CPU in the 100 ms after a block of the suite's
# detector or VAD at default threads; none after oxla's), so the first 40-55 ms of the next
# runtime's block ran on one core less. `wait_idle` after every block, on every side, lets each
# block start with the process's other threads asleep, as a process running one runtime has them.
IDLE_STEP = 0.01
IDLE_LIMIT = 0.5


def host_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the whole machine so far, from /proc/stat (Linux), or None.
    Steal is the time the hypervisor ran something else on this VM's virtual CPUs: over an
    interval, steal / total says how much of the machine was taken away while it was measured."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user and nice]
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float:
    """The share of the machine's CPU time stolen between two `host_ticks`; NaN if unknown."""
    if before is None or after is None or after[1] <= before[1]:
        return math.nan
    return (after[0] - before[0]) / (after[1] - before[1])


def _others_cpu_ns() -> int | None:
    """CPU time used so far by this process's threads other than the caller (Linux), or None."""
    import threading

    me, total = threading.get_native_id(), 0
    try:
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != me:
                try:
                    with open(f"/proc/self/task/{tid}/schedstat") as f:
                        total += int(f.read().split()[0])
                except (FileNotFoundError, ProcessLookupError):  # the thread has just ended
                    continue
    except OSError:
        return None
    return total


def wait_idle(limit: float = IDLE_LIMIT) -> float:
    """Sleep until this process's other threads used no CPU for IDLE_STEP s (at most `limit` s;
    a fixed 0.1 s where per-thread CPU times cannot be read). Returns the seconds waited."""
    start = time.perf_counter()
    before = _others_cpu_ns()
    if before is None:
        time.sleep(0.1)
        return time.perf_counter() - start
    while time.perf_counter() - start < limit:
        time.sleep(IDLE_STEP)
        now = _others_cpu_ns()
        if now is None or now == before:
            break
        before = now
    return time.perf_counter() - start


@dataclass(frozen=True)
class Config:
    name: str
    build: Callable[[], onnx.ModelProto]
    feeds: Callable[[int], dict[str, np.ndarray]]
    batches: tuple[int, ...]


def _image(batch: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)}


def _tokens(batch: int, seq: int = 128) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 30522, (batch, seq)).astype(np.int64),
            "attention_mask": np.ones((batch, seq), np.int64)}


def _vectors(batch: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(0).standard_normal((batch, 784)).astype(np.float32)}


CONFIGS = {
    "resnet50": Config("ResNet-50", models.resnet50, _image, (1, 8)),
    "bert": Config("BERT-base (seq 128)", models.bert_base, _tokens, (1, 8)),
    "mlp": Config("MLP 784-1024x3-10", models.mlp, _vectors, (1, 64)),
}


def model_path(key: str) -> Path:
    """Build (once) and cache the benchmark model file."""
    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"{key}.onnx"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        onnx.save(CONFIGS[key].build(), str(tmp))
        os.replace(tmp, path)
    return path


@dataclass
class Result:
    model: str
    batch: int
    variant: str
    oxla_ms: float
    ort_ms: float
    oxla_load_s: float
    oxla_first_s: float
    ort_load_s: float
    ort_first_s: float
    max_diff: float

    @property
    def ratio(self) -> float:
        return self.oxla_ms / self.ort_ms


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench(key: str, batch: int, runs: int, bake: bool, ort_sess: Any = None) -> tuple[Result, Any]:
    import onnxruntime as ort

    import oxla

    path = str(model_path(key))
    feeds = CONFIGS[key].feeds(batch)
    sess, oxla_load = _timed(lambda: oxla.InferenceSession(path, bake_weights=bake))
    got, oxla_first = _timed(lambda: sess.run(None, feeds))
    ort_load = 0.0
    if ort_sess is None:
        ort_sess, ort_load = _timed(lambda: ort.InferenceSession(path, providers=["CPUExecutionProvider"]))
    want, ort_first = _timed(lambda: ort_sess.run(None, feeds))
    warm = [_timed(lambda: sess.run(None, feeds))[1] + _timed(lambda: ort_sess.run(None, feeds))[1]
            for _ in range(3)]
    runs = max(runs, min(2000, int(2.0 / min(warm))))  # fast models: >= ~1 s of calls per side
    ox_times: list[float] = []
    ort_times: list[float] = []
    block = max(1, runs // 8)  # blocks, not single alternation: onnxruntime's threads spin on
    while len(ox_times) < runs:  # after a call and would steal the cores from the next oxla call
        wait_idle()  # each block starts with the other runtime's threads asleep
        ox_times += [_timed(lambda: sess.run(None, feeds))[1] for _ in range(block)]
        wait_idle()
        ort_times += [_timed(lambda: ort_sess.run(None, feeds))[1] for _ in range(block)]
    # largest difference relative to the output's scale (random-weight logits can be large)
    diff = max(float(np.max(np.abs(np.asarray(g) - np.asarray(w))) / max(np.max(np.abs(w)), 1e-30))
               for g, w in zip(got, want))
    result = Result(CONFIGS[key].name, batch, "constants" if bake else "parameters",
                    statistics.median(ox_times) * 1e3, statistics.median(ort_times) * 1e3,
                    oxla_load, oxla_first, ort_load, ort_first, diff)
    return result, ort_sess


def table(results: list[Result]) -> str:
    lines = ["| model | batch | weights | oxla ms | onnxruntime ms | ratio | oxla load s | oxla first call s | ort load s | max diff / max abs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.model} | {r.batch} | {r.variant} | {r.oxla_ms:.2f} | {r.ort_ms:.2f} | "
                     f"{r.ratio:.2f}x | {r.oxla_load_s:.2f} | {r.oxla_first_s:.2f} | {r.ort_load_s:.2f} | {r.max_diff:.1e} |")
    return "\n".join(lines)


def _in_child(key: str, batch: int, runs: int, bake: bool) -> Result:
    """Each configuration in a fresh process: earlier models' memory and threads stay out of it."""
    cmd = [sys.executable, "-m", "benchmarks.run", "--runs", str(runs), "--one", key, str(batch),
           "1" if bake else "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parent.parent)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark {key} b{batch} failed:\n{proc.stderr[-2000:]}")
    return Result(**json.loads(proc.stdout.strip().splitlines()[-1]))


def cpu_name() -> str:
    """The CPU's model name and widest vector instruction set oxla's kernels use ("AMD EPYC,
    AVX2"): results differ by both, so tables name them."""
    from oxla.native import isa

    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            name = next((line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {({'avx512': 'AVX-512', 'avx2': 'AVX2'}).get(isa() or '', 'no AVX2')}"


def write_results(path: str | Path, title: str, module: str, argv: list[str] | None, note: str,
                  text: str) -> None:
    """Write a results table as the `## title` section: the command, the machine, then `note`."""
    import jax
    import onnxruntime

    command = f"python -m benchmarks.{module} " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (f"Command: `{command}`\n\nMachine: {cpu_name()}, "
              f"{os.cpu_count()} cores; jax {jax.__version__}, onnxruntime {onnxruntime.__version__}, "
              f"onnx {onnx.__version__}. {note}\n\n")
    write_section(Path(path), title, header + text + "\n")


def write_section(path: Path, title: str, body: str) -> None:
    """Replace (or add) the `## title` section of a markdown file, keeping the other sections."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    head = f"## {title}\n"
    start = text.find(head)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + head + "\n" + body
    else:
        end = text.find("\n## ", start + len(head))
        text = text[:start] + head + "\n" + body + ("" if end < 0 else "\n" + text[end + 1:])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="resnet50,bert,mlp")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--bake", action="store_true", help="also measure weights baked as constants")
    parser.add_argument("--write", help="write the results as markdown to this file")
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "BATCH", "BAKE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:  # a child process: one configuration, the result as JSON on the last line
        r, _ = bench(args.one[0], int(args.one[1]), args.runs, args.one[2] == "1")
        print(json.dumps(dataclasses.asdict(r)))
        return 0
    results: list[Result] = []
    for key in args.models.split(","):
        model_path(key)
        for batch in CONFIGS[key].batches:
            for bake in (False, True) if args.bake else (False,):
                r = _in_child(key, batch, args.runs, bake)
                results.append(r)
                print(f"{r.model} b{r.batch} {r.variant}: oxla {r.oxla_ms:.2f} ms, onnxruntime "
                      f"{r.ort_ms:.2f} ms, ratio {r.ratio:.2f}x, first call {r.oxla_first_s:.2f} s", flush=True)
    text = table(results)
    print("\n" + text)
    if args.write:
        write_results(args.write, "Inference", "run", argv,
                      f"Median of {args.runs} calls each (more for fast models: about 1 s of calls "
                      "per side), in alternating blocks, after warm-up.", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
