"""TrainingSession on hand-written training models: step, bindings (good and malformed),
several TrainingInfoProtos, initialize, run, save and export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla.errors import InputError, TrainingError
from oxla.training import TrainingSession, checkpoint

TRAINING = "ai.onnx.preview.training"
W0 = np.array([1.0, 2.0, 3.0], np.float32)
X = np.array([[1.0, 0.5, -1.0], [2.0, -1.0, 0.0]], np.float32)
T = np.array([[0.0, 1.0, 2.0], [1.0, 1.0, 1.0]], np.float32)
LR = 0.1


def _tensor(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _vi(name: str, elem: int = TensorProto.FLOAT, shape: list | None = None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _sgd_algorithm(weight: str = "w", suffix: str = "") -> onnx.GraphProto:
    """loss = sum((y - t)^2); w_new = w - lr * dloss/dw; count_new = count + 1."""
    n = [helper.make_node("Sub", ["y", "t"], [f"d{suffix}"]),
         helper.make_node("Mul", [f"d{suffix}", f"d{suffix}"], [f"sq{suffix}"]),
         helper.make_node("ReduceSum", [f"sq{suffix}"], [f"loss{suffix}"], keepdims=0),
         helper.make_node("Gradient", [weight, "x", "t"], [f"g{suffix}"], xs=[weight], zs=["x", "t"],
                          y=f"loss{suffix}", domain=TRAINING),
         helper.make_node("Mul", [f"lr{suffix}", f"g{suffix}"], [f"step{suffix}"]),
         helper.make_node("Sub", [weight, f"step{suffix}"], [f"{weight}_new"]),
         helper.make_node("Add", [f"count{suffix}", f"one{suffix}"], [f"count{suffix}_new"])]
    return helper.make_graph(
        n, f"sgd{suffix}", [_vi("t", shape=["N", 3])],
        [_vi(f"loss{suffix}", shape=[]), _vi(f"{weight}_new", shape=[3]),
         _vi(f"count{suffix}_new", TensorProto.INT64, [])],
        [_tensor(f"lr{suffix}", np.float32(LR)), _tensor(f"count{suffix}", np.int64(0)),
         _tensor(f"one{suffix}", np.int64(1))])


def _model(infos: list[onnx.TrainingInfoProto], two_weights: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Mul", ["x", "w"], ["y0"])]
    inits = [_tensor("w", W0)]
    if two_weights:
        nodes.append(helper.make_node("Mul", ["y0", "v"], ["y"]))
        inits.append(_tensor("v", np.ones(3, np.float32)))
    else:
        nodes.append(helper.make_node("Identity", ["y0"], ["y"]))
    graph = helper.make_graph(nodes, "infer", [_vi("x", shape=["N", 3])], [_vi("y", shape=["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(TRAINING, 1)])
    model.ir_version = 8
    model.training_info.extend(infos)
    return model


def _info(algorithm: onnx.GraphProto, bindings: list[tuple[str, str]],
          init: onnx.GraphProto | None = None, init_bindings: list | None = None) -> onnx.TrainingInfoProto:
    return helper.make_training_info(algorithm, bindings, init, init_bindings)


SGD = [("w", "w_new"), ("count", "count_new")]


def test_step_updates_state_and_run_sees_it() -> None:
    sess = TrainingSession(_model([_info(_sgd_algorithm(), SGD)]))
    out = sess.step({"x": X, "t": T})
    assert set(out) == {"loss", "w_new", "count_new"}
    grad = (2 * (X * W0 - T) * X).sum(0)
    np.testing.assert_allclose(out["loss"], ((X * W0 - T) ** 2).sum(), rtol=1e-6)
    np.testing.assert_allclose(sess.state["w"], W0 - LR * grad, rtol=1e-6)
    assert int(sess.state["count"]) == 1
    (y,) = sess.run(None, {"x": X})
    np.testing.assert_allclose(y, X * sess.state["w"], rtol=1e-6)
    sess.run(None, {"x": X})  # run has no side effects
    np.testing.assert_allclose(sess.state["w"], W0 - LR * grad, rtol=1e-6)
    assert float(sess.step({"x": X, "t": T}, outputs=["loss"])["loss"]) < float(out["loss"])


def test_update_binding_may_take_an_inference_output() -> None:
    algorithm = helper.make_graph([], "noop", [], [])
    model = _model([_info(algorithm, [("acc", "y")])])
    model.graph.initializer.append(_tensor("acc", np.zeros((2, 3), np.float32)))
    sess = TrainingSession(model)
    sess.step({"x": X})
    np.testing.assert_allclose(sess.state["acc"], X * W0)


def test_several_training_infos_are_selected_by_index() -> None:
    second = _sgd_algorithm("v", "2")
    model = _model([_info(_sgd_algorithm(), SGD),
                    _info(second, [("v", "v_new"), ("count2", "count2_new")])], two_weights=True)
    sess = TrainingSession(model)
    assert sess.algorithms == 2
    sess.step({"x": X, "t": T}, algorithm=1)
    assert not np.allclose(sess.state["v"], 1.0)
    np.testing.assert_array_equal(sess.state["w"], W0)
    assert (int(sess.state["count"]), int(sess.state["count2"])) == (0, 1)
    sess.step({"x": X, "t": T}, algorithm=0)
    assert int(sess.state["count"]) == 1
    with pytest.raises(TrainingError, match="algorithm 2 does not exist; the model has 2"):
        sess.step({"x": X, "t": T}, algorithm=2)


def test_initialize_assigns_through_initialization_binding() -> None:
    init = helper.make_graph(
        [helper.make_node("Constant", [], ["w0"], value=_tensor("c", np.full(3, 0.5, np.float32))),
         helper.make_node("Constant", [], ["c0"], value=_tensor("c", np.int64(10)))],
        "init", [], [_vi("w0", shape=[3]), _vi("c0", TensorProto.INT64, [])])
    sess = TrainingSession(_model([_info(_sgd_algorithm(), SGD, init, [("w", "w0"), ("count", "c0")])]))
    sess.initialize()
    np.testing.assert_array_equal(sess.state["w"], np.full(3, 0.5, np.float32))
    sess.step({"x": X, "t": T})
    assert int(sess.state["count"]) == 11


def _bad(update: list[tuple[str, str]] | None = None, **changes: object) -> onnx.ModelProto:
    algorithm = _sgd_algorithm()
    if changes.get("untyped_w_new"):
        algorithm.output[1].CopyFrom(helper.make_empty_tensor_value_info("w_new"))
    model = _model([_info(algorithm, update or SGD, changes.get("init"), changes.get("init_bindings"))])
    if changes.get("second"):
        copy = helper.make_graph([helper.make_node("Identity", ["w"], ["w_copy"])], "b", [],
                                 [_vi("w_copy", shape=[3])])
        model.training_info.append(_info(copy, [("w", "w_copy")]))
    return model


EMPTY_INIT = helper.make_graph([helper.make_node("Constant", [], ["z"], value=_tensor("c", np.zeros(2, np.float32)))],
                               "init", [], [_vi("z", shape=[2])])


@pytest.mark.parametrize(("model", "message"), [
    (_bad([("nope", "w_new")]), r"update_binding 'nope' <- 'w_new': the key must be an initializer.*"
                                "not defined anywhere"),
    (_bad([("x", "w_new")]), r"'x' <- 'w_new': .*'x' is an input of graph 'infer'"),
    (_bad([("y0", "w_new")]), r"'y0' <- 'w_new': .*'y0' is computed by node 'Mul'"),
    (_bad([("w", "w_new"), ("w", "count_new")]), r"'w' <- 'count_new': 'w' is bound twice"),
    (_bad(second=True), r"training_info\[1\].update_binding 'w' <- 'w_copy': 'w' is already bound by "
                        r"training_info\[0\]"),
    (_bad([("w", "d")]), r"'w' <- 'd': the value must be an output of the algorithm graph or of the "
                         "inference graph; 'd' is computed by node 'Sub'"),
    (_bad([("w", "count_new")]), r"'w' <- 'count_new': type mismatch, initializer 'w' is float32 "
                                 r"\(3,\) but 'count_new' is declared int64 \(\)"),
    (_bad([("w", "loss")]), r"'w' <- 'loss': type mismatch.*float32 \(\)"),
    (_bad(init=EMPTY_INIT, init_bindings=[("w", "z")]),
     r"initialization_binding 'w' <- 'z': type mismatch, initializer 'w' is float32 \(3,\) but 'z' "
     r"is declared float32 \(2,\)"),
    (_bad(init=EMPTY_INIT, init_bindings=[("w", "w_new")]),
     r"initialization_binding 'w' <- 'w_new': the value must be an output of the initialization graph"),
])
def test_malformed_bindings_are_refused_at_load(model: onnx.ModelProto, message: str) -> None:
    with pytest.raises(TrainingError, match=message):
        TrainingSession(model)


def test_undeclared_shape_mismatch_is_caught_at_step() -> None:
    model = _bad([("w", "w_new"), ("count", "count_new")], untyped_w_new=True)
    model.training_info[0].algorithm.node[5].input[0] = "lr"   # w_new = lr - step: still (3,)
    TrainingSession(model).step({"x": X, "t": T})
    model.training_info[0].algorithm.node[5].input[1] = "lr"   # w_new = lr - lr: a scalar
    with pytest.raises(TrainingError, match=r"update_binding 'w' <- 'w_new': 'w_new' is float32 \(\) "
                                            r"but 'w' is float32 \(3,\)"):
        TrainingSession(model).step({"x": X, "t": T})


def test_feeds_and_model_without_training_are_checked() -> None:
    sess = TrainingSession(_model([_info(_sgd_algorithm(), SGD)]))
    with pytest.raises(InputError, match=r"missing feeds \['t'\]"):
        sess.step({"x": X})
    with pytest.raises(InputError, match="feed 't' must have dtype float"):
        sess.step({"x": X, "t": T.astype(np.float64)})
    with pytest.raises(TrainingError, match="unknown outputs"):
        sess.step({"x": X, "t": T}, outputs=["nope"])
    with pytest.raises(TrainingError, match="no training_info"):
        TrainingSession(_model([]))
    with pytest.raises(TrainingError, match="asked for 64 devices"):
        TrainingSession(_model([_info(_sgd_algorithm(), SGD)]), devices=64)


def test_save_and_export(tmp_path: Path) -> None:
    sess = TrainingSession(_model([_info(_sgd_algorithm(), SGD)]))
    sess.step({"x": X, "t": T})
    sess.save(tmp_path / "trained.onnx", metadata={"note": "one step"})
    saved = onnx.load(tmp_path / "trained.onnx")
    assert len(saved.training_info) == 1
    assert {p.key: p.value for p in saved.metadata_props}["note"] == "one step"
    again = TrainingSession(tmp_path / "trained.onnx")
    for name, value in sess.state.items():
        np.testing.assert_array_equal(again.state[name], value)
    sess.export_inference(tmp_path / "infer.onnx")
    infer = onnx.load(tmp_path / "infer.onnx")
    assert not infer.training_info
    onnx.checker.check_model(infer)
    want = sess.run(None, {"x": X})
    got = ort.InferenceSession(str(tmp_path / "infer.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(oxla.InferenceSession(tmp_path / "infer.onnx").run(None, {"x": X})[0], want[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["infer.onnx", "trained.onnx"]


def test_a_failed_save_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sess = TrainingSession(_model([_info(_sgd_algorithm(), SGD)]))
    target = tmp_path / "ckpt.onnx"
    sess.save(target)
    before = target.read_bytes()
    sess.step({"x": X, "t": T})

    def fail(f: object, data: bytes) -> None:
        f.write(data[: len(data) // 2])  # type: ignore[attr-defined]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_all", fail)
    with pytest.raises(TrainingError, match="No space left on device; the previous file"):
        sess.save(target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.onnx"]


def test_save_refuses_a_directory_or_a_device_and_reports_a_size_limit(tmp_path: Path) -> None:
    import resource

    sess = TrainingSession(_model([_info(_sgd_algorithm(), SGD)]))
    with pytest.raises(TrainingError, match="it is a directory"):
        sess.save(tmp_path)
    with pytest.raises(TrainingError, match="not a regular file"):
        sess.save("/dev/null")
    target = tmp_path / "m.onnx"
    sess.save(target)
    before = target.read_bytes()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))  # Python ignores SIGXFSZ: writes fail
    try:
        with pytest.raises(TrainingError, match="cannot write .*previous file, if any, is unchanged"):
            sess.save(target)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temp file left behind
