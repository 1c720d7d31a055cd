"""Hostile inputs (issue 9): each gets a clear oxla error, the exact correct result, or a bounded run.

Nothing is read from outside the model's folder, nothing crashes, nothing allocates past the
memory limit before refusing. Cases that could crash or hang the process (resource bombs, long
loops, deep control flow) run in one child process (tests/hostile_cases.py) under a timeout.

| class                 | cases                                                     | tests                                   |
|-----------------------|-----------------------------------------------------------|-----------------------------------------|
| files                 | garbage, empty, truncated protobuf; missing file          | test_load: test_garbage_bytes,          |
|                       |                                                           |   test_empty_file, test_truncated_file  |
|                       | unknown data_type 1234; non-UTF-8 string tensor           | test_load: test_unknown_data_type_..,   |
|                       |                                                           |   test_string_data_that_is_not_utf8..   |
|                       | opset 999 (default domain)                                | test_load: test_an_opset_newer_than..   |
|                       | opset 999 of ai.onnx.ml; unknown domain's ops             | test_opsets_*                           |
|                       | NUL byte in an external-data location                     | test_load: test_hostile_external_data.. |
|                       | directory, /dev/zero, FIFO, symlink to a device as model  | test_non_regular_model_files            |
|                       | a NUL byte in the model's path                            | test_a_nul_byte_in_the_model_path       |
|                       | exported artifacts (.oxla) with a damaged header/program  | test_damaged_exported_models            |
| external data         | absolute path, '..', symlink out, offset 2**70,           | test_load: test_external_data_*,        |
|                       | length 2**62, length past the end                         |   test_hostile_external_data_entries    |
|                       | Constant sparse_value outside (refused) / inside (loads)  | test_load: test_sparse_constant_*       |
|                       | If branch in a model-local function pointing outside      | test_load: test_tensor_in_an_if_inside..|
|                       | bytes with external data and no base_dir                  | test_load: test_external_data_from_by.. |
|                       | sparse_initializer and training_info tensors outside;     | test_external_*                         |
|                       | a FIFO or device as the data file                         |                                         |
| resource bombs        | ConstantOfShape, Expand, Tile, Pad, Range, Resize, OneHot | test_bomb_is_refused_before_allocating  |
|                       | (depth 1e12), NonZero, Concat doublings, Loop 2**62 with  |   (child process), test_peak_rss_..     |
|                       | a scan output, StringSplit, StringConcat, Tokenizer,      | test_resources (traced shapes)          |
|                       | ImageDecoder (a 69-byte PNG claiming 12000x12000); sizes  |                                         |
|                       | fed at run time (host steps), folded from constants;      |                                         |
|                       | Add/MatMul/Einsum/Gather of small constants               |                                         |
|                       | `oxla run --dim N=10**12` / `N=1e12`                      | test_cli_refusals                       |
| feeds                 | wrong dtype, wrong shape/rank, too few, unknown names,    | test_bad_feeds (InferenceSession, and   |
|                       | a list or None instead of a dict                          |   with onnxruntime's options),          |
|                       |                                                           | test_bad_feeds_through_the_backend,     |
|                       |                                                           | test_compiled_model_takes_a_dict_only   |
|                       | a ragged nested list                                      | test_ragged_list_feed                   |
| memory budget         | oxla.compile(memory_limit=...)                            | test_compile_takes_the_memory_limit     |
| runtime indices       | Gather, GatherElements, GatherND, ScatterElements,        | test_index: test_runtime_indices_out_.. |
|                       | ScatterND out of range: InputError naming the node        |                                         |
| caches                | 300 batch sizes                                           | test_runtime: test_cache_stays_at_its.. |
|                       | 200 string values, 200 overridden initializer values      | test_cache_*                            |
|                       | (plain and needed static)                                 |                                         |
| deep control flow     | 25 nested Ifs on a runtime condition, a 10**6-iteration   | test_long_and_deep_runs (child process) |
|                       | Loop over constants                                       |                                         |
| training files        | non-numeric epoch metadata, truncated .npz, scalar x/y    | training/test_cli: test_train_refuses.. |
|                       |                                                           |   test_a_checkpoint_whose_epoch_is_not..|
|                       | step and run from two threads                             | test_runtime: test_training_step_and_.. |
|                       | .npz declaring 10**12 values, FIFO or device as --data    | test_train_data_file_refusals           |
| degenerate sizes      | Range to inf, Resize scales inf/negative, negative Tile   | test_degenerate_sizes_are_refused       |
|                       | repeats and ConstantOfShape dims                          |                                         |
| CLI                   | one message, exit 2: bad model, bad data file, --out a    | test_cli: test_errors_are_one_message.. |
|                       | directory, --compare onnxruntime refusing the model       | training/test_cli: test_train_refuses.. |
|                       | device/FIFO/directory model, device input, huge --dim     | test_cli_refusals                       |
|                       | export -o / lint --fix onto a device, FIFO or directory   | test_cli_never_renames_over_a_special.. |
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import oxla
from oxla import backend
from oxla.cli import main
from oxla.errors import InputError, InvalidModelError, UnsupportedOpError
from tests.hostile_cases import LIMIT, text_model

ROOT = Path(__file__).resolve().parent.parent
CHILD_TIMEOUT = 300


# --- files ------------------------------------------------------------------------------------

def _add_model() -> onnx.ModelProto:
    return text_model("g (float[2] x, float[2] w) => (float[2] y) <float[2] w = {1.0, 2.0}> { y = Add(x, w) }")


@pytest.mark.parametrize("kind", ["directory", "dev-zero", "fifo", "symlink-to-device"])
def test_non_regular_model_files(tmp_path: Path, kind: str) -> None:
    path = {"directory": tmp_path, "dev-zero": Path("/dev/zero")}.get(kind, tmp_path / "m.onnx")
    if kind == "fifo":
        os.mkfifo(path)  # reading it would block forever
    elif kind == "symlink-to-device":
        os.symlink("/dev/zero", path)  # reading it would never end
    with pytest.raises(InvalidModelError, match=r"cannot read model file .*not a regular file"):
        oxla.InferenceSession(str(path))


def test_a_nul_byte_in_the_model_path() -> None:
    with pytest.raises(InvalidModelError, match="cannot read model file .*the path contains a NUL byte"):
        oxla.InferenceSession("model\0.onnx")
    with pytest.raises(InvalidModelError, match="the path contains a NUL byte"):
        oxla.load_exported("model\0.oxla")


def test_opsets_newer_than_onnx_knows_in_any_onnx_domain() -> None:
    model = _add_model()
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 999))
    with pytest.raises(InvalidModelError, match="imports domain 'ai.onnx.ml' at opset 999, newer than"):
        oxla.InferenceSession(model.SerializeToString())


def test_opsets_of_an_unknown_domain_name_its_ops() -> None:
    model = _add_model()
    model.opset_import.append(helper.make_opsetid("com.hostile", 12345))
    model.graph.node.append(helper.make_node("Boom", ["y"], ["z"], domain="com.hostile", name="b"))
    model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]))
    with pytest.raises(UnsupportedOpError, match=r"com.hostile::Boom at opset 12345 \(node 'b'\)"):
        oxla.InferenceSession(model.SerializeToString())


# --- external data ----------------------------------------------------------------------------

def _externalize(tensor: TensorProto, location: str) -> bytes:
    raw = numpy_helper.to_array(tensor).tobytes()
    for field in ("raw_data", "float_data", "int64_data"):
        tensor.ClearField(field)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in {"location": location, "offset": "0", "length": str(len(raw))}.items():
        tensor.external_data.add(key=key, value=value)
    return raw


def _save_in(folder: Path, model: onnx.ModelProto) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "m.onnx").write_bytes(model.SerializeToString())
    return folder / "m.onnx"


def _sparse_initializer_model() -> onnx.ModelProto:
    values = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "w")
    indices = numpy_helper.from_array(np.array([1, 3], np.int64), "w_idx")
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x", "y"))
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y],
                              sparse_initializer=[helper.make_sparse_tensor(values, indices, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("inside", [True, False])
def test_external_sparse_initializer(tmp_path: Path, inside: bool) -> None:
    model = _sparse_initializer_model()
    raw = _externalize(model.graph.sparse_initializer[0].values, "w.bin" if inside else "../w.bin")
    (tmp_path / "w.bin").write_bytes(np.array([1.0, 2.0], np.float32).tobytes())  # the outside one
    path = _save_in(tmp_path / "model", model)
    (path.parent / "w.bin").write_bytes(raw)
    if not inside:
        with pytest.raises(InvalidModelError, match="tensor 'w'.*'../w.bin' escapes the model's folder"):
            oxla.InferenceSession(str(path))
        return
    (y,) = oxla.InferenceSession(str(path)).run(None, {"x": np.ones(4, np.float32)})
    assert y.tolist() == [1.0, 6.0, 1.0, 8.0]


def test_external_training_info_tensor_outside_is_refused(tmp_path: Path) -> None:
    model = _add_model()
    init = helper.make_graph(
        [helper.make_node("Constant", [], ["w0"], value=numpy_helper.from_array(np.zeros(2, np.float32), "c"))],
        "init", [], [helper.make_tensor_value_info("w0", TensorProto.FLOAT, [2])])
    info = helper.make_training_info(helper.make_graph([], "algo", [], []), [], init, [("w", "w0")])
    model.training_info.append(info)
    _externalize(model.training_info[0].initialization.node[0].attribute[0].t, "../c.bin")
    (tmp_path / "c.bin").write_bytes(b"\0" * 8)
    path = _save_in(tmp_path / "model", model)
    with pytest.raises(InvalidModelError, match="tensor 'c'.*escapes the model's folder"):
        oxla.load_model(str(path), check=False)


@pytest.mark.parametrize("kind", ["fifo", "device-link", "directory"])
def test_external_data_file_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    model = _add_model()
    _externalize(model.graph.initializer[0], "w.bin")
    path = _save_in(tmp_path, model)
    if kind == "fifo":
        os.mkfifo(tmp_path / "w.bin")
        message = "not found in .* \\(or not a regular file\\)"
    elif kind == "device-link":
        os.symlink("/dev/zero", tmp_path / "w.bin")
        message = "escapes the model's folder"
    else:
        (tmp_path / "w.bin").mkdir()
        message = "not a regular file"
    with pytest.raises(InvalidModelError, match=f"tensor 'w'.*{message}"):
        oxla.InferenceSession(str(path))


def _damaged_export(edit: Callable[[dict[str, Any]], None], payload: bytes | None = None) -> bytes:
    """FEED_MODEL exported, then its JSON header edited (and its program replaced)."""
    import struct

    data = oxla.export_model(FEED_MODEL).data
    (size,) = struct.unpack_from("<I", data, 8)
    header = json.loads(data[12:12 + size])
    edit(header)
    blob = json.dumps(header).encode()
    return data[:8] + struct.pack("<I", len(blob)) + blob + (data[12 + size:] if payload is None else payload)


def _set_input(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda header: header["inputs"][0].__setitem__(key, value)


@pytest.mark.parametrize("edit,payload,message", [
    (_set_input("shape", [-5, 3]), None, r"damaged export header: .*'a' has shape \[-5, 3\]"),
    (_set_input("shape", "abc"), None, "damaged export header: .*'a' has shape 'abc'"),
    (_set_input("dtype", "foo"), None, "damaged export header: .*'a' has unknown dtype 'foo'"),
    (_set_input("index_bound", -3), None, "damaged export header: input 'a' has index_bound -3"),
    (lambda header: header.__setitem__("inputs", {"a": 1}), None, "damaged export header"),
    (lambda header: None, b"\0garbage" * 10, "cannot deserialize the exported program"),
], ids=["negative-dim", "shape-not-a-list", "unknown-dtype", "index-bound", "inputs-not-a-list", "program"])
def test_damaged_exported_models(tmp_path: Path, edit: Callable[[dict[str, Any]], None],
                                 payload: bytes | None, message: str) -> None:
    (tmp_path / "m.oxla").write_bytes(_damaged_export(edit, payload))
    with pytest.raises(InvalidModelError, match=message):
        oxla.load_exported(tmp_path / "m.oxla").run(None, {"a": A, "b": A})


# --- resource bombs, long loops, deep control flow (one child process) -----------------------

@pytest.fixture(scope="module")
def child_results() -> dict[str, dict[str, Any]]:
    """Run tests/hostile_cases.py once; its results by case name (a case that killed the child
    is missing, and the tests for it and every later case fail showing the child's stderr)."""
    proc = subprocess.run([sys.executable, "-m", "tests.hostile_cases", "bombs", "long"], cwd=ROOT,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            results[result["case"]] = result
    results["_child"] = {"returncode": proc.returncode, "stderr": proc.stderr[-3000:]}
    return results


BOMBS = {  # case -> (op, shape in the message, bytes in the message)
    "ConstantOfShape-rt": ("ConstantOfShape", "(1000000, 1000000) float32", "3.6 TiB"),
    "Expand-rt": ("Expand", "(1000000, 1000000) float32", "3.6 TiB"),
    "Tile-rt": ("Tile", "(2000000000000,) float32", "7.3 TiB"),
    "Tile-const": ("Tile", "(536870912,) float32", "2.0 GiB"),
    "Pad-rt": ("Pad", "(1000000000002,) float32", "3.6 TiB"),
    "Pad-const": ("Pad", "(536870914,) float32", "2.0 GiB"),
    "Range-rt": ("Range", "(1000000000000,) int64", "7.3 TiB"),
    "Range-const": ("Range", "(536870912,) float64", "4.0 GiB"),   # computed in float64
    "Resize-rt": ("Resize", "(1, 1, 1000000, 1000000) float32", "3.6 TiB"),
    "Resize-const": ("Resize", "(1, 1, 16384, 16384) float32", "1.0 GiB"),
    "OneHot-const": ("OneHot", "(2, 1000000000000) float32", "7.3 TiB"),  # was a SIGABRT
    "OneHot-rt": ("OneHot", "(2, 1000000000000) float32", "7.3 TiB"),
    "NonZero-rt": ("NonZero", "(2, 33554432) int64", "512.0 MiB"),
    "Concat-traced": ("Concat", "(134217728,) float32", "512.0 MiB"),
    "Concat-const": ("Concat", "(134217728,) float32", "512.0 MiB"),
    "Loop-rt": ("Loop", "(4611686018427387904,) float32", "16384.0 PiB"),
    "Add-const": ("Add", "(20000, 20000) float32", "1.5 GiB"),
    "MatMul-const": ("MatMul", "(20000, 20000) float32", "1.5 GiB"),
    "Einsum-const": ("Einsum", "(20000, 20000) float32", "1.5 GiB"),
    "Gather-const": ("Gather", "(20000, 20000) float32", "1.5 GiB"),
    "StringSplit-rt": ("StringSplit", "(20001, 20000) object", "3.0 GiB"),
    "Tokenizer-rt": ("Tokenizer", "(20001, 20000) object", "3.0 GiB"),
    "ImageDecoder-rt": ("ImageDecoder", "(12000, 12000, 3) uint8", "412.0 MiB"),  # a 69-byte PNG
    "StringConcat-rt": ("StringConcat", "(20000, 20000) object", "3.0 GiB"),
}


def _result(results: dict[str, dict[str, Any]], case: str) -> dict[str, Any]:
    assert case in results, f"the child died before or at case {case}: {results['_child']}"
    return results[case]


@pytest.mark.parametrize("case", sorted(BOMBS))
def test_bomb_is_refused_before_allocating(child_results: dict[str, dict[str, Any]], case: str) -> None:
    op, shape, size = BOMBS[case]
    got = _result(child_results, case)
    assert got.get("error") == "ResourceError", got
    domain = "com.microsoft" if op == "Tokenizer" else "ai.onnx"
    assert got["message"].startswith(f"{op} node ({domain} v"), got
    assert f"an output of shape {shape} would take {size}, more than the memory limit 256.0 MiB" in got["message"]


def test_peak_rss_stays_bounded(child_results: dict[str, dict[str, Any]]) -> None:
    # Every bomb asks for >= 512 MiB, the folded ones for 1-4 GiB that would fit in memory; had
    # any been allocated before its refusal, the peak would pass 2 GiB. Under the limit, values
    # may add up (the 27 folded Concat constants hold 512 MiB together): the limit is per value.
    peak = _result(child_results, "peak_rss")["bytes"]
    assert peak < 1536 << 20, f"peak RSS {peak / 2**20:.0f} MiB with a memory limit of {LIMIT >> 20} MiB"
    assert child_results["_child"]["returncode"] == 0, child_results["_child"]


@pytest.mark.parametrize("case,expect", [
    ("Loop-1e6", [[1000000.0]]),
    ("If-nested-25-true", [[1.0]]),
    ("If-nested-25-false", [[-1.0]]),
])
def test_long_and_deep_runs(child_results: dict[str, dict[str, Any]], case: str, expect: list[Any]) -> None:
    got = _result(child_results, case)
    assert got.get("ok") == expect, got


# --- feeds, through every entry point ---------------------------------------------------------

A = np.ones((2, 3), np.float32)
FEED_MODEL = text_model("g (float[2, 3] a, float[2, 3] b) => (float[2, 3] y) { y = Add(a, b) }")


def _runner(kind: str) -> Callable[[Any], Any]:
    data = FEED_MODEL.SerializeToString()
    if kind == "session":
        sess = oxla.InferenceSession(data)
        return lambda feeds: sess.run(None, feeds)
    if kind == "ort-api":
        ort_sess = oxla.InferenceSession(data, sess_options=oxla.SessionOptions(),
                                         providers=["CPUExecutionProvider"])
        return lambda feeds: ort_sess.run(None, feeds, oxla.RunOptions())
    if kind == "backend":
        rep = backend.prepare(FEED_MODEL)
        return lambda feeds: rep.run(feeds)
    compiled = oxla.compile(FEED_MODEL)
    return lambda feeds: compiled(feeds)


BAD_FEEDS = [  # (case, feeds, message); backend takes lists too, so it has its own list cases
    ("dtype", {"a": A.astype(np.float64), "b": A}, "input 'a' must have dtype float32, got float64"),
    ("shape", {"a": np.ones((5, 3), np.float32), "b": A}, r"input 'a' must have shape \(2, 3\), got \(5, 3\)"),
    ("rank", {"a": A[None], "b": A}, r"input 'a' must have shape \(2, 3\), got \(1, 2, 3\)"),
    ("strings", {"a": np.array([["x"] * 3] * 2), "b": A}, "input 'a' must have dtype float32, got <U1"),
    ("too-few", {"a": A}, r"missing inputs \['b'\]; the model's inputs are \['a', 'b'\]"),
    ("unknown", {"a": A, "b": A, "c": A}, r"unknown input names \['c'\]; the model's inputs are \['a', 'b'\]"),
    ("list", [A, A], "feeds must be a dict of input name -> array, got list"),
    ("none", None, "feeds must be a dict of input name -> array, got NoneType"),
]


@pytest.mark.parametrize("kind", ["session", "ort-api"])
@pytest.mark.parametrize("case,feeds,message", BAD_FEEDS, ids=[c[0] for c in BAD_FEEDS])
def test_bad_feeds(kind: str, case: str, feeds: Any, message: str) -> None:
    run = _runner(kind)
    with pytest.raises(InputError, match=message):
        run(feeds)
    assert run({"a": A, "b": A})[0].tolist() == (2 * A).tolist()


@pytest.mark.parametrize("feeds,message", [
    ([A.astype(np.float64), A], "input 'a' must have dtype float32, got float64"),
    ([A], r"missing inputs \['b'\]"),
    ([A, A, A], r"3 inputs given, the model takes 2: \['a', 'b'\]"),
    ({"a": A, "zz": A}, r"unknown input names \['zz'\]"),
    (None, r"inputs must be a list of arrays \(graph order\) or a dict .*got NoneType"),
    (3.0, "got float"),
], ids=["dtype", "too-few", "too-many", "unknown", "none", "scalar"])
def test_bad_feeds_through_the_backend(feeds: Any, message: str) -> None:
    run = _runner("backend")
    with pytest.raises(InputError, match=message):
        run(feeds)
    assert run([A, A])[0].tolist() == (2 * A).tolist()


@pytest.mark.parametrize("feeds", [[A, A], None], ids=["list", "none"])
def test_compiled_model_takes_a_dict_only(feeds: Any) -> None:
    run = _runner("compile")
    with pytest.raises(InputError, match=r"inputs must be a dict of input name -> array, got .*"
                                         r"the model's inputs are \['a', 'b'\]"):
        run(feeds)
    assert np.asarray(run({"a": A, "b": A})["y"]).tolist() == (2 * A).tolist()


def test_compile_takes_the_memory_limit() -> None:
    tile = text_model("g (float[2] x, int64[1] r) => (float[N] y) { y = Tile(x, r) }")
    compiled = oxla.compile(tile, memory_limit=1 << 20)
    x = np.ones(2, np.float32)
    assert np.asarray(compiled({"x": x, "r": np.array([3])})["y"]).tolist() == [1.0] * 6
    with pytest.raises(oxla.ResourceError, match=r"Tile node .*\(262146,\) float32 would take 1.0 MiB, more "
                                                 r"than the memory limit 1.0 MiB"):
        compiled({"x": x, "r": np.array([131073])})


def test_ragged_list_feed() -> None:
    sess = oxla.InferenceSession(FEED_MODEL.SerializeToString())
    with pytest.raises(InputError, match="input 'a'"):
        sess.run(None, {"a": [[1.0, 2.0, 3.0], [1.0]], "b": A})


# --- caches stay at their bound ---------------------------------------------------------------

def test_cache_200_string_values_compile_once() -> None:
    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 18, "ai.onnx.ml" : 3]>' + """
        g (string[N] s) => (int64[N] y) {
            y = ai.onnx.ml.LabelEncoder<keys_strings = ["a", "b"], values_int64s = [1, 2], default_int64 = -1>(s)
        }""")
    sess = oxla.InferenceSession(model.SerializeToString(), cache_size=16)
    for n in range(200):
        assert sess.run(None, {"s": np.array([f"w{n}", "b"], object)})[0].tolist() == [-1, 2]
    info = sess.compiled.cache_info()
    assert info.size <= 2 and info.misses <= 2 and sess.compiled.stats.compiles == 0  # strings: host only


def test_cache_200_overridden_initializer_values() -> None:
    plain = text_model("g (float[3] x, float[3] w) => (float[3] y) <float[3] w = {1.0, 2.0, 3.0}> { y = Mul(x, w) }")
    sess = oxla.InferenceSession(plain.SerializeToString(), cache_size=16)
    for k in range(200):
        w = np.full(3, k, np.float32)
        assert sess.run(None, {"x": np.ones(3, np.float32), "w": w})[0].tolist() == [k] * 3
    assert sess.compiled.stats.compiles == 1 and sess.compiled.cache_info().size == 1


def test_cache_200_values_of_an_initializer_a_rule_needs_static() -> None:
    # Tile's repeats shape the output: each value compiles its own segment; the cache keeps 16
    tile = text_model("g (float[2] x, int64[1] r) => (float[N] y) <int64[1] r = {2}> { y = Tile(x, r) }")
    sess = oxla.InferenceSession(tile.SerializeToString(), cache_size=16)
    for k in range(1, 201):
        assert sess.run(None, {"x": np.ones(2, np.float32), "r": np.array([k])})[0].shape == (2 * k,)
    info = sess.compiled.cache_info()
    assert info.maxsize == 16 and info.size <= 16 and info.evictions >= 200 - 16


# --- the command line: one message, exit status 2 ---------------------------------------------

def test_cli_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transformer = str(ROOT / "models" / "transformer_encoder.onnx")
    digits = str(ROOT / "models" / "digits_mlp.onnx")
    os.mkfifo(tmp_path / "fifo.onnx")
    cases = [
        (["run", "/dev/zero", "--random-inputs"], "cannot read model file '/dev/zero': not a regular file"),
        (["run", str(tmp_path / "fifo.onnx"), "--random-inputs"], "not a regular file"),
        (["run", str(tmp_path), "--random-inputs"], "not a regular file"),
        (["info", "/dev/zero"], "not a regular file"),
        (["export", "/dev/zero", "-o", str(tmp_path / "x.oxla")], "not a regular file"),
        (["run", digits, "--input", "x=/dev/zero"], "cannot read input file '/dev/zero'.*not a regular file"),
        (["run", transformer, "--random-inputs", "--repeat", "0", "--dim", f"batch={10**12}"],
         r"random input 'ids' of shape \(1000000000000, 1\) int64 would take 7.3 TiB, more than the memory "
         r"limit .*; give smaller --dim sizes"),
        (["run", transformer, "--random-inputs", "--dim", "batch=1e12"], "--dim takes NAME=N, got 'batch=1e12'"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("oxla: error:") == 1 and "Traceback" not in err, (argv, err)
        assert re.search(message, err), (argv, err)


@pytest.mark.parametrize("command", ["export", "lint"])
def test_cli_never_renames_over_a_special_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               command: str) -> None:
    # `oxla export -o /dev/null` as root once replaced /dev/null with the artifact; a FIFO
    # stands in for the device here (a regression must not break the machine running the test)
    digits = str(ROOT / "models" / "digits_mlp.onnx")
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    for target, message in [(fifo, "it is not a regular file"), (tmp_path, "it is a directory")]:
        argv = ["export", digits, "-o", str(target)] if command == "export" else ["lint", digits, "--fix", str(target)]
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("oxla: error:") == 1 and message in err, (argv, err)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def _npz_declaring(path: Path, shape: tuple[int, ...]) -> None:
    """An .npz whose x.npy header declares `shape` float32 but holds 16 bytes."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    labels = io.BytesIO()
    np.save(labels, np.zeros(3, np.int64))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * 16)
        z.writestr("y.npy", labels.getvalue())


def test_train_data_file_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(ROOT / "models" / "digits_mlp.onnx")
    _npz_declaring(tmp_path / "bomb.npz", (10**12,))
    os.mkfifo(tmp_path / "fifo.npz")
    cases = [
        (tmp_path / "bomb.npz", "Unable to allocate 3.64 TiB"),   # was a MemoryError traceback
        (tmp_path / "fifo.npz", "not a regular file"),             # was a hang
        (Path("/dev/zero"), "not a regular file"),
    ]
    for data, message in cases:
        assert main(["train", model, "--data", str(data), "--epochs", "1"]) == 2, data
        err = capsys.readouterr().err
        assert err.count("oxla: error:") == 1 and "Traceback" not in err, (data, err)
        assert f"cannot read data file '{data}'" in err and message in err, (data, err)


# --- degenerate values: NaN, infinities, negatives where a size is computed -------------------

DEGENERATE = [
    ("Range", "g (float s, float l, float d) => (float[N] y) { y = Range(s, l, d) }",
     {"s": np.float32(0), "l": np.float32(np.inf), "d": np.float32(1)},
     "Range node .*start, limit and delta must be finite, got 0.0, inf, 1.0"),
    ("Resize-inf", 'g (float[1, 1, 2, 2] x, float[4] s) => (float[N, N, N, N] y) { y = Resize<mode = "nearest">(x, , s) }',
     {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.array([1, 1, np.inf, 1], np.float32)},
     r"Resize node .*scales must be positive and finite, got \[1.0, 1.0, inf, 1.0\]"),
    ("Resize-negative", 'g (float[1, 1, 2, 2] x, float[4] s) => (float[N, N, N, N] y) { y = Resize<mode = "nearest">(x, , s) }',
     {"x": np.ones((1, 1, 2, 2), np.float32), "s": np.array([1, 1, -2, 1], np.float32)},
     r"Resize node .*scales must be positive and finite, got \[1.0, 1.0, -2.0, 1.0\]"),
    ("Tile-negative", "g (float[2] x, int64[1] r) => (float[N] y) { y = Tile(x, r) }",
     {"x": np.ones(2, np.float32), "r": np.array([-3])}, r"Tile node .*repeats \(-3,\) must hold one non-negative"),
    ("ConstantOfShape-negative", "g (int64[2] s) => (float[N, M] y) { y = ConstantOfShape(s) }",
     {"s": np.array([-1, 5])}, r"ConstantOfShape node .*shape \(-1, 5\) has a negative dim"),
    # pools: pads of a whole window or more (onnxruntime: "Pad should be smaller than kernel"),
    # which would size the output from the attributes alone, and a window past the padded input
    ("AveragePool-huge-pads", "g (float[1, 4, 4, 4] x) => (float[N, N, N, N] y) "
     "{ y = AveragePool<kernel_shape = [2, 2], pads = [100000, 0, 100000, 0]>(x) }",
     {"x": np.ones((1, 4, 4, 4), np.float32)},
     r"AveragePool node .*pads \[100000, 0, 100000, 0\] must be smaller than kernel_shape \[2, 2\]"),
    ("MaxPool-pads-of-a-window", "g (float[1, 4, 4, 4] x) => (float[N, N, N, N] y) "
     "{ y = MaxPool<kernel_shape = [2, 2], pads = [0, 2, 0, 0]>(x) }",
     {"x": np.ones((1, 4, 4, 4), np.float32)}, r"MaxPool node .*must be smaller than kernel_shape"),
    ("LpPool-pads-of-a-window", "g (float[1, 4, 4, 4] x) => (float[N, N, N, N] y) "
     "{ y = LpPool<kernel_shape = [2, 2], pads = [3, 0, 3, 0]>(x) }",
     {"x": np.ones((1, 4, 4, 4), np.float32)}, r"LpPool node .*must be smaller than kernel_shape"),
    ("MaxPool-window-past-input", "g (float[1, 4, 4, 4] x) => (float[N, N, N, N] y) "
     "{ y = MaxPool<kernel_shape = [3, 3], dilations = [3, 3]>(x) }",
     {"x": np.ones((1, 4, 4, 4), np.float32)},
     r"MaxPool node .*window \(7 wide on spatial axis 0.*larger than the padded input \(4\): the "
     r"output size would be -2"),
    # channels last (after a Conv, oxla.passes.channels_last): the same refusal, the same node
    ("MaxPool-channels-last-pads", "g (float[1, 4, 8, 8] x) => (float[N, N, N, N] y) "
     "{ w = Constant<value = float[4, 4, 1, 1] {" + ", ".join(["1.0"] * 16) + "}>() "
     "c = Conv(x, w) y = MaxPool<kernel_shape = [3, 3], pads = [3, 3, 3, 3]>(c) }",
     {"x": np.ones((1, 4, 8, 8), np.float32)}, r"MaxPool node .*must be smaller than kernel_shape"),
]


@pytest.mark.parametrize("case,text,feeds,message", DEGENERATE, ids=[c[0] for c in DEGENERATE])
def test_degenerate_sizes_are_refused(case: str, text: str, feeds: dict[str, Any], message: str) -> None:
    sess = oxla.InferenceSession(text_model(text).SerializeToString())
    with pytest.raises(oxla.LoweringError, match=message):
        sess.run(None, feeds)


def test_a_window_one_past_the_padded_input_leaves_an_empty_output() -> None:
    """Output size 0 (not negative) is no error: onnxruntime returns the empty output too."""
    import onnxruntime as ort

    model = text_model("g (float[1, 4, 4, 4] x) => (float[N, N, N, N] y) "
                       "{ y = MaxPool<kernel_shape = [5, 5]>(x) }").SerializeToString()
    x = np.ones((1, 4, 4, 4), np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = oxla.InferenceSession(model).run(None, {"x": x})[0]
    assert want.shape == got.shape == (1, 4, 0, 0)


@pytest.mark.parametrize("group", [1, 4])
def test_an_empty_batch_through_a_convolution_is_empty(group: int) -> None:
    """A batch of 0 images (a detector's crop list, say): onnxruntime returns (0, M, H, W); XLA's
    grouped forms had reshaped X with a -1 that 0 images leave undetermined (a modulo by zero)."""
    import onnxruntime as ort

    w = numpy_helper.from_array(np.ones((12, 12 // group, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group)],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 12, 8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    session = oxla.InferenceSession(model)
    for n in (0, 2):
        x = np.ones((n, 12, 8, 8), np.float32)
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = session.run(None, {"x": x})[0]
        assert got.shape == want.shape == (n, 12, 8, 8)
        np.testing.assert_allclose(got, want, rtol=1e-5)
