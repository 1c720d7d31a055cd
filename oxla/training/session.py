"""TrainingSession: initialize, step (one XLA computation), run, save — the IR's training model."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from onnx import GraphProto, ModelProto, numpy_helper

from oxla.compile import CompiledModel
from oxla.dtypes import to_numpy_dtype, type_name
from oxla.errors import InputError, NotStaticError, TrainingError
from oxla.executor import x64
from oxla.graph import initializer_values
from oxla.load import ModelSource
from oxla.training.bindings import Binding, Stage, combined_model, parse_training, standalone_model
from oxla.training.checkpoint import load_saved, save_model
from oxla.training.make import strip_training
from oxla.training.parallel import Placement, placement

Arrays = dict[str, Any]


def _same_kind(a: Any, b: Any) -> bool:
    return tuple(a.shape) == tuple(b.shape) and np.dtype(a.dtype) == np.dtype(b.dtype)


def _kind(value: Any) -> str:
    return f"{np.dtype(value.dtype)} {tuple(value.shape)}"


class _Step:
    """One algorithm graph joined to the inference graph, jit-compiled as one function."""

    def __init__(self, model: ModelProto, stage: Stage, mutable: set[str], where: Placement) -> None:
        combined = combined_model(model, stage)
        self.stage = stage
        self.where = where
        self.compiled = CompiledModel(combined)
        names = set(initializer_values(combined.graph))
        self.state_names = sorted(n for n in mutable if n in names)
        with x64():
            self.frozen = {n: where.replicate(v) for n, v in self.compiled.params.items()
                           if n not in mutable}
        self.inputs = {i.name: i for i in combined.graph.input
                       if i.name in self.compiled.input_names}
        self.output_names = [o.name for o in stage.algorithm.output]
        self.run = jax.jit(self._run, donate_argnums=0, static_argnums=3)

    def _run(self, state: Arrays, frozen: Arrays, feeds: Arrays,
             wanted: tuple[str, ...]) -> tuple[Arrays, Arrays]:
        try:
            outs = self.compiled.fn({**frozen, **state}, feeds)
        except NotStaticError as e:
            raise TrainingError(f"training_info[{self.stage.index}]: the training step must "
                                f"compile as one XLA computation, but {e}") from None
        new = dict(state)
        for b in self.stage.updates:
            value = outs[b.value]
            if not _same_kind(value, state[b.key]):
                raise TrainingError(f"{b.describe()}: '{b.value}' is {_kind(value)} but "
                                    f"'{b.key}' is {_kind(state[b.key])}")
            new[b.key] = self.where.constrain(value)
        # replicated, so that every process can read the outputs (a no-op on one device)
        return {n: self.where.constrain(outs[n]) for n in wanted}, new


def _check_feeds(feeds: Mapping[str, Any], declared: Mapping[str, Any], what: str) -> dict[str, np.ndarray]:
    unknown = sorted(set(feeds) - set(declared))
    missing = sorted(set(declared) - set(feeds))
    if unknown or missing:
        raise InputError(f"{what}: unknown feeds {unknown}, missing feeds {missing}; the inputs "
                         f"are {sorted(declared)}")
    out = {}
    for name, value in feeds.items():
        arr = np.asarray(value)
        elem = declared[name].type.tensor_type.elem_type
        if elem and arr.dtype != to_numpy_dtype(elem):
            raise InputError(f"{what}: feed '{name}' must have dtype {type_name(elem)}, got {arr.dtype}")
        out[name] = arr
    return out


class TrainingSession:
    """A model with a training section (ModelProto.training_info), as a stateful trainer.

    Args:
        path_or_bytes: a .onnx path, serialized bytes, or a ModelProto with training_info.
        devices: shard each step's batch over this many local JAX devices (data parallel);
            None or 1 runs on the default device.

    Raises:
        TrainingError: the model has no training_info, or a binding is malformed (the message
            names it).
    """

    def __init__(self, path_or_bytes: ModelSource, *, devices: int | None = None) -> None:
        self._model = load_saved(path_or_bytes)
        self._stages = parse_training(self._model)
        if not self._stages:
            raise TrainingError("the model has no training_info; make one with "
                                "oxla.training.make_trainable(model, ...)")
        self._where = placement(devices)
        self._initial: dict[str, np.ndarray] = dict(initializer_values(self._model.graph))
        for stage in self._stages:
            self._initial.update(initializer_values(stage.algorithm))
        mutable = {b.key for s in self._stages for b in (*s.updates, *s.inits)}
        with x64():
            self._state: Arrays = {n: self._where.replicate(self._initial[n]) for n in sorted(mutable)}
        self._steps: dict[int, _Step] = {}
        self._inference: CompiledModel | None = None
        self._inference_version = -1
        self._baked: tuple[int, CompiledModel] | None = None
        self._version = 0
        self._lock = threading.RLock()  # steps replace (and donate) the state buffers

    # --- what the model holds -----------------------------------------------------------------

    @property
    def algorithms(self) -> int:
        """How many TrainingInfoProtos (selectable by `algorithm=` in step)."""
        return len(self._stages)

    @property
    def devices(self) -> int:
        return self._where.count

    @property
    def process_index(self) -> int:
        """This process among `process_count` (after `join`): it feeds that share of each batch."""
        return self._where.process

    @property
    def process_count(self) -> int:
        """Processes the session's devices span (1 unless `join` was called)."""
        return self._where.processes

    @property
    def metadata(self) -> dict[str, str]:
        return {p.key: p.value for p in self._model.metadata_props}

    def input_names(self, algorithm: int = 0) -> list[str]:
        """The feeds step(algorithm) takes: the inference graph's inputs, then the algorithm's."""
        return list(self._step_for(algorithm).inputs)

    def output_names(self, algorithm: int = 0) -> list[str]:
        return [o.name for o in self._stage(algorithm).algorithm.output]

    def bindings(self, algorithm: int = 0) -> tuple[Binding, ...]:
        """The update_binding of `algorithm`: which output each variable takes after a step."""
        return self._stage(algorithm).updates

    @property
    def inference_inputs(self) -> list[str]:
        return self._inference_model().input_names

    @property
    def inference_outputs(self) -> list[str]:
        return self._inference_model().output_names

    @property
    def state(self) -> dict[str, np.ndarray]:
        """Every initializer (inference and algorithm graphs) with its current value."""
        out = dict(self._initial)
        out.update({n: self._where.to_host(v) for n, v in self._state.items()})
        return out

    # --- training -----------------------------------------------------------------------------

    def initialize(self) -> None:
        """Run every initialization graph in order and assign through initialization_binding."""
        for stage in self._stages:
            if stage.initialization is None or not stage.inits:
                continue
            compiled = CompiledModel(standalone_model(self._model, stage.initialization))
            outs = compiled({})
            for b in stage.inits:
                value = outs[b.value]
                if not _same_kind(value, self._initial[b.key]):
                    raise TrainingError(f"{b.describe()}: '{b.value}' is {_kind(value)} but "
                                        f"'{b.key}' is {_kind(self._initial[b.key])}")
                with self._lock, x64():
                    self._state[b.key] = self._where.replicate(value)
        with self._lock:
            self._version += 1

    def step(self, feeds: Mapping[str, Any], algorithm: int = 0,
             outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run one training step of `algorithm` and apply its update_binding.

        Args:
            feeds: the inference graph's inputs and the algorithm graph's inputs, by name.
            algorithm: which TrainingInfoProto.
            outputs: the algorithm outputs to return (default all of them; ask for just the
                loss to save copying the new weights back every step).

        Returns:
            The algorithm graph's outputs by name.

        Raises:
            InputError: feeds that do not match the step's inputs.
            TrainingError: an unknown algorithm index or output, or an update of the wrong
                type or shape.
        """
        result = self.step_async(feeds, algorithm, outputs)
        return {n: self._where.to_host(v) for n, v in result.items()}

    def step_async(self, feeds: Mapping[str, Any], algorithm: int = 0,
                   outputs: Sequence[str] | None = None) -> dict[str, jax.Array]:
        """step() without waiting: the outputs are device arrays, possibly still being computed."""
        step = self._step_for(algorithm)
        wanted = tuple(step.output_names if outputs is None else outputs)
        unknown = [n for n in wanted if n not in step.output_names]
        if unknown:
            raise TrainingError(f"unknown outputs {unknown}; algorithm {algorithm} has "
                                f"{step.output_names}")
        checked = _check_feeds(feeds, step.inputs, f"step(algorithm={algorithm})")
        with self._lock, x64():
            state = {n: self._state[n] for n in step.state_names}
            result, new = step.run(state, step.frozen, self._where.feeds(checked), wanted)
            self._state.update(new)
            self._version += 1
        return result

    def to_host(self, value: Any) -> np.ndarray:
        """A step_async output as numpy (across processes: this process's replicated copy)."""
        return self._where.to_host(value)

    def _stage(self, algorithm: int) -> Stage:
        if not 0 <= algorithm < len(self._stages):
            raise TrainingError(f"algorithm {algorithm} does not exist; the model has "
                                f"{len(self._stages)} training_info entries (0..{len(self._stages) - 1})")
        return self._stages[algorithm]

    def _step_for(self, algorithm: int) -> _Step:
        stage = self._stage(algorithm)
        if algorithm not in self._steps:
            self._steps[algorithm] = _Step(self._model, stage, set(self._state), self._where)
        return self._steps[algorithm]

    # --- inference ----------------------------------------------------------------------------

    def _inference_model(self) -> CompiledModel:
        if self._inference is None:  # the trained state stays parameters: updates never recompile
            self._inference = CompiledModel(strip_training(self._model), dynamic=frozenset(self._state))
        return self._inference

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """Inference with the current state (no side effects), like InferenceSession.run."""
        compiled = self._inference_model()
        declared = {i.name: i for i in compiled.model.graph.input if i.name in compiled.input_names}
        checked = _check_feeds(feeds, declared, "run")
        wanted = list(output_names) if output_names else compiled.output_names
        unknown = [n for n in wanted if n not in compiled.output_names]
        if unknown:
            raise InputError(f"unknown output names {unknown}; the outputs are {compiled.output_names}")
        with self._lock:
            if any(n in compiled.constants for n in self._state) and self._version:
                compiled = self._baked_model()  # a rule needs trained state as a constant
            elif self._inference_version != self._version:
                compiled.set_parameters({n: self._where.to_host(v) for n, v in self._state.items()
                                         if n in compiled.params})
                self._inference_version = self._version
        results = compiled(checked)
        return [np.asarray(results[n]) for n in wanted]

    def _baked_model(self) -> CompiledModel:
        if self._baked is None or self._baked[0] != self._version:
            self._baked = (self._version, CompiledModel(strip_training(self.model())))
        return self._baked[1]

    # --- saving -------------------------------------------------------------------------------

    def model(self, metadata: Mapping[str, str] | None = None) -> ModelProto:
        """The model with the current state as its initializers, training_info kept."""
        out = ModelProto()
        out.CopyFrom(self._model)
        state = {n: self._where.to_host(v) for n, v in self._state.items()}
        _write_state(out.graph, state)
        for info in out.training_info:
            _write_state(info.algorithm, state)
        if metadata:
            props = {p.key: p.value for p in out.metadata_props} | dict(metadata)
            del out.metadata_props[:]
            for key, value in props.items():
                out.metadata_props.add(key=key, value=value)
        return out

    def save(self, path: str | os.PathLike[str], metadata: Mapping[str, str] | None = None, *,
             external_data: bool | None = None) -> None:
        """Write the model with its current state and training_info, atomically (temp, fsync, rename).

        Args:
            path: the .onnx file.
            metadata: metadata_props to add or replace.
            external_data: tensors in a data file beside the model: True always, False never,
                None when they are over protobuf's 2 GiB limit (see checkpoint.save_model).

        Across processes (after `join`) only process 0 writes: every process holds the same
        state, and the others return without touching the file (`model()` still works there).
        """
        if self._where.process != 0:
            return
        save_model(self.model(metadata), path, external_data=external_data)

    def export_inference(self, path: str | os.PathLike[str], *, external_data: bool | None = None) -> None:
        """Write the inference model (training_info stripped) with the current state, atomically;
        `external_data` as in save; only process 0 writes, as in save."""
        if self._where.process != 0:
            return
        save_model(strip_training(self.model()), path, external_data=external_data)


def _write_state(graph: GraphProto, state: Mapping[str, np.ndarray]) -> None:
    for t in graph.initializer:
        if t.name in state:
            t.CopyFrom(numpy_helper.from_array(state[t.name], t.name))
    for i in reversed(range(len(graph.sparse_initializer))):
        name = graph.sparse_initializer[i].values.name
        if name in state:  # a trained sparse initializer is dense now
            del graph.sparse_initializer[i]
            graph.initializer.append(numpy_helper.from_array(state[name], name))
