"""Batches of a pair cache's split: every training pair once per epoch in a pseudo-random order
(a keyed permutation that needs no memory), grouped by length within windows of a few thousand
pairs. A batch is a pure function of (seed, epoch, position): an interrupted run resumes with the
same data order."""

from __future__ import annotations

import hashlib
from typing import Iterator, List

import numpy as np

from phrase_scorer.data.cache import PairSet

TABLE_WINDOW_BATCHES = 64  # batches sorted by length together, for phrase pairs


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64 finaliser of x + key (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        z = x + key
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class KeyedPermutation:
    """perm(i) for i in [0, n): a bijection fixed by ``key``, computed on demand in O(1) memory."""

    ROUNDS = 4

    def __init__(self, n: int, key: int) -> None:
        self.n = n
        bits = max(2, int(n - 1).bit_length())
        self.half = (bits + 1) // 2
        rng = np.random.default_rng(key)
        self.keys = [np.uint64(k) for k in rng.integers(0, 2**63, self.ROUNDS, dtype=np.int64)]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        mask = np.uint64((1 << self.half) - 1)
        left, right = x >> half, x & mask
        for k in self.keys:
            left, right = right, left ^ (_mix(right, k) & mask)
        return (left << half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        out = self._feistel(positions.astype(np.uint64))
        outside = out >= np.uint64(self.n)
        while outside.any():  # cycle walking: at most a few rounds, the domain is < 4n
            out[outside] = self._feistel(out[outside])
            outside = out >= np.uint64(self.n)
        return out.astype(np.int64)


class BatchSampler:
    """Length-grouped batches of pair indices in a reproducible order.

    Each epoch walks a keyed permutation of the training pairs in windows of
    ``window_batches * batch_size`` pairs; within a window, pairs are sorted by (target length,
    source length), cut into batches and the batches shuffled. Batch ``k`` of epoch ``e`` depends
    only on (seed, e, k).
    """

    def __init__(self, pairs: PairSet, batch_size: int, seed: int, window_batches: int = TABLE_WINDOW_BATCHES) -> None:
        self.pairs = pairs
        self.batch_size = batch_size
        self.seed = seed
        self.window = window_batches * batch_size
        n = len(pairs)
        full, rest = divmod(n, self.window)
        self.batches_per_window = window_batches
        self.batches_per_epoch = full * window_batches + -(-rest // batch_size)

    def _window_batches(self, epoch: int, window: int) -> List[np.ndarray]:
        n = len(self.pairs)
        start = window * self.window
        positions = np.arange(start, min(start + self.window, n))
        indices = KeyedPermutation(n, hash_key(self.seed, epoch))(positions)
        lengths = self.pairs.lengths_of(indices)
        order = np.lexsort((lengths[:, 0], lengths[:, 1]))
        indices = indices[order]
        batches = [indices[i : i + self.batch_size] for i in range(0, len(indices), self.batch_size)]
        rng = np.random.default_rng(hash_key(self.seed, epoch, window))
        return [batches[i] for i in rng.permutation(len(batches))]

    def epoch(self, epoch: int, start_batch: int = 0) -> Iterator[np.ndarray]:
        """The batches of ``epoch`` from batch number ``start_batch`` on."""
        window, skip = divmod(start_batch, self.batches_per_window)
        while window * self.window < len(self.pairs):
            for batch in self._window_batches(epoch, window)[skip:]:
                yield batch
            window, skip = window + 1, 0


def hash_key(*parts: int) -> int:
    digest = hashlib.blake2b(",".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
