"""The embedded engine's prefix cache: the KV of sequences seen lately, reused by any request
that starts with one of them (SGLang's radix cache, in its simplest form).

Agents talk in turns: a doctor's prompt at turn k + 1 is its prompt at turn k, its reply and the
patient's answer. Without a cache every turn prefills the whole conversation again, so an
episode pays O(turns^2) prefill. The scheduler stores the KV of every sequence it prefills (the
prompt) and of every request it finishes (prompt + output); a new request takes the longest
stored sequence that is a prefix of its tokens and prefills only the rest. Its reply reports
how many prompt tokens came from here in ``meta_info.cached_tokens``, as SGLang's does.

Entries are whole sequences, not a tree: storing a sequence that extends an entry replaces the
entry, storing one that an entry already extends only marks that entry used. When the stored
KV passes ``max_bytes`` the least recently used entries go first. The engine clears the cache
on every weight update, so no KV computed under old weights survives a sync.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from torch import Tensor


@dataclass
class _Entry:
    tokens: np.ndarray  # (T,) int64
    kv: Tensor  # (L, 2, H, T, D): keys and values of every layer


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """KV of whole token sequences, found by longest common prefix, evicted LRU over a byte cap
    (``max_bytes`` <= 0 turns the cache off: it stores nothing and matches nothing)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self.stats = {"cache_hits": 0, "cache_lookups": 0, "cache_evictions": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, ids: list[int]) -> tuple[int, Tensor | None]:
        """The longest stored prefix of ``ids``, leaving at least one token to prefill (its
        logits sample the first new token): (length c, KV (L, 2, H, c, D)), or (0, None)."""
        self.stats["cache_lookups"] += 1
        query = np.asarray(ids, dtype=np.int64)
        best, hit = 0, None
        for key, entry in self._entries.items():
            if min(len(key), len(ids) - 1) <= best:
                continue
            n = min(_common(entry.tokens, query), len(ids) - 1)
            if n > best:
                best, hit = n, key
        if hit is None:
            return 0, None
        self._entries.move_to_end(hit)
        self.stats["cache_hits"] += 1
        return best, self._entries[hit].kv[:, :, :, :best]

    def insert(self, ids: list[int], kv: Tensor) -> None:
        """Store the KV (L, 2, H, T, D) of the T tokens ``ids`` (the tensor is kept, not
        copied: give one that nothing else writes to)."""
        if kv.shape[3] != len(ids):
            raise ValueError(f"KV of {kv.shape[3]} tokens for a sequence of {len(ids)}")
        size = kv.numel() * kv.element_size()
        if size > self.max_bytes or not ids:
            return
        tokens = np.asarray(ids, dtype=np.int64)
        for key, entry in list(self._entries.items()):
            n = _common(entry.tokens, tokens)
            if n == len(tokens):  # an entry already holds this sequence, or extends it
                self._entries.move_to_end(key)
                return
            if n == len(key):  # this sequence extends the entry: it takes its place
                self._drop(key)
        self._entries[tuple(ids)] = _Entry(tokens, kv)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats["cache_evictions"] += 1

    def clear(self) -> int:
        """Drop every entry (a weight update makes them stale); returns how many there were."""
        n = len(self._entries)
        self._entries.clear()
        self.bytes = 0
        return n

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.kv.numel() * entry.kv.element_size()
