"""The rule table: (domain, op_type, since_version) -> rule; lookup takes the greatest since <= opset."""

from __future__ import annotations

import bisect
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from oxla.graph import canonical_domain

RuleFn = Callable[..., Any]


@dataclass(frozen=True)
class Rule:
    """One lowering rule: the function and what the interpreter must know to call it."""

    domain: str
    op_type: str
    since: int
    fn: RuleFn
    inputs: tuple[str, ...]          # positional input names, in schema order
    variadic: bool                   # the last input is *args
    static: frozenset[int]           # input positions that must be known at trace time
    static_all: bool                 # every input must be static (host ops)
    fold: bool                       # evaluate at trace time when every input is static
    attrs: dict[str, Any] = field(default_factory=dict)  # attribute name -> default
    # a host step may call this first with the node's first input (concrete): the outputs, or
    # None to run the rule as usual (no conversions, checks or context: for a cheap common case)
    host: Callable[[Any], tuple[Any, ...] | None] | None = None

    def static_position(self, index: int) -> bool:
        if self.static_all:
            return True
        if self.variadic and index >= len(self.inputs) - 1:
            return (len(self.inputs) - 1) in self.static
        return index in self.static

    def input_name(self, index: int) -> str:
        if index < len(self.inputs):
            return self.inputs[index]
        return self.inputs[-1] if self.inputs else f"input {index}"


_RULES: dict[tuple[str, str], list[Rule]] = {}
_MISSING = inspect.Parameter.empty


def _describe(fn: RuleFn, static: Iterable[str]) -> tuple[tuple[str, ...], bool, frozenset[int],
                                                           bool, dict[str, Any]]:
    params = list(inspect.signature(fn).parameters.values())[1:]  # drop cx
    inputs: list[str] = []
    variadic = False
    attrs: dict[str, Any] = {}
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            inputs.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            inputs.append(p.name)
            variadic = True
        elif p.kind is p.KEYWORD_ONLY:
            attrs[p.name] = None if p.default is _MISSING else p.default
    wanted = set(static)
    static_all = "*" in wanted
    wanted.discard("*")
    unknown = wanted - set(inputs)
    if unknown:
        raise TypeError(f"rule {fn.__name__}: static names {sorted(unknown)} are not inputs")
    positions = frozenset(i for i, name in enumerate(inputs) if name in wanted)
    return tuple(inputs), variadic, positions, static_all, attrs


def rule(op_type: str | Iterable[str], since: int, *, domain: str = "",
         static: Iterable[str] = (), fold: bool = True,
         host: Callable[[Any], tuple[Any, ...] | None] | None = None
         ) -> Callable[[RuleFn], RuleFn]:
    """Register `fn` as the lowering of `op_type` from opset `since` on.

    Inputs are positional parameters after `cx`; attributes are keyword-only parameters with the
    schema's spelling and defaults. `static` names inputs that must be known at trace time
    ("*" for all of them: host ops such as NonZero); `fold=False` for ops that must not be
    evaluated at trace time even on constant inputs (random ops); `host` (host ops) a shortcut the
    executor's host step tries first (see Rule.host).
    """
    names = [op_type] if isinstance(op_type, str) else list(op_type)

    def register(fn: RuleFn) -> RuleFn:
        inputs, variadic, positions, static_all, attrs = _describe(fn, static)
        for name in names:
            entry = Rule(canonical_domain(domain), name, since, fn, inputs, variadic,
                         positions, static_all, fold, attrs, host)
            versions = _RULES.setdefault((entry.domain, name), [])
            if any(r.since == since for r in versions):
                raise ValueError(f"two rules for {domain or 'ai.onnx'}::{name} since {since}")
            bisect.insort(versions, entry, key=lambda r: r.since)
        return fn

    return register


def register_rule(op_type: str, since: int, fn: RuleFn, **kwargs: Any) -> None:
    """Functional form of @rule, for family factories."""
    rule(op_type, since, **kwargs)(fn)


def _load_rules() -> None:
    """Import every rule family (once): the table is complete whoever reads it first."""
    import oxla.lowering.ops  # noqa: F401  (registers every rule on import)


def lookup(domain: str, op_type: str, opset: int) -> Rule | None:
    """The rule with the greatest since <= opset, or None."""
    _load_rules()
    versions = _RULES.get((canonical_domain(domain), op_type))
    if not versions:
        return None
    i = bisect.bisect_right([r.since for r in versions], opset)
    return versions[i - 1] if i else None


def known_versions(domain: str, op_type: str) -> list[int]:
    """Every since-version that has a rule, for error messages."""
    _load_rules()
    return [r.since for r in _RULES.get((canonical_domain(domain), op_type), [])]


def all_rules() -> list[Rule]:
    """Every registered rule (for coverage tests and `oxla info`)."""
    _load_rules()
    return [r for versions in _RULES.values() for r in versions]
