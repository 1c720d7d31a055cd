"""BatchNormFoldPass: an inference BatchNormalization after a Conv folds into its weights.

Y = scale (Conv(X, W) + B - mean) / sqrt(var + epsilon) + beta is Conv(X, W', B') with
W' = W s per output channel and B' = (B - mean) s + beta, s = scale / sqrt(var + epsilon), as
onnxruntime's ConvBNFusion does when it loads a model. Exporters that fold it themselves (torch
in eval mode) write no such pair; caffe2's files (the ONNX model zoo's and onnx's light zoo
files) and training-style exports do: the light zoo's ResNet-50 ran its 53 BatchNormalizations as
passes of their own after convolutions whose epilogue could have applied them.

Only a Conv of float32 initializer weights (and bias) whose output the BatchNormalization alone
reads, with float32 initializer statistics of one value per output channel (not graph inputs:
those the caller may feed), in inference form
(one output, no training_mode; `spatial` 1 before opset 9) is folded; the new weights are new
initializers (the old ones stay while anything else reads them).
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, numpy_helper

from oxla.graph import (
    add_initializer,
    attribute_value,
    drop_initializers,
    is_onnx_op,
    model_opsets,
    node_reads,
    tensor_value,
)

SUFFIX = "__oxla_bn"


def fold_batch_norms(model: ModelProto) -> int:
    """Fold each eligible Conv -> BatchNormalization pair of the main graph; returns how many."""
    graph = model.graph
    opset = model_opsets(model.opset_import).get("", 0)
    fed = {i.name for i in graph.input}
    inits = {t.name: t for t in graph.initializer
             if t.name not in fed and t.data_type == TensorProto.FLOAT}
    nodes = list(graph.node)  # one wrapper per node, held: ids stay theirs
    readers: dict[str, int] = {o.name: 1 for o in graph.output}
    for node in nodes:
        for name in node_reads(node):
            readers[name] = readers.get(name, 0) + 1
    convs = {n.output[0]: n for n in nodes if is_onnx_op(n, "Conv") and len(n.output) == 1
             and len(n.input) >= 2 and n.input[1] in inits and (len(n.input) < 3 or not n.input[2]
                                                                or n.input[2] in inits)}
    folded: set[int] = set()
    for bn in nodes:
        conv = convs.get(bn.input[0]) if is_onnx_op(bn, "BatchNormalization") and bn.input else None
        if conv is None or readers.get(conv.output[0]) != 1 or not _inference(bn, opset):
            continue
        made = _fold(conv, bn, inits)
        if made is None:
            continue
        w, b = made
        names = (f"{bn.output[0]}{SUFFIX}_w", f"{bn.output[0]}{SUFFIX}_b")
        for v, n in zip((w, b), names, strict=True):
            add_initializer(graph, n, v)
        del conv.input[1:]
        conv.input.extend(names)
        conv.output[0] = bn.output[0]
        folded.add(id(bn))
    if folded:
        kept = [n for n in nodes if id(n) not in folded]
        del graph.node[:]
        graph.node.extend(kept)
        read = {name for n in graph.node for name in node_reads(n)} | {o.name for o in graph.output}
        drop_initializers(graph, lambda name: name not in read and name not in fed)
    return len(folded)


def _inference(bn: NodeProto, opset: int) -> bool:
    """A BatchNormalization in inference form: one output, not training_mode, spatial (before
    opset 9) 1, five inputs."""
    attrs = {a.name: attribute_value(a) for a in bn.attribute}
    if len(bn.input) != 5 or len([o for o in bn.output if o]) != 1 or bn.output[0] == "":
        return False
    if attrs.get("training_mode", 0) or (opset < 9 and attrs.get("spatial", 1) != 1):
        return False
    return set(attrs) <= {"epsilon", "momentum", "spatial", "training_mode", "is_test"}


def _fold(conv: NodeProto, bn: NodeProto, inits: dict[str, TensorProto]
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """(W', B') of the pair, or None when a statistic is not a float32 initializer of one value
    per output channel."""
    values = []
    for name in (conv.input[1], *bn.input[1:]):
        if name not in inits:
            return None
        values.append(tensor_value(name, lambda n=name: numpy_helper.to_array(inits[n])))
    w, scale, beta, mean, var = values
    m = w.shape[0] if w.ndim >= 3 else 0
    if m == 0 or any(v.shape != (m,) for v in (scale, beta, mean, var)):
        return None
    bias = np.zeros(m, np.float64)
    if len(conv.input) > 2 and conv.input[2]:
        b = tensor_value(conv.input[2], lambda: numpy_helper.to_array(inits[conv.input[2]]))
        if b.shape != (m,):
            return None
        bias = b.astype(np.float64)
    epsilon = next((float(attribute_value(a)) for a in bn.attribute if a.name == "epsilon"), 1e-5)
    s = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    folded_w = (w.astype(np.float64) * s.reshape((m,) + (1,) * (w.ndim - 1))).astype(np.float32)
    folded_b = ((bias - mean.astype(np.float64)) * s + beta.astype(np.float64)).astype(np.float32)
    return folded_w, folded_b
