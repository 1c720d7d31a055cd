"""`oxla.export_model` / `oxla.load_exported` / `oxla export`: round trips against InferenceSession."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import onnx
import pytest

import oxla
from oxla.export import MAGIC, ExportedModel, ExportError, export_model, load_exported
from oxla.feeds import random_feeds

MODELS = Path(__file__).resolve().parent.parent / "models"
ROOT = MODELS.parent
# Every shipped model that runs as one computation; the dims its export fixes (None: all symbolic).
ROUND_TRIPS = {
    "resnet_small": None,
    "mobilenet_small": None,
    "digits_mlp": None,
    "control_flow": None,
    "transformer_encoder": {"batch": 2, "seq": 5},
}


def _same_as_session(name: str, exported: ExportedModel, dims: dict[str, int], seed: int) -> None:
    path = MODELS / f"{name}.onnx"
    feeds = random_feeds(onnx.load(path), seed=seed, dims=dims)
    want = oxla.InferenceSession(str(path)).run(None, feeds)
    got = exported.run(None, feeds)
    assert [o.name for o in exported.get_outputs()] == [o.name for o in onnx.load(path).graph.output]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_exported_model_matches_the_session(name: str, tmp_path: Path) -> None:
    dims = ROUND_TRIPS[name]
    result = export_model(MODELS / f"{name}.onnx", dims=dims)
    target = tmp_path / "model.oxla"
    target.write_bytes(result.data)
    exported = load_exported(target)
    _same_as_session(name, exported, dims or {}, seed=1)


def test_one_artifact_runs_two_batch_sizes() -> None:
    result = export_model(MODELS / "resnet_small.onnx")
    assert result.inputs[0].shape == ("batch", 3, 64, 64)
    assert result.outputs[0].shape == ("batch", 10)
    exported = ExportedModel(result.data)
    for batch in (1, 3):
        _same_as_session("resnet_small", exported, {"batch": batch}, seed=batch)


def test_header_carries_names_dtypes_shapes_and_index_bounds() -> None:
    result = export_model(MODELS / "transformer_encoder.onnx", dims={"batch": 2, "seq": 5})
    assert result.data.startswith(MAGIC)
    exported = ExportedModel(result.data)
    (ids,) = exported.get_inputs()
    assert (ids.name, ids.dtype, ids.shape, ids.index_bound) == ("ids", "int64", (2, 5), 100)
    assert exported.header["source"] == "transformer_encoder.onnx"
    assert exported.header["format_version"] == 1


def test_graph_break_is_an_error_naming_the_node() -> None:
    with pytest.raises(ExportError, match="graph breaks at NonMaxSuppression node '/NonMaxSuppression'"):
        export_model(MODELS / "detector_nms.onnx")


def test_dims_that_cannot_stay_symbolic_say_which_to_fix() -> None:
    with pytest.raises(ExportError, match=r"cannot keep dims \['batch', 'seq'\] symbolic.*--dim batch=N"):
        export_model(MODELS / "transformer_encoder.onnx")


def test_unknown_dim_name_is_refused() -> None:
    with pytest.raises(oxla.InputError, match=r"--dim names \['bach'\] are not dims"):
        export_model(MODELS / "resnet_small.onnx", dims={"bach": 2})


def test_wrong_inputs_and_bad_files_are_clear_errors(tmp_path: Path) -> None:
    exported = ExportedModel(export_model(MODELS / "digits_mlp.onnx").data)
    with pytest.raises(oxla.InputError, match="missing input 'image'"):
        exported({})
    with pytest.raises(oxla.InputError, match="input 'image' must be float32, got float64"):
        exported({"image": np.zeros((2, 64))})
    with pytest.raises(oxla.InputError, match=r"must have shape \('N', 64\), got \(2, 63\)"):
        exported({"image": np.zeros((2, 63), np.float32)})
    bad = tmp_path / "bad.oxla"
    bad.write_bytes(b"not an export")
    with pytest.raises(oxla.InvalidModelError, match="is not an oxla exported model"):
        load_exported(bad)
    bad.write_bytes(MAGIC + b"\x05\x00\x00\x00{nope")
    with pytest.raises(oxla.InvalidModelError, match="damaged export header"):
        load_exported(bad)


def test_emit_stablehlo_and_hlo() -> None:
    stablehlo = export_model(MODELS / "digits_mlp.onnx", emit="stablehlo").text or ""
    assert "stablehlo." in stablehlo and "tensor<?x64xf32>" in stablehlo
    hlo = export_model(MODELS / "digits_mlp.onnx", dims={"N": 3}, emit="hlo").text or ""
    assert hlo.startswith("HloModule") and "f32[3,64]" in hlo
    with pytest.raises(ExportError, match="HLO text needs concrete shapes"):
        export_model(MODELS / "digits_mlp.onnx", emit="hlo")


# Runs the CLI with onnx and onnxruntime unimportable: an exported model needs neither.
_NO_ONNX = """
import sys
class Block:
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("onnx", "onnxruntime"):
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Block())
from oxla.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_cli_export_then_run_without_onnx(tmp_path: Path) -> None:
    target = tmp_path / "resnet.oxla"
    proc = subprocess.run([sys.executable, "-m", "oxla", "export", str(MODELS / "resnet_small.onnx"),
                           "-o", str(target)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {target}" in proc.stdout and "image float32['batch', 3, 64, 64]" in proc.stdout
    info = subprocess.run([sys.executable, "-m", "oxla", "info", str(target)], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert "oxla exported model (format 1" in info.stdout and "from resnet_small.onnx" in info.stdout
    assert "platforms cpu)" in info.stdout
    assert "image: float32 ['batch', 3, 64, 64]" in info.stdout and "logits: float32 ['batch', 10]" in info.stdout
    for batch in ("2", "3"):
        run = subprocess.run([sys.executable, "-c", _NO_ONNX, "run", str(target), "--random-inputs",
                              "--dim", f"batch={batch}", "--repeat", "1"],
                             capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        assert f"logits: float32 ({batch}, 10)" in run.stdout


def test_cli_export_errors_exit_2(tmp_path: Path) -> None:
    for args, message in [
        (["export", str(MODELS / "detector_nms.onnx"), "-o", str(tmp_path / "d.oxla")],
         "graph breaks at NonMaxSuppression node"),
        (["export", str(MODELS / "resnet_small.onnx")], "needs -o FILE, --emit"),
        (["export", str(MODELS / "resnet_small.onnx"), "-o", str(tmp_path / "r"), "--dim", "b=2"],
         "--dim names ['b'] are not dims"),
        (["export", str(MODELS / "digits_mlp.onnx"), "-o", str(tmp_path / "no" / "such" / "d.oxla")],
         "cannot write"),
        (["run", str(tmp_path / "nothing.oxla")], "cannot read model file"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "oxla", *args], capture_output=True, text=True)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "d.oxla").exists()


def test_one_artifact_for_several_platforms() -> None:
    result = export_model(MODELS / "digits_mlp.onnx", platforms=["cpu", "cuda"])
    exported = ExportedModel(result.data)
    assert exported.header["platforms"] == ["cpu", "cuda"]
    _same_as_session("digits_mlp", exported, {"N": 4}, seed=2)   # the cpu lowering runs here
    cuda_only = ExportedModel(export_model(MODELS / "digits_mlp.onnx", platforms=["cuda"]).data)
    if jax.default_backend() == "cpu":
        with pytest.raises(oxla.InputError, match=r"exported for \['cuda'\], not for this machine"):
            cuda_only({"image": np.zeros((1, 64), np.float32)})
    with pytest.raises(oxla.InputError, match=r"unknown platforms \['gpu0'\]"):
        export_model(MODELS / "digits_mlp.onnx", platforms=["cpu", "gpu0"])


def test_unnamed_dim_stays_symbolic() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    result = export_model(model)
    assert result.inputs[0].shape == ("_anon1", 3) and result.outputs[0].shape == ("_anon1", 3)
    exported = ExportedModel(result.data)
    for n in (2, 5):
        x = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
        np.testing.assert_array_equal(exported({"x": x})["y"], np.maximum(x, 0))


def test_an_input_without_a_shape_is_refused_not_exported_as_a_scalar() -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ExportError, match=r"input 'x' has no shape \(its rank is unknown\)"):
        export_model(model)
