"""The ``score`` verb: one natural-log log p(y|x) per line of ``src ||| tgt`` lines (or of a whole
phrase table), in order.

It reads the input as ``annotate`` does, in windows of whole lines
(:class:`~phrase_scorer.io.table_windows.RawWindows`, checked by
:func:`~phrase_scorer.io.table_windows.parse_window`, scores not required), looks the words up
with the same byte dictionaries (:class:`~phrase_scorer.scoring.annotate_work.PhraseIds`) and scores each
window with :class:`~phrase_scorer.scoring.batch_scorer.BatchScorer`; a reader thread and a writer thread keep
the model busy. :func:`score_pairs` gives a Python caller the same values for pairs it holds.
"""

from __future__ import annotations

from typing import Iterable, Tuple

import numpy as np

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.phrase_table import split_words
from phrase_scorer.scoring.annotate_work import PhraseIds
from phrase_scorer.config import ScoringOptions
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.nbest import is_nbest_line, nbest_given_for_pairs
from phrase_scorer.io.outputs import model_files
from phrase_scorer.runtime.job import OutputJob
from phrase_scorer.runtime.workers import Pipeline
from phrase_scorer.io.table_windows import RawWindows, parse_window
from phrase_scorer.runtime.progress import progress_bar


def score_pairs(loaded, pairs: Iterable[Tuple[str, str]], scoring_options=None) -> np.ndarray:
    """Natural-log log p(target | source) of each (source, target) pair of phrases held in memory
    (words split as Moses splits them), float64, in order: the values ``score`` writes for
    ``source ||| target`` lines. The pairs are held and scored at once: for a file of them,
    :func:`score_file`. A side without a word is an error naming its pair (counted from 1)."""
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    words = []
    for number, (source, target) in enumerate(pairs, 1):
        sides = split_words(source), split_words(target)
        for side, side_words in zip(("source", "target"), sides):
            if not side_words:
                raise PhraseScorerError(f"pair {number}: the {side} is empty", hint="give each side a word or more")
        words.append(sides)
    scorer = BatchScorer(loaded.model, scoring_options or ScoringOptions())
    return scorer.score([loaded.source_vocab.encode(s) for s, _ in words],
                        [loaded.target_vocab.encode(t) for _, t in words])


def score_file(source: PathLike, output: PathLike, loaded, scoring_options=None, window_lines: int = 20000, *,
               overwrite: bool = False) -> int:
    """Write one natural-log log p(y|x) per line of ``source`` (``src ||| tgt`` lines or a whole
    phrase table), in order; a name ending in .gz is gzipped. Returns the number of lines. An
    existing ``output`` is replaced only with ``overwrite``."""
    from phrase_scorer.scoring.batch_scorer import BatchScorer

    job = OutputJob(output, [("the input", source), *model_files(loaded.directory)], overwrite=overwrite)
    scorer = BatchScorer(loaded.model, scoring_options or ScoringOptions())
    lookup = PhraseIds(loaded.source_vocab, loaded.target_vocab)
    windows = RawWindows(source, window_lines)
    lines = 0
    with job as out:

        def read(put) -> None:
            for window in windows:
                parsed = parse_window(window, source, None, min_fields=2, check_scores=False)
                if window.index == 0 and parsed.fields and is_nbest_line(parsed.fields[0]):
                    raise nbest_given_for_pairs(source, 1)
                if not put(lookup.of(parsed)):
                    return
                progress.advance(window.lines)

        def write(log_probs) -> None:
            nonlocal lines
            data = "".join("%.9g\n" % v for v in log_probs).encode("ascii")
            out.write_text(len(log_probs), data)
            lines += len(log_probs)

        with progress_bar("scoring", windows) as progress:
            Pipeline().run(read, lambda ids: scorer.score(*ids), write)
        out.commit()
    return lines
