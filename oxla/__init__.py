"""oxla: compile, run and train ONNX models with JAX/XLA."""

from __future__ import annotations

from oxla import training
from oxla.cache import enable_compilation_cache
from oxla.compile import CompiledModel, compile
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
from oxla.executor import x64
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

__all__ = [
    "CompiledModel",
    "ExecutionMode",
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
    "get_available_providers",
    "get_device",
    "load_model",
    "training",
    "x64",
]
__version__ = "0.1.0"
