"""Subword vocabularies: words cut into pieces learnt by sentencepiece.

A model trained with ``train --vocabulary bpe`` (or ``unigram``) reads and predicts pieces, not
words: each side has a sentencepiece model, learnt from the side's word counts when training
starts (byte-pair encoding, Sennrich et al. 2016, or the unigram model of Kudo 2018), with as
many entries as the shortlist would have had words. Everything a user hands the commands and
gets back stays word-level Moses text: :class:`SubwordVocabulary` cuts each word into its pieces
where words become ids and joins pieces back into words where ids become words, so every verb
segments by itself through the same :class:`~phrase_scorer.vocab.Vocabulary` interface.

- Pieces never cross a word: each word is segmented on its own (sentencepiece splits text at
  spaces before it segments, so this is the same as segmenting the sentence) and cached. A
  word's first piece carries the word-start mark ``▁`` (U+2581).
- The text is taken as it is (no normalisation), so a word's pieces spell it byte for byte. A
  word they would not spell back (one holding ``▁`` itself) is read as one ``<unk>``.
- Characters never seen in training become ``<unk>`` pieces (runs of them one each); the
  unknown-word column of such a model counts these pieces (:attr:`UNKNOWN_UNIT`).
- Ids 0, 1 and 2 are ``<pad>``, ``</s>`` and ``<unk>``, as in every vocabulary, so a log p of a
  word sequence is the sum over its pieces' log p, ``</s>`` included: scores of a subword
  model compare across hypotheses as a word model's do.
- A right-to-left model reads the pieces last first (the word order and each word's pieces).

Files: the sentencepiece model beside the vocabulary (``subwords.source.model``,
``subwords.target.model``, usable with ``spm_encode``); the vocabulary file lists its pieces and
the model file's SHA-256, and config.json records both the vocabulary's and the model's
SHA-256, checked at every load.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

from phrase_scorer.config import VOCABULARIES
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import write_bytes_atomically
from phrase_scorer.io.paths import PathLike
from phrase_scorer.vocab import EOS, FORMAT, PAD, RIGHT_TO_LEFT, SPECIALS, UNK, UNK_ID, Vocabulary

WORD_START = "\u2581"  # sentencepiece's mark on a word's first piece
LIBRARY = "sentencepiece"
KINDS = VOCABULARIES[1:]  # the segmentations besides whole words
UNKNOWN_UNIT = "pieces"  # what the unknown-word column counts for a subword model (a word model: "words")
# Words whose pieces are kept at once: far more than a language's frequent words, a bounded memory
# however many distinct words a table or list holds (the cache starts again when it is full).
CACHED_WORDS = 1 << 18


def learn(counts: Counter, size: int, kind: str) -> bytes:
    """A sentencepiece model of ``kind`` (bpe | unigram) with at most ``size`` entries, learnt from
    word counts (every word of a side with its count), as the bytes of its file. The same counts
    give the same bytes. Words that hold a space or ``▁`` are left out of the counts."""
    import sentencepiece

    if kind not in KINDS:
        raise PhraseScorerError(f"unknown subword model {kind!r} (one of: {', '.join(KINDS)})")
    words = sorted((w, n) for w, n in counts.items() if w and WORD_START not in w and not any(c.isspace() for c in w)
                   and w not in SPECIALS)
    if not words:
        raise PhraseScorerError("no words to learn subwords from")
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(f"{w}\t{n}" for w, n in words), input_format="tsv", model_writer=model,
            vocab_size=size, hard_vocab_limit=False, model_type=kind, character_coverage=1.0,
            normalization_rule_name="identity", split_digits=False, num_threads=1, minloglevel=2,
            pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece=PAD, eos_piece=EOS, unk_piece=UNK,
            max_sentence_length=1 << 20)
    except RuntimeError as exc:
        raise PhraseScorerError(f"sentencepiece could not learn a {kind} model of {size} entries ({exc})",
                                hint="choose a larger shortlist, or train on more data") from None
    return model.getvalue()


class SubwordVocabulary(Vocabulary):
    """A :class:`~phrase_scorer.vocab.Vocabulary` of sentencepiece pieces that reads and writes words."""

    UNKNOWN_UNIT = UNKNOWN_UNIT

    def __init__(self, model: bytes, kind: str, file_name: str, right_to_left: bool = False) -> None:
        import sentencepiece

        self.model = model  # the sentencepiece model file's bytes
        self.kind = kind
        self.file_name = file_name  # the model file's name, beside the vocabulary file
        try:
            self.processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        except (RuntimeError, TypeError) as exc:
            raise PhraseScorerError(f"not a readable sentencepiece model ({exc})") from None
        pieces = [self.processor.id_to_piece(i) for i in range(self.processor.get_piece_size())]
        if tuple(pieces[: len(SPECIALS)]) != SPECIALS:
            raise PhraseScorerError("sentencepiece model does not reserve <pad>, </s>, <unk> as ids 0, 1, 2")
        super().__init__(pieces[len(SPECIALS):], right_to_left)
        self._word_ids: Dict[str, Tuple[int, ...]] = {}

    @property
    def subwords(self) -> Dict[str, str]:
        """What the vocabulary file and config.json record of the segmentation."""
        return {"library": LIBRARY, "model_type": self.kind, "file": self.file_name, "sha256": self.model_sha256()}

    def model_sha256(self) -> str:
        return hashlib.sha256(self.model).hexdigest()

    def __getstate__(self):  # worker processes get the model's bytes, not the processor
        return {"model": self.model, "kind": self.kind, "file_name": self.file_name,
                "right_to_left": self.right_to_left}

    def __setstate__(self, state) -> None:
        type(self).__init__(self, state["model"], state["kind"], state["file_name"], state["right_to_left"])

    # --- words <-> pieces ----------------------------------------------------------------------

    def word_ids(self, word: str) -> Tuple[int, ...]:
        """The ids of one word's pieces, in reading order (cached). A word its pieces would not
        spell back byte for byte is one ``<unk>``."""
        ids = self._word_ids.get(word)
        if ids is None:
            if not word or WORD_START in word or any(c.isspace() for c in word):
                ids = (UNK_ID,)
            else:
                ids = tuple(self.processor.encode(word))
                if UNK_ID not in ids and "".join(self.tokens[i] for i in ids) != WORD_START + word:
                    ids = (UNK_ID,)
            if len(self._word_ids) >= CACHED_WORDS:
                self._word_ids.clear()
            self._word_ids[word] = ids
        return ids

    def pieces_per_word(self, words: Iterable[str]) -> List[int]:
        """How many pieces each word has (in reading order): how alignments go back to words."""
        return [len(self.word_ids(w)) for w in words]

    def encode(self, words: Iterable[str]) -> List[int]:
        """Ids of the pieces of a phrase's words, in the model's reading order."""
        ids: List[int] = []
        for word in words:
            ids.extend(self.word_ids(word))
        return self.in_model_order(ids)

    def decode(self, ids: Iterable[int]) -> List[str]:
        """The words that ids in the model's order spell, in reading order: pieces joined, cut at
        each word-start mark."""
        return "".join(self.in_model_order([self.tokens[i] for i in ids])).replace(WORD_START, " ").split()

    def __contains__(self, word: str) -> bool:
        """Can ``word`` be read without an ``<unk>`` piece?"""
        return UNK_ID not in self.word_ids(word)

    def count_unknown(self, words: Iterable[str]) -> int:
        """The ``<unk>`` pieces of the words (what the unknown-word column counts)."""
        return sum(self.word_ids(w).count(UNK_ID) for w in words)

    # --- files ---------------------------------------------------------------------------------

    def to_json(self) -> str:
        order = {"order": RIGHT_TO_LEFT} if self.right_to_left else {}
        return json.dumps({"format": FORMAT, "version": 1, **order, "subwords": self.subwords, "tokens": self.tokens},
                          ensure_ascii=False, indent=0)

    def save(self, path: PathLike) -> None:
        write_bytes_atomically(Path(path).with_name(self.file_name), self.model)
        super().save(path)

    @classmethod
    def from_file_data(cls, path: Path, data: dict, right_to_left: bool) -> "SubwordVocabulary":
        """The vocabulary of the file ``path`` (its JSON ``data``), with its sentencepiece model
        read from beside it and checked against the SHA-256 and pieces the file records."""
        record = data.get("subwords")
        if not (isinstance(record, dict) and record.get("library") == LIBRARY and record.get("model_type") in KINDS
                and isinstance(record.get("file"), str) and isinstance(record.get("sha256"), str)
                and Path(record["file"]).name == record["file"]):
            raise PhraseScorerError("vocabulary's 'subwords' record is not a sentencepiece model file with its "
                                    "SHA-256", path=path, hint="put back the vocabulary saved with this model")
        model_path = path.with_name(record["file"])
        try:
            model = model_path.read_bytes()
        except FileNotFoundError:
            raise PhraseScorerError("subword model file is missing", path=model_path,
                                    hint="put back the file saved with this model, or train the model again") from None
        if hashlib.sha256(model).hexdigest() != record["sha256"]:
            raise PhraseScorerError(f"is not the subword model this vocabulary was made with (its SHA-256 differs "
                                    f"from the one {path.name} records)", path=model_path,
                                    hint="put back the file saved with this model, or train the model again")
        try:
            vocab = cls(model, record["model_type"], record["file"], right_to_left)
        except PhraseScorerError as exc:
            raise PhraseScorerError(exc.message, path=model_path) from None
        if vocab.tokens != data["tokens"]:
            raise PhraseScorerError("lists other pieces than its subword model", path=path,
                                    hint="put back the vocabulary saved with this model")
        return vocab


def segmentation_records(source_vocab: Vocabulary, target_vocab: Vocabulary) -> Dict[str, Dict[str, str]]:
    """{side: the record of its sentencepiece model} for the sides that have one: what config.json
    (``subwords``) and a signature's model record keep; empty for a word model."""
    return {side: vocab.subwords for side, vocab in (("source", source_vocab), ("target", target_vocab))
            if isinstance(vocab, SubwordVocabulary)}


def load_vocabulary(path: PathLike) -> Vocabulary:
    """The vocabulary of a model directory's file: a word vocabulary, or a subword one with its
    sentencepiece model read from beside it."""
    path = Path(path)
    data = Vocabulary.read_file(path)
    right_to_left = data.get("order") == RIGHT_TO_LEFT
    if "subwords" in data:
        return SubwordVocabulary.from_file_data(path, data, right_to_left)
    return Vocabulary(data["tokens"][len(SPECIALS):], right_to_left)


def learn_vocabulary(counts: Counter, size: int, kind: str, file_name: str,
                     right_to_left: bool = False) -> SubwordVocabulary:
    """A subword vocabulary of ``size`` pieces besides ``<pad>``, ``</s>``, ``<unk>`` (a word
    shortlist's size), learnt from a side's word counts."""
    return SubwordVocabulary(learn(counts, size + len(SPECIALS), kind), kind, file_name, right_to_left)


def piece_counts(counts: Counter, vocab: Vocabulary) -> Tuple[int, int]:
    """(the pieces, the words) of the text the word counts describe: pieces per word."""
    words = sum(counts.values())
    if not isinstance(vocab, SubwordVocabulary):
        return words, words
    return sum(n * len(vocab.word_ids(w)) for w, n in counts.items()), words
