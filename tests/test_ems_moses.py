"""Moses' Experiment Management System with the documented config blocks (marker `moses`).

The first test needs only MOSES_HOME/scripts (experiment.perl and Perl): EMS runs the
``binarize-config`` step alone on a given moses.ini, and its own re-use planning is checked.
The second (also `slow`) is a whole EMS run:

EMS (MOSES_HOME/scripts/ems/experiment.perl) builds a phrase-based system from 3,000 Multi30k
sentence pairs, starting from the given word alignment and language model (so no GIZA++ and no
LM training), with moses_configs/ems/text-table.config appended to its config: the
``binarize-config`` step trains a tiny model and annotates the table, MERT tunes for one
iteration on 100 dev sentences, and 100 test sentences are decoded and scored. Then EMS's own
re-use planning (experiment.perl without -exec) is checked, and a second run switches to the
compact binary table with a changed model option.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from conftest import A_MAN_TABLE, DATA, ROOT, SHARED, SHARED_SYSTEM, assert_translates, require_shared
from phrase_scorer.io.moses_ini import MosesIni

pytestmark = pytest.mark.moses

CORPUS = SHARED / "multi30k-en-fr"
BLOCKS = ROOT / "moses_configs" / "ems"
DOCUMENTED = "phrase-scorer ems-config --preset small"
TRAIN_SENTENCES, DEV_SENTENCES, TEST_SENTENCES = 3000, 100, 100
# train-model.perl steps 4-9 and tuning need these; GIZA++ is not needed with the alignment given
PROGRAMS = ("moses", "extract", "score", "consolidate", "lexical-reordering-score",
            "extractor", "mert", "kbmira", "pro", "evaluator")
STEPS_AFTER_CREATE_CONFIG = {"TRAINING:binarize-config", "TUNING:tune", "TUNING:apply-weights",
                             "EVALUATION:test:decode", "EVALUATION:test:multi-bleu", "REPORTING:report"}


@pytest.fixture(scope="module")
def moses_scripts() -> Path:
    home = os.environ.get("MOSES_HOME")
    if not home or not (Path(home) / "scripts" / "ems" / "experiment.perl").is_file():
        pytest.skip("set MOSES_HOME to a Moses build whose scripts/ems/experiment.perl exists to run the EMS tests")
    return Path(home).resolve()


@pytest.fixture(scope="module")
def moses_home(moses_scripts) -> Path:
    require_shared()
    missing = [p for p in PROGRAMS if not os.access(moses_scripts / "bin" / p, os.X_OK)]
    if missing:
        pytest.skip(f"the Moses build in {moses_scripts} lacks bin/{', bin/'.join(missing)}")
    return moses_scripts


def write_slice(source: Path, out: Path, lines: int) -> Path:
    with gzip.open(source, "rt", encoding="utf-8") as f:
        out.write_text("".join(islice(f, lines)), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ems-data")
    for side in ("en", "fr"):
        write_slice(CORPUS / f"train.tok.{side}.gz", folder / f"train.{side}", TRAIN_SENTENCES)
        write_slice(CORPUS / f"val.tok.{side}.gz", folder / f"dev.{side}", DEV_SENTENCES)
        write_slice(CORPUS / f"test_2016_flickr.tok.{side}.gz", folder / f"test.{side}", TEST_SENTENCES)
    # the alignment of the same sentences; EMS reads word-alignment + "." + the symmetrisation
    write_slice(SHARED_SYSTEM / "aligned.grow-diag-final-and.gz", folder / "aligned.grow-diag-final-and",
                TRAIN_SENTENCES)
    return folder


def base_config(moses_home: Path, data: Path, work: Path) -> str:
    return f"""[GENERAL]
working-dir = {work}
moses-src-dir = {moses_home}
moses-script-dir = $moses-src-dir/scripts
moses-bin-dir = $moses-src-dir/bin
external-bin-dir = $moses-bin-dir
input-extension = en
output-extension = fr
pair-extension = en-fr
decoder = $moses-bin-dir/moses
data = {data}

[CORPUS]

[LM]
[LM:multi30k]
lm = {SHARED_SYSTEM / "lm.arpa.gz"}
order = 5
type = 8

[TRAINING]
script = $moses-script-dir/training/train-model.perl
corpus = $data/train
word-alignment = $data/aligned
alignment-symmetrization-method = grow-diag-final-and
lexicalized-reordering = msd-bidirectional-fe
max-phrase-length = 5

[TUNING]
tuning-script = $moses-script-dir/training/mert-moses.pl
tuning-settings = "-mertdir $moses-bin-dir --maximum-iterations 1"
input = $data/dev.en
reference = $data/dev.fr
nbest = 100
decoder-settings = "-threads 2"

[EVALUATION]
decoder-settings = "-threads 2"
multi-bleu = "$moses-script-dir/generic/multi-bleu.perl -lc"
[EVALUATION:test]
input = $data/test.en
tokenized-reference = $data/test.fr

[REPORTING]
"""


def with_block(base: str, block: Path, options: str) -> str:
    """The base config with a documented block appended, its command made to run this checkout
    with the test's model options."""
    text = block.read_text(encoding="utf-8")
    assert DOCUMENTED in text
    return base + "\n" + text.replace(DOCUMENTED, f"{sys.executable} -m phrase_scorer ems-config {options}")


def experiment(moses_home: Path, config: Path, *flags: str, timeout: int = 1800) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        ["perl", str(moses_home / "scripts" / "ems" / "experiment.perl"), "-config", str(config), "-no-graph", *flags],
        capture_output=True, text=True, cwd=config.parent, env=env, timeout=timeout,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "ERROR" not in output, output[-4000:]
    return output


def plan(output: str) -> dict:
    """EMS's STEP SUMMARY: step -> 'run' or 're-using (N)'."""
    summary = output.split("STEP SUMMARY:", 1)[1]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^\d+ (\S+) ->\s+(.+)$", summary, re.M)}


def crashed_report(work: Path) -> str:
    reports = []
    for digest in sorted((work / "steps").glob("*/*.STDERR.digest")):
        if digest.read_text().strip():
            stderr = Path(str(digest)[: -len(".digest")]).read_text(errors="replace")
            reports.append(f"{digest.name}: {digest.read_text().strip()}\n{stderr[-3000:]}")
    return "\n".join(reports)


def run_to_the_end(moses_home: Path, config: Path, work: Path, version: int) -> None:
    output = experiment(moses_home, config, "-exec")
    bleu = work / "evaluation" / f"test.multi-bleu.{version}"
    assert "crashed" not in output and bleu.exists(), output[-3000:] + "\n" + crashed_report(work)


def tuned_weights(path: Path) -> list:
    return MosesIni.read(path).weight_line("TranslationModel0").weights


def test_ems_runs_the_step_and_reruns_it_only_for_a_changed_option(moses_scripts, tmp_path):
    """EMS from a given moses.ini ([TRAINING] config) up to binarize-config: the documented block,
    EMS's own argument shape and quoting, its crash check on the step's stderr, its re-use rule."""
    system = tmp_path / "system"
    system.mkdir()
    shutil.copy(A_MAN_TABLE, system / "phrase-table.gz")
    (system / "moses.ini").write_text((DATA / "moses.ini").read_text().replace(
        "path=phrase-table.gz", f"path={system / 'phrase-table'}"))  # the stem, as EMS names tables
    work = tmp_path / "work"
    work.mkdir()
    base = f"""[GENERAL]
working-dir = {work}
moses-src-dir = {moses_scripts}
moses-script-dir = $moses-src-dir/scripts
input-extension = en
output-extension = fr
[TRAINING]
config = {system / "moses.ini"}
"""
    options = "--preset tiny --max-steps 6 --valid-every 3 --valid-pairs 50 --batch-size 16 --threads 1"
    config = tmp_path / "config"
    config.write_text(with_block(base, BLOCKS / "text-table.config", options))
    step = ("-final-step", "TRAINING:binarize-config")

    output = experiment(moses_scripts, config, "-exec", *step)
    done = work / "steps" / "1" / "TRAINING_binarize-config.1.DONE"
    assert done.exists() and "crashed" not in output, output[-3000:] + crashed_report(work)
    written = MosesIni.read(work / "model" / "moses.bin.ini.1")
    table = written.find_phrase_table()
    assert table.get("num-features") == "6" and len(written.weight_line(table.name).weights) == 6
    assert table.get("path") == str(work / "model" / "moses.bin.ini.1.phrase-table.gz")

    assert plan(experiment(moses_scripts, config, *step)) == {"TRAINING:binarize-config": "re-using (1)"}
    changed = tmp_path / "config.seed"
    changed.write_text(with_block(base, BLOCKS / "text-table.config", options + " --seed 2"))
    assert plan(experiment(moses_scripts, changed, *step)) == {"TRAINING:binarize-config": "run"}
    # ttable-binarizer alone is not tracked by EMS (so the docs say to change binarize-all too)
    binarizer_only = tmp_path / "config.binarizer"
    binarizer_only.write_text(config.read_text().replace('ttable-binarizer = ""', "ttable-binarizer = none"))
    assert plan(experiment(moses_scripts, binarizer_only, *step)) == {"TRAINING:binarize-config": "re-using (1)"}


@pytest.mark.slow
def test_ems_run_tunes_and_evaluates_the_new_features(moses_home, data, tmp_path):
    work = tmp_path / "work"
    # With the word alignment given, EMS starts build-lex-trans and extract-phrases together, and
    # build-lex-trans writes into model/ before extract-phrases has made it (train-model.perl then
    # cannot write lex.1.f2e), depending on which starts first; the skipped GIZA++ step would
    # have made the folder.
    (work / "model").mkdir(parents=True)
    base = base_config(moses_home, data, work)
    config = tmp_path / "config.text"
    config.write_text(with_block(base, BLOCKS / "text-table.config", "--preset tiny --max-steps 200 --valid-every 100"))

    run_to_the_end(moses_home, config, work, version=1)

    # The config tuning and evaluation use: the annotated text table, six features, six weights.
    system = MosesIni.read(work / "model" / "moses.bin.ini.1")
    table = system.find_phrase_table()
    assert (table.type, table.get("num-features")) == ("PhraseDictionaryMemory", "6")
    assert table.get("path") == str(work / "model" / "moses.bin.ini.1.phrase-table.gz")
    start = tuned_weights(work / "model" / "moses.bin.ini.1")
    assert len(start) == 6
    with gzip.open(table.get("path"), "rt", encoding="utf-8") as f:
        assert all(len(line.split(" ||| ")[2].split()) == 6 for line in islice(f, 1000))
    # create-config's own moses.ini is left as train-model.perl wrote it
    assert MosesIni.read(work / "model" / "moses.ini.1").find_phrase_table().get("num-features") == "4"

    # Tuning gave the two new features weights of their own.
    tuned = tuned_weights(work / "tuning" / "moses.tuned.ini.1")
    assert len(tuned) == 6 and tuned[4:] != start[4:] and all(w == w for w in tuned)
    assert "MERT optimized" in (work / "tuning" / "moses.ini.1").read_text()
    # Evaluation decoded the test set with it, one line per sentence, and scored it (multi-bleu.perl's
    # line); the output is a translation, far above the untranslated input by the same BLEU. No
    # absolute BLEU: after one tuning iteration with a tiny model trained here, it depends on the
    # model's weights, which differ between CPUs and library builds.
    score = (work / "evaluation" / "test.multi-bleu.1").read_text()
    assert re.search(r"BLEU = [\d.]+, [\d.]+/[\d.]+/[\d.]+/[\d.]+ ", score), score
    hypotheses = (work / "evaluation" / "test.output.1").read_text(encoding="utf-8").splitlines()
    sources = (data / "test.en").read_text(encoding="utf-8").splitlines()
    references = (data / "test.fr").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == TEST_SENTENCES
    assert_translates(hypotheses, sources, references)

    # EMS with nothing changed re-uses every step.
    again = plan(experiment(moses_home, config))
    assert again and all(state.startswith("re-using") for state in again.values()), again

    # A changed model option re-runs this step and what depends on it, and nothing before it.
    compact = tmp_path / "config.compact"
    compact.write_text(with_block(base, BLOCKS / "compact-table.config",
                                  "--preset tiny --max-steps 200 --valid-every 100 --seed 2"))
    planned = plan(experiment(moses_home, compact))
    assert {step for step, state in planned.items() if state == "run"} == STEPS_AFTER_CREATE_CONFIG, planned

    if not os.access(moses_home / "bin" / "processPhraseTableMin", os.X_OK):
        pytest.skip("this Moses build has no processPhraseTableMin (built without --with-cmph): "
                    "the compact-table run is left out")
    run_to_the_end(moses_home, compact, work, version=2)
    system = MosesIni.read(work / "model" / "moses.bin.ini.2")
    table = system.find_phrase_table()
    assert (table.type, table.get("num-features")) == ("PhraseDictionaryCompact", "6")
    assert Path(table.get("path")).is_file() and table.get("path").endswith(".minphr")
    assert len(tuned_weights(work / "tuning" / "moses.tuned.ini.2")) == 6
    assert re.search(r"BLEU = [\d.]+", (work / "evaluation" / "test.multi-bleu.2").read_text())


RERANKING = "phrase-scorer ems-decoder --preset small"
RERANKED_OPTIONS = ("--preset tiny --max-steps 40 --valid-every 20 --vocabulary words --device cpu --nbest-size 10 "
                    "--decoder-threads 2 --threads 1")
STEPS_AFTER_DECODE = {"EVALUATION:test:decode", "EVALUATION:test:multi-bleu", "REPORTING:report"}


def reranking_config(base: str, options: str) -> str:
    text = (BLOCKS / "reranking.config").read_text(encoding="utf-8")
    assert RERANKING in text
    return base + "\n" + text.replace(RERANKING, f"{sys.executable} -m phrase_scorer ems-decoder {options}")


@pytest.mark.slow
def test_ems_evaluation_translates_through_the_reranked_system(moses_home, data, tmp_path):
    """The documented [EVALUATION] line: EMS builds and tunes the system as usual, then its
    evaluation trains the models on EMS's corpus, tunes the reranker on EMS's tuning set and writes
    the reranked translation, which EMS scores; a changed rescoring option re-runs only the
    evaluation, and the build then trains nothing."""
    import json

    work = tmp_path / "work"
    (work / "model").mkdir(parents=True)  # see test_ems_run_tunes_and_evaluates_the_new_features
    base = base_config(moses_home, data, work)
    config = tmp_path / "config.reranked"
    config.write_text(reranking_config(base, RERANKED_OPTIONS + " --runs 1"))
    run_to_the_end(moses_home, config, work, version=1)

    build = work / "rescoring"
    results = json.loads((build / "results.json").read_text(encoding="utf-8"))
    assert set(results["models"]) == {"forward", "right-to-left"}  # the defaults' two
    # the tuning set is EMS's, as Moses read it: its list has one block per dev sentence
    nbest = next((build / "nbest").glob("*.nbest"))
    ids = {line.split(" ||| ", 1)[0] for line in nbest.read_text(encoding="utf-8").splitlines()}
    assert len(ids) == DEV_SENTENCES
    # EMS's output is the reranked translation of its input with its config, line for line
    script = (work / "steps" / "1" / "EVALUATION_test_decode.1").read_text(encoding="utf-8")
    call = next(line for line in script.splitlines() if "ems-decoder" in line)
    ini = re.search(r" -f (\S+)", call).group(1)
    source = re.search(r" < (\S+)", call).group(1)
    direct = tmp_path / "direct.fr"
    subprocess.run([sys.executable, "-m", "phrase_scorer", "translate-system", "--moses", ini, "--reranker",
                    str(build / "reranker.json"), source, "-o", str(direct), "--threads", "1"],
                   check=True, capture_output=True, cwd=work,
                   env=dict(os.environ, MOSES_HOME=str(moses_home), PYTHONPATH=str(ROOT)))
    output = work / "evaluation" / "test.output.1"
    assert output.read_bytes() == direct.read_bytes()
    assert len(output.read_text(encoding="utf-8").splitlines()) == TEST_SENTENCES
    assert re.search(r"BLEU = [\d.]+", (work / "evaluation" / "test.multi-bleu.1").read_text())

    # Nothing changed: EMS re-uses every step. A changed rescoring option: only the evaluation
    # re-runs, and the build re-tunes without training again.
    again = plan(experiment(moses_home, config))
    assert again and all(state.startswith("re-using") for state in again.values()), again
    trained = {p: p.stat().st_mtime_ns for p in (build / "models").glob("*/model.pt")}
    config.write_text(reranking_config(base, RERANKED_OPTIONS + " --runs 2"))
    planned = plan(experiment(moses_home, config))
    assert {step for step, state in planned.items() if state == "run"} == STEPS_AFTER_DECODE, planned
    run_to_the_end(moses_home, config, work, version=2)
    assert trained == {p: p.stat().st_mtime_ns for p in (build / "models").glob("*/model.pt")}
    results = json.loads((build / "results.json").read_text(encoding="utf-8"))
    assert all(len(seeds) == 2 for seeds in results["tuning BLEU per seed"].values())
