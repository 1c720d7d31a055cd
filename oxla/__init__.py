"""oxla: compile, run and train ONNX models with JAX/XLA."""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from oxla.errors import (
    InputError,
    InvalidModelError,
    LoweringError,
    NotStaticError,
    OxlaError,
    ResourceError,
    ShapeError,
    TrainingError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from oxla import training
    from oxla.cache import enable_compilation_cache
    from oxla.compile import CompiledModel, compile
    from oxla.executor import x64
    from oxla.export import ExportedModel, export_model, load_exported
    from oxla.load import load_model
    from oxla.ort import (
        ExecutionMode,
        GraphOptimizationLevel,
        ModelMetadata,
        RunOptions,
        SessionOptions,
        get_available_providers,
        get_device,
    )
    from oxla.session import InferenceSession, NodeArg
    from oxla.training import TrainingSession

# Names that import JAX, bound on first use so that `import oxla` (and `oxla --help`) stays fast.
_LAZY = {
    "CompiledModel": "oxla.compile", "compile": "oxla.compile", "enable_compilation_cache": "oxla.cache",
    "x64": "oxla.executor", "load_model": "oxla.load", "InferenceSession": "oxla.session",
    "NodeArg": "oxla.session", "TrainingSession": "oxla.training", "ExportedModel": "oxla.export",
    "export_model": "oxla.export", "load_exported": "oxla.export",
    **dict.fromkeys(("ExecutionMode", "GraphOptimizationLevel", "ModelMetadata", "RunOptions",
                     "SessionOptions", "get_available_providers", "get_device"), "oxla.ort"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY and name != "training":
        raise AttributeError(f"module 'oxla' has no attribute '{name}'")
    # Any of them brings the whole runtime, as an eager `import oxla` did: oxla.compile registers
    # every lowering rule, which code reading the rule table (classify, lint) relies on.
    importlib.import_module("oxla.compile")
    if name == "training":
        return importlib.import_module("oxla.training")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


class _Package(types.ModuleType):
    """Importing the submodule `oxla.compile` must not hide the function `oxla.compile`."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return  # the import system binding a submodule over a public function's name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "CompiledModel",
    "ExecutionMode",
    "ExportedModel",
    "GraphOptimizationLevel",
    "InferenceSession",
    "InputError",
    "InvalidModelError",
    "LoweringError",
    "ModelMetadata",
    "NodeArg",
    "NotStaticError",
    "OxlaError",
    "ResourceError",
    "RunOptions",
    "SessionOptions",
    "ShapeError",
    "TrainingError",
    "TrainingSession",
    "UnsupportedOpError",
    "compile",
    "enable_compilation_cache",
    "export_model",
    "get_available_providers",
    "get_device",
    "load_exported",
    "load_model",
    "training",
    "x64",
]
__version__ = "0.1.0"
