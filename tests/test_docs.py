"""Docs that run: every ```python block of README.md and docs/*.md, each file's blocks in order.

A block fenced ```python no-run is a fragment (pseudocode, a sketch of a rule) and is skipped.
Each file runs as one script in its own process with the repository root as working directory,
as a reader would paste it; files the blocks write there are removed afterwards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(info string after `python`, code) for each ```python block, in order."""
    return [(m.group(1).strip(), m.group(2)) for m in _FENCE.finditer(text)]


def runnable(path: Path) -> str:
    """The file's runnable blocks joined in order, each prefixed with a comment saying where."""
    text = path.read_text(encoding="utf-8")
    parts = []
    for info, code in python_blocks(text):
        if info == "no-run":
            continue
        line = text[:text.index(code)].count("\n") + 1
        parts.append(f"# --- {path.name}:{line}\n{code}")
    return "\n".join(parts)


def test_fences_are_known() -> None:
    for path in DOCS:
        for info, _ in python_blocks(path.read_text(encoding="utf-8")):
            assert info in ("", "no-run"), f"{path.name}: unknown fence 'python {info}'"


@pytest.mark.parametrize("path", [p for p in DOCS if runnable(p)], ids=lambda p: p.name)
def test_doc_blocks_run(path: Path, tmp_path: Path) -> None:
    # The blocks run in a folder of their own that links to the repo's entries (models/, data/,
    # ...): what they write (mlp.trained.onnx, zoo/...) lands there, so two docs running at once
    # (pytest -n 2) cannot delete each other's files.
    work = tmp_path / "repo"
    work.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (work / entry.name).symlink_to(entry)
    script = tmp_path / f"{path.stem}_blocks.py"
    script.write_text(runnable(path))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script)], cwd=work, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, f"{path.name} blocks failed:\n{proc.stderr[-3000:]}"
