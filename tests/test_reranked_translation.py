"""`translate-system --moses INI --reranker RERANKER`: new text through the whole tuned system, checked
against the same steps run by hand (decode n-best lists, rescore, apply-reranker). Needs a Moses
build (MOSES_HOME) and the shared Multi30k system."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import EXAMPLE_TABLE, SHARED_SYSTEM, SHARED_TABLE
from phrase_scorer.cli import cli
from phrase_scorer.config import CPU_BATCH_TOKENS, MosesIniOptions
from phrase_scorer.io.nbest import read_nbest
from phrase_scorer.records import Signature
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
    from phrase_scorer.rescoring.optimisers import weights_from_ini
    from phrase_scorer.rescoring.reranker import Reranker, rescored_models

    work = tmp_path_factory.mktemp("reranked")
    source = first_lines(TEST_EN, 7, work / "test.en")
    table = table_for_sentences(SHARED_TABLE, source.read_text().splitlines(), work / "pt.gz", minimum=100)
    ini = work / "system.ini"
    patch_moses_ini(SHARED_SYSTEM / "moses.tuned.ini", ini, phrase_table=table,
                    options=MosesIniOptions(add_features=0, absolute_paths=True))
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
    result = run("apply-reranker", reranker, "--test", rescored, "-o", by_hand)
    assert result.exit_code == 0, result.stderr
    return {"work": work, "source": source, "ini": ini, "reranker": reranker, "model": model, "rescored": rescored,
            "by_hand": by_hand.read_text(encoding="utf-8").splitlines(), "moses": moses,
            "vocabulary": request.param}


def words_only(system):
    if system["vocabulary"] != "words":
        pytest.skip("what this checks does not depend on the model's vocabulary: checked with the word model")


@contextlib.contextmanager
def second_chunk_interrupted(monkeypatch, module):
    """Ctrl-C (KeyboardInterrupt) while the second chunk is reranked; ``rerank_chunk`` is itself
    again after the block."""
    real, calls = module.rerank_chunk, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(module, "rerank_chunk", interrupted)
    try:
        yield
    finally:
        monkeypatch.setattr(module, "rerank_chunk", real)


def moses_threads() -> list:
    """The threads decoding chunks ahead that are still alive."""
    return [t for t in threading.enumerate() if t.name.startswith("phrase-scorer-moses")]


def test_one_command_gives_what_the_steps_give_by_hand(system, tmp_path):
    lines = system["source"].read_text(encoding="utf-8").splitlines()
    source = tmp_path / "input.en"
    source.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n", encoding="utf-8")  # an empty line inside
    out = tmp_path / "out.fr"
    result = run("translate-system", "--moses", system["ini"], "--reranker", system["reranker"], source, "-o", out,
                 "--chunk-sentences", 3, "--moses-home", system["moses"].home)
    assert result.exit_code == 0, result.stderr
    by_hand = system["by_hand"]
    assert out.read_text(encoding="utf-8").splitlines() == by_hand[:3] + [""] + by_hand[3:]
    signature = json.loads(Path(f"{out}.json").read_text())
    assert signature["lines"] == 8 and signature["models"][0]["name"] == "RNN0"
    assert signature["tool"] == "phrase-scorer translate --moses --reranker" and signature["output"] == str(out)
    # the CPU's defaults, recorded as the values they are
    assert (signature["bound"], signature["scoring"]["batch_tokens"]) == (True, CPU_BATCH_TOKENS)
    # the summary quotes the signature's one line, read from the signature written
    assert f"signature: {Signature.read(out).line()}" in result.stderr.splitlines()
    assert not Path(f"{out}.work").exists()  # the chunks' files are gone
    phases = re.search(r"\(Moses ([\d.]+) s, rescoring ([\d.]+) s, reranking ([\d.]+) s; waiting for Moses "
                       r"([\d.]+) s\)", result.stderr)
    assert phases and float(phases.group(1)) > 0 and float(phases.group(2)) > 0  # where the time went
    assert float(phases.group(4)) > 0  # the first chunk's decoding is never hidden
    # the system's text tables and ARPA model, which Moses parses before its first sentence, are named
    assert "Moses parses the text files of TranslationModel0, LexicalReordering0, LM0 on one core" in result.stderr
    # a reranker that records no decoder options (as this one, written by hand) is named once
    assert result.stderr.count("records no decoder options") == 1 and "rerank's --decoder-flags" in result.stderr


def test_the_old_spelling_translate_moses_writes_the_same_bytes(system, tmp_path):
    """'translate --moses ...' runs translate-system: the same output and signature, and a note."""
    words_only(system)
    outputs = {}
    for verb in (["translate-system"], ["translate"]):
        out = tmp_path / f"{verb[0]}.fr"
        result = run(*verb, "--moses", system["ini"], "--reranker", system["reranker"], system["source"], "-o", out,
                     "--chunk-sentences", 3, "--moses-home", system["moses"].home)
        assert result.exit_code == 0, result.stderr
        signature = json.loads(Path(f"{out}.json").read_text())
        signature.pop("output"), signature.pop("finished", None)
        outputs[verb[0]] = (out.read_bytes(), signature, "now 'phrase-scorer translate-system'" in result.stderr)
    assert outputs["translate"][:2] == outputs["translate-system"][:2]
    assert (outputs["translate"][2], outputs["translate-system"][2]) == (True, False)


def test_a_model_changed_since_tuning_is_refused(system, tmp_path):
    reranker = json.loads(system["reranker"].read_text())
    reranker["models"]["RNN0"]["weights_sha256"] = "0" * 64
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(reranker))
    result = run("translate-system", "--moses", system["ini"], "--reranker", changed, system["source"], "-o",
                 tmp_path / "out.fr", "--moses-home", system["moses"].home)
    assert result.exit_code == 1 and "the model of feature RNN0 changed since the reranker was tuned" in result.stderr
    assert not (tmp_path / "out.fr").exists()


@pytest.mark.parametrize("pipeline", ["--pipeline", "--no-pipeline"])
def test_an_interrupted_run_resumes_to_the_same_bytes(system, tmp_path, monkeypatch, pipeline):
    import phrase_scorer.rescoring.translation as module

    if pipeline == "--no-pipeline":
        words_only(system)
    args = ["translate-system", "--moses", system["ini"], "--reranker", system["reranker"], system["source"],
            "--chunk-sentences", 3, "--moses-home", system["moses"].home, pipeline]
    whole = tmp_path / "whole.fr"
    assert run(*args, "-o", whole).exit_code == 0
    out = tmp_path / "out.fr"
    with second_chunk_interrupted(monkeypatch, module):  # and the third decoded, pipelined
        result = run(*args, "-o", out)
    assert result.exit_code != 0 and "--resume" in result.stderr and not out.exists()
    assert not moses_threads()  # the decoding ahead was waited for
    part = tmp_path / "out.fr.part"
    assert part.read_bytes() == b"".join(whole.read_bytes().splitlines(keepends=True)[:3])  # the first chunk
    result = run(*args, "-o", out, "--resume")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == whole.read_bytes()
    if pipeline == "--pipeline":  # a run resumes whether or not it pipelines: not a setting of the output
        again = tmp_path / "again.fr"
        with second_chunk_interrupted(monkeypatch, module):
            assert run(*args, "-o", again).exit_code != 0
        result = run(*args[:-1], "--no-pipeline", "-o", again, "--resume")
        assert result.exit_code == 0 and "resuming after 3 lines" in result.stderr, result.stderr
        assert again.read_bytes() == whole.read_bytes()


def test_int8_is_recorded_and_a_resumed_run_refuses_another_precision(system, tmp_path, monkeypatch):
    import phrase_scorer.rescoring.translation as module

    words_only(system)
    args = ["translate-system", "--moses", system["ini"], "--reranker", system["reranker"], system["source"],
            "--chunk-sentences", 3, "--moses-home", system["moses"].home]
    whole = tmp_path / "whole.fr"
    assert run(*args, "--precision", "int8", "-o", whole).exit_code == 0
    scoring = json.loads(Path(f"{whole}.json").read_text())["scoring"]
    assert scoring["precision"] == "int8" and scoring["int8_engine"]
    assert len(whole.read_text(encoding="utf-8").splitlines()) == 7
    out = tmp_path / "out.fr"
    with second_chunk_interrupted(monkeypatch, module):
        assert run(*args, "--precision", "int8", "-o", out).exit_code != 0 and not out.exists()
    result = run(*args, "-o", out, "--resume")  # fp32 now
    assert result.exit_code == 1 and "scoring.precision: int8 -> fp32" in result.stderr, result.stderr
    result = run(*args, "--precision", "int8", "-o", out, "--resume")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("pipeline", [True, False])
def test_moses_decodes_the_next_chunk_while_this_one_is_rescored(system, tmp_path, monkeypatch, pipeline):
    """Pipelined, chunk k + 1 is decoded while chunk k is rescored and reranked, never further
    ahead (two chunks' folders at most); one after the other, only chunk k's folder exists. Both
    write the lines of the steps run by hand, the same bytes."""
    import phrase_scorer.rescoring.translation as module

    lines = system["source"].read_text(encoding="utf-8").splitlines()
    source = tmp_path / "input.en"
    source.write_text("\n".join(lines[:3] + [""] + lines[3:]) + "\n", encoding="utf-8")  # 4 chunks of 2 lines
    decoded = [threading.Event() for _ in range(4)]
    seen = []
    real_decode, real_rerank = module.decode_chunk, module.rerank_chunk

    def decode_chunk(index, *a, **k):
        result = real_decode(index, *a, **k)
        decoded[index].set()
        return result

    def rerank_chunk(chunk, **k):
        if chunk.index < 3:
            if pipeline:  # waits for the next chunk's decoding: it never ends when nothing decodes ahead
                assert decoded[chunk.index + 1].wait(timeout=600)
            else:
                assert not decoded[chunk.index + 1].is_set()
        seen.append((chunk.index, sorted(p.name for p in chunk.directory.parent.glob("chunk-*"))))
        return real_rerank(chunk, **k)

    monkeypatch.setattr(module, "decode_chunk", decode_chunk)
    monkeypatch.setattr(module, "rerank_chunk", rerank_chunk)
    out = tmp_path / "out.fr"
    result = run("translate-system", "--moses", system["ini"], "--reranker", system["reranker"], source, "-o", out,
                 "--chunk-sentences", 2, "--moses-home", system["moses"].home,
                 "--pipeline" if pipeline else "--no-pipeline")
    assert result.exit_code == 0, result.stderr
    if pipeline:
        assert seen == [(0, ["chunk-0", "chunk-1"]), (1, ["chunk-1", "chunk-2"]), (2, ["chunk-2", "chunk-3"]),
                        (3, ["chunk-3"])]
    else:
        assert seen == [(k, [f"chunk-{k}"]) for k in range(4)]
    by_hand = system["by_hand"]
    assert out.read_bytes() == "".join(line + "\n" for line in by_hand[:3] + [""] + by_hand[3:]).encode("utf-8")
    assert "pipeline" not in json.loads(Path(f"{out}.json").read_text())  # not a setting of the output
    assert not Path(f"{out}.work").exists() and not moses_threads()


@pytest.mark.parametrize("pipeline", ["--pipeline", "--no-pipeline"])
def test_moses_dying_during_the_run_stops_it_with_its_error(system, tmp_path, monkeypatch, pipeline):
    """Moses is killed once the first chunk's lists are read: the run stops with exit code 1 and
    an error naming Moses' log, at the first chunk whose lists Moses had not written yet; the
    chunks before it are kept whole for --resume, nothing after; resumed, it writes the lines of
    the steps run by hand."""
    import phrase_scorer.rescoring.translation as module

    words_only(system)
    real = module.decode_chunk

    def decode_chunk(index, *a, **k):
        result = real(index, *a, **k)
        if index == 0:
            k["stream"].process.kill()  # the one Moses of the run
        return result

    monkeypatch.setattr(module, "decode_chunk", decode_chunk)
    out = tmp_path / "out.fr"
    args = ["translate-system", "--moses", system["ini"], "--reranker", system["reranker"], system["source"], "-o", out,
            "--chunk-sentences", 2, "--moses-home", system["moses"].home, pipeline]
    result = run(*args)
    assert result.exit_code == 1 and not out.exists() and not moses_threads()
    message = result.stderr.strip().splitlines()[-1]
    assert re.search(r"moses\.log: Moses was killed by signal 9 \(SIGKILL", message), result.stderr
    by_hand = system["by_hand"]
    kept = Path(f"{out}.part").read_text(encoding="utf-8").splitlines()
    assert 2 <= len(kept) < len(by_hand) and len(kept) % 2 == 0 and kept == by_hand[:len(kept)]  # whole chunks
    monkeypatch.setattr(module, "decode_chunk", real)
    result = run(*args, "--resume")
    assert result.exit_code == 0, result.stderr
    assert out.read_text(encoding="utf-8").splitlines() == by_hand


def test_a_moses_ini_moses_cannot_read_stops_the_run_with_moses_error(system, tmp_path):
    ini = tmp_path / "system.ini"
    ini.write_text(Path(system["ini"]).read_text().replace("[feature]", "[feature]\nNoSuchFeature name=X"))
    out = tmp_path / "out.fr"
    result = run("translate-system", "--moses", ini, "--reranker", system["reranker"], system["source"], "-o", out,
                 "--moses-home", system["moses"].home)
    assert result.exit_code == 1 and not out.exists() and not moses_threads()
    message = result.stderr.strip().splitlines()[-1]
    assert re.search(r"moses\.log: Moses stopped with exit code \d+: .*NoSuchFeature", message), result.stderr


def test_a_model_feature_weighted_0_is_neither_loaded_nor_run(system, tmp_path):
    """The reranker applied without the feature writes what it writes on the list rescored with it."""
    words_only(system)
    reranker = json.loads(system["reranker"].read_text())
    reranker["weights"]["RNN0"] = [0.0]
    reranker["models"]["RNN0"]["directory"] = str(tmp_path / "removed-model")  # loading it would fail
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(reranker))
    with_model = tmp_path / "with-model.txt"
    result = run("apply-reranker", zero, "--test", system["rescored"], "-o", with_model)
    assert result.exit_code == 0, result.stderr
    out = tmp_path / "out.fr"
    result = run("translate-system", "--moses", system["ini"], "--reranker", zero, system["source"], "-o", out,
                 "--chunk-sentences", 4, "--moses-home", system["moses"].home)
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes() == with_model.read_bytes()
    assert "feature RNN0 is weighted 0: its model is not run" in result.stderr
    assert json.loads(Path(f"{out}.json").read_text())["models"] == []
