"""com.microsoft::Tokenizer against onnxruntime (onnx.reference has no com.microsoft ops)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.lowering.util import check_node

TEXTS = np.array(["Hello, world! This is a test.", "a bb ccc dddd", "", "No-separators_here",
                  "tabs\tand\nnewlines  double  spaces", "ünïcödé wörds, ça va?"], dtype=object)
SKLEARN_SEPARATORS = [" ", "[.]", "\\?", ",", ";", ":", "!", "\\(", "\\)", "\n", '"', "'", "-",
                      "\\[", "\\]", "@"]


def tokenize(x: np.ndarray, **attrs: Any) -> np.ndarray:
    attrs.setdefault("mark", 0)
    attrs.setdefault("pad_value", "#")
    attrs.setdefault("mincharnum", 1)
    (y,) = check_node("Tokenizer", {"x": x}, domain="com.microsoft", reference=False, **attrs)
    return y


@pytest.mark.parametrize("mark", [0, 1])
@pytest.mark.parametrize("mincharnum", [1, 2, 3])
@pytest.mark.parametrize("separators", [[" "], SKLEARN_SEPARATORS, ["\\s+", ","], ["[aeiou]"]],
                         ids=["space", "sklearn", "regex", "vowels"])
def test_separators(mark: int, mincharnum: int, separators: list[str]) -> None:
    tokenize(TEXTS, mark=mark, mincharnum=mincharnum, separators=separators)


@pytest.mark.parametrize("mark", [0, 1])
@pytest.mark.parametrize("tokenexp", ["\\w+", "[a-zA-Z]+", "\\b\\w\\w+\\b", "a|ab|abc", "[a-z]+?"])
def test_token_expression(mark: int, tokenexp: str) -> None:
    # "a|ab|abc" and the lazy "[a-z]+?" take the longest match, as RE2 with longest_match does
    x = np.array(["abcabc ab a", "Hello world_1 x", "über straße"], dtype=object)
    tokenize(x, mark=mark, tokenexp=tokenexp, mincharnum=1)
    tokenize(x, mark=mark, tokenexp=tokenexp, mincharnum=2)


def test_two_dimensional_input_and_padding() -> None:
    x = np.array([["one two", "three"], ["", "four five six"]], dtype=object)
    y = tokenize(x, separators=[" "], pad_value="<pad>", mark=1)
    assert y.shape == (2, 2, 5)


@pytest.mark.parametrize("how", [{"tokenexp": "."}, {"separators": [""]}], ids=["tokenexp", "separators"])
def test_character_tokenization(how: dict) -> None:
    tokenize(np.array(["abc", "ça", ""], dtype=object), mark=1, **how)


@pytest.mark.parametrize("x", [np.array(["", ""], dtype=object), np.array([",,", ", ,"], dtype=object)],
                         ids=["empty-strings", "only-separators"])
def test_no_tokens_gives_an_empty_last_axis(x: np.ndarray) -> None:
    assert tokenize(x, separators=[",", " "], mark=1).shape == (2, 0)


def test_empty_input_drops_the_c_axis() -> None:
    assert tokenize(np.empty((3, 0), dtype=object), separators=[" "]).shape == (3, 0)
    assert tokenize(np.empty((0,), dtype=object), separators=[" "]).shape == (0,)
