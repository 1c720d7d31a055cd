"""The oxla exception hierarchy; the wording of messages lives here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


class OxlaError(Exception):
    """Base class of every error oxla raises on purpose."""


class InvalidModelError(OxlaError):
    """The file or proto is not a usable ONNX model (garbage, truncated, unsafe external data)."""


class UnsupportedOpError(OxlaError):
    """The model uses operators oxla has neither a rule nor a function body for."""


class ShapeError(OxlaError):
    """A value has a shape or rank the op (or the model's declared inputs) does not accept."""


class NotStaticError(OxlaError):
    """A value that must be known at compile time is computed from data."""


class LoweringError(OxlaError):
    """A rule failed while lowering a node; the message names the node, op and opset."""


class InputError(OxlaError, ValueError):
    """The feeds passed to `run` do not match the model's inputs (name, dtype or shape)."""


class ResourceError(OxlaError):
    """A value would need more memory than the configured limit (checked before allocating)."""


class TrainingError(OxlaError):
    """The model's training section is malformed or a training step cannot run."""


@dataclass(frozen=True)
class NodeRef:
    """Where an error happened: enough to find the node in the model."""

    name: str
    op_type: str
    domain: str
    opset: int

    def describe(self) -> str:
        domain = self.domain or "ai.onnx"
        name = f" '{self.name}'" if self.name else ""
        return f"{self.op_type} node{name} ({domain} v{self.opset})"


def describe_value(value: object) -> str:
    """A short description of a runtime value: 'shape (4, 3) float32', 'sequence of 2', 'none'."""
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return f"sequence of {len(value)}"
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None:
        return type(value).__name__
    return f"shape {tuple(shape)} {dtype}"


def format_bytes(n: float) -> str:
    """A byte count for people: '512 bytes', '3.8 MiB', '14.6 TiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def too_large(where: str, shape: Sequence[int], dtype: Any, size: int, limit: int) -> ResourceError:
    """A value that would need more than the memory limit, refused before it is allocated."""
    return ResourceError(
        f"{where}: an output of shape {tuple(shape)} {dtype} would take {format_bytes(size)}, more "
        f"than the memory limit {format_bytes(limit)}; check the inputs, or raise "
        "Options.memory_limit / InferenceSession(memory_limit=...)")


def rule_failure(node: NodeRef, inputs: Sequence[object], cause: BaseException) -> LoweringError:
    """Wrap an exception raised inside a rule with the node's context."""
    shapes = ", ".join(describe_value(v) for v in inputs)
    text = str(cause).strip() or type(cause).__name__
    return LoweringError(f"{node.describe()}: {text} (inputs: {shapes or 'none'})")


def unsupported_ops(gaps: Iterable[tuple[Any, ...]]) -> UnsupportedOpError:
    """One error listing every (domain, op, opset, node[, reason]) oxla cannot run."""
    lines = []
    nchwc = False
    for gap in sorted(set(gaps)):
        domain, op, opset, node = gap[:4]
        why = f": {gap[4]}" if len(gap) > 4 and gap[4] else ""
        lines.append(f"  {domain or 'ai.onnx'}::{op} at opset {opset} (node '{node}'){why}")
        nchwc = nchwc or domain == "com.microsoft.nchwc"
    # onnxruntime's ORT_ENABLE_ALL level saves its CPU's blocked layout (8 or 16 channels a block
    # by its instruction set), which its own documentation says not to ship
    hint = ("\nThe com.microsoft.nchwc ops are onnxruntime's blocked layout for the CPU that saved "
            "the file (SessionOptions.graph_optimization_level ORT_ENABLE_ALL): save the model at "
            "ORT_ENABLE_EXTENDED instead, whose fused ops oxla runs." if nchwc else "")
    return UnsupportedOpError(
        "The model uses operators oxla cannot run (no lowering rule and no function body):\n"
        + "\n".join(lines)
        + "\nWhat to do: convert the model to a supported opset, replace these ops, or"
        " provide them as model-local functions." + hint
    )
