"""`oxla lint`: every rule fires on a model that breaks it and stays quiet on one that does not."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import helper, numpy_helper

from oxla.cli import main
from oxla.lint.model import lint_model
from oxla.lint.rules import RULES, Finding
from oxla.lint.schemas import GRANDFATHER, lint_schemas, load_grandfather, triage

HEAD = '<ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>'
PLAIN = '<ir_version: 8, opset_import: ["" : 17]>'
# Every node named, everything used: no finding at all (the baseline the cases vary).
CLEAN = PLAIN + """
g (float[2, 3] x) => (float[2, 3] y) { [relu] t = Relu(x)
  [neg] y = Neg(t) }
"""


def _parse(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(text)


def _graph(body: str, inputs: str = "float[2, 3] x", outputs: str = "float[2, 3] y",
           head: str = PLAIN) -> onnx.ModelProto:
    return _parse(f"{head}\ng ({inputs}) => ({outputs}) {{ {body} }}")


def _custom(op: str = "MyOp", attrs: str = "", domain: str = "com.example") -> onnx.ModelProto:
    head = HEAD.replace("com.example", domain)
    return _graph(f"[c] y = {domain}.{op}{'<' + attrs + '>' if attrs else ''}(x)", head=head)


def _function(inputs: str = "X", doc: str = "Doubles.") -> onnx.ModelProto:
    first = inputs.split(",")[0].strip()
    model = _parse(f"""{HEAD}
g (float[2, 3] x) => (float[2, 3] y) {{ [call] y = com.example.Twice(x, x) }}
<domain: "com.example", opset_import: ["" : 17]>
Twice ({inputs}) => (Y) {{ [add] Y = Add({first}, {first}) }}
""")
    model.functions[0].doc_string = doc
    return model


def _with_initializer(name: str, as_input: bool = False, read: bool = True) -> onnx.ModelProto:
    body = f"[add] y = Add(x, {name})" if read else "[relu] y = Relu(x)"
    model = _graph(body)
    model.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3), np.float32), name))
    if as_input:
        model.graph.input.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [2, 3]))
    return model


def _schema(name: str = "GoodOp", inputs: tuple[tuple[str, str], ...] = (("X", "T"),),
            constraints: tuple[tuple[str, list[str]], ...] = (("T", ["tensor(float)"]),),
            doc: str = "Does things.") -> onnx.defs.OpSchema:
    param = onnx.defs.OpSchema.FormalParameter
    return onnx.defs.OpSchema(
        name, "com.example.lint", 1, doc, inputs=[param(n, t, "an input") for n, t in inputs],
        outputs=[param("Y", inputs[0][1], "the output")],
        type_constraints=[(t, types, "types") for t, types in constraints])


def _external(tmp_path: Path, location: str, write: bool = True) -> tuple[onnx.ModelProto, Path]:
    model = _with_initializer("w")
    tensor = model.graph.initializer[0]
    if write:
        (tmp_path / "w.bin").write_bytes(tensor.raw_data)
    tensor.ClearField("raw_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": "0", "length": "24"}.items():
        tensor.external_data.add(key=k, value=v)
    return model, tmp_path


def _training(key: str) -> onnx.ModelProto:
    model = _with_initializer("w")
    init = helper.make_graph([helper.make_node("Identity", ["w"], ["w_init"], name="i")], "init",
                             [], [helper.make_tensor_value_info("w_init", onnx.TensorProto.FLOAT, [2, 3])])
    info = helper.make_training_info(helper.make_graph([], "algo", [], []), [], init, [(key, "w_init")])
    model.training_info.append(info)
    return model


def _rules(model: onnx.ModelProto, base: Path | None = None) -> set[str]:
    return {f.rule for f in lint_model(model, base_dir=base)}


def _schema_rules(schema: onnx.defs.OpSchema) -> set[str]:
    return {f.rule for f in lint_schemas(schemas=[schema])}


Case = Callable[[Path], set[str]]

# rule -> (what breaks it, what does not); each returns the rules that fired.
CASES: dict[str, tuple[Case, Case]] = {
    "op-name-case": (lambda _: _rules(_custom("my_op")), lambda _: _rules(_custom("MyOp"))),
    "attribute-name-case": (lambda _: _rules(_custom(attrs="fooBar = 1")),
                            lambda _: _rules(_custom(attrs="foo_bar = 1"))),
    "io-name-case": (lambda _: _rules(_function("x")), lambda _: _rules(_function("X"))),
    "bias-name": (lambda _: _rules(_function("X, bias")), lambda _: _rules(_function("X, B"))),
    "weight-name": (lambda _: _rules(_function("X, weight")), lambda _: _rules(_function("X, W"))),
    "axis-attribute-type": (lambda _: _rules(_custom(attrs="axis = [1, 2]")),
                            lambda _: _rules(_custom(attrs="axis = 1, axes = [1, 2]"))),
    "integer-type": (
        lambda _: _schema_rules(_schema(inputs=(("X", "T"), ("indices", "I")), constraints=(
            ("T", ["tensor(float)"]), ("I", ["tensor(int32)"])))),
        lambda _: _schema_rules(_schema(inputs=(("X", "T"), ("indices", "I")), constraints=(
            ("T", ["tensor(float)"]), ("I", ["tensor(int32)", "tensor(int64)"]))))),
    "type-param-name": (
        lambda _: _schema_rules(_schema(inputs=(("X", "t"),), constraints=(("t", ["tensor(float)"]),))),
        lambda _: _schema_rules(_schema())),
    "missing-doc": (lambda _: _rules(_function(doc="")), lambda _: _rules(_function())),
    "domain-name": (lambda _: _rules(_custom(domain="Com.Example")), lambda _: _rules(_custom())),
    "unused-initializer": (lambda _: _rules(_with_initializer("w", read=False)),
                           lambda _: _rules(_with_initializer("w"))),
    "unused-input": (lambda _: _rules(_graph("[r] y = Relu(x)", "float[2, 3] x, float[2] z")),
                     lambda _: _rules(_graph("[r] y = Relu(x)"))),
    "initializer-as-input": (lambda _: _rules(_with_initializer("w", as_input=True)),
                             lambda _: _rules(_with_initializer("w"))),
    "topological-order": (lambda _: _rules(_graph("[neg] y = Neg(t)\n [relu] t = Relu(x)")),
                          lambda _: _rules(_parse(CLEAN))),
    "undefined-value": (lambda _: _rules(_graph("[add] y = Add(x, ghost)")),
                        lambda _: _rules(_parse(CLEAN))),
    "empty-node-name": (lambda _: _rules(_graph("y = Relu(x)")), lambda _: _rules(_parse(CLEAN))),
    "duplicate-node-name": (lambda _: _rules(_graph("[n] t = Relu(x)\n [n] y = Neg(t)")),
                            lambda _: _rules(_parse(CLEAN))),
    "output-not-produced": (lambda _: _rules(_graph("[r] y = Relu(x)", outputs="float[2, 3] y, float z")),
                            lambda _: _rules(_parse(CLEAN))),
    "value-info-mismatch": (
        lambda _: _rules(_graph("[r] y = Relu(x)", outputs="float[3, 2] y")),
        lambda _: _rules(_graph("[r] y = Relu(x)", outputs="float[2, 3] y"))),
    "shape-inference-error": (
        lambda _: _rules(_graph("[a] y = Add(x, z)", "float[2, 3] x, int64[2, 3] z")),
        lambda _: _rules(_graph("[a] y = Add(x, z)", "float[2, 3] x, float[2, 3] z"))),
    "opset-import-missing": (
        lambda _: _rules(_missing_import()),
        lambda _: _rules(_custom())),
    "opset-import-unused": (lambda _: _rules(_graph("[r] y = Relu(x)", head=HEAD)),
                            lambda _: _rules(_parse(CLEAN))),
    "unknown-op": (lambda _: _rules(_graph("[f] y = Frobnicate(x)")), lambda _: _rules(_parse(CLEAN))),
    "deprecated-op": (lambda _: _rules(_upsample("Upsample")), lambda _: _rules(_upsample("Resize"))),
    "deprecated-opset": (lambda _: _rules(_parse(CLEAN.replace('"" : 17', '"" : 6'))),
                         lambda _: _rules(_parse(CLEAN))),
    "large-constant": (lambda _: _rules(_constant(20000)), lambda _: _rules(_constant(10))),
    "external-data-outside": (lambda p: _rules(*_external(p, "../w.bin")),
                              lambda p: _rules(*_external(p, "w.bin"))),
    "external-data-missing": (lambda p: _rules(*_external(p, "w.bin", write=False)),
                              lambda p: _rules(*_external(p, "w.bin"))),
    "training-binding-unknown": (lambda _: _rules(_training("nope")), lambda _: _rules(_training("w"))),
}


def _missing_import() -> onnx.ModelProto:
    model = _custom()
    del model.opset_import[1]  # com.example
    return model


def _upsample(op: str) -> onnx.ModelProto:
    return _graph(f"[u] y = {op}(x, scales)", "float[1, 1, 2, 3] x, float[4] scales",
                  "float[1, 1, 4, 6] y", head=PLAIN.replace("17", "10"))


def _constant(n: int) -> onnx.ModelProto:
    model = _graph("[c] k = Constant<value = float {0}>()\n [s] total = ReduceSum<keepdims = 0>(k)\n"
                   " [a] y = Add(x, total)")
    model.graph.node[0].attribute[0].t.CopyFrom(numpy_helper.from_array(np.zeros(n, np.float32)))
    return model


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_fires(rule: str, tmp_path: Path) -> None:
    assert rule in CASES[rule][0](tmp_path)


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_stays_quiet(rule: str, tmp_path: Path) -> None:
    assert rule not in CASES[rule][1](tmp_path)


def test_every_rule_has_cases() -> None:
    assert set(CASES) == set(RULES)


def test_clean_model_has_no_findings() -> None:
    assert lint_model(_parse(CLEAN)) == []


def test_subgraph_reads_count_as_uses() -> None:
    model = _parse(PLAIN + """
g (float[2, 3] x, bool c) => (float[2, 3] y) {
  [if] y = If(c) <then_branch = t () => (float[2, 3] a) { [ta] a = Add(x, w) },
                  else_branch = e () => (float[2, 3] b) { [eb] b = Neg(x) }>
}
""")
    model.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3), np.float32), "w"))
    assert lint_model(model) == []


def _run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["lint", *args])
    return code, capsys.readouterr().out


def test_fix_applies_the_safe_fixes_atomically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Neg (unnamed) reads t before the Add that makes it; "unused" is read by nothing
    model = _graph("y = Neg(t)\n [add] t = Add(x, w)")
    for name, value in (("w", np.ones((2, 3), np.float32)), ("unused", np.zeros(3, np.float32))):
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    src, out = tmp_path / "m.onnx", tmp_path / "fixed.onnx"
    onnx.save(model, src)
    before = src.read_bytes()
    code, text = _run_cli(capsys, str(src), "--fix", str(out))
    assert code == 0, text
    assert "1 graph(s) re-sorted, 1 unused initializer(s) dropped, 1 node(s) named" in text
    assert src.read_bytes() == before and not list(tmp_path.glob("*.tmp"))
    fixed = onnx.load(out)
    onnx.checker.check_model(fixed)
    assert [n.op_type for n in fixed.graph.node] == ["Add", "Neg"]
    assert [t.name for t in fixed.graph.initializer] == ["w"]
    assert all(n.name for n in fixed.graph.node)
    from onnx.reference import ReferenceEvaluator

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = ReferenceEvaluator(fixed).run(None, {"x": x})
    np.testing.assert_array_equal(y, -(x + 1))


def test_json_output_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad, good = tmp_path / "bad.onnx", tmp_path / "good.onnx"
    onnx.save(_graph("[n] t = Relu(x)\n [n] y = Neg(t)"), bad)
    onnx.save(_parse(CLEAN), good)
    code, text = _run_cli(capsys, str(bad), "--json")
    assert code == 1
    (f,) = json.loads(text)["findings"]
    assert f["rule"] == "duplicate-node-name" and f["severity"] == "error"
    assert f["where"]["node"] == "n" and f["model"] == str(bad) and f["fix"]
    assert _run_cli(capsys, str(good))[0] == 0
    onnx.save(_graph("y = Relu(x)"), good)  # an info finding only: still exit 0
    assert _run_cli(capsys, str(good))[0] == 0


def test_unreadable_model_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "junk.onnx").write_bytes(b"\xff\xff not a model")
    assert main(["lint", str(tmp_path / "junk.onnx")]) == 2
    assert main(["lint"]) == 2


def test_schemas_pass_with_the_grandfather_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _run_cli(capsys, "--schemas")
    assert code == 0, text
    assert "0 finding(s)" in text and "grandfathered" in text


def test_grandfather_file_matches_the_pinned_onnx() -> None:
    # a stale entry means onnx fixed a name: regenerate the file so the exception cannot return
    result = triage(lint_schemas(), load_grandfather(GRANDFATHER), complete=True)
    assert result.new == () and result.stale == ()


def test_a_new_schema_with_a_bad_name_fails(capsys: pytest.CaptureFixture[str]) -> None:
    schema = _schema("bad_op", inputs=(("input", "T"),))
    onnx.defs.register_schema(schema)
    try:
        code, text = _run_cli(capsys, "--schemas", "--json")
    finally:
        onnx.defs.deregister_schema("bad_op", 1, "com.example.lint")
    assert code == 1
    found = {(f["rule"], f["where"]["op"]) for f in json.loads(text)["findings"]}
    assert found == {("op-name-case", "com.example.lint::bad_op")}
    assert _run_cli(capsys, "--schemas")[0] == 0  # deregistered: clean again


def test_schema_checks_on_a_constructed_schema() -> None:
    findings: list[Finding] = lint_schemas(schemas=[_schema("my_op", inputs=(("Data", "T"),))])
    assert {(f.rule, f.fix) for f in findings} == {
        ("op-name-case", "Rename it 'MyOp'."), ("io-name-case", "Rename it 'data'.")}
    assert lint_schemas(schemas=[_schema()]) == []


def test_write_grandfather_then_only_new_findings_fail(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model, exceptions = tmp_path / "m.onnx", tmp_path / "exceptions.json"
    onnx.save(_graph("[n] t = Relu(x)\n [n] y = Neg(t)"), model)
    assert _run_cli(capsys, str(model), "--write-grandfather", str(exceptions))[0] == 0
    assert _run_cli(capsys, str(model), "--grandfather", str(exceptions))[0] == 0
    onnx.save(_graph("[n] t = Relu(x)\n [n] u = Neg(t)\n [m] y = Abs(ghost)"), model)
    code, text = _run_cli(capsys, str(model), "--grandfather", str(exceptions))
    assert code == 1 and "undefined-value" in text and "duplicate-node-name" not in text


def test_fix_keeps_external_data_beside_the_model(tmp_path: Path) -> None:
    model, folder = _external(tmp_path, "w.bin")
    onnx.save(model, folder / "m.onnx")
    (tmp_path / "elsewhere").mkdir()
    assert main(["lint", str(folder / "m.onnx"), "--fix", str(tmp_path / "elsewhere" / "m.onnx")]) == 2
    assert main(["lint", str(folder / "m.onnx"), "--fix", str(folder / "fixed.onnx")]) == 0
    fixed = onnx.load(folder / "fixed.onnx")  # loads w.bin through the kept relative location
    np.testing.assert_array_equal(numpy_helper.to_array(fixed.graph.initializer[0]), np.ones((2, 3)))
