"""rerank: weights for every feature of a fixed n-best list, and the 1-best they pick.

The default tests check the pure-Python parts on the tuned Multi30k system's real 100-best list
(3 sentences, tests/data); the `moses` tests run Moses' extractor, mert and kbmira (they need
MOSES_HOME/bin/extractor) and, for the oracle test, the whole 100-sentence list of ../shared.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from conftest import DATA, SHARED, SHARED_SYSTEM
from phrase_scorer.cli import cli
from phrase_scorer.config import RerankOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import group_by_sentence, read_nbest, write_nbest
from phrase_scorer.io.nbest import dense_layout
from phrase_scorer.rescoring.mert_files import BLEU_ORDER, copy_checked, moses_bleu, read_mert_data
from phrase_scorer.rescoring.optimisers import weights_from_ini, weights_from_totals
from phrase_scorer.rescoring.weights import apply_weights

NBEST = DATA / "val.nbest.head.gz"
TUNED_INI = DATA / "moses.tuned.ini"  # the weights the lists were decoded with
SHARED_NBEST = SHARED_SYSTEM / "val.nbest.gz"
VAL_FR = SHARED / "multi30k-en-fr" / "val.tok.fr.gz"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def layout_of(path) -> tuple:
    return dense_layout(next(iter(read_nbest(path))))


def decoder_1best(path) -> list:
    """What Moses printed as the 1-best: the first entry of each sentence, without the spaces around it."""
    return [entries[0].hypothesis.strip(" ") for _, entries in group_by_sentence(read_nbest(path))]


def test_the_decoders_weights_pick_the_decoders_1best(tmp_path):
    weights = weights_from_ini(TUNED_INI, layout_of(NBEST))
    assert weights.by_name()["TranslationModel0"] == [0.0731793, 0.00306417, 0.0673578, 0.0464722]
    out = tmp_path / "1best.txt"
    assert apply_weights(NBEST, weights, out) == 3
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[:3] == decoder_1best(NBEST) and lines[3] == ""
    assert lines[0] == "un groupe d&apos; hommes chargeant coton dans un camion"


def test_weights_fitted_to_the_totals_are_the_decoders(tmp_path):
    dev = copy_checked(NBEST, tmp_path / "copy.nbest")
    assert (tmp_path / "copy.nbest").read_bytes() == gzip.decompress(NBEST.read_bytes())
    fitted, rms = weights_from_totals(dev)
    # Moses prints 6 significant digits of every value, so the fit is that close, no closer
    np.testing.assert_allclose(fitted.values, weights_from_ini(TUNED_INI, dev.layout).values, atol=1e-5)
    assert rms < 1e-4


def test_features_the_ini_does_not_weight_start_at_zero(tmp_path):
    entries = list(read_nbest(NBEST))
    for e in entries:
        e.features.append(("RNN0", [-3.5]))
    write_nbest(entries, tmp_path / "rescored.txt")
    weights = weights_from_ini(TUNED_INI, layout_of(tmp_path / "rescored.txt"))
    assert weights.by_name()["RNN0"] == [0.0] and weights.value_names()[-2:] == ["TranslationModel0", "RNN0"]
    # a feature the ini weights with a different number of values is refused
    entries[0].features[-2] = ("TranslationModel0", [1.0, 2.0])
    write_nbest(entries[:1], tmp_path / "odd.txt")
    with pytest.raises(PhraseScorerError,
                       match=r"moses.tuned.ini line \d+: TranslationModel0 has 4 weights, but the n-best list has 2"):
        weights_from_ini(TUNED_INI, layout_of(tmp_path / "odd.txt"))


def test_moses_bleu_is_sacrebleus_bleu():
    from sacrebleu.metrics import BLEU

    hypotheses = decoder_1best(NBEST)
    references = (DATA / "val.tok.fr.head").read_text(encoding="utf-8").splitlines()
    score = BLEU(tokenize="none").corpus_score(hypotheses, [references])
    stats = [v for n in range(BLEU_ORDER) for v in (score.counts[n], score.totals[n])] + [score.ref_len]
    assert moses_bleu(np.array(stats, float)) == pytest.approx(score.score, rel=1e-12)
    stats[2 * 3] = 0  # no 4-gram matches: BLEU 0, as Moses has it
    assert moses_bleu(np.array(stats, float)) == 0.0


def test_lists_must_keep_their_features_and_order(tmp_path):
    entries = list(read_nbest(NBEST))
    del entries[5].features[1]  # line 6 lacks Distortion0
    write_nbest(entries, tmp_path / "missing.txt")
    with pytest.raises(PhraseScorerError,
                       match=r"missing.txt line 6: the dense features are .* not .* as on the first line"):
        copy_checked(tmp_path / "missing.txt", tmp_path / "copy")
    weights = weights_from_ini(TUNED_INI, layout_of(NBEST))
    with pytest.raises(PhraseScorerError,
                       match=r"missing.txt line 6: the dense features are .*but the weights are for"):
        apply_weights(tmp_path / "missing.txt", weights, tmp_path / "out.txt")
    assert not (tmp_path / "out.txt").exists()

    entries = list(read_nbest(NBEST))
    write_nbest(entries[100:133] + entries[:100], tmp_path / "shuffled.txt")
    with pytest.raises(PhraseScorerError, match=r"shuffled.txt line 34: sentence id 0 comes after 1"):
        apply_weights(tmp_path / "shuffled.txt", weights, tmp_path / "out.txt")


def test_a_sentence_without_hypotheses_gets_an_empty_line(tmp_path):
    entries = [e for e in read_nbest(NBEST) if e.sentence_id != 1]
    write_nbest(entries, tmp_path / "gap.txt")
    apply_weights(tmp_path / "gap.txt", weights_from_ini(TUNED_INI, layout_of(NBEST)), tmp_path / "out.txt")
    first, _, third = decoder_1best(NBEST)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == f"{first}\n\n{third}\n"


def test_rerank_without_moses_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv("MOSES_HOME", raising=False)
    args = ["rerank", "--dev", NBEST, DATA / "val.tok.fr.head", "--test", NBEST, "-o", tmp_path / "out.txt"]
    result = run(*args)
    assert result.exit_code == 1 and "no Moses installation given" in result.stderr
    (tmp_path / "moses" / "bin").mkdir(parents=True)
    result = run(*args, "--moses-home", tmp_path / "moses")
    assert result.exit_code == 1 and re.search(r"bin/extractor: mert program extractor is missing", result.stderr)
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "out.txt.work").exists()


# --- with Moses' programs ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def moses():
    home = os.environ.get("MOSES_HOME")
    if not home or not (Path(home) / "bin" / "extractor").exists():
        pytest.skip("set MOSES_HOME to a Moses build with its mert programs (bin/extractor, bin/mert, bin/kbmira)")
    from phrase_scorer.moses.installation import MosesInstallation

    return MosesInstallation.find(home)


@pytest.mark.moses
def test_the_extractor_reads_the_rescored_list(moses, tmp_path, loaded_tiny):
    from phrase_scorer.runtime.programs import run_logged
    from phrase_scorer.rescoring.rescore import FeatureModel, rescore

    rescored = tmp_path / "val.rescored.gz"
    rescore(NBEST, DATA / "val.tok.en.head", rescored,
            [FeatureModel("RNN0", loaded_tiny), FeatureModel("RNNReverse0", loaded_tiny, reverse=True)])
    run_logged([moses.program("extractor"), "--sctype", "BLEU", "--scfile", tmp_path / "scores.dat",
                "--ffile", tmp_path / "features.dat", "-r", DATA / "val.tok.fr.head", "-n", rescored],
               tmp_path / "extractor.log")
    header = (tmp_path / "features.dat").read_text().splitlines()[0].split()
    assert header[3] == "16" and header[-2:] == ["RNN0_0", "RNNReverse0_0"]
    data = read_mert_data(tmp_path / "features.dat", tmp_path / "scores.dat", 16)
    assert len(data.features) == 3
    for features, (_, entries) in zip(data.features, group_by_sentence(read_nbest(rescored))):
        from_list = np.unique(np.array([[v for _, vs in e.features for v in vs] for e in entries]), axis=0)
        # the extractor drops duplicate hypotheses and keeps every value as the list has it
        np.testing.assert_allclose(np.unique(features, axis=0), from_list, rtol=1e-6)


def with_oracle(entries, references, first_id: int):
    """The entries of sentences first_id.., renumbered from 0, with `Oracle=` their sentence BLEU."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(tokenize="none", effective_order=True)
    out = []
    for e in entries:
        e.sentence_id -= first_id
        e.features.append(("Oracle",
                           [round(bleu.sentence_score(e.text, [references[e.sentence_id + first_id]]).score / 100, 6)]))
        out.append(e)
    return out


@pytest.mark.moses
@pytest.mark.parametrize("method", ["mert", "mira"])
def test_rerank_recovers_the_oracle(moses, tmp_path, method):
    """A feature that is each hypothesis' sentence BLEU: tuning must learn to trust it."""
    from sacrebleu.metrics import BLEU

    if not SHARED_NBEST.exists():
        pytest.skip(f"needs the Multi30k system's n-best list {SHARED_NBEST}")
    with gzip.open(VAL_FR, "rt", encoding="utf-8") as f:
        references = [next(f).rstrip("\n") for _ in range(100)]
    entries = list(read_nbest(SHARED_NBEST))
    write_nbest(with_oracle([e for e in entries if e.sentence_id < 50], references, 0), tmp_path / "dev.nbest.gz")
    write_nbest(with_oracle([e for e in entries if e.sentence_id >= 50], references, 50), tmp_path / "test.nbest.gz")
    (tmp_path / "dev.ref").write_text("\n".join(references[:50]) + "\n", encoding="utf-8")

    out = tmp_path / "test.1best"
    result = run("rerank", "--dev", tmp_path / "dev.nbest.gz", tmp_path / "dev.ref",
                 "--test", tmp_path / "test.nbest.gz", "-o", out, "--ini", TUNED_INI, "--method", method,
                 "--moses-home", moses.home)
    assert result.exit_code == 0, result.stderr
    # no --decoder-flags: the reranked system would decode with Moses' own options, and rerank says so
    assert "--decoder-flags not given" in result.stderr
    signature = json.loads(Path(str(out) + ".json").read_text())
    assert signature["decoder"]["decoder_flags"] is None
    assert [r["seed"] for r in signature["runs"]] == list(RerankOptions.seeds)
    assert signature["start_weights"]["Oracle"] == [0.0] and signature["weights"]["Oracle"][0] > 0
    assert signature["dev_bleu"] > signature["start_dev_bleu"] + 1

    test_references = references[50:]
    reranked = out.read_text(encoding="utf-8").splitlines()
    moses_1best = decoder_1best(tmp_path / "test.nbest.gz")
    assert len(reranked) == 50
    bleu = BLEU(tokenize="none")
    before = bleu.corpus_score(moses_1best, [test_references]).score
    after = bleu.corpus_score(reranked, [test_references]).score
    assert after > before + 1, (before, after)

    # the reranker file applies to a list without Moses: the same lines rerank wrote when it tuned
    assert signature["format"] == "phrase-scorer-reranker" and signature["decoder"]["nbest_size"] == 100
    again = tmp_path / "again.1best"
    applied = run("apply-reranker", f"{out}.json", "--test", tmp_path / "test.nbest.gz", "-o", again)
    assert applied.exit_code == 0, applied.stderr
    assert again.read_bytes() == out.read_bytes()


def test_ignored_features_are_neither_tuned_nor_used(tmp_path):
    """A feature that would pick the worst hypothesis changes nothing once it is ignored."""
    entries = list(read_nbest(NBEST))
    for _, group in group_by_sentence(entries):
        for rank, entry in enumerate(group):
            entry.features.append(("Worst", [float(rank)]))  # largest for the last hypothesis
    with_extra = tmp_path / "extra.nbest.gz"
    write_nbest(entries, with_extra)
    decoder = weights_from_ini(TUNED_INI, layout_of(NBEST))
    out = tmp_path / "1best.txt"
    apply_weights(with_extra, decoder, out, ignore=("Worst",))
    assert out.read_text(encoding="utf-8").split("\n")[:3] == decoder_1best(NBEST)
    with pytest.raises(PhraseScorerError, match="dense features"):
        apply_weights(with_extra, decoder, tmp_path / "refused.txt")  # not ignored: the layouts differ
    dev = copy_checked(with_extra, tmp_path / "copy.nbest", ignore=("Worst",))
    assert dev.layout == layout_of(NBEST)
    assert "Worst" not in (tmp_path / "copy.nbest").read_text(encoding="utf-8")


def test_a_feature_weighted_0_can_be_left_out_of_the_list_and_the_weights(tmp_path):
    """Weighted 0, a feature that would pick another hypothesis (-inf for the first one included)
    changes nothing: the list without it and the weights without it pick the same bytes."""
    entries = list(read_nbest(NBEST))
    for _, group in group_by_sentence(entries):
        for rank, entry in enumerate(group):
            entry.features.append(("RNN0", [float(rank) if rank else float("-inf")]))
    write_nbest(entries, tmp_path / "with.nbest")
    weights = weights_from_ini(TUNED_INI, layout_of(tmp_path / "with.nbest"))
    assert weights.unweighted() == ["RNN0"]
    apply_weights(tmp_path / "with.nbest", weights, tmp_path / "with.txt")
    without = weights.without(["RNN0"])
    assert without.layout == layout_of(NBEST) and without.values == weights.values[:-1]
    apply_weights(NBEST, without, tmp_path / "without.txt")
    assert (tmp_path / "without.txt").read_bytes() == (tmp_path / "with.txt").read_bytes()
    assert (tmp_path / "with.txt").read_text(encoding="utf-8").split("\n")[:3] == decoder_1best(NBEST)
    weights.values[-1] = 0.5  # weighted, it changes the choices
    apply_weights(tmp_path / "with.nbest", weights, tmp_path / "weighted.txt")
    assert (tmp_path / "weighted.txt").read_bytes() != (tmp_path / "with.txt").read_bytes()
    with pytest.raises(PhraseScorerError, match="feature RNN0 is weighted, so lists cannot leave it out"):
        weights.without(["RNN0"])


# --- the reranker file, applied without Moses ----------------------------------------------------------


def write_reranker(path, weights, models=None, ignore=()) -> Path:
    from phrase_scorer.rescoring.reranker import Reranker

    Path(path).write_text(json.dumps(Reranker(weights, tuple(ignore), models or {}).to_json()), encoding="utf-8")
    return Path(path)


def test_a_reranker_applies_to_the_whole_shared_list(tmp_path):
    """The decoder's own weights, as a reranker file, give back the decoder's 1-best on all 100
    sentences of the system's 100-best list."""
    if not SHARED_NBEST.exists():
        pytest.skip(f"needs the Multi30k system's n-best list {SHARED_NBEST}")
    reranker = write_reranker(tmp_path / "decoder.json", weights_from_ini(TUNED_INI, layout_of(SHARED_NBEST)))
    out = tmp_path / "1best.txt"
    result = run("apply-reranker", reranker, "--test", SHARED_NBEST, "-o", out)
    assert result.exit_code == 0, result.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 100 and lines == decoder_1best(SHARED_NBEST)


def test_a_reranker_refuses_lists_rescored_otherwise(tmp_path, tiny_model, sentence_models):
    from phrase_scorer.rescoring.reranker import rescored_models

    rescored = tmp_path / "rescored.gz"
    assert run("rescore", NBEST, "--source", DATA / "val.tok.en.head", "-m", tiny_model, "-o", rescored).exit_code == 0
    models = rescored_models(rescored)
    assert (set(models) == {"RNN0"} and models["RNN0"]["reverse"] is False
            and len(models["RNN0"]["weights_sha256"]) == 64)
    weights = weights_from_ini(TUNED_INI, layout_of(rescored))
    weights.values[-1] = 0.5  # RNN0
    reranker = write_reranker(tmp_path / "r.json", weights, models)

    out = tmp_path / "1best.txt"
    assert run("apply-reranker", reranker, "--test", rescored, "-o", out).exit_code == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3

    # the same feature name, computed by another model: refused, naming the feature
    other = tmp_path / "other.gz"
    assert run("rescore", NBEST, "--source", DATA / "val.tok.en.head", "-m", sentence_models("encdec"),
               "-o", other).exit_code == 0
    result = run("apply-reranker", reranker, "--test", other, "-o", tmp_path / "refused.txt")
    assert result.exit_code == 1 and "feature RNN0 was tuned with the model" in result.stderr
    assert not (tmp_path / "refused.txt").exists()

    # a list without the feature: refused by name
    result = run("apply-reranker", reranker, "--test", NBEST, "-o", tmp_path / "refused.txt")
    assert result.exit_code == 1 and "but the weights are for" in result.stderr and "RNN0" in result.stderr


@pytest.mark.parametrize("content, message", [
    ("{", "not a reranker file"),
    ('{"format": "phrase-scorer-model"}', "not a reranker file"),
    ('{"format": "phrase-scorer-reranker", "version": 9}', "reranker version 9"),
    ('{"format": "phrase-scorer-reranker", "version": 1, "layout": [["LM0", 1]], "weights": {}}', "damaged"),
])
def test_a_bad_reranker_file_is_one_line(tmp_path, content, message):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = run("apply-reranker", bad, "--test", NBEST, "-o", tmp_path / "out.txt")
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_tuning_and_applying_are_two_verbs(tmp_path):
    """rerank tunes (its dev list is required); applying a tuned reranker is apply-reranker, which
    takes no tuning option; the old 'rerank --weights' names the verb to run."""
    reranker = write_reranker(tmp_path / "r.json", weights_from_ini(TUNED_INI, layout_of(NBEST)))
    old = run("rerank", "--weights", reranker, "--test", NBEST, "-o", tmp_path / "o")
    assert old.exit_code != 0 and f"phrase-scorer apply-reranker {reranker} --test NBEST -o OUT" in old.stderr
    assert not (tmp_path / "o").exists()
    no_dev = run("rerank", "--test", NBEST, "-o", tmp_path / "o")
    assert no_dev.exit_code != 0 and "--dev" in no_dev.stderr
    tuning_option = run("apply-reranker", reranker, "--ini", TUNED_INI, "--test", NBEST, "-o", tmp_path / "o")
    assert tuning_option.exit_code != 0 and "--ini" in tuning_option.stderr and not (tmp_path / "o").exists()


def test_a_model_feature_that_buys_no_dev_bleu_is_weighted_0_and_one_that_does_is_kept():
    """drop_unhelpful on the dev list's extractor data: in every sentence RNN0 turns the
    language model's choice (a hypothesis with no 3-gram right) into the right one, while
    RNNReverse0's small weight changes no choice. Only the model features are candidates."""
    from phrase_scorer.rescoring.mert_files import MertData, reranked_bleu
    from phrase_scorer.rescoring.optimisers import drop_unhelpful
    from phrase_scorer.rescoring.weights import Weights

    good = np.array([5, 5, 4, 4, 3, 3, 2, 2, 5], float)  # n-gram matches and totals, reference length
    bad = np.array([3, 5, 1, 4, 0, 3, 0, 2, 5], float)
    #                     LM0  RNN0  RNNReverse0
    features = np.array([[0.0, -5.0, 0.1],  # bad: the language model's choice
                         [-1.0, 0.0, 0.0]])  # good
    data = MertData([features] * 3, [np.stack([bad, good])] * 3)
    tuned = Weights((("LM0", 1), ("RNN0", 1), ("RNNReverse0", 1)), [1.0, 0.5, 0.1])
    bleu = reranked_bleu(data, tuned.values)
    assert bleu == 100.0 and reranked_bleu(data, [1.0, 0.0, 0.1]) == 0.0  # RNN0 buys all of it

    kept, dropped = drop_unhelpful(data, tuned, ["RNN0", "RNNReverse0"], 0.0)
    assert dropped == {"RNNReverse0": 100.0} and kept.values == [1.0, 0.5, 0.0]
    assert kept.unweighted() == ["RNNReverse0"]  # translate --moses --reranker does not run its model
    assert drop_unhelpful(data, tuned, ["RNN0", "RNNReverse0"], -1.0) == (tuned, {})  # negative: keep all
    # a tolerance of the whole BLEU drops RNN0 too, after the feature that costs less
    everything, dropped = drop_unhelpful(data, tuned, ["RNN0", "RNNReverse0"], 100.0)
    assert list(dropped) == ["RNNReverse0", "RNN0"] and everything.values == [1.0, 0.0, 0.0]
    assert drop_unhelpful(data, tuned, [], 100.0)[1] == {}  # the decoder's own features are never candidates


def test_one_maker_makes_every_reranker_dropping_features_only_where_asked(tmp_path):
    """tuned_reranker, which rerank and both experiments make their rerankers with: it records the
    most hypotheses of one dev sentence as the n-best size (the count rerank's copy of the list
    makes too), drops a model feature that buys nothing only when given a gain to beat
    (rerank --min-feature-gain; the experiments keep their rows' features), never one left out."""
    from phrase_scorer.rescoring.mert_files import MertData
    from phrase_scorer.rescoring.reranker import FeatureDropping, Reranker, most_hypotheses, tuned_reranker
    from phrase_scorer.rescoring.weights import Weights

    dev = tmp_path / "dev.nbest"
    dev.write_text("".join(f"{i} ||| w{k} ||| LM0= -1 RNN0= -2 RNNReverse0= -3 ||| -6\n"
                           for i, size in enumerate((2, 3, 1)) for k in range(size)), encoding="utf-8")
    assert most_hypotheses(dev) == 3
    assert copy_checked(NBEST, tmp_path / "copy").largest_list == most_hypotheses(NBEST) == 100
    good = np.array([5, 5, 4, 4, 3, 3, 2, 2, 5], float)
    bad = np.array([3, 5, 1, 4, 0, 3, 0, 2, 5], float)
    data = MertData([np.array([[0.0, -5.0, 0.1], [-1.0, 0.0, 0.0]])] * 3, [np.stack([bad, good])] * 3)
    tuned = Weights((("LM0", 1), ("RNN0", 1), ("RNNReverse0", 1)), [1.0, 0.5, 0.1])
    models = {name: {"directory": name, "weights_sha256": "0" * 64, "reverse": False, "normalize": False}
              for name in ("RNN0", "RNNReverse0")}

    kept, dropped = tuned_reranker(tuned, dev, decoder_flags="-v 0", system=None, models=models)
    assert dropped == {} and kept.weights == tuned and kept.nbest_size == 3 and kept.models == models
    lean, dropped = tuned_reranker(tuned, dev, decoder_flags="-v 0", system=None, models=models,
                                   dropping=FeatureDropping(0.0, data))
    assert dropped == {"RNNReverse0": 100.0} and lean.weights.values == [1.0, 0.5, 0.0]
    left_out, dropped = tuned_reranker(tuned, dev, ignore_features=["RNNReverse0"], decoder_flags=None, system=None,
                                       models=models, dropping=FeatureDropping(0.0, data), nbest_size=7)
    assert dropped == {} and left_out.ignore_features == ("RNNReverse0",) and left_out.nbest_size == 7
    signed = lean.signature("phrase-scorer rerank", dev_bleu=100.0).to_json()
    assert Reranker.from_json(signed).weights == lean.weights and signed["dev_bleu"] == 100.0
