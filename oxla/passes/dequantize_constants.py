"""DequantizeConstantsPass: DequantizeLinear of initializers becomes a float initializer at load.

A QDQ model stores its weights as int8 with scales; as written, every call dequantizes them
again, and the weight-layout passes cannot lay out a value the graph computes (ResNet-50 QDQ
spent ~half its time there). The value is computed here with the DequantizeLinear rule's own
arithmetic, in numpy: the same subtraction type, one float32 (float64 for float64 outputs)
product rounded once, then the output type; bit-identical to the unfolded graph. Exact layout
ops (Transpose, Reshape, Squeeze, Unsqueeze, Flatten, Identity) applied to a folded weight fold
too, so that the weight-layout passes see the tensor Conv, Gemm or MatMul reads.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import GraphProto, ModelProto, NodeProto, numpy_helper

from oxla.dtypes import to_numpy_dtype
from oxla.graph import attribute_value, drop_initializers, node_reads, tensor_value
from oxla.lowering.interpreter import machine_memory

# A folded float weight takes 4x its int8 bytes (8x for int4): together at most this share of
# the memory budget, so a huge int4 language model keeps dequantizing per call instead.
BUDGET_SHARE = 4
_BF16 = np.dtype(ml_dtypes.bfloat16)
_LAYOUT = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def _param(p: np.ndarray, shape: tuple[int, ...], axis: int, block_size: int) -> np.ndarray | None:
    """The rule's `_param` in numpy; None where the rule would fail (it reports the error)."""
    if p.ndim == 0 or p.size == 1:
        return p.reshape(())
    rank = len(shape)
    if not -rank <= axis < rank or block_size < 0:
        return None
    axis %= rank
    if not block_size:
        if p.ndim != 1 or p.shape[0] != shape[axis]:
            return None
        return p.reshape(tuple(shape[axis] if i == axis else 1 for i in range(rank)))
    p = np.repeat(p, block_size, axis=axis)
    p = np.take(p, np.arange(min(shape[axis], p.shape[axis])), axis=axis)
    return p if tuple(p.shape) == tuple(shape) else None


def dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, *, axis: int = 1,
               block_size: int = 0, output_dtype: int = 0) -> np.ndarray | None:
    """(x - zero_point) * scale exactly as the DequantizeLinear rule computes it; None where the
    rule would fail or the arithmetic is not reproduced here."""
    out = to_numpy_dtype(output_dtype) if output_dtype else np.dtype(scale.dtype)
    if out.kind != "f" and out != _BF16:  # float8 outputs (and float8e8m0, an error) stay nodes
        return None
    wide = np.dtype(np.float64 if out == np.float64 else np.float32)
    sub = np.dtype(np.int32) if x.dtype == np.int32 else wide
    dx = x.astype(sub)
    if zero_point is not None:
        if zero_point.dtype != x.dtype:
            return None
        zp = _param(zero_point, x.shape, axis, block_size)
        if zp is None:
            return None
        with np.errstate(over="ignore"):
            dx = dx - zp.astype(sub)  # int32 wraps, as in XLA
    s = _param(scale, x.shape, axis, block_size)
    if s is None:
        return None
    return np.asarray((dx.astype(wide) * s.astype(wide)).astype(out))


def _layout(node: NodeProto, args: list[np.ndarray], attrs: dict) -> np.ndarray | None:
    """An exact layout op on constant inputs, or None where its rule should decide."""
    x, op = args[0], node.op_type
    try:
        if op == "Identity":
            return x
        if op == "Transpose":
            perm = attrs.get("perm")
            return np.ascontiguousarray(np.transpose(x, None if perm is None else tuple(perm)))
        if op == "Flatten":
            axis = int(attrs.get("axis", 1)) % max(x.ndim, 1) if x.ndim else 0
            return x.reshape(int(np.prod(x.shape[:axis])), -1)
        if op in ("Squeeze", "Unsqueeze"):
            axes = args[1] if len(args) > 1 else attrs.get("axes")
            if axes is None:
                return np.squeeze(x) if op == "Squeeze" else None
            axes = tuple(int(a) for a in np.asarray(axes).reshape(-1))
            return np.squeeze(x, axes) if op == "Squeeze" else np.expand_dims(x, axes)
        if op == "Reshape" and len(args) == 2 and not attrs.get("allowzero", 0):
            shape = [x.shape[i] if int(d) == 0 else int(d) for i, d in enumerate(args[1].reshape(-1))]
            return x.reshape(shape)
    except (ValueError, IndexError, np.exceptions.AxisError):
        return None
    return None


def _foldable(node: NodeProto, folded: set[str]) -> bool:
    """DequantizeLinear, or an exact layout op on a value folded already."""
    if node.op_type == "DequantizeLinear":
        return node.domain in ("", "ai.onnx", "com.microsoft")
    return node.op_type in _LAYOUT and node.domain in ("", "ai.onnx") and node.input[0] in folded


def _fold(node: NodeProto, args: list[np.ndarray | None]) -> np.ndarray | None:
    attrs = {a.name: attribute_value(a) for a in node.attribute}
    if node.op_type == "DequantizeLinear":
        if len(args) < 2 or args[0] is None or args[1] is None:
            return None
        kw = {"axis": int(attrs.get("axis", 1))}
        if node.domain != "com.microsoft":  # the contrib form has axis only
            kw |= {"block_size": int(attrs.get("block_size", 0)),
                   "output_dtype": int(attrs.get("output_dtype", 0))}
        return dequantize(args[0], args[1], args[2] if len(args) > 2 else None, **kw)
    if all(a is not None for a in args):
        return _layout(node, args, attrs)  # type: ignore[arg-type]
    return None


def dequantize_constants(model: ModelProto, memory_limit: int | None = None) -> int:
    """Fold DequantizeLinear of initializers (and exact layout ops on the result) into float
    initializers; drop quantized initializers nothing reads any more. Returns how many nodes."""
    graph = model.graph
    budget = (memory_limit or machine_memory()) // BUDGET_SHARE
    fixed = {i.name for i in graph.input} | {o.name for o in graph.output}
    values = {t.name: t for t in graph.initializer if t.name not in fixed}
    cache: dict[str, np.ndarray] = {}
    folded: set[str] = set()
    consumed: set[str] = set()
    keep, used = [], 0
    for node in graph.node:
        names = list(node.input)
        value = None
        if names and names[0] and len(node.output) == 1 and node.output[0] not in fixed \
                and _foldable(node, folded) and all(n == "" or n in values for n in names):
            args = [None if n == "" else _array(values[n], cache) for n in names]
            value = _fold(node, args)
        if value is None or used + value.nbytes > budget:
            keep.append(node)
            continue
        used += value.nbytes
        consumed.update(names)
        tensor = numpy_helper.from_array(value, node.output[0])
        graph.initializer.append(tensor)
        values[tensor.name] = tensor
        cache[tensor.name] = value
        folded.add(tensor.name)
    removed = len(graph.node) - len(keep)
    if removed:
        del graph.node[:]
        graph.node.extend(keep)
        _drop_unread(graph, consumed - fixed)
    return removed


def _array(tensor, cache: dict[str, np.ndarray]) -> np.ndarray:
    if tensor.name not in cache:
        cache[tensor.name] = tensor_value(tensor.name, lambda: numpy_helper.to_array(tensor))
    return cache[tensor.name]


def _drop_unread(graph: GraphProto, candidates: set[str]) -> None:
    """Remove the initializers in `candidates` that no node reads any more."""
    read = set().union(*(node_reads(n) for n in graph.node))
    drop_initializers(graph, lambda name: name not in read and name in candidates)
