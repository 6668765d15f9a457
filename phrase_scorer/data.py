"""Training data at any scale: an on-disk cache of the table's unique phrase pairs, read with pread.

The table is read twice, streaming: once to count words (:func:`count_words`), once to write the
pairs as word ids (:func:`build_cache`). The cache holds, for each split (``train``, ``valid``),
flat id arrays with offsets and a length array on disk; batches are read from it with positioned
reads, so memory does not grow with the table.

Unique pairs: a Moses table lists each pair once, sorted, so duplicates can only be adjacent; a
repeated pair within a run of lines with the same source is dropped. Every unique pair is drawn
with the same probability, whatever its count in the corpus: that is the paper's choice
(section 3.1), which keeps the model from simply learning phrase frequencies.

The same cache format holds sentence pairs (:mod:`phrase_scorer.corpus`): both kinds of data are
written with :func:`write_cache` and checked against the interrupted run's with :func:`reuse_cache`.

The validation split is held out *by source phrase*: a source goes to validation when a keyed hash
of its text falls under a threshold, so no validation source is ever seen in training.

Batches (:class:`BatchSampler`) visit every training pair once per epoch in a pseudo-random order
(a keyed permutation that needs no memory), grouped by length within windows of a few thousand
pairs, and are a pure function of (seed, epoch, position): an interrupted run resumes with the
same data order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import TrainConfig, valid_share
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import PathLike, file_identity
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.progress import progress_bar
from phrase_scorer.records import refuse_changed
from phrase_scorer.vocab import PAD_ID, Vocabulary

CACHE_FORMAT = "phrase-scorer-pair-cache"
CACHE_VERSION = 1
SPLITS = ("train", "valid")
_FLUSH_PAIRS = 1 << 16
TABLE_WINDOW_BATCHES = 64  # batches sorted by length together, for phrase pairs

log = logging.getLogger(__name__)


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


def source_hash(source_words: List[str], seed: int) -> float:
    """A uniform number in [0, 1) fixed by the source phrase and the seed."""
    digest = hashlib.blake2b(" ".join(source_words).encode("utf-8"), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "little") / 2.0**64


@dataclass
class CacheMeta:
    """What a cache was built from; a cache is reused only when all of it matches."""

    format: str
    version: int
    table: str
    table_size: int
    table_mtime_ns: int
    source_vocab_sha256: str
    target_vocab_sha256: str
    valid_fraction: float
    seed: int
    id_dtype: str
    num_pairs: dict


def vocab_digest(vocab: Vocabulary) -> str:
    return hashlib.sha256(vocab.to_json().encode("utf-8")).hexdigest()


def id_dtype_for(source_vocab: Vocabulary, target_vocab: Vocabulary) -> str:
    """The narrowest unsigned type that holds every word id of both shortlists."""
    return "uint16" if max(len(source_vocab), len(target_vocab)) <= np.iinfo(np.uint16).max + 1 else "uint32"


def expected_meta(table: PathLike, source_vocab: Vocabulary, target_vocab: Vocabulary, valid_fraction: float, seed: int) -> CacheMeta:
    identity = file_identity(table)
    return CacheMeta(
        format=CACHE_FORMAT,
        version=CACHE_VERSION,
        table=identity["path"],
        table_size=identity["size"],
        table_mtime_ns=identity["mtime_ns"],
        source_vocab_sha256=vocab_digest(source_vocab),
        target_vocab_sha256=vocab_digest(target_vocab),
        valid_fraction=valid_fraction,
        seed=seed,
        id_dtype=id_dtype_for(source_vocab, target_vocab),
        num_pairs={},
    )


def read_cache_description(cache_dir: Path) -> Optional[dict]:
    """The ``meta.json`` of a complete cache (any kind), or None."""
    try:
        data = json.loads((Path(cache_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_meta(cache_dir: Path) -> Optional[CacheMeta]:
    try:
        return CacheMeta(**read_cache_description(cache_dir))
    except TypeError:
        return None


def reuse_cache(cache_dir: Path, expected: dict, keep_existing: bool, data_path: PathLike, hint: str) -> Optional[dict]:
    """The description of the cache in ``cache_dir`` when it was built from ``expected`` (its
    pair counts aside); None when it must be (re)built.

    With ``keep_existing`` (a resumed run), a complete cache made from other data or with other
    settings is an error rather than silently rebuilt: the run would go on with other data.
    """
    existing = read_cache_description(cache_dir)
    if existing is None:
        return None
    existing_settings = {k: v for k, v in existing.items() if k != "num_pairs"}
    expected_settings = {k: v for k, v in expected.items() if k != "num_pairs"}
    if existing_settings == expected_settings:
        return existing
    if keep_existing:
        refuse_changed(existing_settings, expected_settings, path=data_path, hint=hint)
    return None


def write_cache(cache_dir: Path, description: dict, pairs: Iterable[Tuple[str, List[int], List[int]]]) -> dict:
    """Write ``(split, source ids, target ids)`` triples as a cache described by ``description``
    (its ``id_dtype`` and ``format`` at least), atomically: a ``.part`` folder renamed into place.
    Returns the description with ``num_pairs`` per split filled in."""
    cache_dir = Path(cache_dir)
    tmp = cache_dir.with_name(cache_dir.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writers = {split: _SplitWriter(tmp, split, description["id_dtype"]) for split in SPLITS}
    try:
        for split, source_ids, target_ids in pairs:
            writers[split].add(source_ids, target_ids)
    finally:
        for writer in writers.values():
            writer.close()
    description = {**description, "num_pairs": {split: writers[split].count for split in SPLITS}}
    (tmp / "meta.json").write_text(json.dumps(description, indent=1) + "\n")
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.replace(tmp, cache_dir)
    return description


class _SplitWriter:
    """Appends pairs of id lists to the flat arrays of one split."""

    def __init__(self, directory: Path, split: str, dtype: str) -> None:
        self.files = {
            name: open(directory / f"{split}.{name}", "wb")
            for name in ("src.ids", "tgt.ids", "src.offsets", "tgt.offsets", "lengths")
        }
        self.dtype = np.dtype(dtype)
        self.count = 0
        self.src_end = 0
        self.tgt_end = 0
        self.files["src.offsets"].write(np.zeros(1, np.int64).tobytes())
        self.files["tgt.offsets"].write(np.zeros(1, np.int64).tobytes())
        self._reset()

    def _reset(self) -> None:
        self.src_ids: List[int] = []
        self.tgt_ids: List[int] = []
        self.src_offsets: List[int] = []
        self.tgt_offsets: List[int] = []
        self.lengths: List[Tuple[int, int]] = []

    def add(self, src: List[int], tgt: List[int]) -> None:
        self.src_ids.extend(src)
        self.tgt_ids.extend(tgt)
        self.src_end += len(src)
        self.tgt_end += len(tgt)
        self.src_offsets.append(self.src_end)
        self.tgt_offsets.append(self.tgt_end)
        self.lengths.append((len(src), len(tgt)))
        self.count += 1
        if len(self.lengths) >= _FLUSH_PAIRS:
            self.flush()

    def flush(self) -> None:
        if not self.lengths:
            return
        f = self.files
        f["src.ids"].write(np.asarray(self.src_ids, self.dtype).tobytes())
        f["tgt.ids"].write(np.asarray(self.tgt_ids, self.dtype).tobytes())
        f["src.offsets"].write(np.asarray(self.src_offsets, np.int64).tobytes())
        f["tgt.offsets"].write(np.asarray(self.tgt_offsets, np.int64).tobytes())
        f["lengths"].write(np.asarray(self.lengths, np.uint16).tobytes())
        self._reset()

    def close(self) -> None:
        self.flush()
        for f in self.files.values():
            f.close()


MAX_PHRASE_WORDS = int(np.iinfo(np.uint16).max)


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
    :func:`phrase_scorer.train.train`.

    A data source offers ``kind`` (the key under which ``config.json`` records the data),
    ``path`` (for messages), ``window_batches`` (how many batches :class:`BatchSampler` sorts by
    length together), :meth:`count_words` (the counts for the shortlists and a record of the
    data) and :meth:`build_cache` (the ``train`` and ``valid`` splits of the pair cache).
    :class:`phrase_scorer.corpus.SentenceCorpus` is the other one.
    """

    table: str

    kind: ClassVar[str] = "table"
    window_batches: ClassVar[int] = TABLE_WINDOW_BATCHES

    @property
    def path(self) -> str:
        return self.table

    def count_words(self, config: TrainConfig) -> Tuple[Counter, Counter, dict]:
        if config.max_length is not None:
            raise PhraseScorerError("--max-length applies to sentence corpora (--corpus), not to phrase tables")
        log.info("counting words over the unique phrase pairs of %s", self.table)
        source_counts, target_counts, num_pairs = count_words(self.table)
        log.info("%d unique pairs", num_pairs)
        return source_counts, target_counts, {"path": os.path.abspath(self.table), "unique_pairs": num_pairs}

    def build_cache(self, cache_dir: Path, source_vocab: Vocabulary, target_vocab: Vocabulary, info: dict,
                    config: TrainConfig, keep_existing: bool) -> dict:
        valid_fraction = valid_share(config.valid_pairs, info.get("unique_pairs") or 1)
        meta = build_cache(self.table, cache_dir, source_vocab, target_vocab, valid_fraction=valid_fraction,
                           seed=config.seed, keep_existing=keep_existing)
        return asdict(meta)


class PairSet:
    """One split of the cache, read with positioned reads (``pread``).

    Nothing is memory-mapped: a mapping's touched pages count as the process's memory and would
    grow with the table over an epoch of random access; reads go through the page cache instead.
    """

    def __init__(self, cache_dir: PathLike, split: str) -> None:
        cache_dir = Path(cache_dir)
        meta = read_cache_description(cache_dir)
        try:
            self.size = int(meta["num_pairs"][split])
            self.id_dtype = np.dtype(meta["id_dtype"])
        except (TypeError, KeyError, ValueError):
            raise PhraseScorerError("pair cache is missing or damaged", path=cache_dir, hint="train again to rebuild it") from None
        self._fds = {}
        for name in ("src.ids", "tgt.ids", "src.offsets", "tgt.offsets", "lengths"):
            path = cache_dir / f"{split}.{name}"
            try:
                self._fds[name] = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise PhraseScorerError("pair cache is damaged (a file is missing)", path=path,
                                        hint="train again with --overwrite") from None
        expected = {"lengths": 4 * self.size, "src.offsets": 8 * (self.size + 1), "tgt.offsets": 8 * (self.size + 1)}
        for name, size in expected.items():
            if os.fstat(self._fds[name]).st_size != size:
                raise PhraseScorerError("pair cache is damaged (array sizes disagree)", path=cache_dir,
                                        hint="train again with --overwrite")

    def __len__(self) -> int:
        return self.size

    def __del__(self) -> None:
        for fd in getattr(self, "_fds", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def _read(self, name: str, dtype, start: int, count: int) -> np.ndarray:
        dtype = np.dtype(dtype)
        data = os.pread(self._fds[name], count * dtype.itemsize, start * dtype.itemsize)
        return np.frombuffer(data, dtype)

    def lengths_of(self, indices: np.ndarray) -> np.ndarray:
        """(source words, target words) of each pair in ``indices``: (n, 2)."""
        out = np.empty((len(indices), 2), np.uint16)
        for row, i in enumerate(np.asarray(indices, np.int64)):
            out[row] = self._read("lengths", np.uint16, 2 * int(i), 2)
        return out

    def all_lengths(self) -> np.ndarray:
        """Every pair's lengths, (N, 2): for small splits (validation)."""
        return self._read("lengths", np.uint16, 0, 2 * self.size).reshape(-1, 2)

    def pair(self, i: int) -> Tuple[np.ndarray, np.ndarray]:
        s0, s1 = self._read("src.offsets", np.int64, i, 2)
        t0, t1 = self._read("tgt.offsets", np.int64, i, 2)
        return self._read("src.ids", self.id_dtype, int(s0), int(s1 - s0)), self._read("tgt.ids", self.id_dtype, int(t0), int(t1 - t0))

    def batch_arrays(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Padded id matrices and lengths for ``indices``: src (B, S), src_len, tgt (B, T), tgt_len."""
        pairs = [self.pair(int(i)) for i in indices]
        src, src_len = pad_ids([s for s, _ in pairs])
        tgt, tgt_len = pad_ids([t for _, t in pairs])
        return src, src_len, tgt, tgt_len


NO_ID = -1  # pads id rows that are sorted or passed between processes: it sorts before every id


def pad_ids(sequences: Sequence[Sequence[int]], fill: int = PAD_ID) -> Tuple[np.ndarray, np.ndarray]:
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
