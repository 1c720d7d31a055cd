"""The `oxla` command: run, info, export, train, zoo and lint.

JAX, onnx and onnxruntime are imported only by the command that needs them, so `oxla --help` and
`oxla --version` answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from oxla.errors import InputError, OxlaError
from oxla.host import check_replaceable

if TYPE_CHECKING:
    from oxla.feeds import InputSpec

EXIT_ERROR = 2
EXIT_MISMATCH = 1
VERSION = "0.1.0"   # oxla.__version__ reads it; kept here so --version imports nothing
# Subcommands whose parsers live in modules that import onnx or JAX: built only when asked for
# (module, function adding the parser, help line for `oxla --help`).
_HEAVY = {
    "train": ("oxla.training.cli", "add_train_parser", "train a model from its training_info on a .npz data set"),
    "zoo": ("oxla.zoo.cli", "add_zoo_parser", "check a model collection against its test data (CI)"),
    "lint": ("oxla.lint.cli", "add_lint_parser", "check operator conventions and model hygiene"),
}


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; a subcommand whose module imports JAX is only built when it is `command`."""
    p = argparse.ArgumentParser(prog="oxla", description="Compile, run and inspect ONNX models with JAX/XLA.")
    p.add_argument("--version", action="version", version=f"oxla {VERSION}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="compile and run a model (or an exported one), optionally against onnxruntime")
    run.add_argument("model", help="path to a .onnx file or a file written by `oxla export`")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE",
                     help="an input from a .npy or TensorProto .pb file (repeatable)")
    run.add_argument("--random-inputs", action="store_true",
                     help="random values for inputs not given with --input (Gather indices in range, "
                          "booleans as masks)")
    run.add_argument("--int-range", metavar="LO,HI", help="integer random inputs in [LO, HI) (default 0,10)")
    _add_dim(run, "size of a symbolic dimension for --random-inputs (default 1)")
    run.add_argument("--seed", type=int, default=0, help="seed for --random-inputs")
    run.add_argument("--repeat", type=int, default=10, help="timed runs after the first (default 10)")
    run.add_argument("--compare", choices=["onnxruntime"], help="run the same inputs through onnxruntime")
    run.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance for --compare")
    run.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance for --compare")
    run.add_argument("--bake-weights", action="store_true", help="compile weights as constants")

    info = sub.add_parser("info", help="show a model's inputs, outputs, training section and how each op is run")
    info.add_argument("model", help="path to a .onnx file")
    info.add_argument("--run", action="store_true",
                      help="also run it once on random inputs and report graph breaks")

    exp = sub.add_parser("export", help="serialize the compiled model (StableHLO with its weights)")
    exp.add_argument("model", help="path to a .onnx file")
    exp.add_argument("-o", "--output", metavar="FILE", help="where to write the exported model")
    _add_dim(exp, "fix a symbolic dimension's size (the others stay symbolic)")
    exp.add_argument("--emit", choices=["stablehlo", "hlo"], help="print the program's text")
    exp.add_argument("--platform", metavar="NAME[,NAME]",
                     help="lower for these JAX platforms, e.g. cpu,cuda (default: this machine's)")

    for name, (module, adder, text) in _HEAVY.items():
        if name == command:
            getattr(importlib.import_module(module), adder)(sub)
        else:  # a stand-in that only lists it; `oxla NAME ...` builds the real one
            sub.add_parser(name, help=text, add_help=False)
    return p


def _add_dim(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--dim", action="append", default=[], metavar="NAME=N", help=text)


def _command(argv: Sequence[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `oxla` command line; returns the exit status (2 for every error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser(_command(argv)).parse_args(argv)
    try:
        return _dispatch(args)
    except OxlaError as e:
        print(f"oxla: error: {e}", file=sys.stderr)
    except BrokenPipeError:  # the reader of our output left (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except OSError as e:  # a file that cannot be read or written: still one message
        print(f"oxla: error: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return 130
    return EXIT_ERROR


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        return cmd_run(args)
    if args.command == "info":
        return cmd_info(args)
    if args.command == "export":
        return cmd_export(args)
    if args.command == "train":
        from oxla.training.cli import cmd_train

        return cmd_train(args)
    if args.command == "zoo":
        from oxla.zoo.cli import cmd_zoo

        return cmd_zoo(args)
    if args.command == "lint":
        from oxla.lint.cli import cmd_lint

        return cmd_lint(args)
    return EXIT_ERROR


@contextmanager
def status(label: str, stream: TextIO | None = None) -> Iterator[None]:
    """On a terminal, a line showing `label` and the seconds elapsed, redrawn until done and then
    erased; elsewhere (logs, pipes) nothing, so logs hold only the plain result lines."""
    out = stream or sys.stdout
    if not out.isatty():
        yield
        return
    start = time.perf_counter()
    done = threading.Event()

    def tick() -> None:
        while True:
            out.write(f"\r\x1b[K{label} {time.perf_counter() - start:.1f} s")
            out.flush()
            if done.wait(0.1):
                return

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        out.write("\r\x1b[K")
        out.flush()


def _dims(items: list[str], named: set[str]) -> dict[str, int]:
    """--dim NAME=N pairs, refusing names that are not symbolic dims of the model's inputs."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value.isdigit():
            raise InputError(f"--dim takes NAME=N, got '{item}'")
        out[name] = int(value)
    unknown = sorted(set(out) - named)
    if unknown:
        raise InputError(f"--dim names {unknown} are not dims of this model's inputs; "
                         f"its symbolic dims are {sorted(named) or 'none'}")
    return out


def _int_range(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    lo, sep, hi = text.partition(",")
    try:
        low, high = int(lo), int(hi)
    except ValueError:
        raise InputError(f"--int-range takes LO,HI (integers), got '{text}'") from None
    if not sep or low >= high:
        raise InputError(f"--int-range takes LO,HI with LO < HI, got '{text}'")
    return low, high


def _feeds(args: argparse.Namespace, specs: Sequence[InputSpec],
           bounds: dict[str, int]) -> dict[str, Any]:
    """--input files, then random values for the rest when --random-inputs asks for them."""
    from oxla.feeds import parse_input_args, random_for_specs, symbolic_dims

    dims = _dims(args.dim, symbolic_dims(specs))
    int_range = _int_range(args.int_range)
    feeds = parse_input_args(args.input)
    if args.random_inputs:
        rest = [s for s in specs if s[0] not in feeds]
        feeds.update(random_for_specs(rest, bounds, seed=args.seed, dims=dims, int_range=int_range))
    return feeds


def _onnx_specs(model: Any) -> tuple[list[InputSpec], dict[str, int]]:
    """The model's inputs as (name, dtype, shape) with dim names kept, and its Gather bounds."""
    from oxla.feeds import index_bounds, input_specs

    return input_specs(model), index_bounds(model)


def _np_dtype(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:  # bfloat16, float8 variants: numpy knows them through ml_dtypes
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


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


def _time(fn: Any, repeat: int, label: str = "first call (compile + run)") -> tuple[float, float]:
    start = time.perf_counter()
    with status(label):
        fn()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times) if times else first


def cmd_run(args: argparse.Namespace) -> int:
    """`oxla run`: a .onnx model through InferenceSession, or an exported one through its program."""
    from oxla.export import is_exported

    if is_exported(args.model):
        return _run_exported(args)
    from oxla.session import InferenceSession

    start = time.perf_counter()
    with status(f"loading {args.model}"):
        sess = InferenceSession(args.model, bake_weights=args.bake_weights)
    load_s = time.perf_counter() - start
    feeds = _feeds(args, *_onnx_specs(sess.compiled.model))
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


def _run_exported(args: argparse.Namespace) -> int:
    from oxla.export import load_exported

    if args.compare:
        raise InputError(f"--compare needs the .onnx file; '{args.model}' is an exported model")
    start = time.perf_counter()
    with status(f"loading {args.model}"):
        model = load_exported(args.model)
    load_s = time.perf_counter() - start
    specs = [(i.name, _np_dtype(i.dtype), list(i.shape)) for i in model.inputs]
    bounds = {i.name: i.index_bound for i in model.inputs if i.index_bound is not None}
    feeds = _feeds(args, specs, bounds)
    outputs: list[Any] = []

    def run_once() -> None:
        outputs[:] = model.run(None, feeds)

    first, median = _time(run_once, args.repeat)
    for out, value in zip(model.get_outputs(), outputs):
        print(f"{out.name}: {_summary(value)}")
    print(f"exported model (jax {model.header.get('jax_version')}): load {load_s * 1e3:.1f} ms, "
          f"first call (compile + run) {first * 1e3:.1f} ms, median of {args.repeat} runs "
          f"{median * 1e3:.3f} ms")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`oxla export`: write the serialized program and/or print its text."""
    from oxla.export import export_model

    if not args.output and not args.emit:
        raise InputError("oxla export needs -o FILE, --emit stablehlo|hlo, or both")
    dims = {}
    for item in args.dim:  # which names are dims is checked by export_model against the model
        name, _, value = item.partition("=")
        if not name or not value.isdigit():
            raise InputError(f"--dim takes NAME=N, got '{item}'")
        dims[name] = int(value)
    start = time.perf_counter()
    with status(f"exporting {args.model}"):
        platforms = [p.strip() for p in args.platform.split(",")] if args.platform else None
        result = export_model(args.model, dims=dims, emit=args.emit, platforms=platforms)
    if args.output:  # written before the text is printed: a reader like `head` may close the pipe
        _write_atomically(args.output, result.data)
        shapes = ", ".join(f"{i.name} {i.dtype}{list(i.shape)}" for i in result.inputs)
        print(f"wrote {args.output}: {len(result.data)} bytes, inputs {shapes}, "
              f"{(time.perf_counter() - start) * 1e3:.0f} ms", file=sys.stderr if args.emit else sys.stdout)
    if result.text is not None:
        print(result.text)
    return 0


def _write_atomically(path: str, data: bytes) -> None:
    """Temp file, fsync, rename: a crash never leaves half an artifact under the final name."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        check_replaceable(path)
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise InputError(f"cannot write '{path}': {e.strerror}") from None


def _compare(args: argparse.Namespace, feeds: dict[str, Any], outputs: list[Any], median: float) -> int:
    import onnxruntime as ort

    ref: list[Any] = []
    try:
        sess = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        ort_feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}

        def run_once() -> None:
            ref[:] = sess.run(names, ort_feeds)

        _, ort_median = _time(run_once, args.repeat, "onnxruntime")
    except Exception as e:  # onnxruntime raises its own classes (Fail, InvalidArgument, ...)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _CompareError(f"onnxruntime failed on this model: {first}") from None
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


_TRAINING_PREFIX = "oxla.training."


def _print_training(model: Any) -> None:
    """The training section: its ops, and what make_trainable recorded in metadata_props."""
    from collections import Counter

    if not model.training_info:
        return
    print("\ntraining:")
    for k, info in enumerate(model.training_info):
        for part in ("initialization", "algorithm"):
            ops = Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in getattr(info, part).node)
            listed = ", ".join(f"{op} x{c}" for op, c in sorted(ops.items())) or "none"
            print(f"  [{k}] {part} ops: {listed}")
        print(f"  [{k}] updates {len(info.update_binding)} value(s), "
              f"initializes {len(info.initialization_binding)}")
    meta = {p.key[len(_TRAINING_PREFIX):]: p.value for p in model.metadata_props
            if p.key.startswith(_TRAINING_PREFIX)}
    labels = {"loss": "loss", "optimizer": "optimizer", "hyperparameters": "hyper-parameters"}
    for key, label in labels.items():
        if key in meta:
            print(f"  {label}: {meta.pop(key)}")
    for key, value in sorted(meta.items()):
        print(f"  {key}: {value}")


class _CompareError(OxlaError):
    """onnxruntime could not run the model for --compare."""


def cmd_info(args: argparse.Namespace) -> int:
    """`oxla info`: the model's header, training section, op table, inputs and outputs."""
    from oxla.export import is_exported

    if is_exported(args.model):
        return _info_exported(args.model)
    from oxla.load import load_model
    from oxla.passes.classify import classify
    from oxla.session import InferenceSession

    model = load_model(args.model)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} v{o.version}" for o in model.opset_import)
    print(f"{args.model}: ir_version {model.ir_version}, opsets {opsets}, "
          f"producer {model.producer_name or '?'} {model.producer_version}")
    print(f"nodes {len(model.graph.node)}, initializers {len(model.graph.initializer)}, "
          f"local functions {len(model.functions)}, training_info {len(model.training_info)}")
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    print(f"parameters {params:,} in {len(model.graph.initializer)} initializers; "
          f"file size {os.path.getsize(args.model):,} bytes")
    _print_training(model)
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
        _info_run(sess, model)
    return 0


def _info_exported(path: str) -> int:
    """`oxla info` on a file written by `oxla export`: its header."""
    from oxla.export import load_exported

    model = load_exported(path)
    print(f"{path}: oxla exported model (format {model.header['format_version']}, "
          f"jax {model.header.get('jax_version')}, platforms {', '.join(model.header.get('platforms', []))}), "
          f"from {model.header.get('source') or '?'}; "
          f"file size {os.path.getsize(path):,} bytes")
    for title, specs in (("inputs", model.inputs), ("outputs", model.outputs)):
        print(f"{title}:")
        for spec in specs:
            bound = f", indices below {spec.index_bound}" if spec.index_bound is not None else ""
            print(f"  {spec.name}: {spec.dtype} {list(spec.shape)}{bound}")
    return 0


def _info_run(sess: Any, model: Any) -> None:
    """`oxla info --run`: one run on random inputs; graph breaks and which ops ran how."""
    from oxla.feeds import random_feeds
    from oxla.passes.classify import FUNCTION, NATIVE

    sess.run(None, random_feeds(model))
    stats = sess.compiled.stats
    ran = sess.compiled.interpreter.ran
    print(f"\nran once: {stats.compiles} XLA computation(s), {stats.host_steps} host step(s)"
          + (f" at {sorted(stats.host_nodes)}" if stats.host_nodes else ""))
    native = sorted({f"{d or 'ai.onnx'}::{o}" for k, d, o, _ in ran if k == NATIVE})
    expanded = sorted({f"{d or 'ai.onnx'}::{o}" for k, d, o, _ in ran if k == FUNCTION})
    print(f"ran native: {', '.join(native) or 'none'}")
    print(f"expanded from function bodies: {', '.join(expanded) or 'none'}")

if __name__ == "__main__":
    sys.exit(main())
