"""Translating sentences: batched beam search, one output line per input line.

Input lines are tokenised sentences, like the Moses system's data (words separated by spaces);
words outside the model's source shortlist are read as ``<unk>``. Sentences are searched
``batch_sentences`` at a time by the package's one beam search
(:func:`phrase_scorer.generation.sampling.beam_search_batch`), each with a length limit of
``ceil(max_length_ratio * source words)`` target words. The output is the best hypothesis's
words joined by single spaces, as the target vocabulary holds them (tokenised like Moses'
output, so BLEU is computed the same way); ``<unk>`` is never generated. An empty input line gives
an empty output line. The output is written to a temporary file and renamed into place; an
existing output is replaced only with ``overwrite``, never when it is the input or a file of the
model (:mod:`phrase_scorer.io.outputs`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, List, Sequence

from phrase_scorer.config import TranslateOptions
from phrase_scorer.io.inputs import TextLines
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.outputs import model_files
from phrase_scorer.runtime.job import OutputJob
from phrase_scorer.runtime.progress import progress_bar


@dataclass
class Translation:
    words: List[str]  # the target words, as the vocabulary holds them
    log_prob: float  # natural-log p(y|x) under the model, </s> included (0 for an empty source)

    @property
    def text(self) -> str:
        return " ".join(self.words)


def translate_sentences(loaded, sentences: Sequence[Sequence[str]],
                        options: TranslateOptions = TranslateOptions()) -> List[Translation]:
    """The best translation of each tokenised sentence (a list of words), in order."""
    from phrase_scorer.generation.sampling import beam_search_batch

    out: List[Translation] = [Translation([], 0.0) for _ in sentences]
    todo = [i for i, words in enumerate(sentences) if words]
    for start in range(0, len(todo), options.batch_sentences):
        batch = todo[start : start + options.batch_sentences]
        source_ids = [loaded.source_vocab.encode(sentences[i]) for i in batch]
        limits = [max(1, math.ceil(options.max_length_ratio * len(ids))) for ids in source_ids]
        found = beam_search_batch(loaded.model, source_ids, options.beam, max_length=limits, allow_unk=False,
                                  length_normalize=options.length_normalize)
        for i, hypotheses in zip(batch, found):
            ids, log_prob = hypotheses[0]
            out[i] = Translation(loaded.target_vocab.decode(ids), log_prob)
    return out


def translate_file(source: PathLike, output: PathLike, loaded, options: TranslateOptions = TranslateOptions(), *,
                   overwrite: bool = False) -> int:
    """Translate each line of ``source`` (plain or gzip; ``-``: stdin) into ``output`` (``-``:
    stdout; a name ending in .gz is gzipped). Returns the number of lines."""
    lines = 0
    reader = TextLines(source, hint="give UTF-8 text, tokenised like the model's training data")
    with OutputJob(output, [("the input", source), *model_files(loaded.directory)], overwrite=overwrite) as out, \
            progress_bar("translating", reader) as progress:
        for batch in _line_batches(reader, options.batch_sentences * 4):
            translations = translate_sentences(loaded, batch, options)
            data = "".join(t.text + "\n" for t in translations).encode("utf-8")
            out.write_text(len(batch), data)
            lines += len(batch)
            progress.advance(len(batch))
        out.commit()
    return lines


def _line_batches(reader: TextLines, size: int) -> Iterator[List[List[str]]]:
    """The input's lines as lists of words, ``size`` lines at a time."""
    batch: List[List[str]] = []
    for _, text in reader:
        batch.append(text.split())
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
