"""`oxla zoo check`: discovery, staged results, limits, cache, history, JSON and HTML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from oxla.cli import main
from oxla.zoo.cases import BARE, FOLDER, LIGHT, backend_cases, discover
from oxla.zoo.compare import compare_value
from oxla.zoo.history import previous_statuses, read_history
from oxla.zoo.results import ModelResult, summarize

RELU = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2, 3] y) { y = Relu(x) }
"""
UNKNOWN_OP = """
<ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
g (float[2, 3] x) => (float[2, 3] y) { y = com.example.Frobnicate(x) }
"""
# The condition is computed (i >= 0) so nothing can prove the loop ends: only the timeout stops it.
ENDLESS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2, 3] y) {
  cond = Constant<value = bool {1}>()
  y = Loop(, cond, x) <body = body (int64 i, bool c, float[2, 3] v) => (bool c_out, float[2, 3] v_out) {
    zero = Constant<value = int64 {0}>()
    c_out = GreaterOrEqual(i, zero)
    v_out = Add(v, v)
  }>
}
"""
# Its one output is 20000 x 20000 float32 (1.6 GB): past a 1 GiB memory limit.
MEMORY_BOMB = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1] x) => (float[N, M] big) {
  shape = Constant<value = int64[2] {20000, 20000}>()
  big = Expand(x, shape)
}
"""
X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


def _folder(root: Path, name: str, text: str, x: np.ndarray, y: np.ndarray) -> Path:
    folder = root / name
    data = folder / "test_data_set_0"
    data.mkdir(parents=True)
    onnx.save(onnx.parser.parse_model(text), folder / "model.onnx")
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    (data / "output_0.pb").write_bytes(numpy_helper.from_array(y).SerializeToString())
    return folder


def _zoo(root: Path) -> Path:
    """Good models, a wrong expected output, a truncated file, an unknown op, an endless Loop."""
    _folder(root, "good", RELU, X, np.maximum(X, 0))
    onnx.save(onnx.parser.parse_model(RELU), root / "bare_relu.onnx")
    _folder(root, "wrong_output", RELU, X, np.maximum(X, 0) + 1)
    truncated = _folder(root, "truncated", RELU, X, np.maximum(X, 0)) / "model.onnx"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    _folder(root, "unknown_op", UNKNOWN_OP, X, X)
    _folder(root, "endless_loop", ENDLESS, X, X)
    return root


def _run(*args: str | Path) -> int:
    return main(["zoo", "check", *map(str, args)])


def _statuses(report: Path) -> dict[str, tuple[str, str]]:
    models = json.loads(report.read_text(encoding="utf-8"))["models"]
    return {Path(m["path"]).name: (m["status"], m["stage"]) for m in models}


def test_one_run_classifies_each_model_and_finishes(tmp_path: Path) -> None:
    zoo = _zoo(tmp_path / "zoo")
    report, page = tmp_path / "out.json", tmp_path / "out.html"
    code = _run(zoo, "--timeout", "10", "--no-cache", "--json", report, "--html", page, "--strict")
    assert code == 1  # --strict: not every model passes
    assert _statuses(report) == {
        "good": ("pass", ""), "bare_relu.onnx": ("pass", ""),
        "wrong_output": ("fail", "compare"), "truncated": ("error", "load"),
        "unknown_op": ("error", "classify"), "endless_loop": ("timeout", "run"),
    }
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert doc["summary"]["counts"] == {"pass": 2, "fail": 1, "error": 2, "timeout": 1, "crash": 0}
    by_name = {Path(m["path"]).name: m for m in doc["models"]}
    wrong = by_name["wrong_output"]["outputs"][0]
    assert wrong["ok"] is False and wrong["max_abs"] == pytest.approx(1.0)
    assert by_name["unknown_op"]["ops"] == ["com.example::Frobnicate"]
    assert "not a valid ONNX protobuf" in by_name["truncated"]["message"]
    assert by_name["good"]["first_run_s"] > 0 and by_name["good"]["latency_ms"] > 0
    html = page.read_text(encoding="utf-8")
    assert "Failures by stage" in html and "com.example::Frobnicate" in html
    assert "<script src" not in html and "<link" not in html  # self-contained


def test_memory_bomb_is_that_models_result(tmp_path: Path) -> None:
    onnx.save(onnx.parser.parse_model(MEMORY_BOMB), tmp_path / "bomb.onnx")
    _folder(tmp_path, "good", RELU, X, np.maximum(X, 0))
    report = tmp_path / "out.json"
    assert _run(tmp_path, "--memory-mb", "1024", "--no-cache", "--json", report) == 0
    statuses = _statuses(report)
    assert statuses["good"] == ("pass", "")  # the limit leaves room for an ordinary model
    status, stage = statuses["bomb.onnx"]
    # XLA aborts on the failed allocation (crash) or reports it (error): either way, at run
    assert status in ("crash", "error") and stage == "run"


def test_history_reports_a_regression_and_reruns_only_what_changed(tmp_path: Path) -> None:
    zoo = tmp_path / "zoo"
    _folder(zoo, "a", RELU, X, np.maximum(X, 0))
    broken = _folder(zoo, "b", RELU, X, np.maximum(X, 0))
    history, cache, report = tmp_path / "history.jsonl", tmp_path / "cache", tmp_path / "out.json"
    common = ("--history", history, "--cache-dir", cache, "--json", report)
    assert _run(zoo, *common) == 0
    (broken / "test_data_set_0" / "output_0.pb").write_bytes(
        numpy_helper.from_array(np.zeros_like(X)).SerializeToString())
    assert _run(zoo, *common) == 1
    doc = json.loads(report.read_text(encoding="utf-8"))
    assert [Path(p).name for p in doc["summary"]["regressions"]] == ["b"]
    cached = {Path(m["path"]).name: m["cached"] for m in doc["models"]}
    assert cached == {"a": True, "b": False}  # only the changed case ran again
    assert len(read_history(history)) == 2
    assert set(previous_statuses(read_history(history)).values()) == {"pass", "fail"}


def test_discovery_layouts(tmp_path: Path) -> None:
    _folder(tmp_path / "nested", "one", RELU, X, X)
    onnx.save(onnx.parser.parse_model(RELU), tmp_path / "light_net.onnx")
    (tmp_path / "light_net_output_0.pb").write_bytes(numpy_helper.from_array(X).SerializeToString())
    onnx.save(onnx.parser.parse_model(RELU), tmp_path / "plain.onnx")
    layouts = {Path(c.id).name: (c.layout, len(c.data_sets)) for c in discover([tmp_path])}
    assert layouts == {"one": (FOLDER, 1), "light_net.onnx": (LIGHT, 1), "plain.onnx": (BARE, 0)}


def test_backend_data_has_the_149_shipped_model_cases() -> None:
    kinds = [c.id.split("/")[1] for c in backend_cases()]
    counts = {k: kinds.count(k) for k in set(kinds)}
    assert counts == {"light": 9, "pytorch-converted": 82, "pytorch-operator": 35, "simple": 23}


def test_backend_cases_run(tmp_path: Path) -> None:
    report = tmp_path / "out.json"
    code = _run("--onnx-backend-data", "--only", "*simple/test_sequence_model[12]",
                "--only", "*pytorch-operator/test_operator_add_broadcast", "--no-cache",
                "--json", report, "--strict")
    assert code == 0, _statuses(report)
    assert len(_statuses(report)) == 3


def test_compare_values() -> None:
    ok = compare_value(np.float32([1, 2]), np.float32([1, 2.001]), 1e-3, 1e-7)
    assert ok.ok and ok.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert not compare_value(np.float32([1]), np.float64([1]), 1e-3, 1e-7).ok  # dtype
    assert not compare_value(np.float32([1]), np.float32([1, 1]), 1e-3, 1e-7).ok  # shape
    assert compare_value(np.float32([np.nan]), np.float32([np.nan]), 1e-3, 1e-7).ok
    assert compare_value(None, None, 1e-3, 1e-7).ok
    assert not compare_value(None, np.float32(1), 1e-3, 1e-7).ok
    seq = [np.int64([1, 2]), np.int64([3])]
    assert compare_value(seq, [np.int64([1, 2]), np.int64([3])], 1e-3, 1e-7).ok
    assert not compare_value(seq, seq[:1], 1e-3, 1e-7).ok
    strings = np.array(["a", "b"], dtype=object)
    assert not compare_value(strings, np.array(["a", "c"], dtype=object), 1e-3, 1e-7).ok


def test_summary_regressions_and_fixed() -> None:
    results = [ModelResult("a", "fail"), ModelResult("b", "pass"), ModelResult("c", "pass")]
    summary = summarize(results, {"a": "pass", "b": "error"})
    assert summary.regressions == ("a",) and summary.fixed == ("b",)
    assert summary.counts["pass"] == 2


def test_no_models_is_a_usage_error(tmp_path: Path) -> None:
    assert _run(tmp_path) == 2
    assert _run() == 2



def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log() -> None:
    import io

    from oxla.zoo.display import Progress

    results = [ModelResult("a", "pass", first_run_s=0.5, latency_ms=1.0),
               ModelResult("b", "error", "classify", "unsupported ops: com.example::Frobnicate")]
    for tty in (True, False):
        stream = io.StringIO()
        progress = Progress(2, stream, tty=tty)
        for r in results:
            progress(r)
        progress.close()
        text = stream.getvalue()
        if tty:
            assert text.startswith("\r[") and "2/2 pass 1 error 1" in text and "Frobnicate" not in text
        else:
            assert text.splitlines()[1].startswith("[2/2] error") and "Frobnicate" in text


def test_html_report_has_the_trend_and_the_groups() -> None:
    from oxla.zoo.html import render_html

    results = [ModelResult("a", "pass"), ModelResult("b", "error", "classify", "gap",
                                                     ops=("com.example::Frobnicate",))]
    summary = summarize(results, {"b": "pass"})
    page = render_html(results, summary, {"oxla_version": "0.1.0"},
                       [("t1", 2, 2), ("t2", 1, 2), ("t3", 1, 2)])
    assert page.count("<polyline") == 2 and "<table class=\"sortable\">" in page
    assert "Regressions</b>: b" in page and "com.example::Frobnicate</b>: 1" in page


def test_a_worker_that_dies_is_a_crash(tmp_path: Path) -> None:
    # A script that runs the zoo at import time, unguarded: every child re-imports it and dies
    # while starting, before it reaches the model. The run still ends, with that model a crash.
    _folder(tmp_path, "good", RELU, X, np.maximum(X, 0))
    script = tmp_path / "unguarded.py"
    script.write_text("from oxla.cli import main\n"
                      "main(['zoo', 'check', 'good', '--no-cache', '--json', 'out.json'])\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (model,) = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))["models"]
    assert model["status"] == "crash" and "if __name__" in model["message"]


def test_maps_compare_by_key_and_value() -> None:
    # skl2onnx classifiers end in ZipMap: a sequence of maps (models/converters/skl_scaler_logreg)
    from oxla.zoo.compare import compare_value

    want = [{0: np.float32(0.25), 1: np.float32(0.75)}]
    assert compare_value(want, [{0: np.float32(0.25), 1: np.float32(0.75)}], 1e-3, 1e-7).ok
    assert not compare_value(want, [{0: np.float32(0.5), 1: np.float32(0.5)}], 1e-3, 1e-7).ok
    assert "expected a map" in compare_value(want, [{0: np.float32(0.25)}], 1e-3, 1e-7).message
