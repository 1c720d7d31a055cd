"""The `oxla run` and `oxla info` commands on a shipped model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MODEL = str(Path(__file__).resolve().parent.parent / "models" / "mobilenet_small.onnx")


def _oxla(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oxla", *args], capture_output=True, text=True)


def test_run_compare_onnxruntime() -> None:
    proc = _oxla("run", MODEL, "--random-inputs", "--dim", "batch=2", "--repeat", "2",
                 "--compare", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert "logits: float32 (2, 10)" in proc.stdout
    assert "logits: ok max abs diff" in proc.stdout and "latency ratio" in proc.stdout


def test_info_classifies_ops_and_reports_the_run() -> None:
    proc = _oxla("info", MODEL, "--run")
    assert proc.returncode == 0, proc.stderr
    assert "ai.onnx::Conv" in proc.stdout and "native (rule since v" in proc.stdout
    assert "0 host step(s)" in proc.stdout and "ran native: " in proc.stdout


def test_run_missing_input_is_a_clear_error() -> None:
    proc = _oxla("run", MODEL)
    assert proc.returncode == 2
    assert "missing inputs ['image']" in proc.stderr and "Traceback" not in proc.stderr


ROOT = Path(__file__).resolve().parent.parent
TRANSFORMER = str(ROOT / "models" / "transformer_encoder.onnx")
DIGITS = str(ROOT / "models" / "digits_mlp.onnx")


def test_version() -> None:
    proc = _oxla("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"oxla {oxla_version()}"


def oxla_version() -> str:
    import oxla

    return oxla.__version__


def test_help_does_not_import_jax() -> None:
    code = ("import sys, time\n"
            "start = time.perf_counter()\n"
            "from oxla.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
            "print('jax' in sys.modules, 'onnx' in sys.modules, time.perf_counter() - start)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    jax_loaded, onnx_loaded, seconds = proc.stdout.strip().splitlines()[-1].split()
    assert (jax_loaded, onnx_loaded) == ("False", "False")
    assert float(seconds) < 2.0   # measured ~0.05 s; importing JAX alone takes longer
    assert "export" in proc.stdout and "train" in proc.stdout


def test_status_line_only_on_a_terminal() -> None:
    import os
    import pty

    piped = _oxla("run", DIGITS, "--random-inputs", "--repeat", "1")
    assert piped.returncode == 0, piped.stderr
    assert "\r" not in piped.stdout and "load " in piped.stdout
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "oxla", "run", MODEL, "--random-inputs", "--repeat", "1"],
                            stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait() == 0
    shown = b"".join(chunks).decode()
    assert "\rloading " in shown or "\r\x1b[Kloading " in shown
    assert "first call (compile + run) " in shown and " s" in shown


def test_random_inputs_stay_inside_the_vocabulary() -> None:
    # onnxruntime refuses Gather indices outside the table: the compare passing shows they fit.
    proc = _oxla("run", TRANSFORMER, "--random-inputs", "--dim", "batch=2", "--dim", "seq=16",
                 "--int-range", "0,100000", "--repeat", "1", "--compare", "onnxruntime")
    assert proc.returncode == 0, proc.stderr
    assert "logits: ok" in proc.stdout


def test_random_feeds_bounds_masks_and_ranges() -> None:
    import numpy as np
    from onnx import TensorProto, helper

    from oxla.errors import InputError
    from oxla.feeds import index_bounds, random_feeds, random_for_specs

    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
         helper.make_node("Gather", ["table", "ids32"], ["rows"]),
         helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT)],
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 6]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, ["n", 6]),
         helper.make_tensor_value_info("count", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, None)],
        [helper.make_tensor("table", TensorProto.FLOAT, [7, 2], [0.0] * 14)])
    model = helper.make_model(graph)
    assert index_bounds(model) == {"ids": 7}
    feeds = random_feeds(model, dims={"n": 50}, seed=3)
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() == 6 and feeds["ids"].shape == (50, 6)
    mask = feeds["mask"]
    assert mask[:, 0].all() and (np.diff(mask.astype(int), axis=1) <= 0).all()  # prefixes of True
    ranged = random_feeds(model, dims={"n": 50}, int_range=(-3, 100))
    assert ranged["ids"].min() == -3 and ranged["ids"].max() == 6
    narrow = random_feeds(model, dims={"n": 50}, int_range=(5, 12))
    assert set(np.unique(narrow["ids"])) == {5, 6} and 5 <= int(narrow["count"]) < 12
    with pytest.raises(InputError, match="leaves no valid index for 'ids'"):
        random_feeds(model, int_range=(10, 12))
    with pytest.raises(InputError, match=r"--dim names \['m'\] are not dims"):
        random_feeds(model, dims={"m": 2})
    with pytest.raises(InputError, match="input 'seq' is not a tensor; give it with --input"):
        random_for_specs([("seq", None, [])], {})
    graph.input.append(helper.make_tensor_value_info("free", TensorProto.FLOAT, None))
    with pytest.raises(InputError, match="input 'free' has no shape .* give it with --input"):
        random_feeds(helper.make_model(graph))  # rank unknown: not guessed as a scalar


def _error(*args: str) -> str:
    proc = _oxla(*args)
    assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("oxla: error:") == 1, proc.stderr
    return proc.stderr


def test_errors_are_one_message_with_status_2(tmp_path: Path) -> None:
    import numpy as np

    assert "--dim names ['bacth'] are not dims" in _error("run", MODEL, "--random-inputs", "--dim", "bacth=2")
    assert "--int-range takes LO,HI" in _error("run", MODEL, "--random-inputs", "--int-range", "5")
    from onnx import TensorProto, helper

    shapeless = tmp_path / "shapeless.onnx"  # an input of unknown rank: not guessed as a scalar
    shapeless.write_bytes(helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert "input 'x' has no shape in the model" in _error("run", str(shapeless), "--random-inputs")
    garbage = tmp_path / "x.npy"
    garbage.write_bytes(b"\x93NUMPY garbage")
    assert "cannot read input file" in _error("run", MODEL, "--input", f"image={garbage}")
    assert "cannot read input file" in _error("run", MODEL, "--input", f"image={tmp_path / 'none.npy'}")
    assert "neither a .npy file" in _error("run", MODEL, "--input", f"image={MODEL}")
    ids = tmp_path / "ids.npy"
    np.save(ids, np.full((1, 4), 500, np.int64))   # past the 100-row embedding table
    stderr = _error("run", TRANSFORMER, "--input", f"ids={ids}", "--repeat", "1")
    assert "Gather node 'node_embedding' (ai.onnx v20): indices out of range for size 100" in stderr
    # a model oxla runs and onnxruntime refuses: bfloat16 Gemm has no CPU kernel there
    import onnx
    from onnx import TensorProto, helper

    bf16 = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2]) for n in ("a", "b", "y")]
    model = helper.make_model(helper.make_graph([helper.make_node("Gemm", ["a", "b"], ["y"])], "g",
                                                bf16[:2], bf16[2:]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "bf16.onnx"))
    stderr = _error("run", str(tmp_path / "bf16.onnx"), "--random-inputs", "--repeat", "1",
                    "--compare", "onnxruntime")
    assert "onnxruntime failed on this model" in stderr


def test_info_shows_training_section_parameters_and_size() -> None:
    proc = _oxla("info", DIGITS)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"file size {Path(DIGITS).stat().st_size:,} bytes" in out
    assert "parameters 17,226 in 6 initializers" in out
    assert "algorithm ops: ai.onnx.preview.training::Adam x1, ai.onnx.preview.training::Gradient x1" in out
    assert "loss: cross_entropy" in out and "optimizer: Adam" in out
    assert 'hyper-parameters: {"lr": 0.003' in out
