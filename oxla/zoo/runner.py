"""Run zoo cases, each in its own process with a time and memory limit, N at a time."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from oxla.zoo.cache import ResultCache
from oxla.zoo.cases import ZooCase
from oxla.zoo.results import CRASH, TIMEOUT, ModelResult
from oxla.zoo.worker import WorkerOptions, child_main

# A finished child gets this long to exit after sending its result before it is killed.
EXIT_GRACE_S = 5.0


@dataclass(frozen=True)
class RunOptions:
    """How to run a batch: parallel jobs, per-model time limit, and what each worker gets."""

    jobs: int = 2
    timeout_s: float = 300.0
    worker: WorkerOptions = field(default_factory=WorkerOptions)


@dataclass
class _Running:
    case: ZooCase
    process: Any
    conn: Connection
    start: float
    stage: str = ""
    result: dict[str, Any] | None = None


def _context() -> Any:
    # forkserver: each model gets a fresh process forked from one that already imported oxla
    # (and jax), so a model costs a fork, not a 2 s import; no JAX backend exists before the fork.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["oxla.zoo.worker"])
    return ctx


def run_cases(cases: Sequence[ZooCase], options: RunOptions, *, cache: ResultCache | None = None,
              on_result: Callable[[ModelResult], None] | None = None) -> list[ModelResult]:
    """Check every case; a crash, hang or memory bomb is that model's result, never the run's end.

    Args:
        cases: what to run.
        options: jobs, timeout and worker options.
        cache: earlier results to reuse (and where to store new ones); None runs everything.
        on_result: called with each result as it arrives (progress display).

    Returns:
        One result per case, in the order of `cases`.
    """
    results: dict[str, ModelResult] = {}

    def done(result: ModelResult) -> None:
        results[result.path] = result
        if on_result is not None:
            on_result(result)

    pending = []
    for case in cases:
        hit = cache.get(case) if cache is not None else None
        if hit is not None:
            done(hit)
        else:
            pending.append(case)
    for result in _run_pending(pending, options):
        if cache is not None:
            cache.put(_case_of(cases, result.path), result)
        done(result)
    return [results[c.id] for c in cases]


def _case_of(cases: Sequence[ZooCase], path: str) -> ZooCase:
    return next(c for c in cases if c.id == path)


def _run_pending(pending: list[ZooCase], options: RunOptions) -> Any:
    """Yield results as children finish, keeping `jobs` children busy."""
    if not pending:
        return
    ctx = _context()
    queue = list(reversed(pending))
    running: list[_Running] = []
    try:
        while queue or running:
            while queue and len(running) < max(1, options.jobs):
                running.append(_start(ctx, queue.pop(), options))
            _wait(running, options.timeout_s)
            for job in list(running):
                result = _poll(job, options)
                if result is not None:
                    running.remove(job)
                    yield result
    finally:
        for job in running:  # interrupted: leave no child behind
            _kill(job)


def _start(ctx: Any, case: ZooCase, options: RunOptions) -> _Running:
    receiver, sender = ctx.Pipe(duplex=False)
    process = ctx.Process(target=child_main, args=(case, options.worker, sender), daemon=True,
                          name=f"oxla-zoo {case.id}")
    process.start()
    sender.close()  # the child holds the only sending end: EOF tells us it is gone
    return _Running(case, process, receiver, time.perf_counter())


def _wait(running: list[_Running], timeout_s: float) -> None:
    now = time.perf_counter()
    next_deadline = min(job.start + timeout_s for job in running)
    handles: list[Any] = []
    for job in running:
        handles.append(job.process.sentinel)
        if job.result is None:
            handles.append(job.conn)
    wait(handles, timeout=max(0.0, min(next_deadline - now, 1.0)))


def _poll(job: _Running, options: RunOptions) -> ModelResult | None:
    """The job's result once it has one (and its process is gone); None while it runs."""
    elapsed = time.perf_counter() - job.start
    try:
        while job.result is None and job.conn.poll():
            message = job.conn.recv()
            job.stage = message.get("stage", job.stage)
            job.result = message.get("result")
    except (EOFError, OSError):  # the child is gone without a result
        job.process.join(EXIT_GRACE_S)
        return _finish(job, _crash(job, elapsed, options.worker.memory_mb))
    if job.result is not None:  # the child has nothing left to do: no need to wait for its exit
        return _finish(job, ModelResult.from_json({**job.result, "wall_s": elapsed}))
    if not job.process.is_alive():
        return _finish(job, _crash(job, elapsed, options.worker.memory_mb))
    if elapsed > options.timeout_s:
        message = f"no result after {options.timeout_s:g} s: killed"
        return _finish(job, ModelResult(job.case.id, TIMEOUT, job.stage, message, wall_s=elapsed))
    return None


def _crash(job: _Running, elapsed: float, memory_mb: int) -> ModelResult:
    code = job.process.exitcode
    if code is not None and code < 0:
        try:
            why = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            why = f"killed by signal {-code}"
    else:
        why = f"exited with status {code} without a result"
    if not job.stage:
        # it died before reaching the model: usually a script that runs the zoo at import time,
        # which every multiprocessing child re-imports
        why += ("; it failed before loading the model (from a Python script, run the zoo under "
                "`if __name__ == \"__main__\":`)")
    elif memory_mb:
        why += f" (memory limit {memory_mb} MiB; XLA aborts when an allocation fails)"
    return ModelResult(job.case.id, CRASH, job.stage, f"the worker process {why}", wall_s=elapsed)


def _finish(job: _Running, result: ModelResult) -> ModelResult:
    _kill(job)
    return result


def _kill(job: _Running) -> None:
    if job.process.is_alive():
        job.process.kill()
        job.process.join(EXIT_GRACE_S)
    job.conn.close()
