"""Build models/digits_mlp.onnx: an MLP for the 8x8 digits with its training recipe inside.

    .venv/bin/python scripts/make_digits_model.py

The inference graph is 64 -> 128 -> 64 -> 10 (Gemm + Relu, He-initialised with a fixed seed);
oxla.training.make_trainable adds a TrainingInfoProto built from standard ops only:
SoftmaxCrossEntropyLoss, Gradient and Adam, with the learning rate and step counter stored as
initializers of the algorithm graph. `make run` trains it with oxla.TrainingSession.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from oxla.training import Adam, make_trainable

REPO = Path(__file__).resolve().parent.parent
SIZES = (64, 128, 64, 10)
SEED = 0
LEARNING_RATE = 3e-3


def mlp(sizes: Sequence[int] = SIZES, seed: int = SEED) -> onnx.ModelProto:
    """The inference MLP: image float[N, 64] -> logits float[N, 10]."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    x = "image"
    for i, (din, dout) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((din, dout)) * np.sqrt(2.0 / din)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"fc{i}.weight"),
                  numpy_helper.from_array(np.zeros(dout, np.float32), f"fc{i}.bias")]
        last = i == len(sizes) - 2
        out = "logits" if last else f"fc{i}"
        nodes.append(helper.make_node("Gemm", [x, f"fc{i}.weight", f"fc{i}.bias"], [out], name=f"fc{i}"))
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"relu{i}"], name=f"relu{i}"))
            out = f"relu{i}"
        x = out
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", sizes[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              producer_name="oxla scripts/make_digits_model.py")
    model.ir_version = 8
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "models" / "digits_mlp.onnx")
    args = parser.parse_args(argv)
    model = make_trainable(mlp(), "cross_entropy", Adam(lr=LEARNING_RATE), labels="label")
    onnx.checker.check_model(model)
    onnx.save(model, args.out)
    print(f"wrote {args.out}: {len(model.graph.node)} inference nodes, "
          f"{len(model.training_info[0].algorithm.node)} algorithm nodes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
