"""What a rule may see: its node, the opset, static values, subgraphs and the compile options.

Rules get a Context and nothing else: no interpreter, no scope. Running a subgraph, asking for a
static value or breaking the graph all go through its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import numpy as np
from onnx import GraphProto, NodeProto

from oxla.errors import LoweringError, NodeRef, ShapeError, describe_value
from oxla.lowering.common import DerivedTables
from oxla.lowering.values import Value, is_static


@dataclass(frozen=True)
class Options:
    """Compile options that rules may consult."""

    bake_weights: bool = False       # initializers become HLO constants instead of parameters
    training: bool = False           # Dropout and friends in training mode when asked by inputs
    layout_weights: bool = False     # store conv kernels as HWIO (renames those parameters)
    memory_limit: int | None = None  # bytes one value may take (None: the machine's memory)
    channels_last: bool = True       # with layout_weights: 2-D conv nets run NHWC between convs
    native_threads: int = 0          # with channels_last: 1x1 convs on oxla's GEMM, on this many cores
    native_recurrent: int = 0        # GRU/LSTM loops on oxla's kernel, on this many threads (0: off)
    native_matmul: bool = False      # MatMuls by constant matrices on oxla's GEMM (CPU sessions)
    native_stems: bool = False       # with channels_last: image stems on oxla's stem kernel (CPU)
    native_convs: bool = False       # with channels_last, on one core (native_threads 0): depthwise
                                     # convolutions (AVX-512) and the convolutions not beside one
                                     # that stays XLA's on oxla's kernels, one thread each
    native_nms: bool = False         # NonMaxSuppression's ranked pass on oxla's kernel (CPU)
    constant_weights: int = 0        # float initializers become HLO constants when they total at
                                     # most this many bytes (plan.SMALL_WEIGHTS; 0: never)


class NeedStatic(Exception):
    """A rule needs the concrete value of a traced input: the executor breaks the graph here."""

    def __init__(self, node: NodeRef, what: str, value_name: str | None) -> None:
        super().__init__(f"{node.describe()}: {what} must be known at compile time")
        self.node = node
        self.what = what
        self.value_name = value_name


class Scope:
    """Name -> value, with the enclosing graph's scope as parent (subgraphs see outer values)."""

    __slots__ = ("parent", "values")

    def __init__(self, parent: Scope | None = None, values: Mapping[str, Value] | None = None) -> None:
        self.values: dict[str, Value] = dict(values) if values else {}
        self.parent = parent

    def get(self, name: str) -> Value:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        raise KeyError(name)

    def __contains__(self, name: str) -> bool:
        scope: Scope | None = self
        while scope is not None:
            if name in scope.values:
                return True
            scope = scope.parent
        return False

    def set(self, name: str, value: Value) -> None:
        self.values[name] = value


class Runner(Protocol):
    """What a Context needs from whoever runs the graph (the interpreter)."""

    options: Options
    derived_tables: DerivedTables

    def run_graph(self, graph: GraphProto, inputs: Sequence[Value], outer: Scope | None,
                  opsets: Mapping[str, int]) -> list[Value]: ...

    def run_nodes(self, nodes: Sequence[NodeProto], scope: Scope, opsets: Mapping[str, int],
                  graph: Sequence[NodeProto] | None = None) -> None: ...

    def run_nested(self, nodes: Sequence[NodeProto], scope: Scope, opsets: Mapping[str, int],
                   graph: Sequence[NodeProto]) -> None: ...

    def add_check(self, ok: Any, witness: Any, message: str) -> None: ...


class Context:
    """Passed as `cx` to every rule."""

    __slots__ = ("_graph", "_runner", "_scope", "inputs", "node", "opsets", "ref")

    def __init__(self, node: NodeProto, ref: NodeRef, inputs: Sequence[Value], opsets: Mapping[str, int],
                 runner: Runner, scope: Scope, graph: Sequence[NodeProto]) -> None:
        self.node = node
        self.ref = ref
        self.inputs = inputs
        self.opsets = opsets
        self._runner = runner
        self._scope = scope
        self._graph = graph

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def opset(self) -> int:
        return self.ref.opset

    @property
    def options(self) -> Options:
        return self._runner.options

    def derived[T](self, what: str, sources: tuple[Any, ...], build: Callable[[], T]) -> T:
        """`build()`, kept by this session's interpreter while the same attribute objects
        `sources` come back (common.DerivedTables): a table a host step's rule derives from its
        attributes, built once."""
        return self._runner.derived_tables.get(what, sources, build)

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def output_used(self, index: int) -> bool:
        """Whether the node names output `index` (optional outputs may be left out)."""
        return index < len(self.node.output) and bool(self.node.output[index])

    # --- static values and graph breaks -------------------------------------------------------

    @staticmethod
    def is_static(value: Value) -> bool:
        return is_static(value)

    def static(self, value: Value, what: str = "input") -> Any:
        """The numpy value of `value`; breaks the graph here when it is only known at run time."""
        if is_static(value):
            return value
        name = next((self.node.input[i] for i, v in enumerate(self.inputs) if v is value), None)
        raise NeedStatic(self.ref, what, name)

    def static_ints(self, value: Value, what: str = "input") -> tuple[int, ...]:
        """A static 0-D or 1-D integer input as a tuple of Python ints."""
        return tuple(int(v) for v in np.asarray(self.static(value, what)).reshape(-1))

    def break_graph(self, why: str) -> NoReturn:
        """End the compiled segment before this node: it runs on the host with concrete values."""
        raise NeedStatic(self.ref, why, None)

    # --- subgraphs and the enclosing graph ----------------------------------------------------

    def run_graph(self, graph: GraphProto, inputs: Sequence[Value]) -> list[Value]:
        """Run a subgraph attribute (If/Loop/Scan body) with this node's scope as outer scope."""
        return self._runner.run_graph(graph, inputs, self._scope, self.opsets)

    @property
    def graph_nodes(self) -> Sequence[NodeProto]:
        """The nodes of the graph (or function body) this node belongs to, in order."""
        return self._graph

    def defined(self, name: str) -> bool:
        """Whether `name` has a value in this node's scope (its graph and enclosing graphs)."""
        return name in self._scope

    def value(self, name: str) -> Value:
        """The value `name` has in this node's scope."""
        try:
            return self._scope.get(name)
        except KeyError:
            raise self.fail(f"value '{name}' is not defined here") from None

    def evaluate(self, nodes: Sequence[NodeProto], bindings: Mapping[str, Value],
                 names: Sequence[str]) -> list[Value]:
        """Run `nodes` of this node's graph with `bindings` overriding values; returns `names`."""
        scope = Scope(self._scope, bindings)
        self._runner.run_nested(nodes, scope, self.opsets, self._graph)
        return [scope.get(n) for n in names]

    def check(self, ok: Value, message: str, witness: Value = None) -> None:
        """Fail unless every element of `ok` is true, where the spec calls the input an error.

        Static: raises now. Traced: the compiled segment reports the first failed check after
        it runs, and the call raises an InputError; `{witness}` in the message shows the
        offending value. Checks inside subgraphs and model.fn's own traces are not made.
        """
        if is_static(ok):
            if not np.all(ok):
                shown = np.asarray(witness if witness is not None else ["?"]).reshape(-1)
                raise self.fail(message.format(witness=shown[0] if shown.size else "?"))
            return
        self._runner.add_check(ok, witness, f"{self.ref.describe()}: {message}")

    # --- errors -------------------------------------------------------------------------------

    def fail(self, message: str) -> LoweringError:
        """An error naming this node; the rule raises it."""
        return LoweringError(f"{self.ref.describe()}: {message}")

    def shape_error(self, message: str) -> ShapeError:
        """A ShapeError naming this node; the rule raises it."""
        return ShapeError(f"{self.ref.describe()}: {message}")

    def expect_rank(self, name: str, value: Value, rank: int | Sequence[int]) -> None:
        """Raise ShapeError unless `value` has one of the given ranks."""
        ranks = (rank,) if isinstance(rank, int) else tuple(rank)
        if len(value.shape) not in ranks:
            want = " or ".join(str(r) for r in ranks)
            raise self.shape_error(f"input {name} must have rank {want}, got {describe_value(value)}")
