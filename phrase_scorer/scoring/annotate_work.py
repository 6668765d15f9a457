"""The host work of ``annotate`` on one window of lines, done in a worker process.

Two stages per window, both in the same worker (see :class:`~phrase_scorer.runtime.workers.WorkerPool`):

    prepare:  raw bytes -> checked lines -> word ids and unknown-word counts, and the plans of
              the scorer's batches (sent to the scorer, which then only launches their work)
    finish:   log p from the scorer -> the two columns -> formatted lines -> one gzip member

Between the stages the worker keeps the window's lines, so only ids go to the scorer and only
scores come back. This module imports neither torch nor the model: a worker that does not score
starts in a fraction of a second and holds little memory.

Where the scorer would run on one CPU thread, the scoring goes to the workers too
(:meth:`WindowWork.annotate`: prepare, score and finish a window in one call, given a
:class:`WorkerScoring`): each worker loads the model and scores with one thread, and the main
process only reads and writes. A worker's batches are a window's, as the main process's would
be, so the scores are the same.

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

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.scoring.columns import check_finite, column_values
from phrase_scorer.config import AnnotateOptions, ScoringOptions
from phrase_scorer.data.padding import IdRows
from phrase_scorer.io.compression import gzip_member
from phrase_scorer.io.table_windows import ParsedWindow, RawWindow, parse_window
from phrase_scorer.scoring.batch_plan import BatchPlan, PlanSettings, plan_window
from phrase_scorer.subwords import CACHED_WORDS, SubwordVocabulary
from phrase_scorer.vocab import SPECIALS, UNK_ID, Vocabulary, in_model_order

if TYPE_CHECKING:
    from phrase_scorer.scoring.batch_scorer import BatchScorer  # imports torch: loaded by the workers alone

class ByteIds(dict):
    """UTF-8 word -> id; any other word (special-symbol spellings included) -> ``<unk>``'s id."""

    def __init__(self, tokens: Sequence[str]) -> None:
        super().__init__((w.encode("utf-8"), i) for i, w in enumerate(tokens) if w not in SPECIALS)

    def __missing__(self, word: bytes) -> int:
        return UNK_ID


@dataclass(frozen=True)
class WorkerScoring:
    """What a worker needs to score on a CPU (with one thread): the model (its directory, and the
    weights' SHA-256 the run's signature records) and the scoring options."""

    directory: str
    weights_sha256: str
    options: ScoringOptions


@dataclass
class PreparedWindow:
    """What the scorer needs from a window: its ids, and the plans of its batches when the
    worker was given the scorer's :class:`PlanSettings`."""

    index: int
    first_line: int
    source_ids: IdRows
    target_ids: IdRows
    num_scores: Optional[int]
    plans: Optional[List[BatchPlan]] = None


class WindowWork:
    """A worker's handler: :meth:`prepare` and :meth:`finish` a window (see the module docstring).

    ``constant_log_prob``, when set, stands in for the model (the host-pipeline benchmark):
    ``finish`` then ignores the scores it is given.
    """

    def __init__(self, path: str, source_vocab: Vocabulary, target_vocab: Vocabulary,
                 options: AnnotateOptions, compress: bool, scoring: Optional[WorkerScoring] = None,
                 plan_settings: Optional[PlanSettings] = None) -> None:
        self.path = path
        self.lookup = PhraseIds(source_vocab, target_vocab)
        self.options = options
        self.compress = compress
        self.value_format = b" ".join(b"%.9g" for _ in options.columns)
        self._kept: Dict[int, tuple] = {}  # window index -> what finish needs
        self.scoring = scoring
        self.plan_settings = plan_settings  # the main process's scorer: plan its batches here
        self._scorer: Optional["BatchScorer"] = None  # loaded at the first window (torch is imported only then)

    def prepare(self, index: int, window: RawWindow, num_scores: Optional[int]) -> PreparedWindow:
        parsed = parse_window(window, self.path, num_scores)
        source_ids, target_ids = self.lookup.of(parsed)
        unk_side = self.options.unk_side
        unknown = np.zeros(len(source_ids), np.int64)
        if unk_side in ("source", "both"):
            unknown += (source_ids.rows == UNK_ID).sum(1)
        if unk_side in ("target", "both"):
            unknown += (target_ids.rows == UNK_ID).sum(1)
        target_words = np.fromiter(map(len, parsed.target_words), np.int64, len(parsed.target_words))
        self._kept[index] = (parsed.appender(), unknown, target_words, window.first_line)
        plans = list(plan_window(self.plan_settings, source_ids, target_ids)) if self.plan_settings else None
        return PreparedWindow(window.index, window.first_line, source_ids, target_ids, parsed.num_scores, plans)

    def finish(self, index: int, log_probs: np.ndarray) -> bytes:
        appender, unknown, target_lengths, first_line = self._kept.pop(index)
        data = appender.with_scores_appended(self.columns(log_probs, unknown, target_lengths, first_line))
        return gzip_member(data, self.options.compress_level) if self.compress else data

    def annotate(self, index: int, window: RawWindow, num_scores: Optional[int]) -> Tuple[Optional[int], bytes]:
        """:meth:`prepare`, score (here, with the :class:`WorkerScoring` this worker was given) and
        :meth:`finish` a window: its score count and its finished bytes."""
        prepared = self.prepare(index, window, num_scores)
        if self._scorer is None:
            from phrase_scorer.scoring.batch_scorer import scorer_for_worker

            self._scorer = scorer_for_worker(self.scoring)
        return prepared.num_scores, self.finish(index, self._scorer.score(prepared.source_ids, prepared.target_ids))

    def columns(self, log_probs: np.ndarray, unknown: np.ndarray, target_lengths: np.ndarray,
                first_line: int) -> List[bytes]:
        """The appended values of each line, formatted."""
        check_finite(log_probs, self.path, first_line)
        columns = column_values(log_probs, unknown, target_lengths, self.options)
        fmt = self.value_format
        return [fmt % values for values in zip(*columns)]


class PieceIds(dict):
    """A subword model's UTF-8 word -> the ids of its pieces (a tuple, in the model's reading
    order of a word: reversed for a right-to-left model), segmented once per word."""

    def __init__(self, vocab: SubwordVocabulary) -> None:
        super().__init__()
        self.vocab = vocab

    def __missing__(self, word: bytes) -> Tuple[int, ...]:
        if len(self) >= CACHED_WORDS:  # memory stays bounded however many distinct words a table holds
            self.clear()
        ids = self[word] = self.vocab.in_model_order(self.vocab.word_ids(word.decode("utf-8")))
        return ids


class PhraseIds:
    """A parsed window's source and target phrases as ids (:class:`IdRows`), the target side in
    the order the model reads it (:func:`~phrase_scorer.vocab.in_model_order`): what the
    ``annotate`` workers and ``score`` hand to the scorer. A subword model's words become their
    pieces here (:mod:`phrase_scorer.subwords`)."""

    def __init__(self, source_vocab: Vocabulary, target_vocab: Vocabulary) -> None:
        self.source_ids = word_lookup(source_vocab)
        self.target_ids = word_lookup(target_vocab)
        self.target_right_to_left = target_vocab.right_to_left  # a right-to-left model (see phrase_scorer.vocab)

    def of(self, parsed: ParsedWindow) -> Tuple[IdRows, IdRows]:
        target_words = parsed.target_words
        if self.target_right_to_left:  # nothing to do, per line, for a left-to-right model
            target_words = [in_model_order(words, True) for words in target_words]
        return look_up(parsed.source_words, self.source_ids), look_up(target_words, self.target_ids)


def word_lookup(vocab: Vocabulary):
    """:class:`ByteIds` for a word vocabulary, :class:`PieceIds` for a subword one."""
    return PieceIds(vocab) if isinstance(vocab, SubwordVocabulary) else ByteIds(vocab.tokens)


def look_up(phrases: List[List[bytes]], ids) -> IdRows:
    """The ids of each phrase's words (a word vocabulary: one dictionary probe per word, no
    Python code per word; a subword one: the pieces of each word, joined)."""
    if isinstance(ids, PieceIds):
        pieces = [ids[w] for w in itertools.chain.from_iterable(phrases)]  # per word: a tuple of ids
        counts = np.fromiter(map(len, pieces), np.int64, len(pieces))
        ends = np.cumsum(np.fromiter(map(len, phrases), np.int64, len(phrases)))
        through = np.concatenate([[0], np.cumsum(counts)])
        lengths = np.diff(np.concatenate([[0], through[ends]]))
        flat = np.fromiter(itertools.chain.from_iterable(pieces), np.int64, int(through[-1]))
        return IdRows.from_flat(flat, lengths)
    lengths = np.fromiter(map(len, phrases), np.int64, len(phrases))
    flat = np.fromiter(map(ids.__getitem__, itertools.chain.from_iterable(phrases)), np.int64, int(lengths.sum()))
    return IdRows.from_flat(flat, lengths)
