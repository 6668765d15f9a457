"""Sentence pairs for training: two aligned files, one tokenised sentence per line.

The source and target files (plain or gzip, UTF-8, words separated by spaces as Moses writes
them) must have the same number of lines; line ``n`` of one translates line ``n`` of the other.
A pair with an empty side is left out, and so is a training pair with a side longer than the
maximum length (the paper's RNNsearch-30 / -50 keep sentences of at most 30 / 50 words); both
are counted and logged, never dropped silently. The length limit applies to training only: the
development pairs are all kept.

The corpus is read twice, streaming, as a phrase table is: once to count words for the
shortlists, once to write the kept pairs as word ids into the same binary cache as phrase pairs
(:func:`phrase_scorer.data.cache.write_cache`), which training reads with positioned reads, so memory
does not grow with the corpus. The ``valid`` split holds the development pairs (``--dev``), or,
without them, about ``valid_pairs`` training pairs held out by a keyed hash of the source
sentence.

Batches follow the paper (Bahdanau et al., section 4.2): the pairs of 20 minibatches are taken
together, sorted by length and cut into minibatches, which are then shuffled. The pairs are drawn
in a keyed pseudo-random order per epoch, so batch ``k`` of epoch ``e`` depends only on the seed,
``e`` and ``k``, and a resumed run continues with exactly the batches it would have seen
(:class:`phrase_scorer.data.batches.BatchSampler`).
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Dict, Iterator, List, Optional, Tuple

from phrase_scorer.config import MAX_VALID_SHARE, TrainConfig, valid_share
from phrase_scorer.data.cache import (
    MAX_PHRASE_WORDS, id_dtype_for, reuse_cache, source_hash, vocab_digest, write_cache,
)
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.records import refuse_changed
from phrase_scorer.data.phrase_pairs import TWO_READINGS
from phrase_scorer.io.file_identity import file_identity, hash_identities
from phrase_scorer.io.inputs import TextLines, refuse_single_pass
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.runtime.progress import progress_bar
from phrase_scorer.vocab import Vocabulary

log = logging.getLogger(__name__)

CORPUS_CACHE_FORMAT = "phrase-scorer-corpus-cache"
CORPUS_CACHE_VERSION = 1
PAPER_WINDOW_BATCHES = 20  # minibatches read, sorted by length and cut together (section 4.2)

EMPTY, TOO_LONG = "empty", "too_long"
CORPUS_FILES = ("source", "target", "dev_source", "dev_target")  # as config.json records them


def read_sentence_pairs(source: PathLike, target: PathLike,
                        desc: str = "reading") -> Iterator[Tuple[int, List[str], List[str]]]:
    """(line number, source words, target words) for every line of two aligned files, in order.

    Raises when the files have different numbers of lines (naming the longer file and its first
    line without a partner), or a line is not UTF-8.
    """
    hint = "corpus files must be UTF-8 text"
    source_lines, target_lines = TextLines(source, hint), TextLines(target, hint)
    with progress_bar(desc, source_lines) as bar:
        pairs = itertools.zip_longest(source_lines, target_lines)
        for number, (source_line, target_line) in enumerate(pairs, 1):
            if source_line is None or target_line is None:
                shorter, longer = (source, target) if source_line is None else (target, source)
                raise PhraseScorerError(
                    f"has more lines than {shorter} ({number - 1} lines)", path=longer, line=number,
                    hint="the two sides of a corpus need one sentence per line, line n translating line n",
                )
            bar.advance()
            yield number, _words(source_line[1], source, number), _words(target_line[1], target, number)


def _words(text: str, path: PathLike, number: int) -> List[str]:
    words = split_words(text)
    if len(words) > MAX_PHRASE_WORDS:
        raise PhraseScorerError(f"a sentence has more than {MAX_PHRASE_WORDS} words", path=path, line=number,
                                hint=Text("set ", setting("max_length"), " to leave such sentences out"))
    return words


def left_out(source_words: List[str], target_words: List[str], max_length: Optional[int]) -> Optional[str]:
    """Why a pair is left out of training (``EMPTY``, ``TOO_LONG``), or None when it is kept."""
    if not source_words or not target_words:
        return EMPTY
    if max_length is not None and max(len(source_words), len(target_words)) > max_length:
        return TOO_LONG
    return None


@dataclass(frozen=True)
class SentenceCorpus:
    """Training data from sentence pairs, for :func:`phrase_scorer.training.run.train`.

    Implements the same data-source interface as :class:`phrase_scorer.data.phrase_pairs.PhraseTableData`:
    ``kind`` (the key under which ``config.json`` records the data), ``path`` (for messages),
    ``window_batches``, :meth:`count_words` and :meth:`build_cache`.
    """

    source: str
    target: str
    dev_source: Optional[str] = None
    dev_target: Optional[str] = None

    kind: ClassVar[str] = "corpus"
    window_batches: ClassVar[int] = PAPER_WINDOW_BATCHES

    def __post_init__(self) -> None:
        if (self.dev_source is None) != (self.dev_target is None):
            raise PhraseScorerError("a development set needs both a source and a target file")
        for path, option in ((self.source, "corpus"), (self.target, "corpus"), (self.dev_source, "dev"),
                             (self.dev_target, "dev")):
            if path is not None:
                refuse_single_pass(path, Text("a file of ", setting(option)), TWO_READINGS)

    @property
    def path(self) -> str:
        return self.source

    def identities(self) -> Dict[str, Optional[dict]]:
        return {
            "source": file_identity(self.source),
            "target": file_identity(self.target),
            "dev_source": file_identity(self.dev_source) if self.dev_source else None,
            "dev_target": file_identity(self.dev_target) if self.dev_target else None,
        }

    def refuse_other_data(self, recorded: dict, path: PathLike) -> None:
        """A resumed run trains on the files its first run recorded (``recorded``, the corpus'
        record in config.json), compared by their bytes, as the pair cache's description compares
        them: checked whether or not the cache is still there to be reused."""
        refuse_changed({key: recorded.get(key) for key in CORPUS_FILES},
                       {key: value for key, value in self.identities().items()},
                       path=path, hint=Text("resume with the same files of ", setting("corpus"), " and ",
                                            setting("dev"), ", unchanged, or start a new run"))

    def count_words(self, config: TrainConfig) -> Tuple[Counter, Counter, dict]:
        """Word counts of each side over the training pairs that are kept, and a record of the
        corpus for ``config.json`` (files, line and pair counts, what was left out and why)."""
        source_counts: Counter = Counter()
        target_counts: Counter = Counter()
        reasons: Counter = Counter()
        lines = 0
        log.info("counting words over the sentence pairs of %s and %s", self.source, self.target)
        for lines, source_words, target_words in read_sentence_pairs(self.source, self.target, "counting words"):
            reason = left_out(source_words, target_words, config.max_length)
            reasons[reason] += 1
            if reason is None:
                source_counts.update(source_words)
                target_counts.update(target_words)
        info = {
            **hash_identities(self.identities()),
            "max_length": config.max_length,
            "lines": lines,
            "pairs": reasons[None],
            "left_out_empty": reasons[EMPTY],
            "left_out_too_long": reasons[TOO_LONG],
        }
        log.info(
            "%d sentence pairs; %d left out for an empty side, %d for a side longer than %s words",
            lines, reasons[EMPTY], reasons[TOO_LONG], config.max_length if config.max_length is not None else "any",
        )
        if reasons[None] == 0:
            raise PhraseScorerError("no sentence pairs left for training", path=self.source,
                                    hint=Text("check the files, or raise ", setting("max_length")))
        return source_counts, target_counts, info

    def build_cache(self, cache_dir: Path, source_vocab: Vocabulary, target_vocab: Vocabulary, info: dict,
                    config: TrainConfig, keep_existing: bool) -> dict:
        """Write (or reuse) the pair cache: kept training pairs, and the development pairs (or
        held-out training pairs) as the ``valid`` split. Returns the cache's description."""
        valid_fraction = None if self.dev_source else valid_share(config.valid_pairs, info.get("pairs", 1))
        expected = {
            "format": CORPUS_CACHE_FORMAT,
            "version": CORPUS_CACHE_VERSION,
            **self.identities(),
            "max_length": config.max_length,
            "valid_fraction": valid_fraction,
            "seed": config.seed,
            "source_vocab_sha256": vocab_digest(source_vocab),
            "target_vocab_sha256": vocab_digest(target_vocab),
            "id_dtype": id_dtype_for(source_vocab, target_vocab),
            "num_pairs": {},
        }
        existing = reuse_cache(Path(cache_dir), expected, keep_existing, self.source,
                               hint=Text("resume with the same corpus files, unchanged, and the same ",
                                         setting("max_length"), ", or start a new run"))
        if existing is not None:
            return existing
        dev_empty: Counter = Counter()

        def split_pairs():
            for _, source_words, target_words in read_sentence_pairs(self.source, self.target, "writing pair cache"):
                if left_out(source_words, target_words, config.max_length) is not None:
                    continue
                in_valid = valid_fraction is not None and source_hash(source_words, config.seed) < valid_fraction
                yield ("valid" if in_valid else "train", source_vocab.encode(source_words),
                       target_vocab.encode(target_words))
            if self.dev_source:
                for _, source_words, target_words in read_sentence_pairs(self.dev_source, self.dev_target,
                                                                         "reading dev set"):
                    if left_out(source_words, target_words, None) is not None:
                        dev_empty["pairs"] += 1
                        continue
                    yield "valid", source_vocab.encode(source_words), target_vocab.encode(target_words)

        description = write_cache(Path(cache_dir), expected, split_pairs())
        if self.dev_source:
            log.info("development set: %d pairs (%d left out for an empty side; no length limit)",
                     description["num_pairs"]["valid"], dev_empty["pairs"])
        else:
            log.info("held out %d of %d sentence pairs for validation (about %s, at most %d%%)",
                     description["num_pairs"].get("valid", 0), info.get("pairs", 0),
                     setting("valid_pairs", config.valid_pairs),
                     round(100 * MAX_VALID_SHARE))
        return description

    def valid_references(self, valid_pairs, target_vocab: Vocabulary) -> List[str]:
        """The reference of each validation pair, in the order of the cache's ``valid`` split:
        the development target sentences as written (``--dev``), or the held-out training
        targets as the target vocabulary spells them (words outside it as ``<unk>``)."""
        if not self.dev_source:
            return [" ".join(target_vocab.decode(valid_pairs.pair(i)[1].tolist())) for i in range(len(valid_pairs))]
        assert self.dev_target is not None  # given with dev_source (checked when the corpus is made)
        references = [" ".join(target_words) for _, source_words, target_words
                      in read_sentence_pairs(self.dev_source, self.dev_target, "reading dev set")
                      if left_out(source_words, target_words, None) is None]
        if len(references) != len(valid_pairs):
            raise PhraseScorerError(f"holds {len(references)} development pairs, the pair cache {len(valid_pairs)}",
                                    path=self.dev_target, hint="the file changed during training: start a new run")
        return references
