"""The ``score`` verb: one natural-log log p(y|x) per line of ``src ||| tgt`` lines (or of a whole
phrase table), in order.

It reads the input as ``annotate`` does, in windows of whole lines
(:class:`~phrase_scorer.io.table_windows.RawWindows`, checked by
:func:`~phrase_scorer.io.table_windows.parse_window`, scores not required), looks the words up
with the same byte dictionaries (:class:`~phrase_scorer.scoring.annotate_work.PhraseIds`) and scores each
window with :class:`~phrase_scorer.scoring.batch_scorer.BatchScorer`; a reader thread and a writer thread keep
the model busy.
"""

from __future__ import annotations

from phrase_scorer.scoring.annotate_work import PhraseIds
from phrase_scorer.config import ScoringOptions
from phrase_scorer.io.files import PathLike
from phrase_scorer.io.nbest import is_nbest_line, nbest_given_for_pairs
from phrase_scorer.io.outputs import model_files
from phrase_scorer.runtime.job import OutputJob
from phrase_scorer.runtime.workers import Pipeline
from phrase_scorer.io.table_windows import RawWindows, parse_window
from phrase_scorer.runtime.progress import progress_bar


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
