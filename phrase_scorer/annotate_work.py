"""The host work of ``annotate`` on one window of lines, done in a worker process.

Two stages per window, both in the same worker (see :class:`~phrase_scorer.io.parallel.WorkerPool`):

    prepare:  raw bytes -> checked lines -> word ids and unknown-word counts (sent to the scorer)
    finish:   log p from the scorer -> the two columns -> formatted lines -> one gzip member

Between the stages the worker keeps the window's lines, so only ids go to the scorer and only
scores come back. This module imports neither torch nor the model: a worker starts in a fraction
of a second and holds little memory.

Column encoding. Moses takes the natural log of every phrase-table column when it loads the table
and floors it at -100 (see docs/moses.md). So the model's column holds p(y|x) = exp(log p), and
the unknown-word column holds exp(n_unk), n_unk being the number of words outside the model's
shortlists; Moses then sees log p(y|x) and n_unk as features. A log p below -100 is written as
exp(-100) (about 3.7e-44), which Moses reads as its own floor, -100; values never reach 0, NaN
or a negative number. The unknown-word count is capped at :data:`UNK_CAP` = 88 before it is
exponentiated: Moses reads every score as a 32-bit float, whose largest value (3.4e38) lies
between e^88 (1.65e38) and e^89, so exp(88) is the largest e^n that Moses (and this package's
reader) takes as a finite number; a phrase with more than 88 unknown words gets the same
column as one with 88. All values are printed with 9 significant digits.

Word ids. A window's words are looked up as UTF-8 bytes in one dictionary per vocabulary, each
word with one C-level dictionary probe (no per-word Python code); words outside the shortlist,
and the literal words ``<pad>``, ``</s>`` and ``<unk>`` (which are never the model's special
symbols), get ``<unk>``'s id and count as unknown words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import AnnotateOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import gzip_member
from phrase_scorer.io.table_windows import RawWindow, parse_window
from phrase_scorer.vocab import SPECIALS, UNK_ID, in_model_order

LOG_FLOOR = -100.0  # Moses floors the log of every column here (LOWEST_SCORE in moses/TypeDef.h)
UNK_CAP = 88  # the unk column is exp(min(n, UNK_CAP)): e^88 < 3.4e38, the largest 32-bit float Moses reads


class ByteIds(dict):
    """UTF-8 word -> id; any other word (special-symbol spellings included) -> ``<unk>``'s id."""

    def __init__(self, tokens: Sequence[str]) -> None:
        super().__init__((w.encode("utf-8"), i) for i, w in enumerate(tokens) if w not in SPECIALS)

    def __missing__(self, word: bytes) -> int:
        return UNK_ID


@dataclass
class PreparedWindow:
    """What the scorer needs from a window."""

    index: int
    first_line: int
    source_ids: List[Tuple[int, ...]]
    target_ids: List[Tuple[int, ...]]
    num_scores: Optional[int]


class WindowWork:
    """A worker's handler: :meth:`prepare` and :meth:`finish` a window (see the module docstring).

    ``constant_log_prob``, when set, stands in for the model (the host-pipeline benchmark):
    ``finish`` then ignores the scores it is given.
    """

    def __init__(self, path: str, source_tokens: Sequence[str], target_tokens: Sequence[str],
                 options: AnnotateOptions, compress: bool, target_right_to_left: bool = False) -> None:
        self.path = path
        self.source_ids = ByteIds(source_tokens)
        self.target_ids = ByteIds(target_tokens)
        self.target_right_to_left = target_right_to_left  # a right-to-left model (see phrase_scorer.vocab)
        self.options = options
        self.compress = compress
        self.value_format = b" ".join(b"%.9g" for _ in options.columns)
        self._kept: Dict[int, tuple] = {}  # window index -> what finish needs

    def prepare(self, index: int, window: RawWindow, num_scores: Optional[int]) -> PreparedWindow:
        parsed = parse_window(window, self.path, num_scores)
        source_get, target_get = self.source_ids.__getitem__, self.target_ids.__getitem__
        source_ids = [tuple(map(source_get, words)) for words in parsed.source_words]
        target_ids = [tuple(map(target_get, words)) for words in parsed.target_words]
        if self.target_right_to_left:  # nothing to do, per line, for a left-to-right model
            target_ids = [in_model_order(ids, True) for ids in target_ids]
        unk_side = self.options.unk_side
        unknown = np.zeros(len(source_ids), np.int64)
        if unk_side in ("source", "both"):
            unknown += np.fromiter((ids.count(UNK_ID) for ids in source_ids), np.int64, len(source_ids))
        if unk_side in ("target", "both"):
            unknown += np.fromiter((ids.count(UNK_ID) for ids in target_ids), np.int64, len(target_ids))
        target_lengths = np.fromiter(map(len, target_ids), np.int64, len(target_ids))
        self._kept[index] = (parsed.appender(), unknown, target_lengths, window.first_line)
        return PreparedWindow(window.index, window.first_line, source_ids, target_ids, parsed.num_scores)

    def finish(self, index: int, log_probs: np.ndarray) -> bytes:
        appender, unknown, target_lengths, first_line = self._kept.pop(index)
        data = appender.with_scores_appended(self.columns(log_probs, unknown, target_lengths, first_line))
        return gzip_member(data, self.options.compress_level) if self.compress else data

    def columns(self, log_probs: np.ndarray, unknown: np.ndarray, target_lengths: np.ndarray,
                first_line: int) -> List[bytes]:
        """The appended values of each line, formatted."""
        check_finite(log_probs, self.path, first_line)
        if self.options.length_normalize:
            log_probs = per_token(log_probs, target_lengths)
        probs = np.exp(np.maximum(log_probs, LOG_FLOOR)).tolist()
        counts = np.exp(np.minimum(unknown, UNK_CAP).astype(np.float64)).tolist()
        columns = [probs if column == "prob" else counts for column in self.options.columns]
        fmt = self.value_format
        return [fmt % values for values in zip(*columns)]


def check_finite(log_probs: np.ndarray, path: str, first_line: int) -> None:
    """Refuse a NaN or infinite score; ``first_line`` is the input line of ``log_probs[0]``."""
    if not np.isfinite(log_probs).all():
        bad = int(np.flatnonzero(~np.isfinite(log_probs))[0])
        raise PhraseScorerError("the model gave a non-finite score", path=path, line=first_line + bad,
                                hint="the model weights are damaged")


def per_token(log_probs: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """log p divided by the number of predicted tokens: the ``target_lengths`` target words and ``</s>``."""
    return log_probs / (np.asarray(target_lengths, np.float64) + 1)
