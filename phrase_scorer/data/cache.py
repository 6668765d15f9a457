"""The on-disk pair cache that both kinds of training data are written to: for each split
(``train``, ``valid``), flat id arrays with offsets and a length array, read with positioned reads
(:class:`PairSet`), so memory does not grow with the data.

Both kinds are written with :func:`write_cache` and checked against an interrupted run's cache
with :func:`reuse_cache`. A cache made from other data is a changed input; a damaged one (a
description or an array that is not what :func:`write_cache` wrote: ``checksums.json`` holds the
SHA-256 of every array) is rebuilt from the data, which gives the same pairs.

The validation split is held out *by source*: a source goes to validation when a keyed hash of
its text falls under a threshold (:func:`source_hash`), so no validation source is ever seen in
training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

import numpy as np

from phrase_scorer.data.padding import pad_ids
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.file_identity import file_sha256, hash_identities, is_file_identity
from phrase_scorer.io.paths import PathLike
from phrase_scorer.records import differences, refuse_changed
from phrase_scorer.vocab import Vocabulary

SPLITS = ("train", "valid")
ARRAYS = ("src.ids", "tgt.ids", "src.offsets", "tgt.offsets", "lengths")
META = "meta.json"
CHECKSUMS = "checksums.json"  # {array file: its SHA-256}
_FLUSH_PAIRS = 1 << 16

log = logging.getLogger(__name__)


def source_hash(source_words: List[str], seed: int) -> float:
    """A uniform number in [0, 1) fixed by the source phrase and the seed."""
    digest = hashlib.blake2b(" ".join(source_words).encode("utf-8"), digest_size=8, key=str(seed).encode()).digest()
    return int.from_bytes(digest, "little") / 2.0**64


def vocab_digest(vocab: Vocabulary) -> str:
    return vocab.sha256()


def id_dtype_for(source_vocab: Vocabulary, target_vocab: Vocabulary) -> str:
    """The narrowest unsigned type that holds every word id of both shortlists."""
    return "uint16" if max(len(source_vocab), len(target_vocab)) <= np.iinfo(np.uint16).max + 1 else "uint32"


def read_cache_description(cache_dir: Path) -> Optional[dict]:
    """The ``meta.json`` of a complete cache (any kind), or None."""
    try:
        data = json.loads((Path(cache_dir) / META).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def reuse_cache(cache_dir: Path, expected: dict, keep_existing: bool, data_path: PathLike, hint: str) -> Optional[dict]:
    """The description of the cache in ``cache_dir`` when it was built from ``expected`` (its
    pair counts aside); None when it must be (re)built.

    With ``keep_existing`` (a resumed run), a complete cache made from other data or with other
    settings is an error rather than silently rebuilt: the run would go on with other data. A
    damaged cache (:func:`description_damage`, :func:`arrays_damage`) is rebuilt, with a warning
    naming the damaged file: the data and settings it is rebuilt from give the same pairs, as a
    missing cache's are.
    """
    cache_dir = Path(cache_dir)
    existing = read_cache_description(cache_dir)
    if existing is None:
        if (cache_dir / META).exists():
            _rebuilding(cache_dir / META, "not a JSON object", data_path)
        return None
    damage = description_damage(existing, expected)
    if damage is not None:
        _rebuilding(cache_dir / META, damage, data_path)
        return None
    existing_settings = {k: v for k, v in existing.items() if k != "num_pairs"}
    expected_settings = {k: v for k, v in expected.items() if k != "num_pairs"}
    if not any(differences(existing_settings, expected_settings)):  # the inputs by their bytes
        broken = arrays_damage(cache_dir, existing)
        if broken is not None:
            _rebuilding(*broken, data_path)
            return None
        if existing_settings != hash_identities(expected_settings):  # moved, copied or touched: record it
            existing = {**expected_settings, "num_pairs": existing.get("num_pairs")}
            write_text_atomically(cache_dir / META, json.dumps(existing, indent=1) + "\n")
        return existing
    if keep_existing:
        refuse_changed(existing_settings, expected_settings, path=data_path, hint=hint)
    return None


def _rebuilding(path: Path, damage: str, data_path: PathLike) -> None:
    log.warning("%s: the pair cache is damaged (%s); rebuilding it from %s", path, damage, data_path)


def description_damage(existing: dict, expected: dict) -> Optional[str]:
    """What is wrong with the description ``existing`` that no run of this version writes (None
    when nothing is), beside the description ``expected`` of the cache the data would give.
    Another format or version is not damage: it is a change, as other data is."""
    if existing.get("format") != expected.get("format") or existing.get("version") != expected.get("version"):
        return None
    missing, unknown = expected.keys() - existing.keys(), existing.keys() - expected.keys()
    if missing or unknown:
        return "; ".join([*(f"no {key}" for key in sorted(missing)), *(f"an unknown {key}" for key in sorted(unknown))])
    counts = existing["num_pairs"]
    if (not isinstance(counts, dict) or counts.keys() != set(SPLITS)
            or not all(type(n) is int and n >= 0 for n in counts.values())):
        return f"num_pairs is not a count per split ({', '.join(SPLITS)})"
    if existing["id_dtype"] not in ("uint16", "uint32"):
        return f"id_dtype {existing['id_dtype']!r} is not uint16 or uint32"
    for key, value in existing.items():
        wanted = expected[key]
        if key == "num_pairs" or value is None or (wanted is None and is_file_identity(value)):
            continue
        if is_file_identity(wanted) or is_file_identity(value):
            sound = (is_file_identity(value) and type(value["size"]) is int
                     and isinstance(value["sha256"], (str, type(None))))
        elif isinstance(wanted, str):
            sound = isinstance(value, str)
        else:  # a number, or no number
            sound = type(value) in (int, float)
        if not sound:
            return f"{key} is {value!r}"
    return None


def arrays_damage(cache_dir: Path, description: dict) -> Optional[Tuple[Path, str]]:
    """The first array of the cache that is not what :func:`write_cache` wrote, and what is wrong
    with it (None when all are sound): a file missing, of the wrong size, or with other bytes than
    ``checksums.json`` records (a cache written before there were checksums: offsets that do not
    add up)."""
    dtype = np.dtype(description["id_dtype"])
    try:
        checksums = json.loads((cache_dir / CHECKSUMS).read_text())
    except FileNotFoundError:
        checksums = None
    except (OSError, ValueError):
        return cache_dir / CHECKSUMS, "not a JSON object"
    if checksums is not None and not isinstance(checksums, dict):
        return cache_dir / CHECKSUMS, "not a JSON object"
    for split in SPLITS:
        count = description["num_pairs"][split]
        sizes = {"lengths": 4 * count, "src.offsets": 8 * (count + 1), "tgt.offsets": 8 * (count + 1)}
        for name in ARRAYS:
            path = cache_dir / f"{split}.{name}"
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                return path, "the file is missing"
            wrong_size = size != sizes[name] if name in sizes else size % dtype.itemsize != 0
            if wrong_size:
                return path, f"{size} bytes, not those of {count} pairs"
            if checksums is not None and checksums.get(path.name) != file_sha256(path):
                return path, f"its bytes are not those recorded in {CHECKSUMS}"
        if checksums is None:
            lengths = np.fromfile(cache_dir / f"{split}.lengths", np.uint16).reshape(-1, 2).astype(np.int64)
            for side, name in enumerate(("src", "tgt")):
                offsets = np.fromfile(cache_dir / f"{split}.{name}.offsets", np.int64)
                ids = (cache_dir / f"{split}.{name}.ids").stat().st_size // dtype.itemsize
                if offsets[0] != 0 or offsets[-1] != ids or (np.diff(offsets) != lengths[:, side]).any():
                    return cache_dir / f"{split}.{name}.offsets", "the offsets do not add up to the ids"
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
    checksums = {f"{split}.{name}": digest.hexdigest() for split in SPLITS
                 for name, digest in writers[split].digests.items()}
    (tmp / CHECKSUMS).write_text(json.dumps(checksums, indent=1) + "\n")
    description = {**hash_identities(description), "num_pairs": {split: writers[split].count for split in SPLITS}}
    (tmp / META).write_text(json.dumps(description, indent=1) + "\n")
    shutil.rmtree(cache_dir, ignore_errors=True)
    os.replace(tmp, cache_dir)
    return description


class _SplitWriter:
    """Appends pairs of id lists to the flat arrays of one split, and hashes what it writes."""

    def __init__(self, directory: Path, split: str, dtype: str) -> None:
        self.files = {name: open(directory / f"{split}.{name}", "wb") for name in ARRAYS}
        self.digests = {name: hashlib.sha256() for name in ARRAYS}
        self.dtype = np.dtype(dtype)
        self.count = 0
        self.src_end = 0
        self.tgt_end = 0
        self._write("src.offsets", np.zeros(1, np.int64))
        self._write("tgt.offsets", np.zeros(1, np.int64))
        self._reset()

    def _write(self, name: str, values: np.ndarray) -> None:
        data = values.tobytes()
        self.files[name].write(data)
        self.digests[name].update(data)

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
        self._write("src.ids", np.asarray(self.src_ids, self.dtype))
        self._write("tgt.ids", np.asarray(self.tgt_ids, self.dtype))
        self._write("src.offsets", np.asarray(self.src_offsets, np.int64))
        self._write("tgt.offsets", np.asarray(self.tgt_offsets, np.int64))
        self._write("lengths", np.asarray(self.lengths, np.uint16))
        self._reset()

    def close(self) -> None:
        self.flush()
        for f in self.files.values():
            f.close()


MAX_PHRASE_WORDS = int(np.iinfo(np.uint16).max)


class PairSet:
    """One split of the cache, read with positioned reads (``pread``).

    Nothing is memory-mapped: a mapping's touched pages count as the process's memory and would
    grow with the table over an epoch of random access; reads go through the page cache instead.
    """

    def __init__(self, cache_dir: PathLike, split: str) -> None:
        cache_dir = Path(cache_dir)
        meta = read_cache_description(cache_dir) or {}  # none: a KeyError below, as a damaged one
        try:
            self.size = int(meta["num_pairs"][split])
            self.id_dtype = np.dtype(meta["id_dtype"])
        except (TypeError, KeyError, ValueError):
            raise PhraseScorerError("pair cache is missing or damaged", path=cache_dir,
                                    hint="train again to rebuild it") from None
        self._fds = {}
        for name in ARRAYS:
            path = cache_dir / f"{split}.{name}"
            try:
                self._fds[name] = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise PhraseScorerError("pair cache is damaged (a file is missing)", path=path,
                                        hint=Text("train again with ", setting("overwrite", True))) from None
        expected = {"lengths": 4 * self.size, "src.offsets": 8 * (self.size + 1), "tgt.offsets": 8 * (self.size + 1)}
        for name, size in expected.items():
            if os.fstat(self._fds[name]).st_size != size:
                raise PhraseScorerError("pair cache is damaged (array sizes disagree)", path=cache_dir,
                                        hint=Text("train again with ", setting("overwrite", True)))

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
        return (self._read("src.ids", self.id_dtype, int(s0), int(s1 - s0)),
                self._read("tgt.ids", self.id_dtype, int(t0), int(t1 - t0)))

    def batch_arrays(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Padded id matrices and lengths for ``indices``: src (B, S), src_len, tgt (B, T), tgt_len."""
        pairs = [self.pair(int(i)) for i in indices]
        src, src_len = pad_ids([s for s, _ in pairs])
        tgt, tgt_len = pad_ids([t for _, t in pairs])
        return src, src_len, tgt, tgt_len
