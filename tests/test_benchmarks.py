"""The benchmark suite's and the profiler's own logic: tables, geomean, agreement, HLO attribution."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from benchmarks import suite, xla_profile


def _row(model: str, threads: int, oxla_ms: float, ort_ms: float) -> suite.Row:
    return suite.Row(model, threads, oxla_ms, ort_ms, 0.1, 0.5, 0.01, 1e-6, 1e-7, 10)


def test_table_reports_ratios_failures_and_geomean_per_thread_setting() -> None:
    rows = [_row("resnet50", 0, 2.0, 1.0), _row("resnet50", 1, 4.0, 2.0),
            _row("vad", 0, 0.5, 1.0), _row("vad", 1, 1.0, 1.0)]
    text = suite.table(rows, {("bert_base", 0): "out of memory"}, [0, 1])
    lines = text.splitlines()
    assert lines[0].count("oxla/ORT") == 2
    assert "| 2.00x |" in lines[2] and "| 0.50x |" in lines[3]
    assert "failed: out of memory" in lines[4]
    assert lines[-1].startswith("| **geomean**") and "**1.00x**" in lines[-1] and "**1.41x**" in lines[-1]


def test_geomean() -> None:
    assert math.isclose(suite.geomean([2.0, 0.5, 1.0]), 1.0)
    assert math.isnan(suite.geomean([]))


def test_compare_is_absolute_and_relative_and_refuses_other_shapes() -> None:
    want = [np.array([1.0, -4.0], np.float32), np.array([0], np.int64)]
    diff, rel = suite._compare([np.array([1.5, -4.0], np.float32), np.array([0], np.int64)], want)
    assert diff == 0.5 and rel == 0.125
    assert suite._compare([np.zeros(3, np.float32), want[1]], want) == (math.inf, math.inf)


def _conv_relu_sum(x: jax.Array, w: jax.Array) -> jax.Array:
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.maximum(y, 0).sum()


def test_parse_hlo_names_each_instruction_and_the_line_that_emitted_it() -> None:
    text = jax.jit(_conv_relu_sum).lower(jnp.ones((1, 8, 8, 16)), jnp.ones((3, 3, 16, 32))).compile().as_text()
    instrs = xla_profile.parse_hlo(text)
    kinds = {i.opcode for i in instrs.values()}
    assert any("convolution" in k for k in kinds), kinds
    conv = next(i for i in instrs.values() if "convolution" in i.opcode)
    assert conv.where.startswith("test_benchmarks.py:_conv_relu_sum:"), conv


def test_fusion_kind_names_shifted_multiply_adds_and_transposes() -> None:
    from collections import Counter

    taps = Counter({"slice": 9, "pad": 9, "multiply": 9, "add": 8, "transpose": 1})
    assert xla_profile._fusion_kind(taps) == "fusion(taps (shifted multiply-adds) + transpose)"
    assert xla_profile._fusion_kind(Counter({"dot": 1, "add": 1})) == "fusion(dot)"
    assert xla_profile._fusion_kind(Counter({"add": 2})) == "fusion(elementwise)"


def test_ort_nodes_are_medians_per_node_slowest_first() -> None:
    events = [{"cat": "Session", "name": "model_run", "dur": 900}]
    for dur in (10, 30, 20):
        events.append({"cat": "Node", "name": "conv_kernel_time", "dur": dur,
                       "args": {"op_name": "Conv", "output_type_shape": [{"float": [1, 8, 4, 4]}]}})
        events.append({"cat": "Node", "name": "conv_fence_before", "dur": 1, "args": {}})
    events.append({"cat": "Node", "name": "relu_kernel_time", "dur": 5, "args": {"op_name": "Relu"}})
    assert xla_profile.ort_nodes(events) == [("conv", "Conv", "(1, 8, 4, 4)", 20.0),
                                             ("relu", "Relu", "", 5.0)]


def test_profile_beside_onnxruntime_prints_both() -> None:
    """`--ort` on the shipped VAD model: oxla's kernels and onnxruntime's nodes in one run."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.xla_profile", "vad", "--calls", "3",
                           "--top", "3", "--ort"], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parent.parent, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "top kernels:" in out and "onnxruntime by op type:" in out, out
    assert re.search(r"onnxruntime, its calls alternating with oxla's: wall [0-9.]+ ms/call", out), out
    assert "LSTM" in out, out


def test_suite_runs_the_shipped_model_end_to_end(tmp_path: Path) -> None:
    """The harness itself: a child process per setting, agreement, a written section."""
    out = tmp_path / "bench.md"
    out.write_text("# Benchmarks\n\n## Other\n\nkept\n")
    assert suite.main(["--models", "vad", "--threads", "default", "--seconds", "0.05",
                       "--write", str(out)]) == 0
    text = out.read_text()
    assert "## Other\n\nkept" in text and "## Benchmark suite" in text
    row = next(line for line in text.splitlines() if line.startswith("| VAD"))
    diff = float(row.split("|")[-2].split()[0])
    assert diff < 1e-5, row  # oxla and onnxruntime agree on the shipped model


def test_conv_benchmark_native_depthwise_form_and_choice() -> None:
    """benchmarks.conv's native depthwise column computes the convolution, and is what a
    session chooses where the kernel wins (AVX-512; under DEPTHWISE_MIN_FLOPS on several cores
    only)."""
    from benchmarks import conv
    from oxla import cpu_client, native
    from oxla.passes import native_gemm

    s = conv.Shape("dw", "conv", 48, 14, 48, 48, 3, 2)
    if not native.available():
        assert "native_dw_last" not in conv._forms(s)
        return
    assert "native_dw_last" in conv._forms(s)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 14, 14, 48)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, 48)).astype(np.float32)  # HWIO
    got = np.asarray(conv._native_dw_last(s, 0)(x, w))
    want = lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)], dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=48)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)
    big = conv.Shape("dw", "conv", 96, 56, 96, 96, 3, 1)  # 5.4e6 flops
    wins = native.isa() in native_gemm.DEPTHWISE_ISAS  # AVX-512 only
    assert conv._chosen(big, (96, 1, 3, 3), 1)[1] == ("native_dw_last" if wins else "taps_last")
    assert conv._chosen(big, (96, 1, 3, 3), 0)[1] == ("native_dw_last" if wins else "taps_last")
    mid = conv.Shape("dw", "conv", 960, 7, 960, 960, 3, 1)  # 0.85e6 flops: over the one-core bound
    assert conv._chosen(mid, (960, 1, 3, 3), 1)[1] == ("native_dw_last" if wins else "taps_last")
    small = conv.Shape("dw", "conv", 576, 7, 576, 576, 3, 1)  # 0.51e6 flops: one core XLA's
    assert conv._chosen(small, (576, 1, 3, 3), 1)[1] == "taps_last"
    several = wins and cpu_client.cores() > 1
    assert conv._chosen(small, (576, 1, 3, 3), 0)[1] == ("native_dw_last" if several else "taps_last")
    # a channel multiplier of 2: 32 input channels, 64 outputs, on the same kernel
    two = conv.Shape("dw multiplier 2", "depthwise", 32, 20, 64, 32, 3)
    assert "native_dw_last" in conv._forms(two)
    x2 = rng.standard_normal((1, 20, 20, 32)).astype(np.float32)
    w2 = rng.standard_normal((3, 3, 1, 64)).astype(np.float32)
    want = lax.conv_general_dilated(x2, w2, (1, 1), [(1, 1), (1, 1)], dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    feature_group_count=32)
    np.testing.assert_allclose(np.asarray(conv._native_dw_last(two, 0)(x2, w2)), np.asarray(want),
                               rtol=1e-5, atol=1e-5)
    assert conv._chosen(two, (64, 1, 3, 3), 0)[1] == ("native_dw_last" if several else "taps_last")


def test_suite_measures_the_file_onnxruntimes_optimizer_saves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--ort-optimized: the model as onnxruntime saves it at its extended level (the VAD's
    convolutions become com.microsoft FusedConv), made once; both runtimes run it and agree."""
    import onnx

    monkeypatch.setattr(suite, "OPTIMIZED_DIR", tmp_path / "ort_extended")
    files = suite.model_files("vad")
    assert files is not None
    path = suite.ort_optimized(files[0], "vad")
    assert path.parent == tmp_path / "ort_extended"
    assert any(n.domain == "com.microsoft" and n.op_type == "FusedConv" for n in onnx.load(str(path)).graph.node)
    made = path.stat().st_mtime_ns
    assert suite.ort_optimized(files[0], "vad") == path and path.stat().st_mtime_ns == made  # kept
    row = suite.measure("vad", 0, 0.05, optimized=True)
    assert row.max_abs_diff < 1e-5 and row.calls >= 5


def test_light_zoo_random_weights_replace_the_fills_and_agree() -> None:
    """benchmarks.light_zoo --random-weights: no ConstantOfShape left, and oxla's output on the
    light squeezenet with those weights is onnxruntime's."""
    import onnx
    import onnxruntime as ort

    import oxla
    from benchmarks import light_zoo

    model = light_zoo.random_weights(onnx.load(light_zoo.path_of("squeezenet")))
    assert not [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    feed, x = light_zoo._input(model)
    data = model.SerializeToString()
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {feed: x})[0]
    got = oxla.InferenceSession(data).run(None, {feed: x})[0]
    assert np.abs(want).max() > 1e-3  # not a constant output
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert "random weights" in light_zoo.agreement("squeezenet")
