"""`oxla train`: train a model from its TrainingInfoProto (or one made on the fly) on a .npz file."""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from oxla.errors import InputError, TrainingError
from oxla.host import NOT_REGULAR, is_regular
from oxla.training.recipe import LOSSES, SCHEDULES

EPILOG = """\
The .npz holds x_train and y_train (x and y also work), and optionally x_test and y_test for the
per-epoch evaluation; x feeds the model's input and y the training step's labels input. A model
without training_info is made trainable first (--optimizer, --loss, --lr). A checkpoint (the
model with its current state and training_info, written atomically) is saved after every epoch;
--resume CHECKPOINT continues from the epoch it records, with the same shuffling.
"""

META_EPOCH = "oxla.training.epoch"
META_SEED = "oxla.training.seed"


def add_train_parser(sub: Any) -> argparse.ArgumentParser:
    """Register the `train` subcommand on an argparse subparsers object."""
    p = sub.add_parser("train", help="train a model from its training_info on a .npz data set",
                       description=__doc__, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a .onnx model (with training_info, or an inference model)")
    p.add_argument("--data", required=True, metavar="FILE.npz", help="training (and test) arrays")
    p.add_argument("--epochs", type=int, default=10, help="passes over the data (default 10)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step (default 32; "
                   "the last partial batch of an epoch is dropped so every step has one shape)")
    p.add_argument("--lr", type=float, help="learning rate (sets the model's learning-rate initializer)")
    p.add_argument("--optimizer", choices=["adam", "adamw", "momentum", "nesterov", "adagrad", "sgd"],
                   help="for a model without training_info (default adam)")
    p.add_argument("--loss", choices=list(LOSSES),
                   help="for a model without training_info (default: cross_entropy for integer "
                        "labels, else mse)")
    _add_recipe_options(p)
    p.add_argument("--out", type=Path, help="where to write the trained model, training_info "
                   "kept (default MODEL.trained.onnx)")
    p.add_argument("--export", type=Path, metavar="FILE", help="also write the inference model "
                   "(training_info stripped)")
    p.add_argument("--checkpoint", type=Path, help="per-epoch checkpoint (default OUT.ckpt.onnx)")
    p.add_argument("--external-data", action="store_true", help="write tensors to a data file beside "
                   "each model (always done when a model is over protobuf's 2 GiB limit)")
    p.add_argument("--resume", type=Path, metavar="CHECKPOINT", help="continue from a checkpoint")
    p.add_argument("--seed", type=int, default=0, help="shuffling seed, and the seed of the recipe's "
                   "random ops (dropout) for a model made trainable here (default 0)")
    p.add_argument("--devices", type=int, help="shard each batch over N local devices")
    p.add_argument("--coordinator", metavar="HOST:PORT", help="join JAX's distributed runtime: each "
                   "of --num-processes processes runs this command with its --process-id, and "
                   "feeds its share of every batch; process 0 writes the files")
    p.add_argument("--num-processes", type=int, metavar="N", help="processes in the run (with --coordinator)")
    p.add_argument("--process-id", type=int, metavar="I", help="this process, 0..N-1 (with --coordinator)")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="draw the loss curve; needs "
                   "matplotlib, which is not an oxla dependency (pip install matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _add_recipe_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("recipe", "for a model without training_info: written into the "
                             "training graph as standard ops (see docs/training.md)")
    g.add_argument("--schedule", choices=list(SCHEDULES), help="learning-rate schedule over steps "
                   "(default constant)")
    g.add_argument("--warmup", type=int, metavar="STEPS", help="linear warm-up over the first STEPS steps")
    g.add_argument("--step-size", type=int, metavar="STEPS", help="step schedule: decay every STEPS steps")
    g.add_argument("--gamma", type=float, help="step schedule: the decay factor (default 0.1)")
    g.add_argument("--total-steps", type=int, metavar="STEPS", help="cosine schedule: steps to the "
                   "lowest rate (default: every step of the run)")
    g.add_argument("--min-lr-ratio", type=float, metavar="R", help="cosine schedule: the lowest rate "
                   "as a fraction of --lr (default 0)")
    g.add_argument("--weight-decay", type=float, help="adamw: decoupled weight decay (default 0.01)")
    g.add_argument("--clip-norm", type=float, metavar="NORM", help="clip gradients to this global L2 norm")
    g.add_argument("--l2", type=float, help="add L2 / 2 * sum of squared weights to the loss")
    g.add_argument("--label-smoothing", type=float, metavar="EPS", help="cross_entropy label smoothing")
    g.add_argument("--huber-delta", type=float, metavar="DELTA", help="huber: where the loss turns "
                   "linear (default 1)")
    g.add_argument("--freeze-bn", action="store_true", help="keep BatchNormalization in inference "
                   "mode (stored statistics, not updated)")


RECIPE_FLAGS = ("schedule", "warmup", "step_size", "gamma", "total_steps", "min_lr_ratio", "weight_decay",
                "clip_norm", "l2", "label_smoothing", "huber_delta", "freeze_bn")


def _recipe(args: argparse.Namespace, steps: int) -> Any:
    """The Recipe the flags ask for; `steps` is the whole run's step count (cosine's default)."""
    from oxla.training.modes import TrainMode
    from oxla.training.recipe import Recipe, Schedule

    schedule = Schedule(args.schedule or "constant", warmup=args.warmup or 0,
                        step_size=args.step_size or 1, gamma=0.1 if args.gamma is None else args.gamma,
                        total=args.total_steps or max(steps, 1),
                        floor=args.min_lr_ratio or 0.0)
    return Recipe(schedule, clip_norm=args.clip_norm, l2=args.l2 or 0.0,
                  label_smoothing=args.label_smoothing or 0.0,
                  huber_delta=1.0 if args.huber_delta is None else args.huber_delta, seed=args.seed,
                  mode=TrainMode(freeze_batch_norm=args.freeze_bn))


def _optimizer(args: argparse.Namespace) -> Any:
    from dataclasses import replace

    from oxla.training.make import AdamW, optimizer_from

    opt = optimizer_from(args.optimizer or "adam", args.lr)
    if args.weight_decay is not None:
        if not isinstance(opt, AdamW):
            raise InputError("--weight-decay applies to --optimizer adamw (use --l2 for the others)")
        opt = replace(opt, weight_decay=args.weight_decay)
    return opt


@dataclass
class _Data:
    x: np.ndarray
    y: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None


def _meta_int(meta: dict[str, str], key: str, default: int) -> int:
    """An integer the checkpoint's metadata_props hold (epoch, seed); anything else is refused."""
    text = meta.get(key, str(default))
    try:
        return int(text)
    except ValueError:
        raise TrainingError(f"the checkpoint's metadata '{key}' is {text!r}, not a whole number; "
                            "it was not written by oxla train, or was edited") from None


def load_data(path: Path) -> _Data:
    """x_train/y_train (or x/y) and the optional x_test/y_test of a .npz file."""
    if Path(path).exists() and not is_regular(path):  # a FIFO would block, a device never end
        raise InputError(f"cannot read data file '{path}': {NOT_REGULAR}")
    try:
        arrays = dict(np.load(path, allow_pickle=False))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:  # a truncated .npz is a bad zip
        raise InputError(f"cannot read data file '{path}': {e}") from None
    except MemoryError as e:  # an array header declaring more than the machine holds
        raise InputError(f"cannot read data file '{path}': {e}") from None
    x = arrays.get("x_train", arrays.get("x"))
    y = arrays.get("y_train", arrays.get("y"))
    if x is None or y is None:
        raise InputError(f"'{path}' must hold x_train and y_train (or x and y); it has {sorted(arrays)}")
    if x.ndim == 0 or y.ndim == 0:
        raise InputError(f"'{path}': x and y must hold one row per sample, got shapes {x.shape} and {y.shape}")
    if len(x) != len(y):
        raise InputError(f"'{path}': x has {len(x)} samples but y has {len(y)}")
    return _Data(x, y, arrays.get("x_test"), arrays.get("y_test"))


def _set_initializer(model: Any, name: str, value: float) -> None:
    from onnx import numpy_helper

    for graph in [model.graph, *[info.algorithm for info in model.training_info]]:
        for t in graph.initializer:
            if t.name == name:
                old = numpy_helper.to_array(t)
                t.CopyFrom(numpy_helper.from_array(np.full(old.shape, value, old.dtype), name))
                return
    raise TrainingError(f"--lr: the model has no learning-rate initializer '{name}'")


def _prepare_model(args: argparse.Namespace, data: _Data) -> Any:
    """The training model: the file itself, or made trainable with the requested recipe."""
    from oxla.training.checkpoint import load_saved
    from oxla.training.make import META, make_trainable

    model = load_saved(args.resume or args.model)
    asked = [f"--{f.replace('_', '-')}" for f in ("optimizer", "loss", *RECIPE_FLAGS)
             if getattr(args, f) not in (None, False)]
    if not model.training_info:
        loss = args.loss or ("cross_entropy" if data.y.dtype.kind in "iu" else "mse")
        steps = args.epochs * (len(data.x) // max(args.batch_size, 1))
        model = make_trainable(model, loss, _optimizer(args), recipe=_recipe(args, steps))
    elif asked:
        raise TrainingError(f"the model already has a training recipe (training_info); {', '.join(asked)} "
                            f"apply to models without one")
    elif args.lr is not None:
        name = {p.key: p.value for p in model.metadata_props}.get(META + "learning_rate")
        if name is None:
            raise TrainingError("--lr: the model's training_info does not say which initializer is "
                                "the learning rate (no oxla.training.learning_rate metadata)")
        _set_initializer(model, name, args.lr)
    return model


@dataclass
class _Feeds:
    """Which step inputs the x and y arrays feed, and which output to evaluate."""

    x: str
    y: str
    output: str


def _feed_names(session: Any) -> _Feeds:
    from oxla.training.make import META

    inference = session.inference_inputs
    extra = [n for n in session.input_names() if n not in inference]
    if len(inference) != 1 or len(extra) != 1:
        raise TrainingError(f"oxla train feeds one model input and one labels input; this step "
                            f"takes {session.input_names()} (use TrainingSession from Python)")
    output = session.metadata.get(META + "output", session.inference_outputs[0])
    return _Feeds(inference[0], extra[0], output)


@dataclass
class _Progress:
    """A one-line progress bar on stderr: steps, loss, samples per second."""

    total: int
    epoch: str
    out: TextIO = field(default_factory=lambda: sys.stderr)
    quiet: bool = False
    start: float = field(default_factory=time.perf_counter)
    shown: float = 0.0

    def update(self, done: int, samples: int, loss: Any, final: bool = False) -> None:
        now = time.perf_counter()
        if self.quiet or (not final and now - self.shown < 0.2):
            return
        self.shown = now
        width = 24
        filled = int(width * done / max(self.total, 1))
        rate = samples / max(now - self.start, 1e-9)
        self.out.write(f"\r{self.epoch} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} "
                       f"loss {float(loss):.4f} {rate:,.0f} samples/s")
        if final:
            self.out.write("\n")
        self.out.flush()


def _epoch(session: Any, data: _Data, feeds: _Feeds, order: np.ndarray, batch: int,
           progress: _Progress, part: tuple[int, int] = (0, 1)) -> tuple[float, float]:
    """One pass over `order`; returns (mean loss, samples per second). `part` (index, count):
    this process feeds that share of the rows of every batch."""
    steps = len(order) // batch
    loss_name = _loss_name(session)
    losses = []
    start = time.perf_counter()
    share = batch // part[1]
    for i in range(steps):
        idx = order[i * batch + part[0] * share:i * batch + (part[0] + 1) * share]
        out = session.step_async({feeds.x: data.x[idx], feeds.y: data.y[idx]}, outputs=[loss_name])
        # across processes only the local copy of the (replicated) loss can be read
        losses.append(out[loss_name] if part[1] == 1 else session.to_host(out[loss_name]))
        progress.update(i + 1, (i + 1) * batch, losses[-1], final=i == steps - 1)
    mean = float(np.mean([float(v) for v in losses]))
    return mean, steps * batch / max(time.perf_counter() - start, 1e-9)


def _loss_name(session: Any) -> str:
    """The first algorithm output that is not an update (make_trainable puts the loss first)."""
    bound = {b.value for b in session.bindings()}
    names = session.output_names()
    return next((n for n in names if n not in bound), names[0])


def _evaluate(session: Any, data: _Data, feeds: _Feeds) -> str:
    if data.x_test is None or data.y_test is None:
        return "no test set"
    (pred,) = session.run([feeds.output], {feeds.x: data.x_test})
    if data.y_test.dtype.kind in "iu" and pred.ndim >= 2:
        return f"test accuracy {float(np.mean(pred.argmax(1) == data.y_test)) * 100:.2f}%"
    return f"test mse {float(np.mean((pred - data.y_test) ** 2)):.5g}"


def _plot(path: Path, losses: Sequence[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(range(1, len(losses) + 1), losses, marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _check_args(args: argparse.Namespace) -> None:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib, which is not installed (it is not an oxla "
                         "dependency): pip install matplotlib")
    if args.epochs < 0 or args.batch_size < 1:
        raise InputError("--epochs must be >= 0 and --batch-size >= 1")
    for option in ("out", "export", "checkpoint", "plot"):
        path = getattr(args, option)
        if path is not None and not path.resolve().parent.is_dir():
            raise InputError(f"--{option} {path}: folder '{path.resolve().parent}' does not exist")


def _join(args: argparse.Namespace) -> tuple[int, int]:
    """Join the distributed runtime when asked; returns (process index, process count)."""
    given = [args.coordinator, args.num_processes, args.process_id]
    if all(v is None for v in given):
        return 0, 1
    if any(v is None for v in given):
        raise InputError("--coordinator, --num-processes and --process-id go together")
    if args.batch_size % args.num_processes:
        raise InputError(f"--batch-size {args.batch_size} must divide by --num-processes {args.num_processes}")
    from oxla.training.parallel import join

    join(args.coordinator, args.num_processes, args.process_id)
    return args.process_id, args.num_processes


def cmd_train(args: argparse.Namespace) -> int:
    """Run `oxla train`; returns the exit status."""
    from oxla.training.session import TrainingSession

    _check_args(args)
    data = load_data(args.data)
    part = _join(args)
    model = _prepare_model(args, data)
    session = TrainingSession(model, devices=args.devices)
    meta = session.metadata
    first = _meta_int(meta, META_EPOCH, 0) if args.resume else 0
    if not args.resume:
        session.initialize()
    elif _meta_int(meta, META_SEED, args.seed) != args.seed:
        print(f"oxla train: note: the checkpoint was shuffled with seed {meta[META_SEED]}, "
              f"continuing with --seed {args.seed}", file=sys.stderr)
    if len(data.x) < args.batch_size:
        raise InputError(f"--batch-size {args.batch_size} is larger than the data ({len(data.x)} samples)")
    losses = _train_epochs(session, args, data, first, part)
    if part[0] == 0:  # one writer: every process holds the same state
        _write_results(session, args, losses)
    return 0


def _outputs(args: argparse.Namespace) -> tuple[Path, Path, bool | None]:
    out = args.out or Path(args.model).with_suffix(".trained.onnx")
    external = True if args.external_data else None  # None: only when over the limit
    return out, args.checkpoint or out.with_suffix(".ckpt.onnx"), external


def _train_epochs(session: Any, args: argparse.Namespace, data: _Data, first: int,
                  part: tuple[int, int]) -> list[float]:
    feeds = _feed_names(session)
    _, checkpoint, external = _outputs(args)
    losses = []
    for epoch in range(first, args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(data.x))
        progress = _Progress(len(order) // args.batch_size, f"epoch {epoch + 1}/{args.epochs}",
                             quiet=args.quiet or part[0] != 0)
        loss, rate = _epoch(session, data, feeds, order, args.batch_size, progress, part)
        losses.append(loss)
        print(f"epoch {epoch + 1}/{args.epochs}: mean loss {loss:.4f}, "
              f"{_evaluate(session, data, feeds)}, {rate:,.0f} samples/s", flush=True)
        if part[0] == 0:
            session.save(checkpoint, {META_EPOCH: str(epoch + 1), META_SEED: str(args.seed)},
                         external_data=external)
    return losses


def _write_results(session: Any, args: argparse.Namespace, losses: list[float]) -> None:
    out, checkpoint, external = _outputs(args)
    session.save(out, {META_EPOCH: str(args.epochs), META_SEED: str(args.seed)}, external_data=external)
    print(f"wrote {out} (checkpoints: {checkpoint})")
    if args.export:
        session.export_inference(args.export, external_data=external)
        print(f"wrote {args.export} (inference model)")
    if args.plot:
        _plot(args.plot, losses)
        print(f"wrote {args.plot}")
