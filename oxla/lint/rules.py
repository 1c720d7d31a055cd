"""The lint rule table (id, severity, what, fix) and the Finding each rule reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)


@dataclass(frozen=True)
class Rule:
    """One check: a stable id, how bad a violation is, what it checks and how to fix it."""

    id: str
    severity: str
    what: str
    fix: str
    auto_fix: bool = False  # `oxla lint --fix` applies it


_RULES = (
    # Operator conventions (onnx/docs/OpConventions.md and the style of onnx's own schemas),
    # checked on onnx.defs schemas, a model's custom ops and its model-local functions.
    Rule("op-name-case", ERROR, "An operator name (schema, custom op or model-local function) is "
         "not UpperCamelCase.", "Rename it in UpperCamelCase, e.g. `my_op` -> `MyOp`."),
    Rule("attribute-name-case", ERROR, "An attribute name is not lower case with underscores.",
         "Rename it in snake_case, e.g. `transA` -> `trans_a`."),
    Rule("io-name-case", ERROR, "An input or output name breaks the convention: one letter is upper "
         "case (`X`), a word or words are lower case with underscores (`initial_h`).",
         "Rename it: `x` -> `X`, `Scale` -> `scale`, `Y_h` -> `y_h`."),
    Rule("bias-name", WARNING, "An input holding a bias is not named `B`.", "Rename it `B`."),
    Rule("weight-name", WARNING, "An input holding a weight is not named `W`.", "Rename it `W`."),
    Rule("axis-attribute-type", ERROR, "An attribute `axis` is not a single int, or `axes` is "
         "not a list of ints.", "Use `axis` for one axis (INT) and `axes` for several (INTS)."),
    Rule("integer-type", WARNING, "An index-like integer input or output (axes, shape, indices, "
         "lengths, counts) does not allow int64, the default integer type.",
         "Allow tensor(int64) (and make it the documented default)."),
    Rule("type-param-name", WARNING, "A type parameter name does not start with a capital letter.",
         "Name type parameters like `T`, `T1`, `Tind`."),
    Rule("missing-doc", INFO, "An operator, attribute, input or output has no documentation.",
         "Write a doc string / description."),
    Rule("domain-name", ERROR, "A domain is not lower-case reverse-DNS style.",
         "Use a name like `com.example.ops`."),
    # Model hygiene.
    Rule("unused-initializer", WARNING, "An initializer no node, subgraph, output or training "
         "binding reads.", "Drop it (`--fix` does).", auto_fix=True),
    Rule("unused-input", WARNING, "A graph input nothing reads.", "Remove the input."),
    Rule("initializer-as-input", INFO, "An initializer is also a graph input: callers may "
         "override it, so runtimes cannot treat it as a constant.",
         "Remove it from the graph inputs unless it is meant to be overridden."),
    Rule("topological-order", ERROR, "A node reads a value that a later node produces (or a "
         "cycle).", "Sort the nodes topologically (`--fix` does).", auto_fix=True),
    Rule("undefined-value", ERROR, "A node reads a name that no input, initializer, node or "
         "enclosing graph defines.", "Feed it from a graph input or an initializer, or fix the name."),
    Rule("empty-node-name", INFO, "A node has no name, so errors and profiles cannot point at it.",
         "Name every node (`--fix` fills in `<OpType>_<n>`).", auto_fix=True),
    Rule("duplicate-node-name", ERROR, "Two nodes of one graph share a name (the IR requires "
         "unique node names).", "Rename one of them."),
    Rule("output-not-produced", ERROR, "A graph output that no node, input or initializer produces.",
         "Produce it or remove it from the outputs."),
    Rule("value-info-mismatch", WARNING, "A value_info or output type contradicts shape inference "
         "(element type, rank or a fixed dimension).", "Correct or drop the declared type."),
    Rule("shape-inference-error", WARNING, "onnx shape inference (strict) reports an error: "
         "a node's input types or shapes do not fit its op.", "Fix the node it names."),
    Rule("opset-import-missing", ERROR, "A node uses a domain the model (or function) does not "
         "import.", "Add the domain to opset_import."),
    Rule("opset-import-unused", INFO, "An imported domain no node uses.",
         "Remove it from opset_import."),
    Rule("unknown-op", ERROR, "A node in an ONNX domain names an operator that does not exist at "
         "the imported opset.", "Fix the op name or raise the opset."),
    Rule("deprecated-op", WARNING, "An operator deprecated at the imported opset (Upsample, "
         "Scatter, ...).", "Use its replacement (Resize, ScatterElements, ...)."),
    Rule("deprecated-opset", WARNING, "The default-domain opset is older than 7, the oldest "
         "onnxruntime guarantees to run.", "Convert the model (onnx.version_converter)."),
    Rule("large-constant", WARNING, "A large tensor inlined in a Constant node: tools that "
         "handle weights look at initializers (onnx's external-data conversion skips attributes "
         "by default), and runtimes may fold it into the compiled code.",
         "Make it an initializer."),
    Rule("external-data-outside", ERROR, "External data with an absolute location or one outside "
         "the model's folder.", "Keep external data files beside the model, with relative names."),
    Rule("external-data-missing", ERROR, "An external data file is missing or shorter than the "
         "tensor needs.", "Ship the file with the model."),
    Rule("training-binding-unknown", ERROR, "A training_info binding names no initializer of the "
         "model or no output of its training graph.", "Fix the binding's names."),
)

RULES: dict[str, Rule] = {r.id: r for r in _RULES}


@dataclass(frozen=True)
class Where:
    """Where a finding is: the graph, node, operator, tensor and attribute it concerns."""

    graph: str = ""
    node: str = ""
    op: str = ""
    tensor: str = ""
    attribute: str = ""

    def describe(self) -> str:
        parts = [self.graph and f"graph {self.graph}", self.node and f"node '{self.node}'",
                 self.op, self.attribute and f"attribute '{self.attribute}'",
                 self.tensor and f"'{self.tensor}'"]
        return ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class Finding:
    """One violation: rule, severity, where, message, fix hint and a stable key (grandfathering)."""

    rule: str
    severity: str
    where: Where
    message: str
    fix: str
    key: str

    def to_json(self) -> dict[str, Any]:
        w = self.where
        return {"rule": self.rule, "severity": self.severity, "message": self.message,
                "fix": self.fix, "key": self.key,
                "where": {"graph": w.graph, "node": w.node, "op": w.op, "tensor": w.tensor,
                          "attribute": w.attribute}}

    def describe(self) -> str:
        where = self.where.describe()
        return f"{self.severity}: {self.rule}: {where + ': ' if where else ''}{self.message} (fix: {self.fix})"


def finding(rule: str, where: Where, message: str, subject: str, fix: str = "") -> Finding:
    """A Finding of `rule`; the key is the rule and `subject`, stable across runs and versions.

    Args:
        rule: a RULES id.
        where: where it is.
        message: what is wrong, with the values.
        subject: what the finding is about ("ai.onnx::Gemm attribute transA"), for the key.
        fix: a specific hint; the rule's generic one when empty.

    Returns:
        The finding, with the rule's severity.
    """
    spec = RULES[rule]
    return Finding(rule, spec.severity, where, message, fix or spec.fix, f"{rule}: {subject}")
