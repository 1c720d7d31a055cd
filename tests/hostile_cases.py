"""Hostile runs for tests/test_hostile.py, executed in a child process (`python -m tests.hostile_cases`).

Each case builds a small model, runs it once with a memory limit of LIMIT bytes and prints one
line `RESULT <json>` with its outcome: the oxla error class and message, or a summary of the
outputs. The last line reports the process's peak RSS. One crash or hang here costs this child,
never the test run; the parent reads what came back line by line and so can name the case that
died.
"""

from __future__ import annotations

import json
import resource
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LIMIT = 256 << 20   # the memory limit every case runs under
BIG = 10**12        # a dimension far past any machine
HEADER = '<ir_version: 8, opset_import: ["" : 18]>'


def text_model(text: str) -> onnx.ModelProto:
    return onnx.parser.parse_model(HEADER + text)


def f32(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


def _png_header(width: int, height: int) -> bytes:
    """A 69-byte PNG whose header claims width x height RGB pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


def _columns(n: int) -> str:
    """Nodes making a = ones(n, 1) and b = ones(1, n) from constants (folded, never fed)."""
    return f"""one = Constant<value = float[1, 1] {{1.0}}>()
        sa = Constant<value = int64[2] {{{n}, 1}}>() sb = Constant<value = int64[2] {{1, {n}}}>()
        a = Expand(one, sa) b = Expand(one, sb)"""


# name -> (model, feeds). "rt" cases get the size from a feed (graph break, host step); "const"
# cases get it from constants (folded while compiling); "traced" ones are refused at trace time.
def _bombs() -> dict[str, tuple[onnx.ModelProto, dict[str, Any]]]:
    two_gib_floats = 1 << 29  # 2 GiB of float32: between the limit and any machine's memory
    doubling = "\n".join(f"x{i + 1} = Concat<axis=0>(x{i}, x{i})" for i in range(40))
    return {
        "ConstantOfShape-rt": (text_model("""g (int64[2] s) => (float[N, M] y) {
            y = ConstantOfShape<value = float {1.0}>(s) }"""), {"s": np.array([10**6, 10**6])}),
        "Expand-rt": (text_model("""g (float[1] x, int64[2] s) => (float[N, M] y) { y = Expand(x, s) }"""),
                      {"x": f32(1), "s": np.array([10**6, 10**6])}),
        "Tile-rt": (text_model("g (float[2] x, int64[1] r) => (float[N] y) { y = Tile(x, r) }"),
                    {"x": f32(2), "r": np.array([BIG])}),
        "Tile-const": (text_model(f"""g (float[1] x) => (float[N] y) {{
            c = Constant<value = float[2] {{1.0, 2.0}}>()
            r = Constant<value = int64[1] {{{two_gib_floats // 2}}}>()
            t = Tile(c, r)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "Pad-rt": (text_model("g (float[2] x, int64[2] p) => (float[N] y) { y = Pad(x, p) }"),
                   {"x": f32(2), "p": np.array([0, BIG])}),
        "Pad-const": (text_model(f"""g (float[1] x) => (float[N] y) {{
            c = Constant<value = float[2] {{1.0, 2.0}}>()
            p = Constant<value = int64[2] {{0, {two_gib_floats}}}>()
            t = Pad(c, p)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "Range-rt": (text_model("""g (int64 n) => (int64[N] y) {
            a = Constant<value = int64 {0}>() d = Constant<value = int64 {1}>() y = Range(a, n, d) }"""),
                     {"n": np.array(BIG)}),
        "Range-const": (text_model(f"""g (float[1] x) => (float[N] y) {{
            a = Constant<value = float {{0.0}}>() d = Constant<value = float {{1.0}}>()
            n = Constant<value = float {{{float(two_gib_floats)}}}>()
            t = Range(a, n, d)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "Resize-rt": (text_model("""g (float[1, 1, 2, 2] x, int64[4] sz) => (float[N, N, N, N] y) {
            y = Resize<mode = "nearest">(x, , , sz) }"""),
                      {"x": f32(1, 1, 2, 2), "sz": np.array([1, 1, 10**6, 10**6])}),
        "Resize-const": (text_model("""g (float[1] x) => (float[N, N, N, N] y) {
            c = Constant<value = float[1, 1, 2, 2] {1.0, 2.0, 3.0, 4.0}>()
            s = Constant<value = float[4] {1.0, 1.0, 8192.0, 8192.0}>()
            t = Resize<mode = "nearest">(c, , s)
            y = Add(t, x) }"""), {"x": f32(1)}),
        "OneHot-const": (text_model("""g (int64[2] x) => (float[2, N] y) {
            depth = Constant<value = int64 {1000000000000}>()
            values = Constant<value = float[2] {0.0, 1.0}>()
            y = OneHot(x, depth, values) }"""), {"x": np.array([1, 0])}),
        "OneHot-rt": (text_model("""g (int64[2] x, int64 depth) => (float[2, N] y) {
            values = Constant<value = float[2] {0.0, 1.0}>()
            y = OneHot(x, depth, values) }"""), {"x": np.array([1, 0]), "depth": np.array(BIG)}),
        "NonZero-rt": (text_model("g (bool[N, M] x) => (int64[2, K] y) { y = NonZero(x) }"),
                       {"x": np.ones((4096, 8192), bool)}),  # 32 MiB in, 512 MiB of indices out
        "Concat-traced": (text_model(f"g (float[1] x0) => (float[N] x40) {{ {doubling} }}"), {"x0": f32(1)}),
        "Concat-const": (text_model(f"""g (float[1] x) => (float[N] y) {{
            x0 = Constant<value = float[1] {{1.0}}>()
            {doubling}
            y = Add(x40, x) }}"""), {"x": f32(1)}),
        "Loop-rt": (text_model("""g (int64 n) => (float[N] out) {
            c = Constant<value = bool {1}>()
            out = Loop(n, c) <body = b (int64 i, bool cin) => (bool cout, float s) {
                cout = Identity(cin) s = Constant<value = float {1.0}>() }> }"""),
                    {"n": np.array(2**62)}),
        # small constants that combine into a huge one while folding
        "Add-const": (text_model(f"""g (float[1] x) => (float[N, N] y) {{ {_columns(20000)}
            t = Add(a, b)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "MatMul-const": (text_model(f"""g (float[1] x) => (float[N, N] y) {{ {_columns(20000)}
            t = MatMul(a, b)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "Einsum-const": (text_model(f"""g (float[1] x) => (float[N, N] y) {{ {_columns(20000)}
            u = Flatten<axis = 0>(a) v = Flatten<axis = 0>(b)
            t = Einsum<equation = "ni,nj->ij">(u, v)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "Gather-const": (text_model(f"""g (float[1] x) => (float[N, N] y) {{ {_columns(20000)}
            n = Constant<value = int64[1] {{20000}}>()
            i = ConstantOfShape<value = int64[1] {{0}}>(n)
            t = Gather(b, i)
            y = Add(t, x) }}"""), {"x": f32(1)}),
        "StringSplit-rt": (onnx.parser.parse_model('<ir_version: 9, opset_import: ["" : 20]>' + """
            g (string[N] x) => (string[N, M] y, int64[N] z) { y, z = StringSplit<delimiter = " ">(x) }"""),
                           {"x": np.array(["a"] * 20000 + [" ".join(["b"] * 20000)], object)}),
        "Tokenizer-rt": (onnx.parser.parse_model(
            '<ir_version: 9, opset_import: ["" : 20, "com.microsoft" : 1]>' + """
            g (string[N] x) => (string[N, M] y) {
                y = com.microsoft.Tokenizer<mark = 0, mincharnum = 1, pad_value = "#", tokenexp = ".">(x) }"""),
                         {"x": np.array(["a"] * 20000 + ["b" * 20000], object)}),
        "ImageDecoder-rt": (onnx.parser.parse_model('<ir_version: 9, opset_import: ["" : 20]>' + """
            g (uint8[N] x) => (uint8[H, W, C] y) { y = ImageDecoder(x) }"""),
                            {"x": np.frombuffer(_png_header(12000, 12000), np.uint8)}),
        "StringConcat-rt": (onnx.parser.parse_model('<ir_version: 9, opset_import: ["" : 20]>' + """
            g (string[N, 1] x, string[1, M] y) => (string[N, M] z) { z = StringConcat(x, y) }"""),
                            {"x": np.full((20000, 1), "a", object), "y": np.full((1, 20000), "b", object)}),
    }


def _nested_ifs(depth: int) -> onnx.ModelProto:
    """`depth` Ifs, each in the then-branch of the one before, all on the runtime condition c."""
    def out(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [1])

    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["o0"])], "g0", [], [out("o0")])
    for d in range(1, depth + 1):
        other = helper.make_graph([helper.make_node("Sub", ["x", "one"], [f"e{d}"])], f"e{d}", [], [out(f"e{d}")])
        node = helper.make_node("If", ["c"], [f"o{d}"], then_branch=graph, else_branch=other)
        graph = helper.make_graph([node], f"g{d}", [], [out(f"o{d}")])
    main = helper.make_graph(
        list(graph.node), "main",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), out("x")], [out(f"o{depth}")],
        [numpy_helper.from_array(np.ones(1, np.float32), "one")])
    return helper.make_model(main, opset_imports=[helper.make_opsetid("", 18)])


def _long_runs() -> dict[str, tuple[onnx.ModelProto, dict[str, Any]]]:
    million = text_model("""g (float x) => (float y) {
        n = Constant<value = int64 {1000000}>()
        c = Constant<value = bool {1}>()
        y = Loop(n, c, x) <body = b (int64 i, bool cin, float a) => (bool cout, float a2) {
            cout = Identity(cin) one = Constant<value = float {1.0}>() a2 = Add(a, one) }> }""")
    nested = _nested_ifs(25)
    return {
        "Loop-1e6": (million, {"x": np.array(0.0, np.float32)}),
        "If-nested-25-true": (nested, {"c": np.array(True), "x": np.zeros(1, np.float32)}),
        "If-nested-25-false": (nested, {"c": np.array(False), "x": np.zeros(1, np.float32)}),
    }


def _summary(outputs: list[Any]) -> list[Any]:
    return [np.asarray(v).reshape(-1)[:4].tolist() for v in outputs]


def _one(name: str, model: onnx.ModelProto, feeds: dict[str, Any], run: Callable[..., Any]) -> dict[str, Any]:
    import oxla

    try:
        sess = oxla.InferenceSession(model.SerializeToString(), memory_limit=LIMIT)
        return {"case": name, "ok": _summary(run(sess, feeds))}
    except oxla.OxlaError as e:
        return {"case": name, "error": type(e).__name__, "message": str(e)}
    except Exception as e:  # a defect: reported, not raised, so the other cases still run
        return {"case": name, "error": "!" + type(e).__name__, "message": str(e)[:2000]}


def main(groups: list[str]) -> None:
    cases: dict[str, tuple[onnx.ModelProto, dict[str, Any]]] = {}
    if "bombs" in groups:
        cases.update(_bombs())
    if "long" in groups:
        cases.update(_long_runs())
    for name, (model, feeds) in cases.items():
        result = _one(name, model, feeds, lambda s, f: s.run(None, f))
        result["peak_rss"] = _peak_rss()
        print("RESULT " + json.dumps(result), flush=True)
    print("RESULT " + json.dumps({"case": "peak_rss", "bytes": _peak_rss()}), flush=True)


def _peak_rss() -> int:
    """This process's peak resident set in bytes: /proc/self/status's VmHWM, which counts this
    program's memory alone. ru_maxrss also keeps the parent's peak across the exec (subprocess
    starts the child by vfork, sharing the parent's memory until the exec): a pytest worker
    that had loaded the light zoo's VGG-19 passed its 4 GiB on to this child."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


if __name__ == "__main__":
    main(sys.argv[1:])
