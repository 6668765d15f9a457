"""The EMS step (``ems-config``), without Moses: EMS's argument shape, the moses.ini it writes,
and what a re-executed step re-uses. The real EMS run is in test_ems_moses.py."""

from __future__ import annotations

import gzip
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import A_MAN_TABLE, DATA
from phrase_scorer.cli import cli
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.moses.ini_patch import patch_moses_ini
from phrase_scorer.config import MosesIniOptions
from phrase_scorer.experiments.ems_config import BINARY_SUFFIXES, MODEL_SUFFIX, TABLE_SUFFIX, parse_binarizer

TRAINING = ["--preset", "tiny", "--max-steps", "6", "--valid-every", "3", "--valid-pairs", "50", "--batch-size", "16",
            "--threads", "1"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("phrase-scorer: error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[-1]


@pytest.fixture
def ems_model_dir(tmp_path) -> Path:
    """What EMS's build-ttable and create-config steps leave in model/: the table under its stem
    name (``phrase-table.1``, the file being ``phrase-table.1.gz``) and ``moses.ini.1`` naming
    every file by its absolute path."""
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(A_MAN_TABLE, model / "phrase-table.1.gz")
    text = (DATA / "moses.ini").read_text()
    text = text.replace("path=phrase-table.gz", f"path={model / 'phrase-table.1'}")
    text = text.replace("path=reordering-table.wbe-msd-bidirectional-fe.gz",
                        f"path={model / 'reordering-table.1.wbe-msd-bidirectional-fe'}")
    text = text.replace("path=lm.arpa.gz", f"path={tmp_path / 'lm.arpa.gz'}")
    (model / "moses.ini.1").write_text(text)
    return model


def table_lines(path: Path) -> list:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


# --- -Binarizer ----------------------------------------------------------------------------------


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.mark.parametrize("value", [None, "", "  ", "none"])
def test_no_binarizer_means_a_text_table(value):
    assert parse_binarizer(value) is None


@pytest.mark.parametrize("program, feature_type", [
    ("processPhraseTableMin", "PhraseDictionaryCompact"),
    ("CreateProbingPT", "ProbingPT"),
    ("CreateOnDiskPt", "PhraseDictionaryOnDisk"),
])
def test_binarizer_program_picks_the_table_type(tmp_path, program, feature_type):
    path = executable(tmp_path / "moses" / "bin" / program)
    target = parse_binarizer(f"{path} 1 1 4 100 2")
    assert target.feature_type == feature_type
    assert target.program == str(path) and target.moses_home == str(tmp_path / "moses")
    assert target.ignored == ["1", "1", "4", "100", "2"]  # EMS's usual OnDisk line names 4 scores


@pytest.mark.parametrize("make, expect", [
    (lambda d: executable(d / "bin" / "gzip"), "not a phrase-table binariser"),
    (lambda d: d / "bin" / "processPhraseTableMin", "not an executable file"),
    (lambda d: executable(d / "tools" / "CreateProbingPT"), "must be in a Moses bin/ folder"),
])
def test_bad_binarizer_is_refused(tmp_path, make, expect):
    with pytest.raises(PhraseScorerError, match=expect):
        parse_binarizer(str(make(tmp_path)))


# --- the config EMS gets -------------------------------------------------------------------------


def test_text_table_config_and_rerun(ems_model_dir, tiny_model, tmp_path):
    ini_in, ini_out = ems_model_dir / "moses.ini.1", ems_model_dir / "moses.bin.ini.1"
    # EMS's exact shape: $binarize-all IN OUT -Binarizer "$ttable-binarizer"
    result = run("ems-config", "--model", tiny_model, ini_in, ini_out, "-Binarizer", "")
    assert result.exit_code == 0, result.output
    annotated = Path(str(ini_out) + TABLE_SUFFIX)

    before, after = MosesIni.read(ini_in), MosesIni.read(ini_out)
    feature = after.find_phrase_table()
    assert feature.type == "PhraseDictionaryMemory" and feature.get("num-features") == "6"
    assert feature.get("path") == str(annotated)
    assert len(after.weight_line("TranslationModel0").weights) == 6
    # The start weights are the ones moses-ini writes: one source for them.
    reference = tmp_path / "reference.ini"
    patch_moses_ini(ini_in, reference, phrase_table=annotated,
                    options=MosesIniOptions(add_features=2, absolute_paths=True))
    assert after.text() == reference.read_text()
    # Only the phrase-table feature and its weights changed.
    changed = [a.number for a, b in zip(before.lines, after.lines) if a.text != b.text]
    assert changed == [feature.line.number, after.weight_line("TranslationModel0").line.number]

    source = table_lines(A_MAN_TABLE)
    lines = table_lines(annotated)
    assert len(lines) == len(source)
    for old, new in zip(source, lines):
        old_fields, new_fields = old.split(" ||| "), new.split(" ||| ")
        assert new_fields[:2] == old_fields[:2] and new_fields[3:] == old_fields[3:]
        assert new_fields[2].split()[:4] == old_fields[2].split() and len(new_fields[2].split()) == 6

    # Run again (EMS -continue re-runs a step under the same number): nothing is redone.
    stamp = annotated.stat().st_mtime_ns
    again = run("ems-config", "--model", tiny_model, ini_in, ini_out, "-Binarizer", "")
    assert again.exit_code == 0 and "(finished before)" in again.stderr, again.output
    assert annotated.stat().st_mtime_ns == stamp and MosesIni.read(ini_out).text() == after.text()

    # A different column option makes a different table, so it is annotated again.
    changed_option = run("ems-config", "--model", tiny_model, "--unk-side", "source", ini_in, ini_out,
                         "-Binarizer", "none")
    assert changed_option.exit_code == 0 and "(annotated)" in changed_option.stderr, changed_option.output
    assert annotated.stat().st_mtime_ns != stamp


def test_training_on_the_table_and_resume(ems_model_dir):
    ini_in, ini_out = ems_model_dir / "moses.ini.1", ems_model_dir / "moses.bin.ini.1"
    first = run("ems-config", *TRAINING, ini_in, ini_out, "-Binarizer", "")
    assert first.exit_code == 0 and "(trained)" in first.stderr, first.output
    model = Path(str(ini_out) + MODEL_SUFFIX)
    assert (model / "model.pt").exists()
    config = (model / "config.json").read_text()
    assert str(ems_model_dir / "phrase-table.1.gz") in config  # trained on the table EMS built

    again = run("ems-config", *TRAINING, ini_in, ini_out, "-Binarizer", "")
    assert again.exit_code == 0, again.output
    assert "(finished before)" in again.stderr and "(annotated)" not in again.stderr

    # A step stopped early (here: by a lower limit) resumes from its checkpoint when run again.
    longer = [*TRAINING[:2], "--max-steps", "9", *TRAINING[4:]]
    resumed = run("ems-config", *longer, ini_in, ini_out, "-Binarizer", "")
    assert resumed.exit_code == 0, resumed.output
    assert "(resumed)" in resumed.stderr and "(annotated)" in resumed.stderr  # new weights, new table


def test_errors_are_one_line(ems_model_dir, tiny_model, tmp_path):
    ini_in = ems_model_dir / "moses.ini.1"
    out = ems_model_dir / "moses.bin.ini.1"
    line = one_error_line(run("ems-config", "--model", tiny_model, "--preset", "tiny", ini_in, out, "-Binarizer", ""))
    assert "--model takes a trained model" in line and "--preset" in line
    line = one_error_line(run("ems-config", "--model", tiny_model, ini_in, ini_in, "-Binarizer", ""))
    assert "is the same file as the input config" in line
    link = ems_model_dir / "link.ini"
    os.symlink(ini_in, link)
    line = one_error_line(run("ems-config", "--model", tiny_model, ini_in, link, "-Binarizer", ""))
    assert "is the same file as the input config" in line and "(through a link)" in line
    line = one_error_line(run("ems-config", "--model", tiny_model, ini_in, out, "-Binarizer", "/usr/bin/gzip"))
    assert "not a phrase-table binariser" in line

    os.unlink(ems_model_dir / "phrase-table.1.gz")
    line = one_error_line(run("ems-config", "--model", tiny_model, ini_in, out, "-Binarizer", ""))
    assert str(ini_in) in line and "phrase-table.1 does not exist" in line
    assert not out.exists()

    binary = tmp_path / "binary.ini"
    binary.write_text(ini_in.read_text().replace("PhraseDictionaryMemory", "PhraseDictionaryCompact"))
    line = one_error_line(run("ems-config", "--model", tiny_model, binary, out, "-Binarizer", ""))
    assert "PhraseDictionaryCompact" in line and "text table" in line


def test_binary_suffixes_cover_every_binarizer():
    from phrase_scorer.moses.binarise import BINARIZERS

    assert set(BINARY_SUFFIXES) == set(BINARIZERS)
