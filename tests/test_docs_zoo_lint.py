"""docs/zoo-ci.md and docs/lint.md: their Python runs as pasted, the rule table matches the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from oxla.lint.rules import RULES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _python_blocks(name: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / name).read_text(encoding="utf-8"), re.S)


def test_python_in_the_docs_runs_as_pasted(tmp_path: Path) -> None:
    # in order, in one folder: zoo-ci.md's second block checks the folder its first one wrote
    blocks = _python_blocks("zoo-ci.md") + _python_blocks("lint.md")
    assert len(blocks) == 4
    for i, block in enumerate(blocks):
        script = tmp_path / f"snippet_{i}.py"
        script.write_text(block)
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"block {i}:\n{block}\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "zoo.json").is_file()


def test_rule_table_lists_every_rule_with_its_severity() -> None:
    rows = re.findall(r"^\| `([a-z-]+)` \| (error|warning|info) \|", (DOCS / "lint.md").read_text(encoding="utf-8"), re.M)
    assert dict(rows) == {r.id: r.severity for r in RULES.values()}
    assert len(rows) == len(RULES)
