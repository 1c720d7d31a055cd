"""Loops whose body computes its condition from static values only (tf2onnx's RNN while-loops):
the count is found at trace time and the loop compiles as one lax.scan with its scan outputs."""

from __future__ import annotations

import numpy as np
import pytest

import oxla
from tests.lowering.test_control_flow import check, parse

# tf2onnx's shape: a time counter carried beside the state, compared with the sequence length in
# the body, the first condition computed outside with a float 0 that is a parameter (traced).
TF_LOOP = """
g (float[3] x{extra}) => (float[3] y, int64 t_out, float[N, 3] s) <float zero = {{0}}, float limit = {{4}}> {{
  m = Constant <value = int64 {{10}}> ()
  t0 = Constant <value = int64 {{0}}> ()
  c = {first}
  y, t_out, s = Loop (m, c, x, t0) <body = b (int64 i, bool ci, float[3] a, int64 t) => (bool co, float[3] a2, int64 t2, float[3] sc) {{
     one = Constant <value = int64 {{1}}> ()
     t2 = Add(t, one)
     lim = Constant <value = int64 {{4}}> ()
     co = Less(t2, lim)
     sum = Add(a, x)
     a2 = Tanh(sum)
     sc = Mul(a2, x)
  }}>
}}"""
X = np.array([0.5, -1.0, 2.0], np.float32)


@pytest.mark.parametrize("first", ["Less(zero, limit)", "Constant <value = bool {1}> ()"],
                         ids=["traced-start", "static-start"])
def test_counted_while_loop_with_scan_outputs_compiles(first: str) -> None:
    _, t, s = check(TF_LOOP.format(extra="", first=first), {"x": X}, host_steps=0)
    assert int(t) == 4 and s.shape == (4, 3)


def test_a_traced_start_that_is_false_fails_at_run_time() -> None:
    # limit is also an input here, so a feed can make the first condition false: onnxruntime then
    # gives no scan rows, which a loop compiled for 4 rows cannot give: it says so
    model = parse(TF_LOOP.format(extra=", float limit", first="Less(zero, limit)"))
    compiled = oxla.compile(model)
    assert compiled({"x": X, "limit": np.array(4, np.float32)})["s"].shape == (4, 3)
    with pytest.raises(Exception, match="the initial condition is false"):
        compiled({"x": X, "limit": np.array(-1, np.float32)})


def test_a_condition_from_data_still_runs_on_the_host() -> None:
    text = TF_LOOP.format(extra="", first="Less(zero, limit)").replace(
        "co = Less(t2, lim)", "r = ReduceSum <keepdims = 0> (x)\n     co = Less(r, limit)")
    check(text, {"x": X}, host_steps=1)
