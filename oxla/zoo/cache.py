"""Zoo results cached by the hash of the model, its test data, oxla's code and the options."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import asdict, replace
from functools import cache
from pathlib import Path
from typing import Any

from oxla.zoo.cases import ZooCase, case_digest
from oxla.zoo.results import CACHEABLE, ModelResult
from oxla.zoo.worker import WorkerOptions

DEFAULT_CACHE_DIR = ".oxla-zoo-cache"


@cache
def oxla_fingerprint() -> str:
    """sha256 over oxla's version, its source files and the versions of what it runs on.

    Hashing the sources rather than naming the commit keeps an edited checkout from reusing
    results computed by the code before the edit.
    """
    import jax
    import onnx

    import oxla

    h = hashlib.sha256(f"{oxla.__version__} jax {jax.__version__} onnx {onnx.__version__}".encode())
    root = Path(oxla.__file__).parent
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    try:
        import onnxruntime

        h.update(f"onnxruntime {onnxruntime.__version__}".encode())  # the reference of bare models
    except ImportError:
        pass
    return h.hexdigest()


@cache
def oxla_commit() -> str:
    """The git commit oxla runs from ('' outside a checkout), '+' when the checkout is edited."""
    import oxla

    root = Path(oxla.__file__).parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+" if dirty else "")


class ResultCache:
    """Results on disk, one JSON file per (model content, oxla code, options) key.

    Args:
        root: the cache folder (created on the first write).
        options: the worker options; tolerances and the memory limit change results.
    """

    def __init__(self, root: str | os.PathLike[str], options: WorkerOptions) -> None:
        self.root = Path(root)
        settings = {k: v for k, v in asdict(options).items() if k != "repeat"}
        self._salt = oxla_fingerprint() + json.dumps(settings, sort_keys=True)
        self._keys: dict[str, str | None] = {}
        self.hits = 0

    def key(self, case: ZooCase) -> str | None:
        """The case's key, None when its files cannot be read (then it is never cached)."""
        if case.id not in self._keys:
            try:
                digest = case_digest(case)
            except OSError:
                self._keys[case.id] = None
            else:
                text = self._salt + case.id + digest
                self._keys[case.id] = hashlib.sha256(text.encode()).hexdigest()
        return self._keys[case.id]

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, case: ZooCase) -> ModelResult | None:
        """The stored result of this exact case, or None."""
        key = self.key(case)
        if key is None:
            return None
        try:
            data: dict[str, Any] = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        self.hits += 1
        return replace(ModelResult.from_json(data), path=case.id, cached=True)

    def put(self, case: ZooCase, result: ModelResult) -> None:
        """Store a result; timeouts and crashes are not stored (the machine may be to blame)."""
        key = self.key(case)
        if result.status not in CACHEABLE or key is None:
            return
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # write then rename: a concurrent or interrupted run never reads half a file
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(result.to_json(), f)
        os.replace(tmp, path)
