"""Where one model's time goes in oxla: XLA's own per-kernel times, traced to the rule that emitted them.

    python -m benchmarks.xla_profile MODEL [--threads default|1] [--calls 20] [--top 15] [--ort]

MODEL is a suite name (exported or shipped, with its `.npz` feeds) or a path to
an .onnx file (feeds then random, from the declared input types). The model runs through
`oxla.InferenceSession` under `jax.profiler` with XLA's optimized HLO dumped, on JAX's own CPU
client (the profiler does not trace the kernels of oxla's synchronous client); every kernel event
(a thunk: a fusion, convolution, dot, copy...) is matched to its HLO instruction, whose metadata
names the source line in oxla that emitted it (the rule module and function). Printed: the wall
time per call, kernel time per call by kind and by emitting rule line, the top kernels, and the
time in the host step functions (Python: e.g. NonMaxSuppression) when the model has a graph break.
With `1`, the process pins itself to one core and XLA's Eigen pool to one thread first, as the
suite's one-thread column does. Kernel times on several threads can overlap: their sum can exceed
the wall time. With `--ort`, onnxruntime runs the model in the same process, its calls alternating
with oxla's while traced (at one thread with `1`), with its own node profile: printed next to
oxla's, its wall time per call and its nodes' times (the median of each node over the calls) by
op type and the top nodes, to read a model's gap layer by layer (onnxruntime's profiling adds
to its wall time, a few microseconds a node: compare the kernel sums).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Instr:
    opcode: str       # for a fusion: the fused computation's heaviest op (convolution, dot, reduce...)
    where: str        # file:function:line of the oxla frame that emitted it
    shape: str


_HEAVY = ("convolution", "dot", "reduce-window", "gather", "scatter", "sort", "reduce", "while",
          "custom-call", "concatenate")


def _fusion_kind(ops: collections.Counter[str]) -> str:
    """A fusion named by its heaviest op; shifted multiply-adds (a conv as taps) named as such."""
    if ops["slice"] + ops["pad"] >= 4 and ops["multiply"] >= 4:
        kind = "taps (shifted multiply-adds)"
    else:
        kind = next((h for h in _HEAVY if ops[h]), "elementwise")
    return f"fusion({kind}{' + transpose' if ops['transpose'] else ''})"


def _frames(text: str) -> dict[int, str]:
    """stack_frame_id -> 'file:function:line' from an HLO dump's frame tables."""
    files = dict(re.findall(r'^(\d+) "([^"]*)"$', text.split("FunctionNames")[0].split("FileNames")[-1], re.M))
    funcs = dict(re.findall(r'^(\d+) "([^"]*)"$', text.split("FileLocations")[0].split("FunctionNames")[-1], re.M))
    locs = {int(i): (f, fn, ln) for i, f, fn, ln in re.findall(
        r"^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", text, re.M)}
    out = {}
    for i, loc in re.findall(r"^(\d+) \{file_location_id=(\d+) parent_frame_id", text, re.M):
        f, fn, ln = locs[int(loc)]
        out[int(i)] = f"{os.path.basename(files.get(f, '?'))}:{funcs.get(fn, '?')}:{ln}"
    return out


def parse_hlo(text: str) -> dict[str, Instr]:
    """Instruction name -> what it is and where it came from, for every computation of a module."""
    frames = _frames(text)
    comps: dict[str, list[tuple[str, str, str, str]]] = collections.defaultdict(list)
    current = ""
    line_re = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+?)(?:\{[^}]*\})? (\S+?)\((.*)$")
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%(\S+) ", line)
        if head and line.rstrip().endswith("{"):
            current = head.group(1)
            continue
        m = line_re.match(line)
        if m:
            comps[current].append((m.group(1), m.group(3), m.group(2), m.group(4)))
    out = {}
    for instrs in comps.values():
        for name, opcode, shape, rest in instrs:
            frame = re.search(r"stack_frame_id=(\d+)", rest)
            called = re.search(r"calls=%([\w.\-]+)", rest)
            kind = opcode
            where = frames.get(int(frame.group(1)), "") if frame else ""
            if opcode == "fusion" and called:
                inner = comps.get(called.group(1), [])
                kind = _fusion_kind(collections.Counter(op for _, op, _, _ in inner))
                heavy = kind[len("fusion("):].split(" ")[0].rstrip(")")
                heavy = "multiply" if heavy == "taps" else heavy
                ids = collections.Counter(frames.get(int(x), "") for _, op, _, r in inner
                                          if op == heavy or (heavy == "elementwise" and op not in
                                                             ("parameter", "bitcast", "constant"))
                                          for x in re.findall(r"stack_frame_id=(\d+)", r))
                if ids:  # the line that emitted the fusion's heavy op, not just its root
                    where = ids.most_common(1)[0][0]
            out[name] = Instr(kind, where or "(no source)", shape)
    return out


def _feeds(name: str) -> tuple[str, dict[str, np.ndarray]]:
    from benchmarks.suite import model_files

    files = model_files(name)
    if files is not None:
        with np.load(files[1]) as data:
            return str(files[0]), {k: data[k] for k in data.files}
    import onnx

    model = onnx.load(name, load_external_data=False)
    rng = np.random.default_rng(0)
    feeds = {}
    init = {i.name for i in model.graph.initializer}
    for inp in model.graph.input:
        if inp.name in init:
            continue
        t = inp.type.tensor_type
        shape = [d.dim_value or 1 for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        feeds[inp.name] = (rng.integers(0, 10, shape) if dtype.kind in "iu" else rng.standard_normal(shape)).astype(dtype)
    return name, feeds


def ort_nodes(events: list[dict]) -> list[tuple[str, str, str, float]]:
    """onnxruntime's profile events (its JSON) as (node, op type, output shapes, median
    microseconds of the node's kernel over the runs), slowest first."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    info: dict[str, tuple[str, str]] = {}
    for e in events:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            node = e["name"][:-len("_kernel_time")]
            times[node].append(float(e["dur"]))
            args = e.get("args", {})
            shapes = [next(iter(o.values())) for o in args.get("output_type_shape", []) if o]
            info[node] = (str(args.get("op_name", "?")), " ".join(str(tuple(v)) for v in shapes))
    rows = [(n, *info[n], statistics.median(v)) for n, v in times.items()]
    return sorted(rows, key=lambda r: -r[3])


def _ort_session(path: str, one_thread: bool, prefix: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = prefix
    if one_thread:
        options.intra_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _print_ort(sess: Any, walls: list[float], top: int) -> None:
    with open(sess.end_profiling()) as f:
        rows = ort_nodes(json.load(f))
    total = sum(r[3] for r in rows)
    print(f"\nonnxruntime, its calls alternating with oxla's: wall {statistics.median(walls) * 1e3:.3f} "
          f"ms/call (median); nodes {total / 1e3:.3f} ms/call (each node's median, summed); "
          f"{len(rows)} nodes")
    by_op: dict[str, float] = collections.Counter()
    for _, op, _, us in rows:
        by_op[op] += us
    print("\nonnxruntime by op type:")
    for op, us in sorted(by_op.items(), key=lambda x: -x[1])[:top]:
        print(f"  {us / 1e3:8.3f} ms  {100 * us / max(total, 1e-9):5.1f}%  {op}")
    print("\nonnxruntime's top nodes:")
    for node, op, shapes, us in rows[:top]:
        print(f"  {us / 1e3:8.3f} ms  {node}  {op}  {shapes}")


def profile(name: str, calls: int, top: int, dump: str, ort: bool = False, one_thread: bool = False) -> None:
    import jax

    import oxla
    import oxla.executor

    # JAX's profiler traces the kernels of JAX's own CPU client, not those of oxla's synchronous
    # one (oxla.cpu_client): most of a model's kernels went missing from the trace
    default_cpu = jax.devices("cpu")[0]
    oxla.executor._runtime_device = lambda: default_cpu  # type: ignore[attr-defined]
    path, feeds = _feeds(name)
    sess = oxla.InferenceSession(path)
    for _ in range(3):
        sess.run(None, feeds)
    walls = []
    for _ in range(max(5, calls)):
        start = time.perf_counter()
        sess.run(None, feeds)
        walls.append(time.perf_counter() - start)
    trace = tempfile.mkdtemp(prefix="oxla-profile-")
    ref = _ort_session(path, one_thread, os.path.join(trace, "ort")) if ort else None
    ref_walls = []
    for _ in range(3 if ref is not None else 0):
        ref.run(None, feeds)
    traced = []
    jax.profiler.start_trace(trace)
    for _ in range(calls):
        start = time.perf_counter()
        sess.run(None, feeds)
        traced.append(time.perf_counter() - start)
        if ref is not None:
            start = time.perf_counter()
            ref.run(None, feeds)
            ref_walls.append(time.perf_counter() - start)
    jax.profiler.stop_trace()
    instrs: dict[str, Instr] = {}
    for f in glob.glob(os.path.join(dump, "*after_optimizations.txt")):
        instrs.update(parse_hlo(Path(f).read_text()))
    xplane = sorted(glob.glob(f"{trace}/**/*.xplane.pb", recursive=True))[-1]
    data = jax.profiler.ProfileData.from_file(xplane)
    kernel: dict[str, float] = collections.Counter()
    host: dict[str, float] = collections.Counter()
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                if line.name == "python":
                    if "image.py" in ev.name or "host_step" in ev.name:
                        host[ev.name] += ev.duration_ns
                    continue
                op = dict(ev.stats).get("hlo_op") if not ev.name.startswith(("end:", "Thread", "Thunk")) else None
                if op:
                    kernel[str(op)] += ev.duration_ns
    total = sum(kernel.values())
    print(f"{name}: wall {statistics.median(walls) * 1e3:.3f} ms/call (median)"
          + (f", {statistics.median(traced) * 1e3:.3f} while traced beside onnxruntime" if ort else "")
          + f"; XLA kernels {total / calls / 1e6:.3f} ms/call summed over threads; {len(kernel)} kernels")
    for title, key in (("by kind", lambda k: instrs.get(k, Instr("?", "?", "")).opcode),
                       ("by emitting line", lambda k: instrs.get(k, Instr("?", "?", "")).where)):
        groups: dict[str, float] = collections.Counter()
        for k, ns in kernel.items():
            groups[key(k)] += ns
        print(f"\n{title}:")
        for g, ns in sorted(groups.items(), key=lambda x: -x[1])[:top]:
            print(f"  {ns / calls / 1e6:8.3f} ms  {100 * ns / total:5.1f}%  {g}")
    print("\ntop kernels:")
    for k, ns in sorted(kernel.items(), key=lambda x: -x[1])[:top]:
        i = instrs.get(k, Instr("?", "?", "?"))
        print(f"  {ns / calls / 1e6:8.3f} ms  {k}  {i.opcode}  {i.shape}  {i.where}")
    if host:
        print("\nhost-step Python (inclusive):")
        for k, ns in sorted(host.items(), key=lambda x: -x[1])[:top]:
            print(f"  {ns / calls / 1e6:8.3f} ms  {k}")
    if ref is not None:
        _print_ort(ref, ref_walls, top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--threads", default="default", choices=("default", "1"))
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--ort", action="store_true",
                        help="onnxruntime beside it, calls alternating, with its node profile")
    args = parser.parse_args(argv)
    if "jax" in sys.modules:
        raise SystemExit("benchmarks.xla_profile must set XLA_FLAGS before JAX is imported")
    dump = tempfile.mkdtemp(prefix="oxla-hlo-")
    flags = [os.environ.get("XLA_FLAGS", ""), f"--xla_dump_to={dump}", "--xla_dump_hlo_as_text"]
    if args.threads == "1":
        flags.append("--xla_cpu_multi_thread_eigen=false")
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    os.environ["XLA_FLAGS"] = " ".join(f for f in flags if f)
    profile(args.model, args.calls, args.top, dump, args.ort, args.threads == "1")
    return 0


if __name__ == "__main__":
    sys.exit(main(None if len(sys.argv) > 1 else ["--help"]))

