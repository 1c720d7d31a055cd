"""One zoo model, staged (load, check, classify, compile, run, compare), in its own process."""

from __future__ import annotations

import re
import resource
import statistics
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import onnx
from onnx import numpy_helper

from oxla.zoo.cases import BARE, LIGHT, ZooCase
from oxla.zoo.compare import compare_outputs
from oxla.zoo.results import ERROR, FAIL, PASS, ModelResult

# The backend-test tolerances (onnx's runner), and looser ones against onnxruntime: two float32
# implementations on random inputs differ by ~1e-6 near zero, which atol 1e-7 would call a failure.
BACKEND_RTOL, BACKEND_ATOL = 1e-3, 1e-7
ORT_RTOL, ORT_ATOL = 1e-3, 1e-4
MESSAGE_CHARS = 2000
_NODE_OP = re.compile(r"(\w+) node(?: '[^']*')? \(([\w.]+) v\d+\)")


@dataclass(frozen=True)
class WorkerOptions:
    """What a worker needs: tolerances (None: the layout's default), timed reruns, memory limit."""

    rtol: float | None = None
    atol: float | None = None
    repeat: int = 3
    memory_mb: int = 4096


_DataSet = tuple[dict[str, Any], list[Any]]


class _StageError(Exception):
    def __init__(self, message: str, ops: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.ops = tuple(ops)


class _Progress:
    """The stage a worker is in, also sent to the parent so a hang or crash names its stage."""

    def __init__(self, conn: Connection | None) -> None:
        self.conn = conn
        self.stage = ""

    def enter(self, stage: str) -> None:
        self.stage = stage
        if self.conn is not None:
            self.conn.send({"stage": stage})


def child_main(case: ZooCase, options: WorkerOptions, conn: Connection) -> None:
    """Entry point of the child process: limit memory, evaluate, send the result back."""
    if options.memory_mb > 0:
        # RLIMIT_DATA (heap and private writable mappings, Linux >= 4.7) follows what a model
        # really allocates; RLIMIT_AS would also count the address space XLA's threads and
        # malloc's arenas reserve without using (~1 GB more on a small model, growing with cores).
        limit = options.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    conn.send({"result": evaluate(case, options, conn).to_json()})
    conn.close()


def evaluate(case: ZooCase, options: WorkerOptions, conn: Connection | None = None) -> ModelResult:
    """Run one case through every stage; the first stage that fails ends it.

    Args:
        case: the model and its test data.
        options: tolerances, timed reruns.
        conn: where to report each stage as it starts (the parent process), if anywhere.

    Returns:
        A pass, fail (outputs differ) or error (a stage before compare failed) result.
    """
    progress = _Progress(conn)
    try:
        return _stages(case, options, progress)
    except MemoryError:
        message = f"out of memory (limit {options.memory_mb} MiB)"
        return ModelResult(case.id, ERROR, progress.stage, message)
    except Exception as e:  # the report records every failure; none may stop the run
        ops = e.ops if isinstance(e, _StageError) else _named_ops(str(e))
        return ModelResult(case.id, ERROR, progress.stage, _message(e), ops=ops)


def _stages(case: ZooCase, options: WorkerOptions, progress: _Progress) -> ModelResult:
    import oxla
    from oxla.passes.classify import classify

    progress.enter("load")
    model = oxla.load_model(case.model, check=False)
    data = _read_data(case, model)
    progress.enter("check")
    oxla.load_model(case.model)  # onnx.checker on the file's bytes, with oxla's tolerances
    progress.enter("classify")
    gaps = [f"{u.domain or 'ai.onnx'}::{u.op_type}" for u in classify(model) if u.kind == "unsupported"]
    if gaps:
        raise _StageError(f"unsupported ops: {', '.join(gaps)}", gaps)
    del model
    progress.enter("compile")
    sess = oxla.InferenceSession(case.model)
    progress.enter("run")
    start = time.perf_counter()
    got = [sess.run(None, data[0][0])]
    first_run_s = round(time.perf_counter() - start, 4)
    got += [sess.run(None, feeds) for feeds, _ in data[1:]]
    latency_ms = _latency(sess, data[0][0], options.repeat)
    progress.enter("compare")
    names = [o.name for o in sess.get_outputs()]
    return _compare(case, options, names, data, got, first_run_s, latency_ms)


def _latency(sess: Any, feeds: dict[str, Any], repeat: int) -> float | None:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 4) if times else None


def _compare(case: ZooCase, options: WorkerOptions, names: list[str], data: list[_DataSet],
             got: list[list[Any]], first_run_s: float, latency_ms: float | None) -> ModelResult:
    note = ""
    if case.layout == BARE:
        expected, note = _onnxruntime_reference(case, data[0][0])
        data = [(data[0][0], expected)] if expected is not None else []
    if not data:
        return ModelResult(case.id, PASS, "", f"run only: {note}", first_run_s=first_run_s,
                           latency_ms=latency_ms)
    default = (ORT_RTOL, ORT_ATOL) if case.layout == BARE else (BACKEND_RTOL, BACKEND_ATOL)
    rtol = options.rtol if options.rtol is not None else default[0]
    atol = options.atol if options.atol is not None else default[1]
    diffs = compare_outputs(names, [want for _, want in data], got, rtol, atol)
    bad = [d for d in diffs if not d.ok]
    status, stage = (FAIL, "compare") if bad else (PASS, "")
    message = "; ".join(f"{d.name}: {d.message}" for d in bad)[:MESSAGE_CHARS]
    return ModelResult(case.id, status, stage, message, tuple(diffs), first_run_s, latency_ms)


def _read_data(case: ZooCase, model: onnx.ModelProto) -> list[_DataSet]:
    """(feeds, expected outputs) per data set; a bare model gets seeded random feeds, no outputs."""
    if case.layout == BARE:
        from oxla.feeds import random_feeds

        return [(random_feeds(model, seed=0), [])]
    graph_inputs = {i.name: i for i in model.graph.input}
    inits = {t.name for t in model.graph.initializer} | {
        s.values.name for s in model.graph.sparse_initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    out = []
    for ds in case.data_sets:
        if case.layout == LIGHT:
            from onnx.backend.test.runner import Runner

            feeds = {n: Runner.generate_dummy_data(graph_inputs[n], seed=0, random=False) for n in names}
        else:
            # input_K is the K-th input the session takes; older files also feed initializer-inputs
            order = names if len(ds.inputs) <= len(names) else list(graph_inputs)
            feeds = {n: read_pb(p, graph_inputs[n].type) for n, p in zip(order, ds.inputs)}
        # more expected outputs than the model has: read them anyway, compare reports the gap
        types = [o.type for o in model.graph.output]
        want = [read_pb(p, types[k] if k < len(types) else onnx.TypeProto())
                for k, p in enumerate(ds.outputs)]
        out.append((feeds, want))
    if not out:
        raise _StageError("the folder has no test_data_set_N with input_K.pb files")
    return out


def read_pb(path: str, type_proto: onnx.TypeProto) -> Any:
    """A serialized TensorProto, SequenceProto or OptionalProto, read as the declared type says."""
    with open(path, "rb") as f:
        data = f.read()
    kind = type_proto.WhichOneof("value")
    if kind == "sequence_type":
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if kind == "optional_type":
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    return numpy_helper.to_array(tensor)


def _onnxruntime_reference(case: ZooCase, feeds: dict[str, Any]) -> tuple[list[Any] | None, str]:
    """onnxruntime's outputs on the same feeds, or None and why not."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed, nothing to compare with"
    so = ort.SessionOptions()
    # onnxruntime's default level fuses quantized groups into kernels that differ from the graph
    # as written (FACTS.md); the basic level keeps its semantics.
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        sess = ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"])
        return list(sess.run(None, feeds)), ""
    except Exception as e:  # onnxruntime's own gap is not the model's failure
        return None, f"onnxruntime cannot run it ({_message(e)[:300]})"


def _named_ops(message: str) -> tuple[str, ...]:
    """The ops an oxla error message names ('Gemm node 'fc1' (ai.onnx v13): ...')."""
    return tuple(sorted({f"{d}::{op}" for op, d in _NODE_OP.findall(message)}))


def _message(e: BaseException) -> str:
    text = str(e).strip()
    if not text:
        text = traceback.format_exc(limit=3).strip()
    return f"{type(e).__name__}: {text}"[:MESSAGE_CHARS]
