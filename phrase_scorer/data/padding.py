"""Padding id sequences into rows: the one routine that training batches, the scorer and the
annotate workers share (numpy only: inference imports it without the training data's code)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Sequence, Tuple, Union

import numpy as np

from phrase_scorer.vocab import PAD_ID


NO_ID = -1  # pads id rows that are sorted or passed between processes: it sorts before every id


def pad_ids(sequences: Sequence[Union[Sequence[int], np.ndarray]], fill: int = PAD_ID) -> Tuple[np.ndarray, np.ndarray]:
    """The one padding routine: a (B, L) int64 id matrix padded with ``fill`` (``<pad>`` unless
    told; L >= 1) and the (B,) int64 lengths. Row b holds sequence b's ids, then ``fill``."""
    lengths = np.fromiter(map(len, sequences), np.int64, len(sequences))
    flat = np.fromiter(itertools.chain.from_iterable(sequences), np.int64, int(lengths.sum()))
    return pad_flat(flat, lengths, fill), lengths


def pad_flat(flat: np.ndarray, lengths: np.ndarray, fill: int = PAD_ID) -> np.ndarray:
    """:func:`pad_ids` of sequences given end to end: ``flat`` (sum of lengths,) holds the ids of
    every sequence in turn, ``lengths`` (B,) how many each has -> (B, L) with L >= 1."""
    matrix = np.full((len(lengths), max(int(lengths.max(initial=0)), 1)), fill, np.int64)
    matrix[np.arange(matrix.shape[1]) < lengths[:, None]] = flat  # (B, L) mask, filled row by row
    return matrix


@dataclass
class IdRows:
    """Id sequences as one (n, L) int64 matrix padded with :data:`NO_ID` and their (n,) lengths:
    what a scorer sorts and batches, and what crosses between processes as two arrays (no Python
    object per id)."""

    rows: np.ndarray  # (n, L)
    lengths: np.ndarray  # (n,)

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def of(cls, sequences: "Sequence[Sequence[int]] | IdRows") -> "IdRows":
        return sequences if isinstance(sequences, IdRows) else cls(*pad_ids(sequences, fill=NO_ID))

    @classmethod
    def from_flat(cls, flat: np.ndarray, lengths: np.ndarray) -> "IdRows":
        return cls(pad_flat(flat, lengths, NO_ID), lengths)


# --- a permutation of [0, n) that needs no memory: a keyed Feistel network with cycle walking ---
