"""NmsSplitPass: NonMaxSuppression with constant limits as a compiled hint and a host selection,
checked row for row against onnxruntime (onnx.reference is too slow for these sizes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla import native
from oxla.lowering.ops import image
from oxla.passes import nms_split
from oxla.passes.nms_split import DOMAIN, split_non_max_suppression

OPSET = 17


def nms_model(boxes: np.ndarray, scores: np.ndarray, limit: int, iou: float, score: float | None,
              *, fed: bool = False, **attrs: Any) -> onnx.ModelProto:
    """One NonMaxSuppression with its limit and thresholds as initializers (graph inputs: fed)."""
    consts = {"max": np.array([limit], np.int64), "iou": np.array([iou], np.float32),
              "score": np.array([-1.0 if score is None else score], np.float32)}
    names = ["boxes", "scores", "max", "iou", "score" if score is not None else ""]
    node = helper.make_node("NonMaxSuppression", names, ["selected"], name="nms", **attrs)
    inputs = [helper.make_tensor_value_info("boxes", onnx.TensorProto.FLOAT, boxes.shape),
              helper.make_tensor_value_info("scores", onnx.TensorProto.FLOAT, scores.shape)]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    if fed:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in inits]
    graph = helper.make_graph([node], "nms", inputs,
                              [helper.make_tensor_value_info("selected", onnx.TensorProto.INT64, ["n", 3])],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def run_both(model: onnx.ModelProto, boxes: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, bool]:
    """oxla's selection (asserted equal to onnxruntime's) and whether oxla split the node."""
    sess = oxla.InferenceSession(model.SerializeToString())
    got = sess.run(None, {"boxes": boxes, "scores": scores})[0]
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(
        None, {"boxes": boxes, "scores": scores})[0]
    np.testing.assert_array_equal(got, want)
    split = any(n.domain == DOMAIN for n in sess._compiled.plan.nodes)
    return got, split


@pytest.fixture
def whole_nms_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the host op's fall-backs to the whole NMS."""
    calls: list[int] = []
    whole = image.non_max_suppression

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return whole(*args, **kwargs)

    monkeypatch.setattr(image, "non_max_suppression", counted)
    return calls


@pytest.fixture(params=["native", "compiled"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The hint from oxla's NMS kernel (CPU sessions), or from the compiled ranked pass."""
    if request.param == "native" and not native.available():
        pytest.skip(f"oxla's native kernels: {native.unavailable_reason()}")
    monkeypatch.setattr(nms_split, "NATIVE_NMS", request.param == "native")
    return str(request.param)


def _boxes(rng: np.random.Generator, kind: str, shape: tuple[int, int], center: int) -> np.ndarray:
    if kind == "grid":  # on a half-unit grid: many equal, zero-area and reversed boxes
        return (rng.integers(0, 4, (*shape, 4)) / 2).astype(np.float32)
    if kind == "normal":  # corners in any order
        return (rng.standard_normal((*shape, 4)) * 2).astype(np.float32)
    xy, wh = rng.random((*shape, 2)) * 10, rng.random((*shape, 2)) * 3
    return np.concatenate([xy, wh if center else xy + wh], -1).astype(np.float32)


@pytest.mark.parametrize("center", [0, 1])
@pytest.mark.parametrize("kind", ["grid", "normal", "boxes"])
def test_split_matches_onnxruntime(kind: str, center: int, path: str) -> None:
    rng = np.random.default_rng(11)
    for n, classes, limit, iou, score in [(5, 3, 3, 0.5, None), (40, 2, 10, 0.0, 0.3),
                                          (300, 3, 50, 0.5, 0.5), (300, 2, 2**40, 0.7, None),
                                          (200, 2, 20, 1.0, 0.0), (120, 2, 8, 0.3, None)]:
        boxes = _boxes(rng, kind, (2, n), center)
        scores = (rng.integers(0, 5, (2, classes, n)) / 4 if kind == "grid"  # many ties
                  else rng.random((2, classes, n))).astype(np.float32)
        _, split = run_both(nms_model(boxes, scores, limit, iou, score, center_point_box=center),
                            boxes, scores)
        assert split


def test_detector_sized_case_is_settled_by_the_compiled_prefix(whole_nms_calls: list[int],
                                                              path: str) -> None:
    rng = np.random.default_rng(3)
    boxes = _boxes(rng, "boxes", (1, 1200), 0)
    scores = rng.random((1, 8, 1200)).astype(np.float32)
    got, split = run_both(nms_model(boxes, scores, 50, 0.5, 0.3), boxes, scores)
    assert split and len(got) == 400 and not whole_nms_calls


def test_settled_hint_is_sliced_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host step takes a settled hint's rows itself (the rule's `host` shortcut): no node runs
    through the interpreter after the first call compiled the segments (the rows not trimmed after
    the segment instead: see the tests of trim_nms_rows below)."""
    from oxla.lowering.interpreter import Interpreter

    monkeypatch.setattr(nms_split, "TRIM_ROWS", False)

    rng = np.random.default_rng(5)
    boxes = _boxes(rng, "boxes", (1, 300), 0)
    scores = rng.random((1, 3, 300)).astype(np.float32)
    model = nms_model(boxes, scores, 20, 0.5, 0.2)
    sess = oxla.InferenceSession(model.SerializeToString())
    feeds = {"boxes": boxes, "scores": scores}
    first = sess.run(None, feeds)[0]
    ran: list[str] = []
    run_node = Interpreter.run_node

    def counted(self: Interpreter, node: onnx.NodeProto, *args: Any, **kwargs: Any) -> None:
        ran.append(node.op_type)
        run_node(self, node, *args, **kwargs)

    monkeypatch.setattr(Interpreter, "run_node", counted)
    steps = sess._compiled.stats.host_steps
    got = sess.run(None, feeds)[0]
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, first)
    assert len(got) == 60 and ran == []
    assert sess._compiled.stats.host_steps == steps + 1  # still counted as a host step


def test_a_prefix_that_runs_out_falls_back_to_the_whole_nms(whole_nms_calls: list[int],
                                                            path: str) -> None:
    # the 100 best boxes are one box: the prefix keeps 1 of the 40 wanted, others remain; the
    # kernel goes on past its prefix itself
    boxes = np.tile(np.array([0, 0, 1, 1], np.float32), (300, 1))
    boxes[100:] += np.arange(200, dtype=np.float32)[:, None] * 2
    scores = np.linspace(1, 0.1, 300, dtype=np.float32)[None, None]
    got, _ = run_both(nms_model(boxes[None], scores, 40, 0.5, None), boxes[None], scores)
    assert len(got) == 40 and bool(whole_nms_calls) == (path == "compiled")


def test_ties_signed_zeros_and_nan_scores(path: str) -> None:
    boxes = np.stack([np.arange(200) * 2, np.zeros(200), np.arange(200) * 2 + 1, np.ones(200)], 1)
    boxes = boxes[None].astype(np.float32)
    tied = (np.arange(200)[::-1] // 7).astype(np.float32)[None, None]  # the cut falls in a tie
    assert len(run_both(nms_model(boxes, tied, 30, 0.5, None), boxes, tied)[0]) == 30
    zeros = np.where(np.arange(200) % 2, 0.0, -0.0).astype(np.float32)[None, None]
    run_both(nms_model(boxes, zeros, 30, 0.5, None), boxes, zeros)
    nan = np.random.default_rng(5).random((1, 1, 200)).astype(np.float32)
    nan[0, 0, ::9] = np.nan
    run_both(nms_model(boxes, nan, 30, 0.5, 0.2), boxes, nan)
    # without a threshold onnxruntime ranks a NaN score first, oxla's host NMS last: the split
    # leaves such a (batch, class) to the host NMS, so the two oxla paths agree
    feeds = {"boxes": boxes, "scores": nan}
    split, whole = (oxla.InferenceSession(nms_model(boxes, nan, 30, 0.5, None, fed=fed).SerializeToString())
                    .run(None, feeds)[0] for fed in (False, True))
    np.testing.assert_array_equal(split, whole)


def test_fed_thresholds_keep_the_onnx_op() -> None:
    boxes = _boxes(np.random.default_rng(2), "boxes", (1, 50), 0)
    scores = np.random.default_rng(2).random((1, 2, 50)).astype(np.float32)
    got, split = run_both(nms_model(boxes, scores, 5, 0.5, 0.1, fed=True), boxes, scores)
    assert not split and len(got) == 10
    assert split_non_max_suppression(nms_model(boxes, scores, 5, 0.5, None)) == 1


@pytest.mark.parametrize("score", [0.2, None])
def test_split_model_is_valid_onnx_and_runs_in_onnxruntime(score: float | None) -> None:
    rng = np.random.default_rng(4)
    boxes = _boxes(rng, "boxes", (1, 100), 0)
    scores = rng.random((1, 3, 100)).astype(np.float32)
    model = nms_model(boxes, scores, 10, 0.5, score)
    feeds = {"boxes": boxes, "scores": scores}
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert split_non_max_suppression(model) == 1
    onnx.checker.check_model(model)
    got = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("limit, score", [(0, 0.1), (5, 2.0)])
def test_nothing_to_select(limit: int, score: float) -> None:
    rng = np.random.default_rng(6)
    boxes = _boxes(rng, "boxes", (2, 30), 0)
    scores = rng.random((2, 3, 30)).astype(np.float32)
    got, split = run_both(nms_model(boxes, scores, limit, 0.5, score), boxes, scores)
    assert split and got.shape == (0, 3)


def test_native_kernel_is_the_host_nms() -> None:
    """oxla_snms against the host op's NMS (itself checked against onnxruntime above) on random
    cases: ties, signed zeros and NaN scores, degenerate, reversed, NaN and infinite boxes, tiny
    boxes whose intersection underflows, negative and out-of-range thresholds, both box formats,
    limits past the prefix; on one thread or two (rows compacted after)."""
    import jax
    import jax.numpy as jnp

    if not native.available():
        pytest.skip(f"oxla's native kernels: {native.unavailable_reason()}")
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for case in range(412):
            b, c, n = (int(v) for v in (rng.integers(1, 3), rng.integers(1, 4), rng.integers(1, 200)))
            if case >= 400:  # rows enough for the kernel to split them over two threads
                b, c, n = 2, 4, 1000
            kind = rng.integers(0, 4)
            if kind == 0:  # a small grid: equal, zero-area and reversed boxes
                boxes = rng.integers(0, 6, (b, n, 4)).astype(np.float32)
            elif kind == 1:  # tiny boxes: width times height underflows to 0
                boxes = (rng.random((b, n, 4)) * 1e-22).astype(np.float32)
            else:
                boxes = (rng.random((b, n, 4)) * 10).astype(np.float32)
            if rng.random() < 0.2:
                boxes[rng.random(boxes.shape) < 0.03] = rng.choice([np.nan, np.inf, -np.inf])
            scores = rng.random((b, c, n)).astype(np.float32)
            if rng.random() < 0.5:
                scores = np.round(scores * 4) / 4
            if rng.random() < 0.2:
                scores[rng.random(scores.shape) < 0.1] = rng.choice([np.nan, -0.0, 0.0])
            limit = int(rng.integers(1, n + 1)) if rng.random() < 0.5 else int(min(n, rng.integers(1, 6)))
            iou = np.float32(rng.choice([0.5, 0.0, 0.3, 1.0, -0.1]))
            score = None if rng.random() < 0.4 else np.float32(rng.choice([0.0, 0.3, -1.0]))
            center = int(rng.integers(0, 2))
            want = image.non_max_suppression(None, boxes, scores, np.array([limit]), np.array([iou]),
                                             None if score is None else np.array([score]),
                                             center_point_box=center)
            hint = np.asarray(image._native_nms(jnp.asarray(boxes), jnp.asarray(scores), limit, iou,
                                                score, center, threads=int(rng.integers(1, 3))))
            assert hint.shape == (1 + b * c * limit, 3)
            np.testing.assert_array_equal(image.settled_selection(hint), want)


def detector_tail(boxes: np.ndarray, scores: np.ndarray, limit: int, score: float | None,
                  tail: str = "rows") -> onnx.ModelProto:
    """nms_model plus a detector's reading of the selection: the kept boxes (Gather of the box
    column, Squeeze, Gather of batch 0's boxes by them) as a second output; `tail="sum"` reads
    the selection with a ReduceSum instead (not one row per row)."""
    model = nms_model(boxes, scores, limit, 0.5, score)
    graph = model.graph
    consts = {"col": np.array([2], np.int64), "axes": np.array([1], np.int64),
              "zero": np.array(0, np.int64)}
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
    if tail == "sum":
        graph.node.append(helper.make_node("ReduceSum", ["selected"], ["kept"], keepdims=0))
        out = helper.make_tensor_value_info("kept", onnx.TensorProto.INT64, [])
    else:
        graph.node.extend([
            helper.make_node("Gather", ["selected", "col"], ["idx2"], axis=1),
            helper.make_node("Squeeze", ["idx2", "axes"], ["idx"]),
            helper.make_node("Gather", ["boxes", "zero"], ["boxes0"]),
            helper.make_node("Gather", ["boxes0", "idx"], ["kept"]),
        ])
        out = helper.make_tensor_value_info("kept", onnx.TensorProto.FLOAT, ["n", 4])
    graph.output.append(out)
    return model


@pytest.mark.parametrize("score", [0.3, None])
def test_rows_are_trimmed_after_one_compiled_segment(score: float | None) -> None:
    """With the kernel's hint (CPU sessions) what reads the selection row by row runs on the padded
    rows in the one compiled segment, and the graph outputs are cut on the host: no host step, one
    compile, and onnxruntime's results for selections of every length, through the session's
    fast path and the executor's general path (JAX arrays) alike."""
    if not native.available():
        pytest.skip(f"oxla's native kernels: {native.unavailable_reason()}")
    rng = np.random.default_rng(8)
    boxes = _boxes(rng, "boxes", (1, 300), 0)
    scores = rng.random((1, 4, 300)).astype(np.float32)
    model = detector_tail(boxes, scores, 20, score)
    sess = oxla.InferenceSession(model.SerializeToString())
    assert [n.op_type for n in sess._compiled.plan.nodes[-2:]] == ["TakeRows", "TakeRows"]
    ref = onnxruntime.InferenceSession(model.SerializeToString())
    lengths = set()
    for scale in (1.0, 0.32, 0.305, 0.0):  # fewer and fewer scores above the threshold
        feeds = {"boxes": boxes, "scores": (scores * scale).astype(np.float32)}
        want = ref.run(None, feeds)
        for _ in range(2):
            got = sess.run(None, feeds)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)
        direct = sess._compiled(feeds)  # the general path, JAX arrays
        np.testing.assert_array_equal(np.asarray(direct["kept"]), want[1])
        lengths.add(len(want[0]))
    assert len(lengths) >= (3 if score is not None else 1)
    stats = sess._compiled.stats
    assert stats.host_steps == 0 and stats.compiles == 1


def test_the_trimmed_plan_runs_in_onnxruntime() -> None:
    """The planned model (HintRows, TakeRows and the ranked hint carry ONNX function bodies, the
    hint's now the settled one) gives onnxruntime its own results."""
    if not native.available():
        pytest.skip(f"oxla's native kernels: {native.unavailable_reason()}")
    rng = np.random.default_rng(9)
    boxes = _boxes(rng, "boxes", (1, 200), 0)
    scores = rng.random((1, 3, 200)).astype(np.float32)
    model = detector_tail(boxes, scores, 15, 0.4)
    planned = oxla.InferenceSession(model.SerializeToString())._compiled.model
    assert {n.op_type for n in planned.graph.node if n.domain == DOMAIN} >= {"HintRows", "TakeRows"}
    feeds = {"boxes": boxes, "scores": scores}
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    got = onnxruntime.InferenceSession(planned.SerializeToString()).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_other_readers_keep_the_host_step() -> None:
    """A reader that does not keep one row per selected row (a ReduceSum) leaves the rows to the
    host step, whose result it then reads."""
    rng = np.random.default_rng(10)
    boxes = _boxes(rng, "boxes", (1, 100), 0)
    scores = rng.random((1, 2, 100)).astype(np.float32)
    model = detector_tail(boxes, scores, 10, 0.2, tail="sum")
    sess = oxla.InferenceSession(model.SerializeToString())
    assert not any(n.op_type == "TakeRows" for n in sess._compiled.plan.nodes)
    feeds = {"boxes": boxes, "scores": scores}
    want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert sess._compiled.stats.host_steps == 1


def test_take_rows_refuses_an_unsettled_hint() -> None:
    with pytest.raises(oxla.OxlaError, match="did not settle"):
        nms_split.take_rows(np.zeros((5, 3), np.int64), np.full((1, 1), -1, np.int64))
    np.testing.assert_array_equal(
        nms_split.take_rows(np.arange(12).reshape(4, 3), np.array([[1, 2, 0], [0, 0, 0]])),
        np.arange(6).reshape(2, 3))
