"""Input element types against the op schema's type constraints, checked once per node per trace.

onnxruntime picks a kernel by the input types and refuses a node none matches; oxla's rules are
written for the types the schema allows. A node reading any other type (a model whose Add reads a
float6 initializer, an Add of float32 and float64) is an invalid model, said so with the node,
instead of a silently promoted result or an abort inside XLA (XLA:CPU has no literal support for
some of the new small types).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.defs

from oxla.dtypes import to_onnx_type
from oxla.errors import InvalidModelError, NodeRef

# (formal input name, type parameter or None, allowed tensor types, homogeneous across inputs)
_Formal = tuple[str, str | None, frozenset[str], bool]


@functools.lru_cache(maxsize=4096)
def _formals(domain: str, op: str, opset: int) -> tuple[tuple[_Formal, ...], bool] | None:
    """The schema's formal inputs and whether the last one is variadic; None without a schema."""
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
    except onnx.defs.SchemaError:
        return None
    constraints = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}
    formals = []
    for formal in schema.inputs:
        allowed = constraints.get(formal.type_str, frozenset({formal.type_str}))
        param = formal.type_str if formal.type_str in constraints else None
        formals.append((formal.name, param, allowed, bool(formal.is_homogeneous)))
    variadic = bool(schema.inputs) and \
        schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    return tuple(formals), variadic


@functools.lru_cache(maxsize=64)
def _type_string(dtype: np.dtype) -> str | None:
    try:
        elem = to_onnx_type(dtype)
    except InvalidModelError:  # no ONNX type (a rule's internal value): nothing to check
        return None
    return f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"


_PASSED: set[tuple[object, ...]] = set()  # (domain, op, opset, input dtypes) that passed
_PASSED_MOST = 1 << 16


def check_input_types(ref: NodeRef, inputs: Sequence[object]) -> None:
    """Raise InvalidModelError when an input's element type is not one the op's schema allows, or
    two inputs bound to one type parameter differ. Sequences, maps and optionals are not checked."""
    key = (ref.domain, ref.op_type, ref.opset,
           tuple([None if isinstance(v, list | dict) else getattr(v, "dtype", None) for v in inputs]))
    if key in _PASSED:  # host steps check the same node every call
        return
    found = _formals(ref.domain, ref.op_type, ref.opset)
    if found is None:
        return
    formals, variadic = found
    bound: dict[str, tuple[str, str]] = {}  # type parameter -> (type, formal input that set it)
    for i, value in enumerate(inputs):
        if value is None or isinstance(value, list | dict):
            continue
        if i < len(formals):
            formal = formals[i]
        elif variadic and formals:
            formal = formals[-1]
        else:
            return  # too many inputs: the rule's own arity check says so
        dtype = getattr(value, "dtype", None)
        if dtype is None:
            continue
        got = _type_string(np.dtype(dtype))
        name, param, allowed, _ = formal
        tensors = {t for t in allowed if t.startswith("tensor(")}
        if got is None or not tensors:
            continue
        if got not in tensors:
            raise InvalidModelError(
                f"{ref.describe()}: input {i} ('{name}') is {got}, which this op does not take; "
                f"it takes {_listing(tensors)}. Cast the input or fix the model's types.")
        if param is None or (variadic and i >= len(formals) - 1):  # variadic: checked per input only
            continue
        first = bound.setdefault(param, (got, name))
        if first[0] != got:
            raise InvalidModelError(
                f"{ref.describe()}: input {i} ('{name}') is {got} but input '{first[1]}' is "
                f"{first[0]}; both are type {param} and must be the same. Cast one of them.")
    if len(_PASSED) >= _PASSED_MOST:
        _PASSED.clear()
    _PASSED.add(key)


def _listing(types: set[str], most: int = 10) -> str:
    names = sorted(types)
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
