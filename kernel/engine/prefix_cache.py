"""The embedded engine's prefix cache: the KV of sequences seen lately, reused by any request
that starts with one of them (SGLang's radix cache, in its simplest form).

Agents talk in turns: a doctor's prompt at turn k + 1 is its prompt at turn k, its reply and the
patient's answer. Without a cache every turn prefills the whole conversation again, so an
episode pays O(turns^2) prefill. The scheduler stores the KV of every sequence it prefills (the
prompt) and of every request it finishes (prompt + output); a new request takes the longest
stored sequence that is a prefix of its tokens and prefills only the rest. Its reply reports
how many prompt tokens came from here in ``meta_info.cached_tokens``, as SGLang's does.

Entries are whole sequences, found through a hash of each of their full blocks of ``BLOCK``
tokens chained with the blocks before it (vLLM's prefix hashing): a request walks its own blocks
while an entry shares them, takes the most recent such entry and compares tokens from there, so a
lookup or an insert costs its own length, not the number of entries. Storing a sequence that
extends the entry it was found through replaces that entry; storing one an entry already holds
only marks the entry used. When the stored KV passes ``max_bytes`` the least recently used
entries go first. The engine clears the cache on every weight update, so no KV computed under
old weights survives a sync.

Every entry belongs to a ``key``: the LoRA adapter that computed its KV (None: the base model).
A lookup finds only entries of its own key -- the key seeds the block hashes and is compared --
so one adapter's KV never serves another's request, while all share one byte budget.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from torch import Tensor

BLOCK = 16
"""Tokens per hashed block. A prefix is found through its full blocks; the match then extends
token by token within the entry found."""


@dataclass
class _Entry:
    tokens: np.ndarray  # (T,) int64
    kv: Tensor  # (L, 2, H, T, D): keys and values of every layer
    blocks: list[int]  # the chained hash of each full block
    key: str | None  # the LoRA adapter whose KV this is (None: the base model)


def _common(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two token arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def _chain(ids: list[int], key: str | None) -> list[int]:
    """The hash of each full block of ``ids``, each chained with the ones before it and with
    ``key``."""
    out, h = [], hash(key)
    for i in range(0, len(ids) - BLOCK + 1, BLOCK):
        h = hash((h, tuple(ids[i : i + BLOCK])))
        out.append(h)
    return out


class PrefixCache:
    """KV of whole token sequences, found by longest common prefix, evicted LRU over a byte cap
    (``max_bytes`` <= 0 turns the cache off: it stores nothing and matches nothing)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # id -> entry, LRU first
        self._blocks: dict[int, dict[int, None]] = {}  # block hash -> ids of entries holding it
        self._next_id = 0
        self.stats = {"cache_hits": 0, "cache_lookups": 0, "cache_evictions": 0}

    def __len__(self) -> int:
        return len(self._entries)

    def _found(
        self, tokens: np.ndarray, blocks: list[int], key: str | None
    ) -> tuple[int | None, int]:
        """The most recent entry of ``key`` sharing the most full blocks (their ``_chain``
        hashes) with ``tokens`` and the length of their common prefix (None, 0 when no entry
        shares the first block)."""
        hit = None
        for h in blocks:
            holders = self._blocks.get(h)
            if not holders:
                break
            hit = next(reversed(holders))
        if hit is None or self._entries[hit].key != key:  # the key is in the hash: a collision
            return None, 0
        return hit, _common(self._entries[hit].tokens, tokens)

    def match(self, ids: list[int], key: str | None = None) -> tuple[int, Tensor | None]:
        """The longest prefix of ``ids`` stored under ``key`` found, leaving at least one token
        to prefill (its logits sample the first new token): (length c, KV (L, 2, H, c, D)), or
        (0, None)."""
        self.stats["cache_lookups"] += 1
        hit, n = self._found(np.asarray(ids, dtype=np.int64), _chain(ids, key), key)
        n = min(n, len(ids) - 1)
        if hit is None or n <= 0:
            return 0, None
        self._entries.move_to_end(hit)
        self.stats["cache_hits"] += 1
        return n, self._entries[hit].kv[:, :, :, :n]

    def insert(self, ids: list[int], kv: Tensor, key: str | None = None) -> None:
        """Store the KV (L, 2, H, T, D) of the T tokens ``ids`` under ``key`` (the tensor is
        kept, not copied: give one that nothing else writes to)."""
        if kv.shape[3] != len(ids):
            raise ValueError(f"KV of {kv.shape[3]} tokens for a sequence of {len(ids)}")
        size = kv.numel() * kv.element_size()
        if size > self.max_bytes or len(ids) < BLOCK:
            return
        tokens, blocks = np.asarray(ids, dtype=np.int64), _chain(ids, key)
        hit, n = self._found(tokens, blocks, key)
        if hit is not None:
            if n == len(ids):  # an entry already holds this sequence, or extends it
                self._entries.move_to_end(hit)
                return
            if n == len(self._entries[hit].tokens):  # this sequence extends it: takes its place
                self._drop(hit)
        entry = _Entry(tokens, kv, blocks, key)
        key, self._next_id = self._next_id, self._next_id + 1
        self._entries[key] = entry
        for h in entry.blocks:
            self._blocks.setdefault(h, {})[key] = None
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
            self.stats["cache_evictions"] += 1

    def clear(self) -> int:
        """Drop every entry (a weight update makes them stale); returns how many there were."""
        n = len(self._entries)
        self._entries.clear()
        self._blocks.clear()
        self.bytes = 0
        return n

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.kv.numel() * entry.kv.element_size()
        for h in entry.blocks:
            holders = self._blocks[h]
            del holders[key]
            if not holders:
                del self._blocks[h]
