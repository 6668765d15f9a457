"""`translate --moses INI --reranker RERANKER`: new text through the whole tuned system, checked
against the same steps run by hand (decode n-best lists, rescore, rerank --weights). Needs a Moses
build (MOSES_HOME) and the shared Multi30k system."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXAMPLE_TABLE, SHARED_SYSTEM, SHARED_TABLE
from phrase_scorer.cli import cli
from phrase_scorer.io.nbest import read_nbest
from test_moses_integration import TEST_EN, decode, first_lines, table_for_sentences

pytestmark = pytest.mark.moses


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module", params=["words", "bpe"])
def system(request, moses, tmp_path_factory, tiny_model):
    """The tuned Multi30k system on a slice of its table, and a reranker for it: the decoder's
    weights plus a weight for the tiny model's feature, as `rerank` would write it; the model
    reads words, or (``bpe``) subword pieces."""
    from phrase_scorer.moses.ini_patch import patch_moses_ini
    from phrase_scorer.io.nbest import dense_layout
    from phrase_scorer.moses.optimisers import weights_from_ini
    from phrase_scorer.moses.reranker import Reranker, rescored_models

    work = tmp_path_factory.mktemp("reranked")
    source = first_lines(TEST_EN, 7, work / "test.en")
    table = table_for_sentences(SHARED_TABLE, source.read_text().splitlines(), work / "pt.gz", minimum=100)
    ini = work / "system.ini"
    patch_moses_ini(SHARED_SYSTEM / "moses.tuned.ini", ini, phrase_table=table, add_features=0, absolute_paths=True)
    model = work / "model"
    if request.param == "words":
        shutil.copytree(tiny_model, model)
    else:
        from phrase_scorer.config import TrainConfig
        from phrase_scorer.training.run import train

        train(EXAMPLE_TABLE, model, TrainConfig(preset="tiny", vocabulary="bpe", max_steps=100, valid_every=100,
                                                valid_pairs=300, seed=3))

    # by hand: 50-best lists, the model's feature, the weights
    nbest = work / "test.nbest"
    decode(moses, ini, source, "-n-best-list", str(nbest), "50", "distinct")
    rescored = work / "test.rescored.gz"
    assert run("rescore", nbest, "--source", source, "-m", model, "-o", rescored).exit_code == 0
    weights = weights_from_ini(ini, dense_layout(next(iter(read_nbest(rescored)))))
    weights.values[-1] = 0.05  # RNN0: enough to change some choices
    reranker = work / "reranker.json"
    reranker.write_text(json.dumps(Reranker(weights, (), rescored_models(rescored), nbest_size=50).to_json()))
    by_hand = work / "by-hand.txt"
    result = run("rerank", "--weights", reranker, "--test", rescored, "-o", by_hand)
    assert result.exit_code == 0, result.stderr
    return {"work": work, "source": source, "ini": ini, "reranker": reranker, "model": model,
            "by_hand": by_hand.read_text(encoding="utf-8").splitlines(), "moses": moses}


def test_one_command_gives_what_the_steps_give_by_hand(system, tmp_path):
    lines = system["source"].read_text(encoding="utf-8").splitlines()
    source = tmp_path / "input.en"
    source.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n", encoding="utf-8")  # an empty line inside
    out = tmp_path / "out.fr"
    result = run("translate", "--moses", system["ini"], "--reranker", system["reranker"], source, "-o", out,
                 "--chunk-sentences", 3, "--moses-home", system["moses"].home)
    assert result.exit_code == 0, result.stderr
    by_hand = system["by_hand"]
    assert out.read_text(encoding="utf-8").splitlines() == by_hand[:3] + [""] + by_hand[3:]
    signature = json.loads(Path(f"{out}.json").read_text())
    assert signature["lines"] == 8 and signature["models"][0]["name"] == "RNN0"
    assert signature["tool"] == "phrase-scorer translate --moses --reranker" and signature["output"] == str(out)
    assert not Path(f"{out}.work").exists()  # the chunks' files are gone
    phases = re.search(r"\(Moses ([\d.]+) s, rescoring ([\d.]+) s, reranking ([\d.]+) s\)", result.stderr)
    assert phases and float(phases.group(1)) > 0 and float(phases.group(2)) > 0  # where the time went


def test_a_model_changed_since_tuning_is_refused(system, tmp_path):
    reranker = json.loads(system["reranker"].read_text())
    reranker["models"]["RNN0"]["weights_sha256"] = "0" * 64
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(reranker))
    result = run("translate", "--moses", system["ini"], "--reranker", changed, system["source"], "-o",
                 tmp_path / "out.fr", "--moses-home", system["moses"].home)
    assert result.exit_code == 1 and "the model of feature RNN0 changed since the reranker was tuned" in result.stderr
    assert not (tmp_path / "out.fr").exists()


def test_an_interrupted_run_resumes_to_the_same_bytes(system, tmp_path, monkeypatch):
    import phrase_scorer.generation.reranked_translation as module

    args = ["translate", "--moses", system["ini"], "--reranker", system["reranker"], system["source"],
            "--chunk-sentences", 3, "--moses-home", system["moses"].home]
    whole = tmp_path / "whole.fr"
    assert run(*args, "-o", whole).exit_code == 0
    real, calls = module.translate_chunk, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(module, "translate_chunk", interrupted)
    out = tmp_path / "out.fr"
    result = run(*args, "-o", out)
    assert result.exit_code != 0 and "--resume" in result.stderr and not out.exists()
    monkeypatch.setattr(module, "translate_chunk", real)
    result = run(*args, "-o", out, "--resume")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == whole.read_bytes()
