"""String rules and TfIdfVectorizer against onnx.reference and onnxruntime."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oxla.errors import LoweringError
from tests.lowering.util import (
    node_model,
    run_onnxruntime,
    run_oxla,
    run_reference,
    strings_as_objects,
)


def check(op: str, inputs: dict[str, np.ndarray], outputs: tuple[str, ...] = ("y",), *,
          reference: bool = True, ort: bool = True, **attrs: Any) -> list[np.ndarray]:
    """Run one node with oxla and compare with the references that get it right."""
    model = node_model(op, inputs, outputs, **attrs)
    got = strings_as_objects(run_oxla(model, inputs))
    wants = ([run_reference] if reference else []) + ([run_onnxruntime] if ort else [])
    for run in wants:
        want = strings_as_objects(run(model, inputs))
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g, w)
            np.testing.assert_array_equal(g, w)
    return got


def S(*values: Any) -> np.ndarray:
    return np.array(values, dtype=object)


# --- StringNormalizer ---------------------------------------------------------------------------
# onnxruntime needs the en_US.UTF-8 locale by default, which this machine lacks: it gets locale C.

@pytest.mark.parametrize("attrs", [
    {"case_change_action": "UPPER", "stopwords": ["monday"]},
    {"case_change_action": "LOWER", "is_case_sensitive": 1, "stopwords": ["Monday"]},
    {"case_change_action": "NONE", "is_case_sensitive": 0, "stopwords": ["MONDAY", "friday"]},
    {"case_change_action": "UPPER"},
], ids=["insensitive-upper", "sensitive-lower", "insensitive-none", "no-stopwords"])
def test_string_normalizer(attrs: dict[str, Any]) -> None:
    x = S("Monday", "tuesday", "monday", "Friday", "sat urday")
    # onnx.reference ignores is_case_sensitive=0 when case_change_action is NONE
    reference = attrs["case_change_action"] != "NONE"
    check("StringNormalizer", {"x": x}, locale="C", reference=reference, **attrs)
    check("StringNormalizer", {"x": x.reshape(1, -1)}, locale="C", reference=reference, **attrs)


def test_string_normalizer_all_removed_keeps_rank() -> None:
    x = S("monday", "Monday").reshape(1, 2)
    got = check("StringNormalizer", {"x": x}, stopwords=["monday"], locale="C",
                case_change_action="LOWER")
    assert got[0].shape == (1, 1) and got[0][0, 0] == ""


def test_string_normalizer_unicode_case_without_locale() -> None:
    # onnx.reference also strips accents (sklearn's habit, not in the spec); ort needs a locale
    x = S("straße", "Élan", "çà")
    got = check("StringNormalizer", {"x": x}, reference=False, ort=False, case_change_action="UPPER")
    assert got[0].tolist() == ["STRASSE", "ÉLAN", "ÇÀ"]


def test_string_normalizer_rejects_batches() -> None:
    model = node_model("StringNormalizer", {"x": S("a", "b", "c", "d").reshape(2, 2)})
    with pytest.raises(LoweringError, match=r"must have shape \[C\] or \[1, C\], got \(2, 2\)"):
        run_oxla(model, {"x": S("a", "b", "c", "d").reshape(2, 2)})


# --- StringConcat, StringSplit, RegexFullMatch --------------------------------------------------

@pytest.mark.parametrize("x,y", [
    (S("a", "bc", ""), S("x", "", "z")),
    (S(["a", "b"], ["c", "d"]), S("!")),
    (np.array("é", dtype=object), np.array("ü", dtype=object)),
], ids=["same-shape", "broadcast", "0d-utf8"])
def test_string_concat(x: np.ndarray, y: np.ndarray) -> None:
    check("StringConcat", {"x": x, "y": y}, ("z",))


@pytest.mark.parametrize("x,attrs", [
    (S("a,b,c", "d", ",,e"), {"delimiter": ","}),
    (S("a  b c ", "", " d"), {}),
    (S("a  b c ", "x"), {"delimiter": ""}),
    (S(["1-2-3-4", "5"], ["6-7", "--"]), {"delimiter": "-", "maxsplit": 2}),
    (S("ab--cd--", "--"), {"delimiter": "--", "maxsplit": 0}),
    (np.empty((0, 2), dtype=object), {"delimiter": ","}),
], ids=["comma", "whitespace", "empty-delimiter", "maxsplit-2d", "multichar-maxsplit0", "empty"])
def test_string_split(x: np.ndarray, attrs: dict[str, Any]) -> None:
    y, z = check("StringSplit", {"x": x}, ("y", "z"), **attrs)
    assert z.dtype == np.int64 and y.shape == (*x.shape, int(z.max(initial=0)))


def test_string_split_on_any_whitespace() -> None:
    # The spec splits at "consecutive whitespace"; onnxruntime splits at runs of spaces only
    y, z = check("StringSplit", {"x": S("a \tb\nc ", "")}, ("y", "z"), ort=False)
    assert y.tolist() == [["a", "b", "c"], ["", "", ""]] and z.tolist() == [3, 0]


@pytest.mark.parametrize("pattern", [r"[a-z]+@[a-z]+\.com", r"(ab)*", r"\d{2,3}", r"", r"(?i)AB.*"])
def test_regex_full_match(pattern: str) -> None:
    x = S(["ab@cd.com", "abab", "123"], ["", "ABx", "1234"])
    check("RegexFullMatch", {"x": x}, pattern=pattern)


def test_regex_full_match_bad_pattern() -> None:
    model = node_model("RegexFullMatch", {"x": S("a")}, pattern="(a")
    with pytest.raises(LoweringError, match=r"pattern '\(a' is not a valid regular expression"):
        run_oxla(model, {"x": S("a")})


# --- TfIdfVectorizer ----------------------------------------------------------------------------

POOL = {"ngram_counts": [0, 4], "ngram_indexes": list(range(7)),
        "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]}
X = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], np.int32)


@pytest.mark.parametrize("mode,weights", [("TF", None), ("IDF", None), ("TFIDF", None),
                                          ("IDF", [.5, 1, 2, 3, 4, 5, 6]),
                                          ("TFIDF", [.5, 1, 2, 3, 4, 5, 6])])
def test_tfidf_modes(mode: str, weights: list[float] | None) -> None:
    extra = {"weights": weights} if weights else {}
    # onnx.reference fails on IDF/TFIDF without weights (it calls len(None))
    check("TfIdfVectorizer", {"x": X}, reference=mode == "TF" or weights is not None, mode=mode,
          min_gram_length=1, max_gram_length=2, max_skip_count=1, **POOL, **extra)


@pytest.mark.parametrize("grams,skip", [((1, 1), 0), ((2, 2), 0), ((1, 2), 3), ((2, 2), 5)])
def test_tfidf_grams_and_skips(grams: tuple[int, int], skip: int) -> None:
    check("TfIdfVectorizer", {"x": X.reshape(-1).astype(np.int64)}, mode="TF",
          min_gram_length=grams[0], max_gram_length=grams[1], max_skip_count=skip, **POOL)


def test_tfidf_strings_with_trigrams_and_gaps_in_indexes() -> None:
    x = S(["a", "b", "c", "a", "b"], ["c", "x", "a", "b", "c"])
    check("TfIdfVectorizer", {"x": x}, mode="TF", min_gram_length=1, max_gram_length=3,
          max_skip_count=1, ngram_counts=[0, 2, 6], ngram_indexes=[5, 0, 1, 3, 2],
          pool_strings=["a", "c", "a", "b", "b", "c", "a", "b", "c"])


STRING_POOL = {**{k: v for k, v in POOL.items() if k != "pool_int64s"},
               "pool_strings": [str(v) for v in POOL["pool_int64s"]]}


@pytest.mark.parametrize("step_by_step", [True, False])
@pytest.mark.parametrize("grams,skip", [((1, 1), 0), ((1, 2), 1), ((2, 2), 3), ((1, 2), 5)])
def test_tfidf_strings_walked_step_by_step_or_in_numpy(
        monkeypatch: pytest.MonkeyPatch, step_by_step: bool, grams: tuple[int, int], skip: int) -> None:
    # string input runs on the host: a few tokens walk the trie in Python, more in numpy
    from oxla.lowering.ops import string

    monkeypatch.setattr(string, "SMALL_WALK", 1 << 30 if step_by_step else 0)
    x = np.array([[str(v) for v in row] for row in X], dtype=object)
    check("TfIdfVectorizer", {"x": x}, mode="TFIDF", min_gram_length=grams[0],
          max_gram_length=grams[1], max_skip_count=skip, weights=[.5, 1, 2, 3, 4, 5, 6],
          **STRING_POOL)


def test_tfidf_host_step_tables_follow_each_call() -> None:
    # the host step builds its trie once (common.derived): later calls with other text still
    # count their own n-grams
    import oxla

    model = node_model("TfIdfVectorizer", {"x": S("5", "6")}, ("y",), mode="TF",
                       min_gram_length=1, max_gram_length=2, max_skip_count=0, **STRING_POOL)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "C"
    session = oxla.InferenceSession(model.SerializeToString())
    for row in (["5", "6", "7"], ["8", "6", "7", "5"], ["x"], ["2", "3", "5", "4"]):
        x = np.array(row, dtype=object)
        got = session.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, run_onnxruntime(model, {"x": x})[0])
    # the trie is the session's: its interpreter holds it, not a process-wide cache
    assert len(session.compiled.interpreter.derived_tables._tables) == 1
    other = oxla.InferenceSession(model.SerializeToString())
    assert len(other.compiled.interpreter.derived_tables._tables) == 0


def test_tfidf_bigrams_only_pool() -> None:
    x = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32)
    got = check("TfIdfVectorizer", {"x": x}, mode="TF", min_gram_length=2, max_gram_length=2,
                max_skip_count=0, ngram_counts=[0, 0], ngram_indexes=[0, 1, 2],
                pool_int64s=[5, 6, 7, 8, 6, 7])
    assert got[0].tolist() == [1.0, 1.0, 1.0]


def test_tfidf_sparse_trie_search(monkeypatch: pytest.MonkeyPatch) -> None:
    # Large pools look trie edges up with searchsorted instead of a dense table
    from oxla.lowering.ops import string

    monkeypatch.setattr(string, "DENSE_TRIE", 0)
    check("TfIdfVectorizer", {"x": X}, mode="TF", min_gram_length=1, max_gram_length=2,
          max_skip_count=2, **POOL)
