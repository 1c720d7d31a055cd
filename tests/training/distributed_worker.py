"""One process of tests/training/test_distributed.py's Python-API run: join (when given a
coordinator), train an MLP on the rows in DATA (this process's share of every batch, one batch
per entry), save to OUT, print what it saw as one JSON line.

    python -m tests.training.distributed_worker DATA OUT [--devices N]
           [--coordinator HOST:PORT --num-processes N --process-id I]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from oxla.training import AdamW, Recipe, Schedule, TrainingSession, join, make_trainable
from tests.training.models import mlp, mlp_weights

SIZES = (64, 16, 10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--devices", type=int)
    p.add_argument("--coordinator")
    p.add_argument("--num-processes", type=int)
    p.add_argument("--process-id", type=int)
    args = p.parse_args(argv)
    if args.coordinator:
        join(args.coordinator, args.num_processes, args.process_id)
    shard = np.load(args.data)  # x: (steps, rows, 64), y: (steps, rows)
    recipe = Recipe(Schedule("cosine", warmup=2, total=len(shard["x"])), clip_norm=1.0)
    model = make_trainable(mlp(mlp_weights(SIZES)), "cross_entropy", AdamW(lr=0.02), recipe=recipe)
    sess = TrainingSession(model, devices=args.devices)
    sess.initialize()
    losses = [float(sess.step({"x": x, "labels": y}, outputs=["loss"])["loss"])
              for x, y in zip(shard["x"], shard["y"], strict=True)]
    sess.save(args.out)
    print(json.dumps({"process": sess.process_index, "processes": sess.process_count,
                      "devices": sess.devices, "losses": losses}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
