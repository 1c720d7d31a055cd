"""Loading: bad files, external data kept inside the model's folder, IR 3 models, unknown ops."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import oxla
from oxla.errors import InvalidModelError, UnsupportedOpError


def _model_with_weight(n: int = 64) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(n, dtype=np.float32), "w")
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [n])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external(tmp_path: Path, location: str, length: int | None = None) -> Path:
    model = _model_with_weight()
    tensor = model.graph.initializer[0]
    raw = tensor.raw_data or np.arange(64, dtype=np.float32).tobytes()
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entries = {"location": location, "offset": "0", "length": str(length or len(raw))}
    for k, v in entries.items():
        tensor.external_data.add(key=k, value=v)
    (tmp_path / "weights.bin").write_bytes(raw)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_garbage_bytes() -> None:
    with pytest.raises(InvalidModelError, match="not a valid ONNX protobuf"):
        oxla.InferenceSession(b"\xff\xfe this is not a model")


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"")
    with pytest.raises(InvalidModelError, match="empty"):
        oxla.InferenceSession(str(tmp_path / "m.onnx"))


def test_truncated_file(tmp_path: Path) -> None:
    data = _model_with_weight(1000).SerializeToString()
    (tmp_path / "m.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match="truncated"):
        oxla.InferenceSession(str(tmp_path / "m.onnx"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="cannot read model file"):
        oxla.InferenceSession(str(tmp_path / "nope.onnx"))


def test_external_data_inside_folder_loads(tmp_path: Path) -> None:
    sess = oxla.InferenceSession(str(_external(tmp_path, "weights.bin")))
    (y,) = sess.run(None, {"x": np.ones(64, np.float32)})
    np.testing.assert_array_equal(y, np.arange(64, dtype=np.float32) + 1)


def test_external_data_escaping_folder(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    path = _external(inner, "../weights.bin")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 256)
    with pytest.raises(InvalidModelError, match="tensor 'w'.*escapes the model's folder"):
        oxla.InferenceSession(str(path))


def test_external_data_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="tensor 'w'.*absolute path"):
        oxla.InferenceSession(str(_external(tmp_path, str(tmp_path / "weights.bin"))))


def test_external_data_symlink_out_of_folder(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    inner.mkdir()
    path = _external(inner, "link.bin")
    (tmp_path / "outside.bin").write_bytes(b"\0" * 256)
    os.symlink(tmp_path / "outside.bin", inner / "link.bin")
    with pytest.raises(InvalidModelError, match="escapes"):
        oxla.InferenceSession(str(path))


def test_external_data_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="tensor 'w'.*not found"):
        oxla.InferenceSession(str(_external(tmp_path, "other.bin")))


def test_external_data_short_read(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match="tensor 'w'.*short: wanted 1000 bytes"):
        oxla.InferenceSession(str(_external(tmp_path, "weights.bin", length=1000)))


def test_external_data_from_bytes_needs_folder(tmp_path: Path) -> None:
    data = _external(tmp_path, "weights.bin").read_bytes()
    with pytest.raises(InvalidModelError, match="base_dir"):
        oxla.InferenceSession(data)
    model = oxla.load_model(data, base_dir=tmp_path)
    assert len(model.graph.initializer[0].raw_data) == 256


def test_unknown_ops_listed_together() -> None:
    m = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17, "com.acme" : 1]>
        g (float[3] x) => (float[3] y) { a = com.acme.Frob(x) b = com.acme.Blip(a) y = Relu(b) }
    """)
    with pytest.raises(UnsupportedOpError) as info:
        oxla.InferenceSession(m.SerializeToString())
    text = str(info.value)
    assert "com.acme::Blip at opset 1" in text and "com.acme::Frob at opset 1" in text


def test_ir3_weights_listed_as_inputs() -> None:
    model = _model_with_weight()
    model.ir_version = 3
    model.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [64]))
    sess = oxla.InferenceSession(model.SerializeToString())
    assert [i.name for i in sess.get_inputs()] == ["x"]
    (y,) = sess.run(None, {"x": np.zeros(64, np.float32)})
    np.testing.assert_array_equal(y, np.arange(64, dtype=np.float32))


def test_declared_but_unused_domain() -> None:
    model = _model_with_weight()
    model.opset_import.append(helper.make_opsetid("com.unused", 3))
    (y,) = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": np.ones(64, np.float32)})
    assert y[1] == 2.0


def test_ir3_initializer_listed_as_an_input_is_a_constant_as_in_onnxruntime() -> None:
    """Before IR 4 every initializer had to be listed as a graph input too; onnxruntime holds
    them constant (not among its session's inputs, a feed of one refused), and so does oxla. From
    IR 4 such an initializer is the caller's to override."""
    import onnxruntime as ort

    model = _model_with_weight()
    model.ir_version = 3
    model.graph.input.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [64]))
    data = model.SerializeToString()
    sess = oxla.InferenceSession(data)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == [i.name for i in ref.get_inputs()] == ["x"]
    assert sess.get_overridable_initializers() == [] == ref.get_overridable_initializers()
    x = np.zeros(64, np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    with pytest.raises(oxla.InputError, match=r"unknown input names \['w'\]"):
        sess.run(None, {"x": x, "w": np.ones(64, np.float32)})
    model.ir_version = 4
    (y,) = oxla.InferenceSession(model.SerializeToString()).run(None, {"x": x, "w": np.ones(64, np.float32)})
    np.testing.assert_array_equal(y, np.ones(64, np.float32))


def test_unsupported_old_schema_gives_its_reason() -> None:
    m = onnx.parser.parse_model("""
        <ir_version: 3, opset_import: ["" : 5]>
        g (float[2, 1, 3] x, float[1, 12, 3] w, float[1, 12, 4] r) => (float[2, 1, 1, 4] y) {
            y = GRU <hidden_size: int = 4> (x, w, r) }
    """)
    with pytest.raises(UnsupportedOpError, match=r"ai.onnx::GRU at opset 5 .*onnx.version_converter"):
        oxla.InferenceSession(m.SerializeToString())


# --- every external reference, at any depth, resolved inside the model's folder only ---------

def _externalize(tensor: onnx.TensorProto, location: str, offset: int = 0, length: int | None = None) -> bytes:
    raw = numpy_helper.to_array(tensor).tobytes()
    for field in ("raw_data", "float_data", "int64_data", "int32_data"):
        tensor.ClearField(field)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": str(offset),
                 "length": str(len(raw) if length is None else length)}.items():
        tensor.external_data.add(key=k, value=v)
    return raw


def _sparse_constant_model() -> onnx.ModelProto:
    values = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "vals")
    indices = numpy_helper.from_array(np.array([1, 3], np.int64), "idx")
    sparse = helper.make_sparse_tensor(values, indices, [4])
    node = helper.make_node("Constant", [], ["y"], sparse_value=sparse)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_sparse_constant_external_data_inside_the_folder_loads(tmp_path: Path) -> None:
    model = _sparse_constant_model()
    raw = _externalize(model.graph.node[0].attribute[0].sparse_tensor.values, "vals.bin")
    (tmp_path / "vals.bin").write_bytes(raw)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    (y,) = oxla.InferenceSession(str(tmp_path / "m.onnx")).run(None, {})
    assert y.tolist() == [0.0, 5.0, 0.0, 7.0]


def test_sparse_constant_external_data_outside_the_folder_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.array([1.0, 2.0], np.float32).tobytes())
    (tmp_path / "model").mkdir()
    model = _sparse_constant_model()
    _externalize(model.graph.node[0].attribute[0].sparse_tensor.values, "../secret.bin")
    (tmp_path / "model" / "m.onnx").write_bytes(model.SerializeToString())
    cwd = os.getcwd()
    os.chdir(tmp_path / "model")  # the old resolver read Constant data relative to the cwd
    try:
        with pytest.raises(InvalidModelError, match="escapes the model's folder"):
            oxla.InferenceSession(str(tmp_path / "model" / "m.onnx"))
    finally:
        os.chdir(cwd)


def _function_with_if_tensor() -> onnx.ModelProto:
    """A model-local function whose If branch holds a Constant tensor."""
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([3.0], np.float32)))
    then = helper.make_graph([const], "then", [], [helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [1])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "else", [],
                              [helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [1])])
    body = [helper.make_node("If", ["cond"], ["r"], then_branch=then, else_branch=other)]
    fn = helper.make_function("local", "Pick", ["cond", "x"], ["r"], body,
                              [helper.make_opsetid("", 17)])
    graph = helper.make_graph(
        [helper.make_node("Pick", ["cond", "x"], ["y"], domain="local")], "g",
        [helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    return helper.make_model(graph, functions=[fn], opset_imports=[helper.make_opsetid("", 17),
                                                                   helper.make_opsetid("local", 1)])


@pytest.mark.parametrize("inside", [True, False])
def test_tensor_in_an_if_inside_a_local_function(tmp_path: Path, inside: bool) -> None:
    model = _function_with_if_tensor()
    then = next(a.g for a in model.functions[0].node[0].attribute if a.name == "then_branch")
    tensor = then.node[0].attribute[0].t
    location = "c.bin" if inside else "../c.bin"
    raw = _externalize(tensor, location)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "c.bin").write_bytes(raw)
    (tmp_path / "c.bin").write_bytes(np.array([99.0], np.float32).tobytes())
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    if not inside:
        with pytest.raises(InvalidModelError, match="escapes the model's folder"):
            oxla.InferenceSession(str(folder / "m.onnx"))
        return
    sess = oxla.InferenceSession(str(folder / "m.onnx"))
    assert sess.run(None, {"cond": np.array(True), "x": np.array([1.0], np.float32)})[0].tolist() == [3.0]


@pytest.mark.parametrize("location,offset,length,message", [
    ("weights.bin\x00.txt", 0, None, "NUL byte"),
    ("weights.bin", 2**70, None, "short"),
    ("weights.bin", 0, 2**62, "short"),
    ("weights.bin", 8, 256, "short"),
])
def test_hostile_external_data_entries(tmp_path: Path, location: str, offset: int, length: int | None,
                                       message: str) -> None:
    model = _model_with_weight()
    raw = _externalize(model.graph.initializer[0], location, offset, length)
    (tmp_path / "weights.bin").write_bytes(raw)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(InvalidModelError, match=message):
        oxla.InferenceSession(str(tmp_path / "m.onnx"))


def test_an_opset_newer_than_onnx_knows_is_refused() -> None:
    model = _model_with_weight()
    model.opset_import[0].version = 999
    with pytest.raises(InvalidModelError, match="opset 999, newer than the"):
        oxla.InferenceSession(model.SerializeToString())


def test_unknown_data_type_is_named() -> None:
    model = _model_with_weight()
    model.graph.initializer[0].data_type = 1234
    with pytest.raises(InvalidModelError, match="tensor 'w' has unknown data type 1234"):
        oxla.load_model(model.SerializeToString(), check=False)


def test_string_data_that_is_not_utf8_is_named() -> None:
    tensor = helper.make_tensor("s", onnx.TensorProto.STRING, [1], [b"ok"])
    tensor.string_data[0] = b"\xff\xfe"
    out = helper.make_tensor_value_info("y", onnx.TensorProto.STRING, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["s"], ["y"])], "g", [], [out], [tensor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InvalidModelError, match="string tensor 's' holds bytes that are not UTF-8"):
        oxla.InferenceSession(model.SerializeToString())


# --- graph inputs and outputs without a shape (rank unknown), loaded as onnxruntime loads them ---

def _save_external(model: onnx.ModelProto, path: Path) -> None:
    """Save a copy of the model with every weight in weights.bin beside it."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save_model(copy, path, save_as_external_data=True, size_threshold=0, location="weights.bin")


def _unshaped(which: str) -> onnx.ModelProto:
    """y = Relu(x + b), b a scalar weight; `which` of x and y ("input", "output", "both") has no
    shape field at all (onnx.checker refuses that, the IR spec and onnxruntime do not)."""
    x_shape = None if which in ("input", "both") else [2, 3]
    y_shape = None if which in ("output", "both") else [2, 3]
    b = numpy_helper.from_array(np.float32(0.5), "b")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node("Relu", ["s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)], [b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("which", ["output", "input", "both"])
def test_unshaped_inputs_and_outputs_run_as_in_onnxruntime(which: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    data = _unshaped(which).SerializeToString()
    ours = oxla.InferenceSession(data)
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    # an input of unknown rank shows as [], as in onnxruntime (whose outputs show its own
    # shape inference; oxla's show what the model declares: [] for none)
    assert [i.shape for i in ours.get_inputs()] == [i.shape for i in theirs.get_inputs()]
    assert ours.get_outputs()[0].shape == ([] if which != "input" else [2, 3])
    xs = [np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)]
    if which != "output":  # any rank goes in
        xs += [np.array(-0.7, np.float32), np.float32([-2, 0, 3]), np.ones((2, 1, 2), np.float32) * -0.6]
    for x in xs:
        (want,) = theirs.run(None, {"x": x})
        (got,) = ours.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_unshaped_inputs_and_outputs_load_from_every_source(tmp_path: Path) -> None:
    model = _unshaped("both")
    weight = model.graph.initializer[0]
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    _save_external(model, tmp_path / "ext.onnx")
    for source in (model, model.SerializeToString(), tmp_path / "m.onnx", tmp_path / "ext.onnx"):
        loaded = oxla.load_model(source)
        # the shapes given for the check are gone: the model is as its file has it
        assert not any(v.type.tensor_type.HasField("shape")
                       for v in (*loaded.graph.input, *loaded.graph.output))
        assert loaded.graph.initializer[0].raw_data == weight.raw_data
    assert not model.graph.output[0].type.tensor_type.HasField("shape")  # the given proto untouched


def test_unshaped_inputs_and_outputs_still_get_the_checkers_other_errors(tmp_path: Path) -> None:
    model = _unshaped("both")
    model.graph.node[1].input[0] = "nowhere"  # read before any node writes it
    _save_external(model, tmp_path / "ext.onnx")
    for source in (model, model.SerializeToString(), tmp_path / "ext.onnx"):
        with pytest.raises(InvalidModelError, match="onnx.checker rejects the model: Nodes in a "
                           "graph must be topologically sorted, however input 'nowhere'"):
            oxla.load_model(source)
    broken = _unshaped("input")  # checked after the input without a shape: still checked
    broken.graph.output[0].type.tensor_type.ClearField("elem_type")
    with pytest.raises(InvalidModelError, match="Field 'elem_type' of 'type' is required"):
        oxla.load_model(broken.SerializeToString())


def test_unshaped_outputs_of_a_model_too_large_to_check_in_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _unshaped("output")
    _save_external(model, tmp_path / "ext.onnx")
    # as over 2 GiB: only the path can be checked, and its first complaint is the missing shape
    monkeypatch.setattr(onnx.checker, "MAXIMUM_PROTOBUF", 0)
    loaded = oxla.load_model(tmp_path / "ext.onnx")
    assert not loaded.graph.output[0].type.tensor_type.HasField("shape")
