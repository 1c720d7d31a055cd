"""Sequences and optionals: a sequence is a Python list of tensors, an empty optional is None."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from oxla.lowering.common import axis_index, check_size
from oxla.lowering.registry import rule
from oxla.lowering.values import is_static


def _position(cx, position, length: int, *, inserting: bool = False) -> int:
    """A (possibly negative) static position, checked against the sequence length."""
    (pos,) = cx.static_ints(position, "position")
    top = length if inserting else length - 1
    if not -length <= pos <= top:
        raise cx.fail(f"position {pos} is out of range for a sequence of {length} "
                      f"(accepted: {-length}..{top})")
    return pos + length if pos < 0 else pos


@rule("SequenceConstruct", since=11)
def sequence_construct(cx, *inputs):
    """[inputs...]  (v11+)."""
    return list(inputs)


@rule("SequenceEmpty", since=11)
def sequence_empty(cx, *, dtype=None):
    """[]  (v11+)."""
    # A list carries no element type; dtype only matters to type inference, which oxla skips.
    return []


@rule("SequenceLength", since=11)
def sequence_length(cx, input_sequence):
    """len(input_sequence) as an int64 scalar  (v11+); always known at trace time."""
    return np.array(len(input_sequence), np.int64)


@rule("SequenceAt", since=11)
def sequence_at(cx, input_sequence, position):
    """input_sequence[position], negative positions count from the end  (v11+)."""
    n = len(input_sequence)
    if is_static(position) or not _uniform(input_sequence):
        return input_sequence[_position(cx, position, n)]
    # A run-time position into equally shaped tensors: index their stack (out-of-range clamps).
    pos = jnp.reshape(position, ()).astype(jnp.int64)
    return jnp.stack(input_sequence)[jnp.where(pos < 0, pos + n, pos)]


def _uniform(seq: list) -> bool:
    return bool(seq) and all(t.shape == seq[0].shape and t.dtype == seq[0].dtype for t in seq)


@rule("SequenceInsert", since=11, static=("position",))
def sequence_insert(cx, input_sequence, tensor, position=None):
    """input_sequence with tensor inserted before position (default: appended)  (v11+)."""
    n = len(input_sequence)
    pos = n if position is None else _position(cx, position, n, inserting=True)
    return [*input_sequence[:pos], tensor, *input_sequence[pos:]]


@rule("SequenceErase", since=11, static=("position",))
def sequence_erase(cx, input_sequence, position=None):
    """input_sequence without the tensor at position (default: the last)  (v11+)."""
    n = len(input_sequence)
    if n == 0:
        raise cx.fail("cannot erase from an empty sequence")
    pos = n - 1 if position is None else _position(cx, position, n)
    return [*input_sequence[:pos], *input_sequence[pos + 1:]]


@rule("SplitToSequence", since=11, static=("split",))
def split_to_sequence(cx, input, split=None, *, axis=0, keepdims=1):
    """Split input along axis into parts of lengths split (scalar: chunks of that size)  (v11+)."""
    axis = axis_index(cx, axis, len(input.shape))
    size = input.shape[axis]
    xp = np if is_static(input) else jnp
    if split is None:
        parts = [xp.take(input, i, axis=axis) if not keepdims
                 else xp.take(input, np.arange(i, i + 1), axis=axis) for i in range(size)]
        return parts
    lengths = _split_lengths(cx, np.asarray(split), size)
    bounds = np.cumsum(lengths)[:-1].tolist()
    return list(xp.split(input, bounds, axis=axis))


def _split_lengths(cx, split: np.ndarray, size: int) -> list[int]:
    if np.any(split < 0):
        raise cx.fail(f"split must be non-negative, got {split.tolist()}")
    if split.ndim == 0:
        chunk = int(split)
        if chunk == 0:
            raise cx.fail("a scalar split must be positive, got 0")
        # The last chunk alone may be shorter when size is not a multiple of split.
        return [min(chunk, size - start) for start in range(0, size, chunk)] or [0]
    lengths = [int(v) for v in split.reshape(-1)]
    if sum(lengths) != size:
        raise cx.fail(f"split {lengths} sums to {sum(lengths)}, the axis has length {size}")
    return lengths


@rule("ConcatFromSequence", since=11)
def concat_from_sequence(cx, input_sequence, *, axis=None, new_axis=0):
    """concat(input_sequence, axis), or stack along a new axis when new_axis=1  (v11+)."""
    if axis is None:
        raise cx.fail("attribute 'axis' is required")
    if not input_sequence:
        raise cx.fail("cannot concatenate an empty sequence (its element type is unknown)")
    rank = len(input_sequence[0].shape) + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise cx.fail(f"axis {axis} is out of range for rank {rank}")
    first = input_sequence[0]
    total = sum(math.prod(t.shape) for t in input_sequence)
    check_size(cx, [total], first.dtype)  # the joined tensor holds every element once
    xp = np if is_static(input_sequence) else jnp
    if new_axis:
        return xp.stack(input_sequence, axis=axis)
    return xp.concatenate(input_sequence, axis=axis)


@rule("Optional", since=15)
def optional(cx, input=None, *, type=None):
    """An optional holding input, or an empty optional (None) of the given type  (v15+)."""
    if input is None and type is None:
        raise cx.fail("an empty Optional needs the 'type' attribute")
    return input


@rule("OptionalHasElement", since=15)
def optional_has_element(cx, input=None):
    """input is not an empty optional, as a bool scalar  (v15+; v18+ also plain tensors/sequences)."""
    return np.array(input is not None)


@rule("OptionalGetElement", since=15)
def optional_get_element(cx, input):
    """The value an optional holds  (v15+; v18+ a plain tensor or sequence passes through)."""
    if input is None:
        raise cx.fail("the optional input is empty")
    return input
