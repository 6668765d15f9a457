"""Training data from a Moses phrase table: its unique phrase pairs, in the pair cache.

The table is read twice, streaming: once to count words (:func:`count_words`), once to write the
pairs as word ids (:func:`build_cache`).

Unique pairs: a Moses table lists each pair once, sorted, so duplicates can only be adjacent; a
repeated pair within a run of lines with the same source is dropped. Every unique pair is drawn
with the same probability, whatever its count in the corpus: that is the paper's choice
(section 3.1), which keeps the model from simply learning phrase frequencies.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Iterator, List, Optional, Tuple

from phrase_scorer.config import TrainConfig, valid_share
from phrase_scorer.data.batches import TABLE_WINDOW_BATCHES
from phrase_scorer.data.cache import (
    MAX_PHRASE_WORDS, id_dtype_for, read_cache_description, reuse_cache, source_hash, vocab_digest, write_cache,
)
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.file_identity import file_identity, hash_identities
from phrase_scorer.io.inputs import refuse_single_pass
from phrase_scorer.io.paths import PathLike
from phrase_scorer.records import refuse_changed
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.runtime.progress import progress_bar
from phrase_scorer.vocab import Vocabulary

CACHE_FORMAT = "phrase-scorer-pair-cache"
CACHE_VERSION = 2  # 2: the table by its bytes (file_identity), not by its path and time

log = logging.getLogger(__name__)

TWO_READINGS = "training reads its data twice (the words counted, then the pairs cached)"


def unique_pairs(table: PathLike, desc: str = "reading") -> Iterator[Tuple[List[str], List[str]]]:
    """The (source words, target words) of each unique pair of a phrase table, in table order."""
    reader = read_phrase_table(table)
    last_source: Optional[List[str]] = None
    targets_seen: set = set()  # targets of the current run of lines with one source
    with progress_bar(desc, reader) as bar:
        for line in reader:
            bar.advance()
            if line.source_words != last_source:
                last_source, targets_seen = line.source_words, set()
            target = " ".join(line.target_words)
            if target in targets_seen:
                continue
            targets_seen.add(target)
            yield line.source_words, line.target_words


def count_words(table: PathLike) -> Tuple[Counter, Counter, int]:
    """Word counts of each side over the unique pairs, and the number of unique pairs."""
    source_counts: Counter = Counter()
    target_counts: Counter = Counter()
    pairs = 0
    for source_words, target_words in unique_pairs(table, desc="counting words"):
        source_counts.update(source_words)
        target_counts.update(target_words)
        pairs += 1
    return source_counts, target_counts, pairs


@dataclass
class CacheMeta:
    """What a cache was built from; a cache is reused only when all of it matches."""

    format: str
    version: int
    table: dict  # file_identity
    source_vocab_sha256: str
    target_vocab_sha256: str
    valid_fraction: float
    seed: int
    id_dtype: str
    num_pairs: dict


def expected_meta(table: PathLike, source_vocab: Vocabulary, target_vocab: Vocabulary, valid_fraction: float,
                  seed: int) -> CacheMeta:
    return CacheMeta(
        format=CACHE_FORMAT,
        version=CACHE_VERSION,
        table=file_identity(table),
        source_vocab_sha256=vocab_digest(source_vocab),
        target_vocab_sha256=vocab_digest(target_vocab),
        valid_fraction=valid_fraction,
        seed=seed,
        id_dtype=id_dtype_for(source_vocab, target_vocab),
        num_pairs={},
    )


def read_meta(cache_dir: Path) -> Optional[CacheMeta]:
    try:
        return CacheMeta(**(read_cache_description(cache_dir) or {}))  # none: a TypeError, as a damaged one
    except TypeError:
        return None


def build_cache(
    table: PathLike,
    cache_dir: PathLike,
    source_vocab: Vocabulary,
    target_vocab: Vocabulary,
    *,
    valid_fraction: float,
    seed: int,
    keep_existing: bool = False,
) -> CacheMeta:
    """Write (or reuse) the pair cache of ``table`` in ``cache_dir``; returns its description.

    With ``keep_existing`` (a resumed run), a complete cache made from another table or with
    other settings is an error rather than silently rebuilt: the run would go on with other data.
    """
    meta = expected_meta(table, source_vocab, target_vocab, valid_fraction, seed)
    existing = reuse_cache(Path(cache_dir), asdict(meta), keep_existing, table,
                           hint="resume with the same table, unchanged, or start a new run")
    if existing is not None:
        return CacheMeta(**existing)

    def split_pairs():
        last_source: Optional[List[str]] = None
        in_valid = False
        for source_words, target_words in unique_pairs(table, desc="writing pair cache"):
            if len(source_words) > MAX_PHRASE_WORDS or len(target_words) > MAX_PHRASE_WORDS:
                raise PhraseScorerError(f"a phrase has more than {MAX_PHRASE_WORDS} words", path=table)
            if source_words != last_source:
                last_source = source_words
                in_valid = source_hash(source_words, seed) < valid_fraction
            yield "valid" if in_valid else "train", source_vocab.encode(source_words), target_vocab.encode(target_words)

    return CacheMeta(**write_cache(Path(cache_dir), asdict(meta), split_pairs()))


@dataclass(frozen=True)
class PhraseTableData:
    """Training data from the unique phrase pairs of a Moses table, for
    :func:`phrase_scorer.training.run.train`.

    A data source offers ``kind`` (the key under which ``config.json`` records the data),
    ``path`` (for messages), ``window_batches`` (how many batches :class:`BatchSampler` sorts by
    length together), :meth:`count_words` (the counts for the shortlists and a record of the
    data) and :meth:`build_cache` (the ``train`` and ``valid`` splits of the pair cache).
    :class:`phrase_scorer.data.sentence_pairs.SentenceCorpus` is the other one.
    """

    table: str

    kind: ClassVar[str] = "table"
    window_batches: ClassVar[int] = TABLE_WINDOW_BATCHES

    def __post_init__(self) -> None:
        refuse_single_pass(self.table, "the phrase table", TWO_READINGS)

    @property
    def path(self) -> str:
        return self.table

    def refuse_other_data(self, recorded: dict, path: PathLike) -> None:
        """A resumed run trains on the table it recorded (``recorded``, the table's record in
        config.json), compared by its bytes, whether or not the pair cache is still there to be
        reused (a model trained before the record held them is checked by its cache alone)."""
        if "table" in recorded:
            refuse_changed({"table": recorded["table"]}, {"table": file_identity(self.table)}, path=path,
                           hint="resume with the same table, unchanged, or start a new run")

    def count_words(self, config: TrainConfig) -> Tuple[Counter, Counter, dict]:
        if config.max_length is not None:
            raise PhraseScorerError(Text(setting("max_length"), " applies to sentence corpora (", setting("corpus"),
                                         "), not to phrase tables"))
        log.info("counting words over the unique phrase pairs of %s", self.table)
        source_counts, target_counts, num_pairs = count_words(self.table)
        log.info("%d unique pairs", num_pairs)
        return source_counts, target_counts, {"path": os.path.abspath(self.table), "unique_pairs": num_pairs,
                                              "table": hash_identities(file_identity(self.table))}

    def build_cache(self, cache_dir: Path, source_vocab: Vocabulary, target_vocab: Vocabulary, info: dict,
                    config: TrainConfig, keep_existing: bool) -> dict:
        valid_fraction = valid_share(config.valid_pairs, info.get("unique_pairs") or 1)
        meta = build_cache(self.table, cache_dir, source_vocab, target_vocab, valid_fraction=valid_fraction,
                           seed=config.seed, keep_existing=keep_existing)
        return asdict(meta)
