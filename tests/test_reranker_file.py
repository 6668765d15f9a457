"""The reranker file read through one schema, the n-best lists it is applied to, and the
signature that ties a rescored list to its models: damaged input is refused in one line naming
the file and the key (or line); every sentence with hypotheses gets its line."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DATA
from phrase_scorer.cli import cli
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import group_by_sentence, read_nbest, write_nbest
from phrase_scorer.io.nbest import dense_layout
from phrase_scorer.rescoring.optimisers import weights_from_ini
from phrase_scorer.rescoring.reranker import Reranker, rescored_models

NBEST = DATA / "val.nbest.head.gz"  # 3 sentences, 100 hypotheses each, best first
TUNED_INI = DATA / "moses.tuned.ini"
SOURCE = DATA / "val.tok.en.head"
A_MAN_TABLE = DATA / "phrase-table.a-man.gz"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def decoder_weights(nbest=NBEST):
    return weights_from_ini(TUNED_INI, dense_layout(next(iter(read_nbest(nbest)))))


def decoder_record(models=None) -> dict:
    return json.loads(json.dumps(Reranker(decoder_weights(), (), models or {}).to_json()))


def write_json(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def assert_one_line_error(result, *needles, output=None):
    assert result.exit_code == 1, result.stderr
    lines = result.stderr.strip().splitlines()  # log lines (a busy-machine warning) may come first
    assert lines[-1].startswith("phrase-scorer: error: ") and "Traceback" not in result.stderr, result.stderr
    assert sum("error" in line for line in lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[-1], (needle, lines[-1])
    if output is not None:
        assert not Path(output).exists() and not Path(f"{output}.part").exists()


def hypotheses_by_sentence(nbest=NBEST):
    return [[e.hypothesis.strip(" ") for e in entries] for _, entries in group_by_sentence(read_nbest(nbest))]


# --- the reranker file ------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e400", '"0.5"', "true", "null", "[0.5]"])
def test_a_weight_that_is_not_a_finite_number_is_refused_naming_the_key(tmp_path, raw):
    text = json.dumps(decoder_record())
    text, replaced = re.subn(r'"LM0": \[[^\]]*\]', f'"LM0": [{raw}]', text)
    assert replaced == 1
    reranker = write_json(tmp_path / "r.json", text)
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", NBEST, "-o", out)
    assert_one_line_error(result, str(reranker), "weights.LM0[0]", "not a finite number", output=out)


@pytest.mark.parametrize("counts", [(5, 2), (7, 0)])
def test_weight_counts_per_feature_must_match_the_layout_even_when_they_add_up(tmp_path, counts):
    """6 + 1 weights given as 5 + 2 (or 7 + 0) used to be applied shifted onto the next feature."""
    record = decoder_record()
    values = record["weights"]["LexicalReordering0"] + record["weights"]["Distortion0"]
    record["weights"]["LexicalReordering0"], record["weights"]["Distortion0"] = values[:counts[0]], values[counts[0]:]
    reranker = write_json(tmp_path / "r.json", record)
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", NBEST, "-o", out)
    assert_one_line_error(result, str(reranker), "weights.LexicalReordering0 has", "the layout gives", output=out)


def damage(change):
    def apply(record):
        record = copy.deepcopy(record)
        change(record)
        return record
    return apply


MODEL = {"directory": "/models/a", "weights_sha256": "0" * 64, "reverse": False, "normalize": False}


@pytest.mark.parametrize("change, key", [
    (lambda r: r.update(models=None), "models is null, not an object"),
    (lambda r: r.update(models=[]), "models is a list, not an object"),
    (lambda r: r.update(models={"RNN0": dict(MODEL, reverse="no")}), "models.RNN0.reverse"),
    (lambda r: r.update(models={"RNN0": {k: v for k, v in MODEL.items() if k != "reverse"}}),
     "models.RNN0.reverse is missing"),
    (lambda r: r.update(models={"RNN0": dict(MODEL, directory=["/a", "/b"])}), "models.RNN0.weights_sha256"),
    (lambda r: r.update(models={"RNN0": dict(MODEL, weights_sha256=None)}), "models.RNN0.weights_sha256"),
    (lambda r: r.update(layout=[], weights={}), "layout is empty: the reranker weights no feature"),
    (lambda r: r.pop("layout"), "layout is missing"),
    (lambda r: r.pop("weights"), "weights is missing"),
    (lambda r: r["layout"].__setitem__(2, ["LM0", "1"]), "layout[2][1]"),
    (lambda r: r["layout"].__setitem__(2, ["LM0", 1.5]), "layout[2][1]"),
    (lambda r: r["layout"].__setitem__(2, ["LM0", 0]), "layout[2][1]"),
    (lambda r: r["layout"].__setitem__(2, ["LM0"]), "layout[2] has 1 items"),
    (lambda r: r["layout"].__setitem__(3, ["LM0", 1]), "layout[3][0] names LM0 a second time"),
    (lambda r: r["weights"].__setitem__("Extra0", [1.0]), "weights.Extra0 is not in the layout"),
    (lambda r: r.update(ignore_features=None), "ignore_features is null"),
    (lambda r: r.update(ignore_features=[3]), "ignore_features[0]"),
    (lambda r: r.update(decoder={"nbest_size": -5}), "decoder.nbest_size"),
    (lambda r: r.update(decoder="moses"), "decoder is \"moses\", not an object"),
    (lambda r: r.update(version=True), "reranker version true"),
])
def test_a_damaged_reranker_is_one_line_naming_the_key(tmp_path, change, key):
    reranker = write_json(tmp_path / "r.json", damage(change)(decoder_record()))
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", NBEST, "-o", out)
    assert_one_line_error(result, str(reranker), key, output=out)


@pytest.mark.parametrize("flags, warned", [(None, True), ("", False), ("-v 0 -n-best-factor 100", False)])
def test_a_reranker_that_records_no_decoder_options_is_named_before_translating(tmp_path, flags, warned):
    """``translate --moses`` decodes with the options the reranker records: one that records none
    (tuned on lists it was given) is named, with its n-best size and the flag that records them;
    one that records Moses' defaults (an empty string) or other options is not."""
    from phrase_scorer.cli.group import shown
    from phrase_scorer.rescoring.translation import unrecorded_decoder_options

    path = write_json(tmp_path / "r.json", Reranker(decoder_weights(), (), {}, nbest_size=100,
                                                     decoder_flags=flags).to_json())
    message = unrecorded_decoder_options(Reranker.read(path))
    if not warned:
        assert message is None
        return
    assert message is not None and message.startswith(f"{path} records no decoder options")
    assert "its 100-best lists" in message and "-n-best-factor (20)" in message
    assert message.endswith("with rerank's decoder_flags saying how")
    assert shown(message, ("translate",)).endswith("with rerank's --decoder-flags saying how")  # rerank's flag


# --- the n-best list it is applied to ---------------------------------------------------------------


def with_values(tmp_path, changes) -> Path:
    """NBEST with feature values changed: {(sentence, rank): {name: [values]}}."""
    entries = list(read_nbest(NBEST))
    ranks = {}
    for e in entries:
        rank = ranks[e.sentence_id] = ranks.get(e.sentence_id, -1) + 1
        for name, values in changes(e.sentence_id, rank).items():
            e.features = [(n, values if n == name else v) for n, v in e.features]
    path = tmp_path / "changed.nbest"
    write_nbest(entries, path)
    return path


def test_a_nan_feature_is_refused_naming_the_list_and_line(tmp_path):
    nbest = with_values(tmp_path, lambda s, r: {"LM0": [math.nan]} if (s, r) == (1, 7) else {})
    reranker = write_json(tmp_path / "r.json", decoder_record())
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", nbest, "-o", out)
    assert_one_line_error(result, f"{nbest} line 108:", "feature LM0 is nan", output=out)


def test_infinite_sums_never_drop_a_sentence_moses_order_breaks_the_tie(tmp_path):
    """Sentence 0: its first hypothesis' sum is undefined (+inf and -inf), so the best of the
    others wins; sentence 1: every sum is -inf, so the first hypothesis (Moses' 1-best) wins;
    sentence 2: a -inf feature weighted 0 does not count, and the usual best wins."""

    def changes(sentence, rank):
        if sentence == 0 and rank == 0:
            return {"LM0": [math.inf], "WordPenalty0": [math.inf]}  # weights +0.077 and -0.149: inf - inf
        if sentence == 1:
            return {"LM0": [-math.inf]}
        if sentence == 2:
            return {"PhrasePenalty0": [-math.inf]}
        return {}

    nbest = with_values(tmp_path, changes)
    record = decoder_record()
    record["weights"]["PhrasePenalty0"] = [0.0]
    reranker = write_json(tmp_path / "r.json", record)
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", nbest, "-o", out)
    assert result.exit_code == 0, result.stderr

    # the expected choices, computed here from the original list's values
    w = np.array(decoder_weights().values)
    w[decoder_weights().value_names().index("PhrasePenalty0")] = 0.0
    sums = [np.array([[v for n, vs in e.features if "_" not in n for v in vs] for e in entries]) @ w
            for _, entries in group_by_sentence(read_nbest(NBEST))]
    hypotheses = hypotheses_by_sentence()
    expected = [hypotheses[0][1 + int(np.argmax(sums[0][1:]))], hypotheses[1][0],
                hypotheses[2][int(np.argmax(sums[2]))]]
    assert out.read_text(encoding="utf-8") == "".join(h + "\n" for h in expected)
    assert all(expected)


def test_weights_whose_sums_overflow_still_give_every_sentence_its_first_hypothesis(tmp_path):
    """A finite weight of 1e308 makes every sum -inf (LM0 values are negative): Moses' 1-best."""
    record = decoder_record()
    record["weights"]["LM0"] = [1e308]
    reranker = write_json(tmp_path / "r.json", record)
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", NBEST, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert out.read_text(encoding="utf-8") == "".join(h[0] + "\n" for h in hypotheses_by_sentence())


def test_dev_bleu_ranks_undefined_and_infinite_sums_as_reranking_does():
    """The BLEU a tuning run reports for weights is that of the hypotheses apply_weights picks:
    sentence 0's first sum is inf - inf (ranked last) and its third has -inf weighted 0 (not
    counted): the third wins; sentence 1's sums are all -inf: the first wins."""
    from phrase_scorer.rescoring.mert_files import MertData, reranked_bleu

    features = [np.array([[math.inf, math.inf, 0.0], [1.0, 0.0, 0.0], [2.0, 0.0, -math.inf]]),
                np.array([[-math.inf, 0.0, 0.0], [-math.inf, -5.0, 0.0]])]
    perfect, poor = [5, 5, 4, 4, 3, 3, 2, 2, 5], [1, 5, 0, 4, 0, 3, 0, 2, 5]
    stats = [np.array([poor, poor, perfect], float), np.array([perfect, poor], float)]
    assert reranked_bleu(MertData(features, stats), [1.0, -1.0, 0.0]) == pytest.approx(100.0)


@pytest.mark.parametrize("line", [
    "0\t|||\tun\thomme\t|||\tLM0= -1\t|||\t-1\n",
    "0 ||| un\thomme ||| LM0= -1 ||| -1\n",
    "0 ||| un homme ||| LM0=\t-1 ||| -1\n",
])
def test_a_tab_in_an_nbest_line_is_refused_naming_the_list_and_line(tmp_path, line):
    nbest = tmp_path / "tabs.nbest"
    nbest.write_text("0 ||| un chien ||| LM0= -2 ||| -2\n" + line, encoding="utf-8")
    with pytest.raises(PhraseScorerError, match=rf"^{re.escape(str(nbest))} line 2: a tab at column \d+"):
        list(read_nbest(nbest))
    reranker = write_json(tmp_path / "r.json", {"format": "phrase-scorer-reranker", "version": 1,
                                                "layout": [["LM0", 1]], "weights": {"LM0": [1.0]}})
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", nbest, "-o", out)
    assert_one_line_error(result, f"{nbest} line 2: a tab at column", output=out)


# --- the rescored list's signature must describe the list ----------------------------------------------


@pytest.fixture
def rescored(tmp_path, tiny_model):
    """A list rescored by the tiny model (plain text), and a reranker tuned with that model."""
    path = tmp_path / "rescored.nbest"
    result = run("rescore", NBEST, "--source", SOURCE, "-m", tiny_model, "-o", path)
    assert result.exit_code == 0, result.stderr
    weights = decoder_weights(path)
    weights.values[-1] = 0.5  # RNN0
    reranker = write_json(tmp_path / "r.json", Reranker(weights, (), rescored_models(path)).to_json())
    return path, reranker


def test_rescore_signs_the_size_and_sha256_of_its_list_and_a_copy_of_both_stays_valid(tmp_path, rescored):
    path, reranker = rescored
    signature = json.loads(Path(f"{path}.json").read_text())
    assert signature["output_size"] == path.stat().st_size
    assert signature["output_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    moved = tmp_path / "elsewhere" / "copy.nbest"  # the bytes are checked, not the path or the time
    moved.parent.mkdir()
    shutil.copy(path, moved)
    shutil.copy(f"{path}.json", f"{moved}.json")
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", moved, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3


def test_a_list_rewritten_by_another_model_is_refused_by_its_stale_signature(tmp_path, rescored, sentence_models):
    path, reranker = rescored
    other = tmp_path / "other.nbest"
    assert run("rescore", NBEST, "--source", SOURCE, "-m", sentence_models("encdec"), "-o", other).exit_code == 0
    assert path.stat().st_size != other.stat().st_size
    shutil.copyfile(other, path)  # the list now holds the other model's RNN0; its signature still names the first
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", path, "-o", out)
    assert_one_line_error(result, str(path), "does not describe this list any more", "rescore the list again",
                          output=out)


def test_a_list_changed_in_place_at_the_same_size_is_refused_by_its_hash(tmp_path, rescored):
    path, reranker = rescored
    data = bytearray(path.read_bytes())
    at = data.index(b"RNN0= -") + len(b"RNN0= -")
    data[at] = ord("1") if data[at] != ord("1") else ord("2")  # another value of the same length
    path.write_bytes(bytes(data))
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", path, "-o", out)
    assert_one_line_error(result, str(path), "does not describe this list any more", output=out)


def test_a_signature_older_than_its_size_and_hash_is_trusted_with_a_warning(tmp_path, rescored):
    """Signatures written before they recorded output_size and output_sha256 are accepted, as a
    list without a signature is, with a warning that they cannot be checked against the list."""
    path, reranker = rescored
    signature = json.loads(Path(f"{path}.json").read_text())
    for key in ("output_size", "output_sha256"):
        signature.pop(key, None)
    Path(f"{path}.json").write_text(json.dumps(signature))
    out = tmp_path / "out.txt"
    result = run("apply-reranker", reranker, "--test", path, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "predates signatures that record their list's size and SHA-256" in result.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3


# --- compare with nothing to show ------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    (["--min-words", "40"], "no source phrase of 40 words or more has 3 targets or more"),
    (["--min-targets", "100000"], "no source phrase of 4 words or more has 100000 targets or more"),
    (["--frequent", "0", "--rare", "0"], "--frequent 0 and --rare 0 show no source phrase"),
])
def test_compare_with_no_qualifying_source_phrase_says_so(tiny_model, options, message):
    result = run("compare", "-m", tiny_model, A_MAN_TABLE, *options)
    assert result.stdout == ""
    assert_one_line_error(result, message)
