"""--resume re-runs the checks a fresh run makes: an input a fresh run refuses is refused again by
the resume of the same command, and no error tells the user to resume a run that would fail fresh.

The list is the first three sentences (221 lines) of the tuned Multi30k system's 100-best list of
val (sentences of 100, 33 and 88 hypotheses); the sources are the first three lines of val.tok.en.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import pytest

from conftest import DATA, error_line, run_cli
from phrase_scorer.config import RescoreOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.rescoring.features import FeatureModel, rescore
from phrase_scorer.runtime.job import OutputJob

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


def part_files(out: Path) -> list:
    return sorted(p.name for p in out.parent.glob(out.name + ".part*"))


@pytest.mark.parametrize("extra", ["more sentences\n" * 997, "\n"], ids=["1000-lines", "trailing-empty-line"])
def test_a_source_longer_than_the_list_is_not_offered_a_resume(tmp_path, tiny_model, extra):
    """The fresh run's check (the source has more lines than the list has sentences) names the
    source and keeps no partial output; the same command with --resume is refused the same way."""
    source = tmp_path / "source.en"
    source.write_text(SOURCE.read_text(encoding="utf-8") + extra, encoding="utf-8")
    out = tmp_path / "out.gz"
    command = ["rescore", NBEST, "--source", source, "-m", tiny_model, "-o", out, "--window-lines", "30",
               "--workers", "0"]
    line = error_line(run_cli(*command))
    assert "more lines than the n-best list" in line and str(source) in line
    assert "--resume" not in line
    assert part_files(out) == [] and not out.exists()

    resumed = error_line(run_cli(*command, "--resume"))
    assert "more lines than the n-best list" in resumed
    assert not out.exists()


@contextlib.contextmanager
def killed_before_sentence(monkeypatch, lines_done: int):
    """The run stops (KeyboardInterrupt, as a kill) when the reader looks up the source of the
    sentence after list line ``lines_done``, once the writer has written and recorded the window
    that ends there: a run stopped at that point, whatever the threads' timing."""
    from phrase_scorer.rescoring.features import SourceSentences

    write, words = OutputJob.write, SourceSentences.words
    written = threading.Event()

    def write_and_tell(self, lines, data):
        write(self, lines, data)
        if self.lines_done == lines_done:
            written.set()

    def stop_after(self, sentence_id, nbest_line):
        if nbest_line > lines_done:
            assert written.wait(60), "the window was never written"
            raise KeyboardInterrupt
        return words(self, sentence_id, nbest_line)

    monkeypatch.setattr(OutputJob, "write", write_and_tell)
    monkeypatch.setattr(SourceSentences, "words", stop_after)
    try:
        yield
    finally:
        monkeypatch.setattr(OutputJob, "write", write)
        monkeypatch.setattr(SourceSentences, "words", words)


@contextlib.contextmanager
def killed_while_failing(monkeypatch):
    """A SIGKILL while the run handles its error: the partial output and its resume record stay
    as the last window left them (nothing of the job's failure handling runs)."""
    monkeypatch.setattr(OutputJob, "_fail", lambda self, exc: None)
    try:
        yield
    finally:
        monkeypatch.undo()


def test_resume_of_a_run_killed_after_its_last_window_checks_the_source_again(tmp_path, loaded_tiny, monkeypatch):
    """A run killed after writing every window, as it reports the source longer than the list:
    the resume skips every line of the list and must still find the source longer than the list."""
    source = tmp_path / "source.en"
    source.write_text(SOURCE.read_text(encoding="utf-8") + "one more sentence\n", encoding="utf-8")
    out = tmp_path / "out.gz"
    models = [FeatureModel("RNN0", loaded_tiny)]
    options = RescoreOptions(window_lines=30)
    with killed_while_failing(monkeypatch), pytest.raises(PhraseScorerError, match="more lines than"):
        rescore(NBEST, source, out, models, options, workers=0)
    assert part_files(out) == ["out.gz.part", "out.gz.part.json"]
    assert json.loads(Path(str(out) + ".part.json").read_text())["lines_done"] == 221

    with pytest.raises(PhraseScorerError, match="more lines than the n-best list") as raised:
        rescore(NBEST, source, out, models, options, resume=True, workers=0)
    assert "kept with the first" not in str(raised.value.hint)
    assert not out.exists() and part_files(out) == []


def test_resume_of_a_run_stopped_after_its_last_window_finishes_a_right_source(tmp_path, loaded_tiny, monkeypatch):
    """A run stopped after writing every window, before its commit, with the right source: the
    resume has nothing left to score, its checks of the whole list pass, and it commits the bytes
    of an uninterrupted run."""
    models = [FeatureModel("RNN0", loaded_tiny)]
    options = RescoreOptions(window_lines=30)
    reference = tmp_path / "ref.gz"
    rescore(NBEST, SOURCE, reference, models, options, workers=0)
    out = tmp_path / "out.gz"

    def stop(self, signature=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(OutputJob, "commit", stop)
    with pytest.raises(KeyboardInterrupt):
        rescore(NBEST, SOURCE, out, models, options, workers=0)
    monkeypatch.undo()
    assert json.loads(Path(str(out) + ".part.json").read_text())["lines_done"] == 221

    rescore(NBEST, SOURCE, out, models, options, resume=True, workers=0)
    assert out.read_bytes() == reference.read_bytes()


def test_a_source_too_short_for_a_resumed_list_is_refused(tmp_path, loaded_tiny, monkeypatch):
    """Stopped after the first two sentences' windows: the source has two lines, so the fresh run
    would fail at sentence 2; the resume reads on and fails there too, naming the list's line."""
    source = tmp_path / "source.en"
    source.write_text("".join(SOURCE.read_text(encoding="utf-8").splitlines(keepends=True)[:2]), encoding="utf-8")
    out = tmp_path / "out.gz"
    models = [FeatureModel("RNN0", loaded_tiny)]
    options = RescoreOptions(window_lines=30)
    with killed_before_sentence(monkeypatch, 133), pytest.raises(KeyboardInterrupt):
        rescore(NBEST, source, out, models, options, workers=0)
    assert part_files(out) == ["out.gz.part", "out.gz.part.json"]

    with pytest.raises(PhraseScorerError, match="needs source line 3") as raised:
        rescore(NBEST, source, out, models, options, resume=True, workers=0)
    assert raised.value.line == 134
    assert not out.exists()
