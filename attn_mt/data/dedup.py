"""The hashes the `dedup` rule of `data.filters` keeps: a hash of each pair (`pair_hashes`, made
on the worker processes) and the set of those a corpus has kept (`SeenHashes`, 8 bytes a pair,
in the one process that reads the corpus in order)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def pair_hashes(src: Sequence[str], tgt: Sequence[str]) -> np.ndarray:
    """(N,) uint64: a hash of each pair, its spaces collapsed (blake2b: the same on every
    machine and in every process)."""
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(
                    f"{' '.join(s.split())}\t{' '.join(t.split())}".encode(), digest_size=8
                ).digest(),
                "little",
            )
            for s, t in zip(src, tgt, strict=True)
        ),
        dtype=np.uint64,
        count=len(src),
    )


class SeenHashes:
    """A set of 64-bit hashes, 8 bytes each: sorted arrays of sizes that halve (a log-structured
    merge), so adding N hashes costs O(N log N) in all and a lookup a binary search a level."""

    def __init__(self) -> None:
        self._levels: list[np.ndarray] = []  # sorted, largest first

    def __len__(self) -> int:
        return sum(map(len, self._levels))

    def add_new(self, hashes: np.ndarray) -> np.ndarray:
        """(N,) bool: which of `hashes` were not seen before (nor earlier in `hashes`); those
        are added."""
        unique, first = np.unique(hashes, return_index=True)
        new = np.ones(len(unique), dtype=bool)
        for level in self._levels:
            found = np.minimum(np.searchsorted(level, unique), len(level) - 1)
            new &= level[found] != unique
        fresh = np.zeros(len(hashes), dtype=bool)
        fresh[first[new]] = True
        level = unique[new]
        while self._levels and len(self._levels[-1]) <= len(level):
            level = np.sort(np.concatenate([self._levels.pop(), level]), kind="stable")
        if len(level):
            self._levels.append(level)
        return fresh
