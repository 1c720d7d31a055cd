"""String ops (host-side numpy on object arrays) and TfIdfVectorizer (jnp, also on int64 input)."""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from oxla.lowering.common import check_size, xp
from oxla.lowering.registry import rule


def text(value: Any) -> str:
    """One element of a string tensor as str (feeds may hold bytes)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return str(value)


def strings(x: Any) -> np.ndarray:
    """A string tensor as an object array of str."""
    arr = np.asarray(x, dtype=object)
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [text(v) for v in arr.reshape(-1)]
    return out


def _map(fn: Any, x: np.ndarray, otype: Any = object) -> np.ndarray:
    """fn applied to every element, keeping the shape (0-d and empty arrays included)."""
    out = np.empty(x.shape, dtype=otype)
    out.reshape(-1)[:] = [fn(v) for v in x.reshape(-1)]
    return out


# --- StringNormalizer, StringConcat, StringSplit, RegexFullMatch -------------------------------

_CASE = {"NONE": lambda s: s, "LOWER": str.lower, "UPPER": str.upper}


@rule("StringNormalizer", since=10, static=("*",))
def string_normalizer(cx, x, *, case_change_action="NONE", is_case_sensitive=0, locale=None,
                      stopwords=None):
    """Y = change_case(X without the elements in stopwords)  (v10+; X is [C] or [1, C])."""
    change = _CASE.get(case_change_action)
    if change is None:
        raise cx.fail(f"case_change_action must be NONE, LOWER or UPPER, got {case_change_action!r}")
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise cx.fail(f"input X must have shape [C] or [1, C], got {x.shape}")
    # Case changes use Python's Unicode tables: no locale needed (the locale attribute is a hint)
    fold = (lambda s: s) if is_case_sensitive else str.lower
    stops = {fold(s) for s in stopwords or ()}
    kept = [change(s) for s in strings(x).reshape(-1) if fold(s) not in stops]
    # An all-removed input gives one empty string, [1] or [1, 1] by the input's rank
    kept = kept or [""]
    return np.array(kept, dtype=object).reshape((len(kept),) if x.ndim == 1 else (1, len(kept)))


@rule("StringConcat", since=20, static=("*",))
def string_concat(cx, x, y):
    """Z = X + Y elementwise, with numpy broadcasting  (v20+)."""
    x, y = strings(x), strings(y)
    try:
        shape = np.broadcast_shapes(x.shape, y.shape)
    except ValueError:
        raise cx.fail(f"shapes {x.shape} and {y.shape} do not broadcast") from None
    check_size(cx, shape, object)
    z = np.frompyfunc(operator.add, 2, 1)(x, y)
    return np.asarray(z, dtype=object)


@rule("StringSplit", since=20, static=("*",))
def string_split(cx, x, *, delimiter=None, maxsplit=None):
    """Y[..., k] = k-th piece of X split at delimiter (padded with ''), Z = number of pieces  (v20+)."""
    # An empty or absent delimiter splits at runs of whitespace, dropping leading/trailing ones
    sep = delimiter or None
    limit = -1 if maxsplit is None else maxsplit
    pieces = _map(lambda s: s.split(sep, limit), strings(x))
    counts = _map(len, pieces, np.int64)
    width = int(counts.max(initial=0))
    check_size(cx, [*x.shape, width], object)  # padded to the most pieces any element has
    y = np.full((*x.shape, width), "", dtype=object)
    for index in np.ndindex(*x.shape):
        y[index][: counts[index]] = pieces[index]
    return y, counts


@rule("RegexFullMatch", since=20, static=("*",))
def regex_full_match(cx, x, *, pattern=None):
    """Y = whether pattern matches the whole of X, elementwise  (v20+)."""
    if pattern is None:
        raise cx.fail("attribute 'pattern' is required")
    # The spec names RE2 syntax; Python's re accepts nearly all of it (not \p{..} classes or \C)
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise cx.fail(f"pattern {pattern!r} is not a valid regular expression: {e}") from None
    return _map(lambda s: regex.fullmatch(s) is not None, strings(x), np.bool_)


# --- TfIdfVectorizer ---------------------------------------------------------------------------


class _Trie(NamedTuple):
    """The pool's n-grams as a trie over token ids: tokens are the distinct pool items (token id =
    position, `ids` the reverse); trie edge parent -> child on token t has key
    parent * len(tokens) + t (`keys` sorted, `children` alongside; `edges` the same as a dict);
    outputs[node] is the output column of the n-gram ending there or -1."""

    tokens: list[Any]
    ids: dict[Any, int]
    keys: np.ndarray
    children: np.ndarray
    outputs: np.ndarray
    edges: dict[int, int]


def _ngram_trie(pool: Sequence[Any], ngram_counts: Sequence[int], ngram_indexes: Sequence[int],
                min_n: int, max_n: int) -> _Trie:
    """The pool's n-grams of size min_n..max_n as a trie over token ids."""
    tokens = sorted(set(pool))
    tid = {t: i for i, t in enumerate(tokens)}
    edges: dict[int, int] = {}
    outputs = [-1]
    gram = 0
    bounds = [*ngram_counts, len(pool)]
    for n in range(1, len(ngram_counts) + 1):
        items = pool[bounds[n - 1]:bounds[n]]
        for start in range(0, len(items) - n + 1, n):
            if min_n <= n <= max_n and gram < len(ngram_indexes):
                node = 0
                for t in items[start:start + n]:
                    key = node * len(tokens) + tid[t]
                    if key not in edges:
                        edges[key] = len(outputs)
                        outputs.append(-1)
                    node = edges[key]
                outputs[node] = ngram_indexes[gram]  # a repeated n-gram: the last one counts
            gram += 1
    keys = np.array(sorted(edges), dtype=np.int64)
    children = np.array([edges[k] for k in keys], dtype=np.int64)
    return _Trie(tokens, tid, keys, children, np.array(outputs, dtype=np.int64), edges)


def _token_ids(cx, x: Any, trie: _Trie, pool_strings: Any) -> Any:
    """Each item of X as its pool token id, or -1 when the pool does not hold it."""
    tokens = trie.tokens
    if pool_strings:
        return _map(lambda s: trie.ids.get(text(s), -1), np.asarray(cx.static(x)), np.int64)
    m = xp(x)
    if not tokens:
        return m.full(x.shape, -1, np.int64)
    table = m.asarray(np.array(tokens, dtype=np.int64))
    x = m.asarray(x).astype(np.int64)
    at = m.clip(m.searchsorted(table, x), 0, len(tokens) - 1)
    return m.where(table[at] == x, at, -1)


DENSE_TRIE = 1 << 22  # trie edges as a dense (node, token) table up to this many entries


def _step(keys: np.ndarray, children: np.ndarray, n_nodes: int, n_tokens: int, m: Any) -> Any:
    """next(node, token): the trie child, or -1; node and token may be -1 (dead, unknown)."""
    if n_nodes * n_tokens <= DENSE_TRIE:
        table = np.full(n_nodes * n_tokens + 1, -1, np.int64)
        table[keys] = children
        flat = m.asarray(table)
        return lambda node, tok: flat[m.where((node >= 0) & (tok >= 0), node * n_tokens + tok, -1)]
    sorted_keys, kids = m.asarray(keys), m.asarray(children)

    def search(node: Any, tok: Any) -> Any:
        key = node * n_tokens + tok
        at = m.clip(m.searchsorted(sorted_keys, key), 0, keys.size - 1)
        return m.where((node >= 0) & (tok >= 0) & (sorted_keys[at] == key), kids[at], -1)
    return search


def _walk(ids: Any, keys: np.ndarray, children: np.ndarray, outputs: np.ndarray, n_tokens: int,
          min_n: int, max_n: int, max_skip: int, size: int) -> Any:
    """Counts[b, column]: every n-gram occurrence in each row, items skip apart (0..max_skip).

    numpy on host values (string input runs on the host: eager jax there costs ~10 ms a call)."""
    m = xp(ids)
    rows, width = ids.shape
    if keys.size == 0 or width == 0:
        return m.zeros((rows, size), np.float32)
    step = _step(keys, children, outputs.size, n_tokens, m)
    column_of = m.asarray(np.append(outputs, -1))  # node -1 (dead) has no column
    starts = np.arange(width)
    found = []
    for skip in range(max_skip + 1):
        node = m.zeros((rows, width), np.int64)
        for n in range(1, max_n + 1):
            pos = starts + (n - 1) * (skip + 1)
            tok = m.where(pos < width, ids[:, np.minimum(pos, width - 1)], -1)
            node = step(node, tok)
            # Unigrams are counted once, not once per skip distance (as onnxruntime does)
            if n >= min_n and (n > 1 or skip == 0):
                column = column_of[node]
                found.append(m.where(column >= 0, column, size))
    columns = m.concatenate(found, axis=1)
    row = m.arange(rows)[:, None]
    if m is np:  # column `size` marks no n-gram: counted in a spare column, then dropped
        counts = np.zeros((rows, size + 1), np.float32)
        np.add.at(counts, (np.broadcast_to(row, columns.shape), columns), 1.0)
        return counts[:, :size]
    return jnp.zeros((rows, size), jnp.float32).at[row, columns].add(1.0, mode="drop")


SMALL_WALK = 4096  # trie steps a host call walks in Python (numpy's per-op cost is larger)


def _walk_small(ids: np.ndarray, trie: _Trie, min_n: int, max_n: int, max_skip: int,
                size: int) -> np.ndarray:
    """_walk for a few host tokens, one trie step at a time (the same counts)."""
    rows, width = ids.shape
    counts = np.zeros((rows, size), np.float32)
    edges, outputs, n_tokens = trie.edges, trie.outputs.tolist(), len(trie.tokens)
    for r, row in enumerate(ids.tolist()):
        for start in range(width):
            for skip in range(max_skip + 1):
                node = 0
                for n in range(1, max_n + 1):
                    pos = start + (n - 1) * (skip + 1)
                    if pos >= width or row[pos] < 0:
                        break
                    node = edges.get(node * n_tokens + row[pos], -1)
                    if node < 0:
                        break
                    # Unigrams are counted once, not once per skip distance (as onnxruntime does)
                    if n >= min_n and (n > 1 or skip == 0) and outputs[node] >= 0:
                        counts[r, outputs[node]] += 1
    return counts


@rule("TfIdfVectorizer", since=9)
def tf_idf_vectorizer(cx, x, *, max_gram_length=None, max_skip_count=None, min_gram_length=None,
                      mode=None, ngram_counts=None, ngram_indexes=None, pool_int64s=None,
                      pool_strings=None, weights=None):
    """Y[b, ngram_indexes[j]] = TF, IDF or TF*IDF of pool n-gram j in row b of X  (v9+)."""
    if mode not in ("TF", "IDF", "TFIDF"):
        raise cx.fail(f"mode must be TF, IDF or TFIDF, got {mode!r}")
    if x.ndim not in (1, 2):
        raise cx.fail(f"input X must have shape [C] or [N, C], got {x.shape}")
    if not ngram_indexes:
        raise cx.fail("attribute ngram_indexes must not be empty")
    missing = [name for name, v in (("max_gram_length", max_gram_length),
                                    ("max_skip_count", max_skip_count),
                                    ("min_gram_length", min_gram_length)) if v is None]
    if missing:
        raise cx.fail(f"attributes {', '.join(missing)} are required")

    def trie() -> _Trie:
        pool = list(pool_strings) if pool_strings else list(pool_int64s or ())
        return _ngram_trie(pool, ngram_counts or (0,), ngram_indexes, min_gram_length,
                           max_gram_length)

    size = max(ngram_indexes) + 1
    host = cx.is_static(x) or bool(pool_strings)  # strings run on the host
    t = cx.derived("TfIdfVectorizer", (pool_strings, pool_int64s, ngram_counts, ngram_indexes,
                                       min_gram_length, max_gram_length), trie) if host else trie()
    ids = _token_ids(cx, x, t, pool_strings)
    m = xp(ids)
    rows = m.asarray(ids).reshape((1, -1) if x.ndim == 1 else ids.shape)
    steps = rows.shape[0] * rows.shape[1] * max_gram_length * (max_skip_count + 1)
    if m is np and steps <= SMALL_WALK:
        tf = _walk_small(rows, t, min_gram_length, max_gram_length, max_skip_count, size)
    else:
        tf = _walk(rows, t.keys, t.children, t.outputs, len(t.tokens), min_gram_length,
                   max_gram_length, max_skip_count, size)
    w = m.asarray(np.asarray(weights, np.float32)) if weights else None
    if mode == "IDF":
        y = m.where(tf > 0, w if w is not None else np.float32(1), np.float32(0)).astype(np.float32)
    elif mode == "TFIDF" and w is not None:
        y = tf * w
    else:
        y = tf
    return y.reshape((size,)) if x.ndim == 1 else y
