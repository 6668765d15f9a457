"""Source and target shortlists.

As in the paper (section 4.1), each side keeps its most frequent words (15,000 by default),
counted over the table's unique phrase pairs; every other word maps to ``<unk>``. Words are used
exactly as the table writes them, Moses escapes included (``&apos;``, ``&amp;``, ...).

Ids 0, 1 and 2 are reserved: ``<pad>`` (padding), ``</s>`` (end of phrase, predicted after the
last target word) and ``<unk>``. A table may hold these strings as literal words (Moses escapes
``<`` and ``>`` in its own output, but other tools and hand-made tables need not): such a word is
an ordinary word outside the shortlist, so it encodes as ``<unk>`` and counts as unknown. This is
the only place that turns words into ids, so training, scoring, annotating and sampling all agree.
A subword model's vocabulary (:class:`phrase_scorer.subwords.SubwordVocabulary`) has the same
interface and cuts each word into pieces here.

The target vocabulary of a right-to-left model (``train --right-to-left``) also holds the order in
which the model reads a phrase: it encodes words into ids last word first and decodes ids back
into reading order, so every path that scores, translates or samples with such a model reverses
the target side here, and only here (the annotate workers' byte lookup asks :func:`in_model_order`).
Its file records ``"order": "right-to-left"``; a file without the key is left to right.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Sequence, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.atomic import write_text_atomically
from phrase_scorer.io.paths import PathLike

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# The softmax covers target ids 1.. (</s>, <unk>, words); <pad> (id 0) is never predicted.
FIRST_OUTPUT_ID = EOS_ID
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIALS = (PAD, EOS, UNK)
FORMAT = "phrase-scorer-vocabulary"
RIGHT_TO_LEFT = "right-to-left"


def in_model_order(items, right_to_left: bool):
    """``items`` (a list, tuple or array along its first axis), one per word of a phrase in
    reading order, in the order a model reads them (and back: the reversal is its own inverse)."""
    return items[::-1] if right_to_left else items


def word_spans(vocab: "Vocabulary", words: Sequence[str]) -> List[Tuple[int, int]]:
    """For each word (reading order), the [start, end) of its ids in the reading-order ids of
    the phrase: one id per word, or a subword model's pieces."""
    spans, start = [], 0
    for n in vocab.pieces_per_word(words):
        spans.append((start, start + n))
        start += n
    return spans


class Vocabulary:
    """A shortlist: word <-> id, with ``<pad>``, ``</s>`` and ``<unk>`` at ids 0, 1, 2."""

    def __init__(self, words: Sequence[str], right_to_left: bool = False) -> None:
        self.tokens: List[str] = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        # words only: the reserved tokens are never looked up from text
        self.index: Dict[str, int] = {w: i for i, w in enumerate(self.tokens) if i >= len(SPECIALS)}
        self.right_to_left = right_to_left  # the model reads the phrase last word first

    @classmethod
    def from_counts(cls, counts: Counter, max_words: int, right_to_left: bool = False) -> "Vocabulary":
        """The ``max_words`` most frequent words; ties broken alphabetically, for reproducibility."""
        ranked = sorted((w for w in counts if w not in SPECIALS), key=lambda w: (-counts[w], w))
        return cls(ranked[:max_words], right_to_left)

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, word: str) -> bool:
        """Is ``word`` (a word of a phrase) in the shortlist? False for ``<pad>``, ``</s>``, ``<unk>``."""
        return word in self.index

    def encode(self, words: Iterable[str]) -> List[int]:
        """Ids of a phrase's words, in the model's reading order; a word outside the shortlist
        (literal ``</s>`` too) is ``<unk>``."""
        get = self.index.get
        return self.in_model_order([get(w, UNK_ID) for w in words])

    def decode(self, ids: Iterable[int]) -> List[str]:
        """The words of ids in the model's order, in reading order."""
        return self.in_model_order([self.tokens[i] for i in ids])

    def in_model_order(self, items):
        """:func:`in_model_order` for this vocabulary's model."""
        return in_model_order(items, self.right_to_left)

    UNKNOWN_UNIT = "words"  # what count_unknown counts (a subword vocabulary: pieces)

    def pieces_per_word(self, words: Iterable[str]) -> List[int]:
        """How many ids each word becomes (a word vocabulary: one each)."""
        return [1 for _ in words]

    def count_unknown(self, words: Iterable[str]) -> int:
        """The words outside the shortlist (``<unk>`` ids of :meth:`encode`)."""
        index = self.index
        return sum(1 for w in words if w not in index)

    def to_json(self) -> str:
        order = {"order": RIGHT_TO_LEFT} if self.right_to_left else {}  # left to right: the files as before
        return json.dumps({"format": FORMAT, "version": 1, **order, "tokens": self.tokens}, ensure_ascii=False,
                          indent=0)

    def sha256(self) -> str:
        """The SHA-256 of the vocabulary as :meth:`to_json` writes it (its words, their order and
        its reading order): what config.json records to tie the vocabularies to the weights. A
        file re-indented by hand keeps it; a word changed, added or moved does not."""
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def save(self, path: PathLike) -> None:
        write_text_atomically(path, self.to_json() + "\n")

    @classmethod
    def load(cls, path: PathLike) -> "Vocabulary":
        """A word vocabulary's file (a subword model's: :func:`phrase_scorer.subwords.load_vocabulary`,
        which reads either)."""
        path = Path(path)
        data = cls.read_file(path)
        if "subwords" in data:
            raise PhraseScorerError("is a subword model's vocabulary (read it with phrase_scorer.subwords)", path=path)
        return cls(data["tokens"][len(SPECIALS):], data.get("order") == RIGHT_TO_LEFT)

    @staticmethod
    def read_file(path: PathLike) -> dict:
        """The checked contents of a vocabulary file: its tokens, and its reading order."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PhraseScorerError("vocabulary file is missing", path=path) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PhraseScorerError(f"vocabulary file is not valid JSON ({exc})", path=path) from None
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if (
            not isinstance(data, dict)
            or data.get("format") != FORMAT
            or not isinstance(tokens, list)
            or tuple(tokens[: len(SPECIALS)]) != SPECIALS
            or not all(isinstance(t, str) and t for t in tokens)
        ):
            raise PhraseScorerError(
                "not a phrase-scorer vocabulary (expected a 'tokens' list starting with <pad>, </s>, <unk>)",
                path=path,
            )
        if len(set(tokens)) != len(tokens):
            raise PhraseScorerError("vocabulary lists a word twice", path=path)
        order = data.get("order", "left-to-right")
        if order not in ("left-to-right", RIGHT_TO_LEFT):
            raise PhraseScorerError(f"vocabulary order {order!r} is neither left-to-right nor {RIGHT_TO_LEFT}",
                                    path=path)
        return data
