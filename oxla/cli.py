"""The `oxla` command: run, info, train, zoo and lint."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from oxla.errors import OxlaError

EXIT_ERROR = 2
EXIT_MISMATCH = 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oxla", description="Compile, run and inspect ONNX models with JAX/XLA.")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="compile and run a model, optionally against onnxruntime")
    run.add_argument("model", help="path to a .onnx file")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                     help="an input from a .npy or TensorProto .pb file (repeatable)")
    run.add_argument("--random-inputs", action="store_true",
                     help="random values for inputs not given with --input")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=N",
                     help="size of a symbolic dimension for --random-inputs (default 1)")
    run.add_argument("--seed", type=int, default=0, help="seed for --random-inputs")
    run.add_argument("--repeat", type=int, default=10, help="timed runs after the first (default 10)")
    run.add_argument("--compare", choices=["onnxruntime"], help="run the same inputs through onnxruntime")
    run.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance for --compare")
    run.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance for --compare")
    run.add_argument("--bake-weights", action="store_true", help="compile weights as constants")

    info = sub.add_parser("info", help="show a model's inputs, outputs and how each op is run")
    info.add_argument("model", help="path to a .onnx file")
    info.add_argument("--run", action="store_true",
                      help="also run it once on random inputs and report graph breaks")

    from oxla.lint.cli import add_lint_parser
    from oxla.training.cli import add_train_parser
    from oxla.zoo.cli import add_zoo_parser

    add_train_parser(sub)
    add_zoo_parser(sub)
    add_lint_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "info":
            return cmd_info(args)
        if args.command == "train":
            from oxla.training.cli import cmd_train

            return cmd_train(args)
        if args.command == "zoo":
            from oxla.zoo.cli import cmd_zoo

            return cmd_zoo(args)
        if args.command == "lint":
            from oxla.lint.cli import cmd_lint

            return cmd_lint(args)
    except OxlaError as e:
        print(f"oxla: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return EXIT_ERROR


def _dims(items: list[str]) -> dict[str, int]:
    from oxla.errors import InputError

    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit():
            raise InputError(f"--dim takes NAME=N, got '{item}'")
        out[name] = int(value)
    return out


def _feeds(args: argparse.Namespace, model: Any) -> dict[str, Any]:
    from oxla.feeds import parse_input_args, random_feeds

    feeds = parse_input_args(args.input)
    if args.random_inputs:
        for name, value in random_feeds(model, seed=args.seed, dims=_dims(args.dim)).items():
            feeds.setdefault(name, value)
    return feeds


def _summary(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return f"sequence of {len(value)}"
    arr = np.asarray(value)
    head = np.array2string(arr.reshape(-1)[:6], precision=4, separator=", ")
    stats = ""
    if arr.size and arr.dtype.kind in "fiu":
        f = arr.astype(np.float64)
        stats = f" min {f.min():.4g} max {f.max():.4g} mean {f.mean():.4g}"
    return f"{arr.dtype} {tuple(arr.shape)}{stats} {head}"


def _time(fn: Any, repeat: int) -> tuple[float, float]:
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times) if times else first


def cmd_run(args: argparse.Namespace) -> int:
    from oxla.session import InferenceSession

    start = time.perf_counter()
    sess = InferenceSession(args.model, bake_weights=args.bake_weights)
    load_s = time.perf_counter() - start
    feeds = _feeds(args, sess.compiled.model)
    outputs: list[Any] = []

    def run_once() -> None:
        outputs[:] = sess.run(None, feeds)

    first, median = _time(run_once, args.repeat)
    for out, value in zip(sess.get_outputs(), outputs):
        print(f"{out.name}: {_summary(value)}")
    stats = sess.compiled.stats
    print(f"load {load_s * 1e3:.1f} ms, first call (compile + run) {first * 1e3:.1f} ms, "
          f"median of {args.repeat} runs {median * 1e3:.3f} ms; "
          f"{stats.compiles} XLA computation(s), {len(stats.host_nodes)} host node(s)")
    if args.compare:
        return _compare(args, feeds, outputs, median)
    return 0


def _compare(args: argparse.Namespace, feeds: dict[str, Any], outputs: list[Any], median: float) -> int:
    import onnxruntime as ort

    sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ort_feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
    ref: list[Any] = []

    def run_once() -> None:
        ref[:] = sess.run(names, ort_feeds)

    _, ort_median = _time(run_once, args.repeat)
    ok = True
    for name, got, want in zip(names, outputs, ref):
        g, w = np.asarray(got), np.asarray(want)
        if g.shape != w.shape:
            print(f"{name}: MISMATCH shape {g.shape} vs onnxruntime {w.shape}")
            ok = False
            continue
        if w.dtype.kind in "fc":
            diff = float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) if g.size else 0.0
            close = bool(np.allclose(g, w, rtol=args.rtol, atol=args.atol, equal_nan=True))
        else:
            diff = float(np.sum(g != w))
            close = bool(np.array_equal(g, w))
        ok &= close
        print(f"{name}: {'ok' if close else 'MISMATCH'} max abs diff {diff:.3g} vs onnxruntime")
    print(f"onnxruntime median {ort_median * 1e3:.3f} ms; oxla/onnxruntime latency ratio "
          f"{median / ort_median:.2f}x")
    return 0 if ok else EXIT_MISMATCH


def cmd_info(args: argparse.Namespace) -> int:
    from oxla.load import load_model
    from oxla.passes.classify import FUNCTION, NATIVE, classify
    from oxla.session import InferenceSession

    model = load_model(args.model)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} v{o.version}" for o in model.opset_import)
    print(f"{args.model}: ir_version {model.ir_version}, opsets {opsets}, "
          f"producer {model.producer_name or '?'} {model.producer_version}")
    print(f"nodes {len(model.graph.node)}, initializers {len(model.graph.initializer)}, "
          f"local functions {len(model.functions)}, training_info {len(model.training_info)}")
    uses = classify(model)
    print(f"\n{'op':40s} {'opset':>5s} {'count':>6s}  how")
    for u in uses:
        how = f"native (rule since v{u.rule_since})" if u.rule_since else u.kind
        print(f"{(u.domain or 'ai.onnx') + '::' + u.op_type:40s} {u.opset:5d} {u.count:6d}  {how}")
    if any(u.kind == "unsupported" for u in uses):
        return EXIT_ERROR
    sess = InferenceSession(model)
    print("\ninputs:")
    for i in sess.get_inputs():
        print(f"  {i.name}: {i.type} {i.shape}")
    print("outputs:")
    for o in sess.get_outputs():
        print(f"  {o.name}: {o.type} {o.shape}")
    if args.run:
        from oxla.feeds import random_feeds

        sess.run(None, random_feeds(model))
        stats = sess.compiled.stats
        ran = sess.compiled.interpreter.ran
        print(f"\nran once: {stats.compiles} XLA computation(s), {stats.host_steps} host step(s)"
              + (f" at {sorted(stats.host_nodes)}" if stats.host_nodes else ""))
        native = sorted({f"{d or 'ai.onnx'}::{o}" for k, d, o, _ in ran if k == NATIVE})
        expanded = sorted({f"{d or 'ai.onnx'}::{o}" for k, d, o, _ in ran if k == FUNCTION})
        print(f"ran native: {', '.join(native) or 'none'}")
        print(f"expanded from function bodies: {', '.join(expanded) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
