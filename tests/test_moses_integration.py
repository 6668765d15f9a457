"""The real Moses decoder on annotated tables and patched configs (marker `moses`).

Run with `make test-moses`, MOSES_HOME pointing to a Moses build (bin/moses, bin/ mert tools,
scripts/), and ../shared beside the repository for the Multi30k system.
"""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

import pytest

from conftest import SHARED, SHARED_SYSTEM, SHARED_TABLE, assert_translates

pytestmark = pytest.mark.moses

TEST_EN = SHARED / "multi30k-en-fr" / "test_2016_flickr.tok.en.gz"
TEST_FR = SHARED / "multi30k-en-fr" / "test_2016_flickr.tok.fr.gz"
VAL_EN = SHARED / "multi30k-en-fr" / "val.tok.en.gz"
VAL_FR = SHARED / "multi30k-en-fr" / "val.tok.fr.gz"


@pytest.fixture(scope="module")
def annotated_table(tmp_path_factory, loaded_tiny):
    """The whole Multi30k phrase table with the tiny model's two columns."""
    from phrase_scorer.scoring.annotate import annotate

    out = tmp_path_factory.mktemp("annotated") / "phrase-table.rnn.gz"
    annotate(SHARED_TABLE, out, loaded_tiny)
    return out


def first_lines(path: Path, n: int, out: Path) -> Path:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(n)]
    out.write_text("".join(lines), encoding="utf-8")
    return out


def decode(moses, ini: Path, source: Path, *extra: str, program: str = "moses") -> list:
    """Translate ``source`` with ``MOSES_HOME/bin/PROGRAM`` (moses or moses2) and ``ini``."""
    with open(source, "rb") as stdin:
        result = subprocess.run([str(moses.decoder(program)), "-f", str(ini), "-threads", "2", "-v", "0", *extra],
                                stdin=stdin, capture_output=True, cwd=ini.parent)
    assert result.returncode == 0, f"{program} failed: {result.stderr.decode('utf-8', 'replace')[-3000:]}"
    return result.stdout.decode("utf-8").splitlines()


@pytest.fixture(scope="module")
def rnnsearch_slice(tmp_path_factory):
    """The pairs of the table for the first 60 test sentences, and that slice annotated by a tiny
    RNNsearch model trained on it."""
    from phrase_scorer.scoring.annotate import annotate
    from phrase_scorer.config import TrainConfig
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.training.run import train

    work = tmp_path_factory.mktemp("rnnsearch")
    source = first_lines(TEST_EN, 60, work / "test.en")
    table = table_for_sentences(SHARED_TABLE, source.read_text().splitlines(), work / "pt.gz")
    train(table, work / "model", TrainConfig(arch="rnnsearch", preset="tiny", max_steps=40, valid_every=20,
                                             valid_pairs=200, seed=3))
    annotated = work / "pt.rnn.gz"
    annotate(table, annotated, load_model(work / "model"))
    return table, annotated


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_annotated_table_loads_and_translates(moses, arch, request, tmp_path):
    """Moses loads a table annotated by each architecture and uses its new columns: the whole
    table annotated by the tiny encoder-decoder, or the test sentences' slice annotated by a tiny
    RNNsearch trained on that slice."""
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini

    if arch == "encdec":
        table, annotated_table = SHARED_TABLE, request.getfixturevalue("annotated_table")
    else:
        table, annotated_table = request.getfixturevalue("rnnsearch_slice")
    source = first_lines(TEST_EN, 60, tmp_path / "test.en")
    baseline_ini = tmp_path / "baseline.ini"
    patch_moses_ini(SHARED_SYSTEM / "moses.tuned.ini", baseline_ini, phrase_table=table,
                    options=MosesIniOptions(add_features=0, absolute_paths=True))
    zero_ini = tmp_path / "rnn-zero.ini"
    result = patch_moses_ini(SHARED_SYSTEM / "moses.tuned.ini", zero_ini, phrase_table=annotated_table,
                             options=MosesIniOptions(add_features=2, initial_weights=0.0, absolute_paths=True))
    assert result.new_num_features == 6
    baseline = decode(moses, baseline_ini, source)
    with_zero_weights = decode(moses, zero_ini, source)
    # the table is used (not passed through), and with zero weights the new columns change nothing
    sources = source.read_text().splitlines()
    assert sum(h.split() != s.split() for h, s in zip(baseline, sources)) >= 55
    assert with_zero_weights == baseline

    weighted_ini = tmp_path / "rnn.ini"
    patch_moses_ini(SHARED_SYSTEM / "moses.tuned.ini", weighted_ini, phrase_table=annotated_table,
                    options=MosesIniOptions(add_features=2, initial_weights=0.1, absolute_paths=True))
    nbest = tmp_path / "nbest.txt"
    decode(moses, weighted_ini, source, "-n-best-list", str(nbest), "5")
    from phrase_scorer.io.nbest import read_nbest

    entries = list(read_nbest(nbest))
    assert {e.sentence_id for e in entries} == set(range(60))
    for entry in entries:
        tm = entry.feature("TranslationModel0")
        assert len(tm) == 6
        assert tm[4] < 0  # sum over the phrases used of log p(y|x)
        assert tm[5] >= 0 and abs(tm[5] - round(tm[5])) < 1e-3  # the unknown-word count


def test_patch_tune_and_evaluate(moses, annotated_table, tmp_path):
    from phrase_scorer.config import TuneOptions
    from phrase_scorer.io.moses_ini import MosesIni
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini
    from phrase_scorer.moses.evaluate import evaluate, score
    from phrase_scorer.moses.installation import read_lines
    from phrase_scorer.moses.tune import tune

    ini = tmp_path / "rnn.ini"
    patch_moses_ini(SHARED_SYSTEM / "moses.ini", ini, phrase_table=annotated_table,
                    options=MosesIniOptions(absolute_paths=True))
    dev_src = first_lines(VAL_EN, 25, tmp_path / "dev.en")
    dev_ref = first_lines(VAL_FR, 25, tmp_path / "dev.fr")
    tuned = tmp_path / "tuned.ini"
    mertdir = tmp_path / "mert-programs"  # mert's programs in a folder of their own (--mertdir)
    mertdir.mkdir()
    for name in ("extractor", "mert", "kbmira", "pro", "evaluator"):
        (mertdir / name).symlink_to(moses.bin / name)
    result = tune(ini, dev_src, dev_ref, tuned, moses=moses,
                  options=TuneOptions(max_iterations=1, decoder_flags="-v 0 -s 100", nbest=20, mertdir=str(mertdir)))
    assert [it for it, _ in result.iterations] == [1]
    assert f"--mertdir {mertdir}" in (Path(result.working_dir) / "tune.log").read_text()
    # MERT's dev BLEU, above that of the untranslated dev sentences (no absolute BLEU: after one
    # tuning iteration with a tiny model trained in this session, it depends on the model's weights,
    # which differ between CPUs and library builds)
    untranslated_dev = score(read_lines(dev_src), read_lines(dev_ref), kind="tokenized")  # as MERT scores
    assert untranslated_dev.bleu < result.dev_bleu < 100
    weights = MosesIni.read(tuned).weight_line("TranslationModel0").weights
    assert len(weights) == 6
    test_src = first_lines(TEST_EN, 40, tmp_path / "test.en")
    test_ref = first_lines(TEST_FR, 40, tmp_path / "test.fr")
    evaluation = evaluate(tuned, test_src, test_ref, tmp_path / "test.hyp", moses=moses)
    assert evaluation.references == "tokenized"
    assert "tok:none" in evaluation.bleu_signature
    hypotheses, sources, references = (read_lines(f) for f in (tmp_path / "test.hyp", test_src, test_ref))
    assert len(hypotheses) == 40
    # the decode is a translation, and evaluate scored it: BLEU and chrF above the untranslated input's
    assert_translates(hypotheses, sources, references)
    untranslated = score(sources, references)
    assert untranslated.bleu < evaluation.bleu < 100 and untranslated.chrf < evaluation.chrf < 100
    assert evaluation.bleu == score(hypotheses, references).bleu


def test_experiment_end_to_end_and_resume(moses, annotated_table, tmp_path):
    """The Table 1 comparison on slices: three systems, one tuning run each, a report; a second
    call reuses every finished run."""
    from phrase_scorer.config import ExperimentOptions, TuneOptions
    from phrase_scorer.moses.evaluate import Decoding, decode
    from phrase_scorer.experiments.experiment import run_experiment
    from phrase_scorer.experiments.report import ExperimentOutputs
    from phrase_scorer.moses.installation import read_lines

    dev = (first_lines(VAL_EN, 20, tmp_path / "dev.en"), first_lines(VAL_FR, 20, tmp_path / "dev.fr"))
    test = (first_lines(TEST_EN, 30, tmp_path / "test.en"), first_lines(TEST_FR, 30, tmp_path / "test.fr"))
    flags = "-v 0 -s 100 -max-phrase-length 2"  # far from Moses' defaults, so that decoding without them shows
    options = ExperimentOptions(runs=1, bootstrap_samples=100,
                                tune=TuneOptions(max_iterations=1, decoder_flags=flags, nbest=20))
    report = run_experiment(SHARED_SYSTEM / "moses.ini", dev, test, ExperimentOutputs(tmp_path / "work"), moses=moses,
                            annotated=annotated_table, options=options)
    assert [r.system for r in report.runs] == ["Baseline", "RNN", "RNN + WP"]
    assert all(0 < r.test_bleu < 100 for r in report.runs)
    # the test set was decoded with the decoder flags the tuning used
    redo = decode(report.runs[2].tuned_ini, test[0], tmp_path / "redo.hyp", moses=moses,
                  decoding=Decoding(decoder_flags=flags))
    assert redo == read_lines(report.runs[2].hypotheses)
    assert set(report.significance) == {"RNN", "RNN + WP"}
    assert all(0 <= p <= 1 for ps in report.significance.values() for p in ps)
    for row in ("| Baseline |", "| RNN |", "| RNN + WP |", "weight of log p(y\\|x)", "sacrebleu signatures"):
        assert row in report.markdown
    five = tmp_path / "work" / "tables" / "phrase-table.rnn.gz"
    with gzip.open(five, "rt") as f:
        assert len(f.readline().split("|||")[2].split()) == 5
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "work").glob("*/run-1/result.json")}
    again = run_experiment(SHARED_SYSTEM / "moses.ini", dev, test, ExperimentOutputs(tmp_path / "work"), moses=moses,
                           annotated=annotated_table, options=options)
    assert [r.test_bleu for r in again.runs] == [r.test_bleu for r in report.runs]
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # nothing was tuned again


# --- binarised tables and Moses2 -------------------------------------------------------------------

BINARY_SENTENCES = 15
TABLE_LIMIT = 20  # Moses' default table-limit


def table_for_sentences(table: Path, sentences: list, out: Path, minimum: int = 1000) -> Path:
    """The lines of ``table`` whose source phrase occurs in ``sentences``, in table order (what
    filter-model-given-input.pl keeps), so that binarising takes seconds.

    At most TABLE_LIMIT targets are kept per source, so that no table type prunes any: a text
    table keeps the best ``table-limit`` targets by their weighted score, an OnDisk table the
    first ones in the order CreateOnDiskPt sorted them (by p(e|f)), and the two would otherwise
    decode differently whatever the new columns hold.
    """
    phrases = {" ".join(words[i:j]) for words in (s.split() for s in sentences)
               for i in range(len(words)) for j in range(i + 1, min(len(words), i + 7) + 1)}
    kept, previous, targets = 0, None, 0
    with gzip.open(table, "rb") as f, gzip.open(out, "wb") as o:
        for line in f:
            source = line.split(b" ||| ", 1)[0]
            targets = targets + 1 if source == previous else 1
            previous = source
            if targets <= TABLE_LIMIT and source.decode("utf-8") in phrases:
                o.write(line)
                kept += 1
    assert kept > minimum
    return out


@pytest.fixture(scope="module")
def binary_case(moses, annotated_table, tmp_path_factory):
    """A slice of the annotated table for the first test sentences, and the text table's n-best list."""
    from phrase_scorer.moses.tune import with_absolute_paths

    work = tmp_path_factory.mktemp("binary")
    source = first_lines(TEST_EN, BINARY_SENTENCES, work / "test.en")
    table = table_for_sentences(annotated_table, source.read_text().splitlines(), work / "pt.rnn.gz")
    # the tuned system with absolute paths, its phrase table declared as each type in turn
    with_absolute_paths(SHARED_SYSTEM / "moses.tuned.ini", work / "system.ini")
    case = {"work": work, "source": source, "table": table, "system": work / "system.ini"}
    case["nbest"] = work / "memory.nbest"
    decode(moses, patched_system(moses, case, "PhraseDictionaryMemory", "memory"), source,
           "-n-best-list", str(case["nbest"]), "10")
    return case


def patched_system(moses, case: dict, table_type: str, name: str) -> Path:
    """The system with its phrase table declared as ``table_type`` and patched by
    ``patch_moses_ini`` for the slice's six scores (binarised into ``pt.NAME`` for binary types)."""
    from phrase_scorer.io.moses_ini import MosesIni
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini

    work = case["work"]
    declared = work / f"{name}.ini"
    declared.write_text(case["system"].read_text().replace("PhraseDictionaryMemory ", f"{table_type} "))
    patched = work / f"{name}.rnn.ini"
    if table_type == "PhraseDictionaryMemory":
        result = patch_moses_ini(declared, patched, phrase_table=case["table"],
                                 options=MosesIniOptions(add_features=2, initial_weights=0.1))
    else:
        suffix = ".minphr" if table_type == "PhraseDictionaryCompact" else ""
        result = patch_moses_ini(declared, patched, phrase_table=work / f"pt.{name}{suffix}",
                                 options=MosesIniOptions(add_features=2, initial_weights=0.1),
                                 binarize_from=case["table"], moses_home=moses.home)
        assert result.binarize_command
    assert result.new_num_features == 6
    assert MosesIni.read(patched).find_phrase_table().type == table_type
    return patched


def nbest_by_sentence(path: Path) -> dict:
    from phrase_scorer.io.nbest import dense_feature_vector, group_by_sentence, read_nbest

    return {sid: [(e.text, dense_feature_vector(e)) for e in entries]
            for sid, entries in group_by_sentence(read_nbest(path))}


def nbest_features_by_name(path: Path) -> dict:
    """Sentence id -> [(hypothesis, {dense feature name: values})], in n-best order."""
    from phrase_scorer.io.nbest import group_by_sentence, read_nbest

    return {sid: [(e.text, {name: values for name, values in e.features if "_" not in name}) for e in entries]
            for sid, entries in group_by_sentence(read_nbest(path))}


@pytest.mark.parametrize("table_type", ["PhraseDictionaryCompact", "ProbingPT", "PhraseDictionaryOnDisk"])
def test_binarised_tables_decode_like_the_text_table(moses, binary_case, table_type):
    """moses-ini --binarize-from builds each binary table with six scores, and Moses decoding with
    it gives the text table's n-best lists: the same hypotheses with the same feature values."""
    from phrase_scorer.moses.binarise import BINARIZERS

    if not os.access(os.path.join(moses.home, "bin", BINARIZERS[table_type]), os.X_OK):
        pytest.skip(f"{BINARIZERS[table_type]} is not built in {moses.home}/bin")
    patched = patched_system(moses, binary_case, table_type, table_type)
    nbest = binary_case["work"] / f"{table_type}.nbest"
    decode(moses, patched, binary_case["source"], "-n-best-list", str(nbest), "10")

    expected, got = nbest_by_sentence(binary_case["nbest"]), nbest_by_sentence(nbest)
    assert set(got) == set(range(BINARY_SENTENCES))
    for sid, entries in expected.items():
        # the best hypothesis and its features agree (scores stored as 32-bit floats)
        (text, features), (got_text, got_features) = entries[0], got[sid][0]
        assert got_text == text, sid
        assert got_features == pytest.approx(features, rel=1e-4, abs=1e-4), sid


def require_moses2(moses) -> Path:
    moses2 = moses.bin / "moses2"
    if not moses2.exists():
        pytest.skip(f"this Moses build has no {moses2} (build Moses with its moses2 target to run the Moses2 tests)")
    return moses2


def test_moses2_decodes_with_the_patched_config_and_the_annotated_table(moses, binary_case):
    """bin/moses2 itself (not bin/moses) decodes with the patched config, for the text table and
    ProbingPT (the two table types Moses2 knows), sees six TranslationModel0 scores, and gives the
    n-best lists that Moses 1 gives with the same config: same hypotheses, same feature values."""
    from phrase_scorer.io.nbest import read_nbest

    require_moses2(moses)
    outputs = {}
    for table_type in ("PhraseDictionaryMemory", "ProbingPT"):
        patched = patched_system(moses, binary_case, table_type, f"moses2-{table_type}")
        nbest = binary_case["work"] / f"moses2-{table_type}.nbest"
        outputs[table_type] = decode(moses, patched, binary_case["source"], "-n-best-list", str(nbest), "10",
                                     program="moses2")
        assert len(outputs[table_type]) == BINARY_SENTENCES
        got = nbest_features_by_name(nbest)
        assert set(got) == set(range(BINARY_SENTENCES))
        for entry in read_nbest(nbest):
            tm = entry.feature("TranslationModel0")
            assert len(tm) == 6 and tm[4] < 0 and tm[5] >= 0
        # Moses 1 on the text table: the same best hypotheses with the same feature values (by
        # name: Moses2 lists the features in another order)
        for sid, entries in nbest_features_by_name(binary_case["nbest"]).items():
            (text, features), (got_text, got_features) = entries[0], got[sid][0]
            assert got_text == text, (table_type, sid)
            assert set(got_features) == set(features), (table_type, sid)
            for name, values in features.items():
                assert got_features[name] == pytest.approx(values, rel=1e-4, abs=1e-4), (table_type, sid, name)
    assert outputs["ProbingPT"] == outputs["PhraseDictionaryMemory"]
    sources = binary_case["source"].read_text().splitlines()
    assert sum(h.split() != s.split() for h, s in zip(outputs["ProbingPT"], sources)) >= BINARY_SENTENCES - 2


def test_moses2_features_are_the_log_of_the_annotated_columns(moses, annotated_table, tmp_path):
    """One-word sentences are translated by exactly one phrase pair, so each n-best entry's six
    TranslationModel0 values must be the natural log of that pair's six columns in the annotated
    table (floored at -100): the model's p(y|x) column and e^n_unk included."""
    import math

    from phrase_scorer.io.moses_ini import MosesIni
    from phrase_scorer.config import MosesIniOptions
    from phrase_scorer.moses.ini_patch import patch_moses_ini
    from phrase_scorer.io.nbest import read_nbest
    from phrase_scorer.io.phrase_table import read_phrase_table
    from phrase_scorer.moses.tune import with_absolute_paths

    require_moses2(moses)
    words = ["man", "dog", "woman", "girl", "street", "water"]
    source = tmp_path / "words.en"
    source.write_text("\n".join(words) + "\n")
    table = table_for_sentences(annotated_table, words, tmp_path / "pt.rnn.gz", minimum=len(words))
    columns = {(l.source, l.target): l.scores for l in read_phrase_table(table)}
    with_absolute_paths(SHARED_SYSTEM / "moses.tuned.ini", tmp_path / "system.ini")
    ini = tmp_path / "moses2.ini"
    result = patch_moses_ini(tmp_path / "system.ini", ini, phrase_table=table,
                             options=MosesIniOptions(absolute_paths=True))
    assert result.new_num_features == 6
    assert MosesIni.read(ini).find_phrase_table().get("path") == str(table)
    nbest = tmp_path / "words.nbest"
    decode(moses, ini, source, "-n-best-list", str(nbest), "20", program="moses2")
    checked = 0
    for entry in read_nbest(nbest):
        word = words[entry.sentence_id]
        scores = columns.get((word, entry.text.strip()))
        assert scores is not None, f"{word!r} -> {entry.text!r} is not a pair of the annotated table"
        expected = [max(math.log(v), -100.0) for v in scores]
        assert entry.feature("TranslationModel0") == pytest.approx(expected, rel=1e-4, abs=1e-4), (word, entry.text)
        checked += 1
    assert checked >= 3 * len(words)
