"""com.microsoft::Tokenizer (skl2onnx writes it for every Tfidf/CountVectorizer), on the host.

onnxruntime's semantics: RE2 with leftmost-longest matching, ASCII \\w and \\b, tokens shorter
than mincharnum dropped, rows padded with pad_value to the longest row, optional start (0x02)
and end (0x03) marks around every row.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from oxla.lowering.common import check_size
from oxla.lowering.ops.string import strings
from oxla.lowering.registry import rule

MS = "com.microsoft"
START, END = "\x02", "\x03"


class _Longest:
    """A pattern searched leftmost-longest, as RE2 with longest_match (Python's re is leftmost-first:
    it differs only where an alternation or a lazy quantifier can stop early)."""

    def __init__(self, pattern: str) -> None:
        # RE2's \w, \d, \s and \b are ASCII; Python's (?u) flag (sklearn's default pattern) says
        # Unicode, which RE2 ignores here as well
        self.regex = re.compile(pattern.replace("(?u)", ""), re.ASCII)
        self.ambiguous = "|" in pattern or "?" in pattern.replace("(?", "")

    def search(self, text: str, start: int) -> tuple[int, int] | None:
        m = self.regex.search(text, start)
        if m is None:
            return None
        end = m.end()
        if self.ambiguous:  # the longest match at the same start
            end = next((e for e in range(len(text), end, -1) if self.regex.fullmatch(text, m.start(), e)), end)
        return m.start(), end


def _split(text: str, sep: _Longest, mincharnum: int) -> list[str]:
    """The pieces of text between matches of sep, those of at least mincharnum characters."""
    out, start = [], 0
    while (found := sep.search(text, start)) is not None:
        at, end = found
        if at - start >= mincharnum:
            out.append(text[start:at])
        # an empty match moves one character on, and that character is dropped (onnxruntime)
        start = end if end > at else at + 1
        if start > len(text):
            return out
    if len(text) - start >= mincharnum:
        out.append(text[start:])
    return out


def _by_separators(text: str, seps: Sequence[_Longest], mincharnum: int) -> list[str]:
    row = [text]
    for sep in seps:
        row = [piece for t in row for piece in _split(t, sep, mincharnum)]
        if not row:  # nothing left for the separators after this one
            break
    return row


def _by_expression(text: str, exp: _Longest, mincharnum: int) -> list[str]:
    """Every match of at least mincharnum characters; a shorter match moves one character on."""
    row: list[str] = []
    if len(text) < mincharnum:
        return row
    start = 0
    while start <= len(text) and (found := exp.search(text, start)) is not None:
        at, end = found
        if end - at >= mincharnum:
            row.append(text[at:end])
            start = end
        else:
            start = at + 1
    return row


def _padded(cx, rows: list[list[str]], mark: bool, pad_value: str) -> tuple[np.ndarray, int]:
    width = max((len(r) for r in rows), default=0)
    if width == 0:
        return np.empty((len(rows), 0), dtype=object), 0
    full = width + 2 * mark
    check_size(cx, [len(rows), full], object)  # every row padded to the longest one
    out = np.full((len(rows), full), pad_value, dtype=object)
    for i, row in enumerate(rows):
        tokens = [START, *row, END] if mark else row
        out[i, :len(tokens)] = tokens
    return out, full


@rule("Tokenizer", since=1, domain=MS, static=("*",))
def tokenizer(cx, X, *, mark=None, mincharnum=None, pad_value=None, separators=None, tokenexp=None):
    """Y[..., :] = the tokens of X[...] (split at separators, or the matches of tokenexp), padded
    to the longest row with pad_value, between 0x02/0x03 marks when mark  (com.microsoft v1)."""
    if mark is None or mincharnum is None or pad_value is None:
        raise cx.fail("attributes mark, mincharnum and pad_value are required")
    if mincharnum < 1:
        raise cx.fail(f"mincharnum must be positive, got {mincharnum}")
    if X.ndim not in (1, 2):
        raise cx.fail(f"input X must have shape [C] or [N, C], got {X.shape}")
    if X.size == 0:  # onnxruntime: [N, 0] or [0], the C axis dropped
        return np.empty((*X.shape[:-1], 0) if X.ndim == 2 else (0,), dtype=object)
    texts = list(strings(X).reshape(-1))
    chars = tokenexp == "." if separators is None else tuple(separators) == ("",)
    if separators is None and not tokenexp:
        raise cx.fail("one of separators and tokenexp is required")
    if chars:
        if mincharnum > 1:
            raise cx.fail("mincharnum must be 1 for character tokenization")
        rows = [list(t) for t in texts]
    elif separators is not None:
        seps = [_Longest(s) for s in separators]
        rows = [_by_separators(t, seps, mincharnum) for t in texts]
    else:
        exp = _Longest(tokenexp)
        rows = [_by_expression(t, exp, mincharnum) for t in texts]
    out, width = _padded(cx, rows, bool(mark), pad_value)
    return out.reshape((*X.shape, width))
