"""A worker process in another interpreter (a side venv with torch), driven by JSON lines."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from typing import Any


class LineWorker:
    """Starts `argv`, reads its first JSON line as `info`; `ask` sends one request, reads one reply."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info: dict[str, Any] = json.loads(self._read())

    def _read(self) -> str:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"the worker {self.proc.args!r} exited")
        return line

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._read()))

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
