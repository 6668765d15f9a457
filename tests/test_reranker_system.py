"""A reranker against the system it is used on: a moses.ini whose dense features are not those the
reranker weights (one missing, one added, another number of values), or another system than the
one it was tuned for (another language pair's, whose weights differ), is refused in one line
naming the ini, the reranker and the feature, before Moses decodes anything. No Moses build
needed: a stand-in decoder records whether it was ever started."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import DATA, error_line, run_cli
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import dense_layout, read_nbest
from phrase_scorer.moses.system import ini_features, system_record
from phrase_scorer.rescoring.optimisers import weights_from_ini
from phrase_scorer.rescoring.reranker import Reranker
from phrase_scorer.rescoring.translation import check_reranker_system
from test_decoder_flags import stand_in_moses

NBEST = DATA / "val.nbest.head.gz"
REFERENCE = DATA / "val.tok.fr.head"
SOURCE = DATA / "val.tok.en.head"
EN_FR = DATA / "moses.tuned.ini"  # the English-French system the list was decoded by
EN_CS = DATA / "moses.en-cs.tuned.ini"  # the English-Czech system: the same features, its own weights


def write_reranker(path: Path, *, system=None, models=None) -> Path:
    """A reranker of the decoder's features of the English-French list (and any ``models``)."""
    weights = weights_from_ini(EN_FR, dense_layout(next(iter(read_nbest(NBEST)))))
    tuned = Reranker(weights, (), models or {}, nbest_size=10, decoder_flags="-v 0", system=system)
    path.write_text(json.dumps(tuned.to_json()), encoding="utf-8")
    return path


def edited_ini(tmp_path: Path, edit) -> Path:
    """EN_FR with ``edit`` applied to its lines."""
    lines = EN_FR.read_text(encoding="utf-8").splitlines()
    ini = tmp_path / "moses.edited.ini"
    ini.write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")
    return ini


def without_lexical_reordering(lines):
    return [line for line in lines if "LexicalReordering" not in line]


def with_a_second_lm(lines):
    out = []
    for line in lines:
        out.append(line)
        if line.startswith("KENLM name=LM0"):
            out.append("KENLM name=LM1 factor=0 path=lm1.arpa.gz order=5")
        if line.startswith("LM0="):
            out.append("LM1= 0.05")
    return out


def with_five_translation_scores(lines):
    return [line.replace("num-features=4", "num-features=5") if "TranslationModel0" in line and "num-features" in line
            else line + " 0.01" if line.startswith("TranslationModel0=") else line for line in lines]


def translate(reranker: Path, ini: Path, tmp_path: Path, *more):
    home = stand_in_moses(tmp_path)
    out = tmp_path / "out.txt"
    result = run_cli("translate-system", "--moses", ini, "--reranker", reranker, SOURCE, "-o", out, "--moses-home",
                     home, *more)
    line = error_line(result)
    assert not (home / "started").exists(), "Moses was started"
    assert not out.exists() and not Path(f"{out}.work").exists()
    return line


@pytest.mark.parametrize("edit, feature, problem", [
    (without_lexical_reordering, "LexicalReordering0", "weights the decoder feature LexicalReordering0 (6 values), "
                                                       "which this moses.ini does not have"),
    (with_a_second_lm, "LM1", "feature LM1 is not among the features"),
    (with_five_translation_scores, "TranslationModel0", "TranslationModel0 has 5 values here, but"),
])
def test_an_ini_with_other_features_is_refused_before_moses_decodes(tmp_path, edit, feature, problem):
    reranker = write_reranker(tmp_path / "reranker.json")
    ini = edited_ini(tmp_path, edit)
    line = translate(reranker, ini, tmp_path)
    assert problem in line and feature in line
    assert f"error: {ini}" in line and str(reranker) in line  # the ini where, the reranker by name
    assert "chunk" not in line


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_a_reranker_on_another_language_pairs_system_is_refused(tmp_path, resume):
    """Refused as a fresh run refuses it when the run is resumed too."""
    reranker = write_reranker(tmp_path / "reranker.json", system=system_record(EN_FR))
    line = translate(reranker, EN_CS, tmp_path, *resume)
    assert re.search(rf"error: {re.escape(str(EN_CS))}: {re.escape(str(reranker))} was tuned for another system "
                     rf"\({re.escape(str(EN_FR.resolve()))}\): the weights of \w+ are", line), line


def test_the_system_it_was_tuned_for_and_older_rerankers_pass_the_checks(tmp_path):
    recorded = Reranker.read(write_reranker(tmp_path / "new.json", system=system_record(EN_FR)))
    assert recorded.system == {"moses.ini": str(EN_FR.resolve()), "weights": ini_features_of(EN_FR)}
    check_reranker_system(recorded, EN_FR)
    # the same system elsewhere, its tables binarised: the same features and weights
    moved = tmp_path / "elsewhere" / "moses.ini"
    moved.parent.mkdir()
    moved.write_text(EN_FR.read_text().replace("PhraseDictionaryMemory", "PhraseDictionaryCompact")
                     .replace("path=phrase-table.gz", "path=/binarised/phrase-table.minphr"))
    check_reranker_system(recorded, moved)
    older = Reranker.read(write_reranker(tmp_path / "old.json"))  # written before rerankers recorded a system
    assert older.system is None
    check_reranker_system(older, EN_FR)
    with pytest.raises(PhraseScorerError, match="tuned for another system"):
        check_reranker_system(recorded, EN_CS)


def ini_features_of(ini: Path) -> dict:
    from phrase_scorer.io.moses_ini import MosesIni

    return ini_features(MosesIni.read(ini))


def test_the_ini_features_are_the_dense_features_of_its_lists():
    """Every tuneable feature with its number of values; the unknown-word penalty, which Moses does
    not tune unless told to, writes none."""
    counts = {name: len(weights) for name, weights in ini_features_of(EN_FR).items()}
    assert counts == dict(dense_layout(next(iter(read_nbest(NBEST)))))
    assert "UnknownWordPenalty0" not in counts


def test_a_damaged_system_record_is_refused_naming_the_key(tmp_path):
    path = write_reranker(tmp_path / "reranker.json", system=system_record(EN_FR))
    data = json.loads(path.read_text())
    data["system"]["weights"]["LM0"] = ["heavy"]
    path.write_text(json.dumps(data))
    with pytest.raises(PhraseScorerError, match=r"system\.weights\.LM0\[0\] is \"heavy\", not a finite number"):
        Reranker.read(path)


def test_rerank_refuses_a_feature_to_leave_out_that_the_list_does_not_have(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    out = tmp_path / "test.best"
    result = run_cli("rerank", "--dev", NBEST, REFERENCE, "--test", NBEST, "-o", out, "--ignore-feature", "NoSuch")
    line = error_line(result)
    assert f"{NBEST} line 1: --ignore-feature NoSuch: the dev list has no dense feature NoSuch" in line
    assert "LexicalReordering0, Distortion0, LM0" in line
    assert not list(tmp_path.iterdir())
    # a feature the list has passes the check: what fails next is the missing Moses
    result = run_cli("rerank", "--dev", NBEST, REFERENCE, "--test", NBEST, "-o", out, "--ignore-feature", "LM0")
    assert "no Moses installation given" in error_line(result)


def test_the_rerankers_the_experiments_write_record_the_system_that_decoded_the_dev_list(tmp_path):
    """rescore-experiment and build-reranker write their rerankers through write_rerankers, given
    the moses.ini that decoded the dev list: translate --moses then refuses another system."""
    from phrase_scorer.experiments.system_steps import RETUNED_ROW, Row, RowRun, write_rerankers

    weights = weights_from_ini(EN_FR, dense_layout(next(iter(read_nbest(NBEST)))))
    run = RowRun(row=RETUNED_ROW, seed=1, scores={}, hypotheses={}, weights=weights.by_name(), tuned_dev_bleu=50.0)
    written = write_rerankers([run], [Row(RETUNED_ROW, ())], NBEST, tmp_path, "-v 0", system=system_record(EN_FR))
    reranker = Reranker.read(written[RETUNED_ROW])
    assert reranker.system == {"moses.ini": str(EN_FR.resolve()), "weights": ini_features_of(EN_FR)}
    check_reranker_system(reranker, EN_FR)
    with pytest.raises(PhraseScorerError, match="was tuned for another system"):
        check_reranker_system(reranker, EN_CS)


def test_rerank_records_the_ini_only_when_its_weights_made_the_dev_list(tmp_path, caplog):
    """Moses' totals of the dev list are its features weighted by the system that decoded it: the
    ini given to rerank is recorded as the system only when its weights reproduce them."""
    from phrase_scorer.moses.system import decoded_with
    from phrase_scorer.rescoring.rerank import decoding_system

    assert decoded_with(NBEST, ini_features_of(EN_FR), []) is True
    assert decoded_with(NBEST, ini_features_of(EN_CS), []) is False
    assert decoded_with(NBEST, {"LM0": [1.0]}, []) is None  # features the weights do not name: cannot tell
    assert decoding_system(NBEST, EN_FR, {}) == system_record(EN_FR)
    assert decoding_system(NBEST, EN_CS, {}) is None
    assert f"{NBEST} was not decoded with the weights of {EN_CS}" in caplog.text
    assert decoding_system(NBEST, None, {}) is None
