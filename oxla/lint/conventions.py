"""ONNX operator conventions (docs/OpConventions.md, and the style of onnx's schemas) on signatures."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from oxla.lint.rules import Finding, Where, finding

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*$")
TYPE_PARAM = re.compile(r"^[A-Z][A-Za-z0-9]*$")
DOMAIN = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
# Inputs/outputs that hold indices, shapes or counts: the convention makes int64 their type.
INDEX_LIKE = re.compile(r"^(axis|axes|shape|indices|sequence_lens|lengths|repeats|starts|ends|"
                        r"steps|pads|sizes|split|k|trip_count|M)$")
INTEGER_TYPES = frozenset(f"tensor({t}{n})" for t in ("int", "uint") for n in (8, 16, 32, 64))
BIAS_NAMES = frozenset({"bias", "biases"})
WEIGHT_NAMES = frozenset({"weight", "weights"})


@dataclass(frozen=True)
class Param:
    """An input or output: its name, allowed types ('tensor(int64)'; () when unknown), doc."""

    name: str
    types: tuple[str, ...] = ()
    description: str | None = None  # None: the source has no descriptions to check


@dataclass(frozen=True)
class Attr:
    """An attribute: its name, type ('INT', 'INTS', ...; '' when unknown) and doc."""

    name: str
    type: str = ""
    description: str | None = None


@dataclass(frozen=True)
class OpSignature:
    """What the conventions look at, from an OpSchema, a FunctionProto or a custom node."""

    domain: str
    name: str
    kind: str  # "schema", "function" or "custom op"
    inputs: tuple[Param, ...] = ()
    outputs: tuple[Param, ...] = ()
    attributes: tuple[Attr, ...] = ()
    type_params: tuple[str, ...] = ()
    doc: str | None = None

    @property
    def label(self) -> str:
        return f"{self.domain or 'ai.onnx'}::{self.name}"


def from_schema(schema: Any) -> OpSignature:
    """The signature of an onnx.defs.OpSchema."""
    constraints = {t.type_param_str: tuple(t.allowed_type_strs) for t in schema.type_constraints}

    def param(p: Any) -> Param:
        return Param(p.name, constraints.get(p.type_str, (p.type_str,)), p.description)

    attrs = tuple(Attr(name, str(a.type).rsplit(".", 1)[-1], a.description)
                  for name, a in sorted(schema.attributes.items()))
    return OpSignature(schema.domain, schema.name, "schema", tuple(map(param, schema.inputs)),
                       tuple(map(param, schema.outputs)), attrs, tuple(constraints), schema.doc)


def snake_case(name: str) -> str:
    """transA -> trans_a, InvStdDev -> inv_std_dev, Y_h -> y_h."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name.replace("-", "_")).lower().strip("_")


def camel_case(name: str) -> str:
    """my_op -> MyOp, myOp -> MyOp."""
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[_\-.]+", name) if part)


def check_domain(domain: str, where: Where) -> list[Finding]:
    """domain-name: '' (the default domain) or lower-case reverse-DNS."""
    if domain == "" or DOMAIN.match(domain):
        return []
    return [finding("domain-name", where, f"domain '{domain}' is not lower-case reverse-DNS style",
                    f"domain {domain}", f"Use a name like '{domain.lower().replace('-', '_')}'.")]


def check_signature(sig: OpSignature) -> list[Finding]:
    """Every convention rule on one operator signature.

    Args:
        sig: the operator (schema, model-local function or custom op).

    Returns:
        The findings; keys name the op and the offending name, never the version, so a new
        version of an op keeps the exceptions its older versions were granted.
    """
    out = _name_findings(sig) + _attribute_findings(sig) + _type_param_findings(sig)
    for kind, params in (("input", sig.inputs), ("output", sig.outputs)):
        for p in params:
            out += _param_findings(sig, kind, p)
    return out + _doc_findings(sig)


def _name_findings(sig: OpSignature) -> list[Finding]:
    if CAMEL.match(sig.name):
        return []
    where = Where(op=sig.label)
    return [finding("op-name-case", where, f"{sig.kind} name '{sig.name}' is not UpperCamelCase",
                    sig.label, f"Rename it '{camel_case(sig.name)}'.")]


def _attribute_findings(sig: OpSignature) -> list[Finding]:
    out = []
    for a in sig.attributes:
        where = Where(op=sig.label, attribute=a.name)
        subject = f"{sig.label} attribute {a.name}"
        if not SNAKE.match(a.name):
            out.append(finding("attribute-name-case", where, f"attribute '{a.name}' is not lower "
                               "case with underscores", subject, f"Rename it '{snake_case(a.name)}'."))
        wrong = (a.name == "axis" and a.type not in ("", "INT")) or (
            a.name == "axes" and a.type not in ("", "INTS"))
        if wrong:
            want = "INT" if a.name == "axis" else "INTS"
            out.append(finding("axis-attribute-type", where, f"attribute '{a.name}' has type "
                               f"{a.type}, expected {want}", subject))
    return out


def _param_findings(sig: OpSignature, kind: str, p: Param) -> list[Finding]:
    out = []
    where = Where(op=sig.label, tensor=p.name)
    subject = f"{sig.label} {kind} {p.name}"
    if len(p.name) == 1 and not p.name.isupper():
        out.append(finding("io-name-case", where, f"one-letter {kind} '{p.name}' is not upper case",
                           subject, f"Rename it '{p.name.upper()}'."))
    elif len(p.name) > 1 and not SNAKE.match(p.name):
        out.append(finding("io-name-case", where, f"{kind} '{p.name}' is not lower case with "
                           "underscores", subject, f"Rename it '{snake_case(p.name)}'."))
    if kind == "input" and p.name.lower() in BIAS_NAMES:
        out.append(finding("bias-name", where, f"bias input named '{p.name}'", subject))
    if kind == "input" and p.name.lower() in WEIGHT_NAMES:
        out.append(finding("weight-name", where, f"weight input named '{p.name}'", subject))
    types = set(p.types)
    if INDEX_LIKE.match(p.name) and types and types <= INTEGER_TYPES and "tensor(int64)" not in types:
        out.append(finding("integer-type", where, f"{kind} '{p.name}' allows only "
                           f"{', '.join(sorted(types))}, not int64", subject))
    return out


def _type_param_findings(sig: OpSignature) -> list[Finding]:
    return [finding("type-param-name", Where(op=sig.label), f"type parameter '{t}' does not start "
                    "with a capital letter", f"{sig.label} type parameter {t}")
            for t in sig.type_params if not TYPE_PARAM.match(t)]


def _doc_findings(sig: OpSignature) -> list[Finding]:
    out = []
    if sig.doc is not None and not sig.doc.strip():
        out.append(finding("missing-doc", Where(op=sig.label), f"{sig.kind} '{sig.name}' has no "
                           "documentation", f"{sig.label}"))
    items = [("attribute", a.name, a.description) for a in sig.attributes]
    items += [(kind, p.name, p.description) for kind, params in
              (("input", sig.inputs), ("output", sig.outputs)) for p in params]
    for kind, name, text in items:
        if text is not None and not text.strip():
            where = (Where(op=sig.label, attribute=name) if kind == "attribute"
                     else Where(op=sig.label, tensor=name))
            out.append(finding("missing-doc", where, f"{kind} '{name}' has no description",
                               f"{sig.label} {kind} {name}"))
    return out
