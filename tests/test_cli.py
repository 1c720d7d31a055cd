"""The `oxla run` and `oxla info` commands on a shipped model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MODEL = str(Path(__file__).resolve().parent.parent / "models" / "mobilenet_small.onnx")


def _oxla(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oxla", *args], capture_output=True, text=True)


def test_run_compare_onnxruntime() -> None:
    proc = _oxla("run", MODEL, "--random-inputs", "--dim", "batch=2", "--repeat", "2",
                 "--compare", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert "logits: float32 (2, 10)" in proc.stdout
    assert "logits: ok max abs diff" in proc.stdout and "latency ratio" in proc.stdout


def test_info_classifies_ops_and_reports_the_run() -> None:
    proc = _oxla("info", MODEL, "--run")
    assert proc.returncode == 0, proc.stderr
    assert "ai.onnx::Conv" in proc.stdout and "native (rule since v" in proc.stdout
    assert "0 host step(s)" in proc.stdout and "ran native: " in proc.stdout


def test_run_missing_input_is_a_clear_error() -> None:
    proc = _oxla("run", MODEL)
    assert proc.returncode == 2
    assert "missing inputs ['image']" in proc.stderr and "Traceback" not in proc.stderr
