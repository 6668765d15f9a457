"""--resume re-runs the checks a fresh run makes: an input a fresh run refuses is refused again by
the resume of the same command, and no error tells the user to resume a run that would fail fresh.

The list is the first three sentences (221 lines) of the tuned Multi30k system's 100-best list of
val (sentences of 100, 33 and 88 hypotheses); the sources are the first three lines of val.tok.en.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
from pathlib import Path

import pytest

from conftest import DATA, EXAMPLE_TABLE, error_line, run_cli
from phrase_scorer.config import RescoreOptions, RunOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.rescoring.rescore import FeatureModel, rescore
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
    from phrase_scorer.rescoring.rescore import SourceSentences

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
        rescore(NBEST, source, out, models, options, run=RunOptions(workers=0))
    assert part_files(out) == ["out.gz.part", "out.gz.part.json"]
    assert json.loads(Path(str(out) + ".part.json").read_text())["lines_done"] == 221

    with pytest.raises(PhraseScorerError, match="more lines than the n-best list") as raised:
        rescore(NBEST, source, out, models, options, run=RunOptions(resume=True, workers=0))
    assert "kept with the first" not in str(raised.value.hint)
    assert not out.exists() and part_files(out) == []


def test_resume_of_a_run_stopped_after_its_last_window_finishes_a_right_source(tmp_path, loaded_tiny, monkeypatch):
    """A run stopped after writing every window, before its commit, with the right source: the
    resume has nothing left to score, its checks of the whole list pass, and it commits the bytes
    of an uninterrupted run."""
    models = [FeatureModel("RNN0", loaded_tiny)]
    options = RescoreOptions(window_lines=30)
    reference = tmp_path / "ref.gz"
    rescore(NBEST, SOURCE, reference, models, options, run=RunOptions(workers=0))
    out = tmp_path / "out.gz"

    def stop(self, signature=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(OutputJob, "commit", stop)
    with pytest.raises(KeyboardInterrupt):
        rescore(NBEST, SOURCE, out, models, options, run=RunOptions(workers=0))
    monkeypatch.undo()
    assert json.loads(Path(str(out) + ".part.json").read_text())["lines_done"] == 221

    rescore(NBEST, SOURCE, out, models, options, run=RunOptions(resume=True, workers=0))
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
        rescore(NBEST, source, out, models, options, run=RunOptions(workers=0))
    assert part_files(out) == ["out.gz.part", "out.gz.part.json"]

    with pytest.raises(PhraseScorerError, match="needs source line 3") as raised:
        rescore(NBEST, source, out, models, options, run=RunOptions(resume=True, workers=0))
    assert raised.value.line == 134
    assert not out.exists()


def test_annotate_resume_checks_the_score_count_against_the_tables_first_line(tmp_path, loaded_tiny, monkeypatch):
    """The table's lines from 601 on have five scores, its first lines four: a fresh run refuses
    line 601. A run stopped after its first 600 lines resumes at line 601; it must hold those
    lines to the first line's count too, not take theirs as the table's."""
    from phrase_scorer.config import AnnotateOptions
    from phrase_scorer.io.table_windows import RawWindows
    from phrase_scorer.scoring.annotate import annotate

    with gzip.open(EXAMPLE_TABLE, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(900)]
    fields = [line.split(" ||| ") for line in lines[600:]]
    lines[600:] = [" ||| ".join([*parts[:2], parts[2] + " 0.5", *parts[3:]]) for parts in fields]
    table = tmp_path / "table.gz"
    table.write_bytes(gzip.compress("".join(lines).encode("utf-8")))
    out = tmp_path / "out.gz"
    options = AnnotateOptions(window_lines=300)
    with pytest.raises(PhraseScorerError, match="line 601") as fresh:
        annotate(table, out, loaded_tiny, options, run=RunOptions(workers=0))
    assert not out.exists() and part_files(out) == []

    write, windows = OutputJob.write, RawWindows.__iter__
    written = threading.Event()

    def write_and_tell(self, count, data):
        write(self, count, data)
        if self.lines_done == 600:
            written.set()

    def stop_at_line_601(self):
        for window in windows(self):
            if window.first_line == 601:
                assert written.wait(60), "the first 600 lines were never written"
                raise KeyboardInterrupt
            yield window

    monkeypatch.setattr(OutputJob, "write", write_and_tell)
    monkeypatch.setattr(RawWindows, "__iter__", stop_at_line_601)
    with pytest.raises(KeyboardInterrupt):
        annotate(table, out, loaded_tiny, options, run=RunOptions(workers=0))
    monkeypatch.undo()
    assert json.loads(Path(str(out) + ".part.json").read_text())["lines_done"] == 600

    with pytest.raises(PhraseScorerError, match="line 601") as resumed:
        annotate(table, out, loaded_tiny, options, run=RunOptions(workers=0, resume=True))
    assert resumed.value.message == fresh.value.message
    assert not out.exists()


def test_train_resume_on_other_sentence_pairs_is_refused_when_the_cache_is_rebuilt(tmp_path):
    """A model trained on one corpus, its pair cache removed (to save space, or damaged): resumed
    with other files, it once rebuilt the cache from them with the old vocabularies and trained
    on, exit 0. The files the run recorded are checked as the cache's description would be."""
    import shutil

    from conftest import TRAIN_EN, TRAIN_FR
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.data.sentence_pairs import SentenceCorpus
    from phrase_scorer.model_dir import ModelDirectory
    from phrase_scorer.training.run import train

    sides = {}
    for name, path in (("en", TRAIN_EN), ("fr", TRAIN_FR)):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [next(f) for _ in range(160)]
        for part, chosen in (("a", lines[:80]), ("b", lines[80:])):
            sides[part, name] = tmp_path / f"{part}.{name}"
            sides[part, name].write_text("".join(chosen), encoding="utf-8")
    out = tmp_path / "m"
    config = dict(preset="tiny", max_length=12, valid_every=2, valid_pairs=10, seed=2)
    train(SentenceCorpus(str(sides["a", "en"]), str(sides["a", "fr"])), out, TrainConfig(max_steps=2, **config))
    shutil.rmtree(ModelDirectory(out).cache_dir)

    with pytest.raises(PhraseScorerError, match="cannot resume") as raised:
        train(SentenceCorpus(str(sides["b", "en"]), str(sides["b", "fr"])), out, TrainConfig(max_steps=4, **config),
              resume=True)
    assert "source" in raised.value.message
    state = train(SentenceCorpus(str(sides["a", "en"]), str(sides["a", "fr"])), out,
                  TrainConfig(max_steps=4, **config), resume=True)
    assert state.step == 4


def test_train_resume_on_another_phrase_table_is_refused_when_the_cache_is_rebuilt(tmp_path):
    """As for sentence pairs: a table model whose pair cache is gone, resumed on another table,
    once trained on with the old vocabularies; the run records its table by its bytes."""
    import shutil

    from phrase_scorer.config import TrainConfig
    from phrase_scorer.model_dir import ModelDirectory
    from phrase_scorer.training.run import train

    with gzip.open(EXAMPLE_TABLE, "rb") as f:
        lines = [next(f) for _ in range(1200)]
    first, other = tmp_path / "first.txt", tmp_path / "other.txt"
    first.write_bytes(b"".join(lines[:600]))
    other.write_bytes(b"".join(lines[600:]))
    out = tmp_path / "m"
    config = dict(preset="tiny", valid_every=2, valid_pairs=20, seed=2)
    train(first, out, TrainConfig(max_steps=2, **config))
    shutil.rmtree(ModelDirectory(out).cache_dir)

    with pytest.raises(PhraseScorerError, match="cannot resume"):
        train(other, out, TrainConfig(max_steps=4, **config), resume=True)
    assert train(first, out, TrainConfig(max_steps=4, **config), resume=True).step == 4


@pytest.mark.parametrize("piped", ["nbest", "source"])
def test_resume_from_a_pipe_is_refused_before_any_work(tmp_path, tiny_model, piped):
    """--resume skips what the record says is done, trusting the input's bytes to be those it
    recorded: a pipe's cannot be checked (nor read again), so --resume with one is refused as
    with '-', before anything is scored."""
    import os

    files = {"nbest": tmp_path / "list.nbest", "source": SOURCE}
    files["nbest"].write_bytes(gzip.decompress(NBEST.read_bytes()))
    data = files[piped].read_bytes()
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data[:60_000])
        os.close(write_end)
        files[piped] = f"/dev/fd/{read_end}"
        out = tmp_path / "out.txt"
        line = error_line(run_cli("rescore", files["nbest"], "--source", files["source"], "-m", tiny_model,
                                  "-o", out, "--resume"))
        assert "--resume needs named input and output files" in line, line
        assert not out.exists() and part_files(out) == []
    finally:
        os.close(read_end)
