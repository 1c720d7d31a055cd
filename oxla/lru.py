"""A bounded, thread-safe least-recently-used map with hit and eviction counts."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class CacheInfo:
    """What a cache holds and how it was used, like functools' cache_info()."""

    hits: int
    misses: int
    size: int
    maxsize: int
    evictions: int


class LRU[V]:
    """Key -> value, holding at most `maxsize` entries; the least recently used goes first."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"a cache holds at least one entry, got maxsize={maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0

    def get(self, key: Hashable, *, count_miss: bool = True) -> V | None:
        """The value under `key` (now the most recent), or None; `count_miss=False` for a probe
        whose miss is not a miss of the cache (a caller that falls back to another key)."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self._misses += count_miss
            else:
                self._hits += 1
                self._data.move_to_end(key)
            return value

    def setdefault(self, key: Hashable, value: V) -> V:
        """The value under `key`, inserting `value` (and evicting the oldest) when absent."""
        with self._lock:
            existing = self._data.get(key)
            if existing is not None:
                return existing
            self._data[key] = value
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
                self._evictions += 1
            return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, len(self._data), self.maxsize, self._evictions)
