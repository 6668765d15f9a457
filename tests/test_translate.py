"""translate: a line per input line, deterministic, scores the model agrees with, width 1 = greedy."""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

from phrase_scorer.cli import cli
from phrase_scorer.config import TranslateOptions
from phrase_scorer.model_dir import load_model
from phrase_scorer.scoring.batch_scorer import BatchScorer, pad
from phrase_scorer.generation.translate import translate_sentences
from phrase_scorer.vocab import EOS_ID, PAD_ID, UNK_ID

from conftest import VAL_EN, in_fp64


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module", params=["encdec", "rnnsearch"])
def sentence_model(request, sentence_models):
    """A tiny model of each architecture trained briefly on 500 Multi30k sentence pairs."""
    return sentence_models(request.param)


@pytest.fixture(scope="module")
def val_lines():
    return VAL_EN.read_text(encoding="utf-8").splitlines()[:6]


def test_one_line_per_input_line_and_deterministic(tmp_path, sentence_model, val_lines):
    source = tmp_path / "in.txt"
    source.write_text("\n".join([val_lines[0], "", *val_lines[1:4], ""]) + "\n", encoding="utf-8")
    first, again = tmp_path / "out1.txt", tmp_path / "out2.txt"
    assert run("translate", "-m", sentence_model, source, "-o", first, "--beam", 3,
               "--batch-sentences", 2).exit_code == 0
    assert run("translate", "-m", sentence_model, source, "-o", again, "--beam", 3,
               "--batch-sentences", 2).exit_code == 0
    lines = first.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 7 and lines[-1] == ""  # six lines, each ended by a newline
    assert lines[1] == "" and lines[5] == ""  # empty in, empty out
    assert all(lines[i] for i in (0, 2, 3, 4))
    assert all("<unk>" not in line and "  " not in line for line in lines)
    assert first.read_text(encoding="utf-8") == again.read_text(encoding="utf-8")


def test_batching_changes_nothing(sentence_model, val_lines):
    """Sentences searched two at a time or all together: the same translations and scores (in fp64,
    where the batch shape cannot flip a near-tie between candidates; see conftest.in_fp64)."""
    loaded = in_fp64(load_model(sentence_model))
    sentences = [line.split() for line in val_lines]
    pairs = translate_sentences(loaded, sentences, TranslateOptions(beam=3, batch_sentences=2))
    together = translate_sentences(loaded, sentences, TranslateOptions(beam=3))
    assert [t.words for t in pairs] == [t.words for t in together]
    assert [t.log_prob for t in pairs] == pytest.approx([t.log_prob for t in together], rel=1e-6, abs=1e-5)


@pytest.mark.parametrize("length_normalize", [True, False])
def test_reported_score_is_the_models_score(sentence_model, val_lines, length_normalize):
    loaded = load_model(sentence_model)
    sentences = [line.split() for line in val_lines]
    found = translate_sentences(loaded, sentences, TranslateOptions(beam=4, length_normalize=length_normalize))
    source_ids = [loaded.source_vocab.encode(s) for s in sentences]
    target_ids = [loaded.target_vocab.encode(t.words) for t in found]
    assert all(t.words and UNK_ID not in ids for t, ids in zip(found, target_ids))
    scored = BatchScorer(loaded.model).score(source_ids, target_ids)
    assert [t.log_prob for t in found] == pytest.approx(list(scored), rel=1e-5, abs=1e-4)  # beam sums in fp32


@torch.no_grad()
def greedy(model, source_ids, max_length):
    """Greedy decoding written out on the model interface: the most probable next word, with
    </s> barred first and <unk> always, until </s> or the length limit."""
    src, src_len = pad([source_ids], "cpu")
    rows = model.encode(src, src_len)
    state = model.start(rows)
    prev = torch.tensor([PAD_ID])
    words, total = [], 0.0
    for t in range(max_length + 1):
        state, features = model.step(rows, state, prev)
        log_p = model.log_probs(features)[0].clone()
        log_p[UNK_ID - 1] = -math.inf
        if t == 0:
            log_p[EOS_ID - 1] = -math.inf
        if t == max_length:
            return words, total + log_p[EOS_ID - 1].item()
        best = int(log_p.argmax()) + 1
        total += log_p[best - 1].item()
        if best == EOS_ID:
            return words, total
        words.append(best)
        prev = torch.tensor([best])


def test_beam_width_one_is_greedy(sentence_model, val_lines):
    # in fp64: the search runs the sentences in one batch, greedy() one at a time (conftest.in_fp64)
    loaded = in_fp64(load_model(sentence_model))
    sentences = [line.split() for line in val_lines]
    found = translate_sentences(loaded, sentences, TranslateOptions(beam=1, max_length_ratio=1.5))
    for sentence, translation in zip(sentences, found):
        ids = loaded.source_vocab.encode(sentence)
        words, total = greedy(loaded.model, ids, math.ceil(1.5 * len(ids)))
        assert loaded.target_vocab.decode(words) == translation.words
        assert translation.log_prob == pytest.approx(total, rel=1e-5, abs=1e-4)  # the beam sums in fp32


def run_both(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_the_whole_system_is_its_own_verb_and_the_old_spelling_reaches_it_with_a_note(tmp_path):
    """translate-system is the whole tuned system; 'translate --moses ...' still runs it, to the
    same result, with one line on stderr naming the new verb."""
    ini, reranker, source = tmp_path / "moses.ini", tmp_path / "reranker.json", tmp_path / "in.en"
    for path in (ini, reranker, source):
        path.write_text("a\n", encoding="utf-8")
    args = ["--moses", ini, "--reranker", reranker, source, "-o", tmp_path / "out.fr", "--moses-home",
            tmp_path / "no-moses"]
    new, old = run_both("translate-system", *args), run_both("translate", *args)
    assert new.exit_code == old.exit_code == 1 and "--moses-home" in new.stderr  # past the options, to Moses
    assert "translate-system" not in new.stderr
    note, *rest = old.stderr.splitlines(keepends=True)

    def steady(lines):  # a busy machine's warning counts the tasks running at that moment
        return [line for line in lines if "this machine is busy" not in line]

    assert "'translate --moses' is now 'phrase-scorer translate-system'" in note
    assert steady(rest) == steady(new.stderr.splitlines(keepends=True))
    assert not (tmp_path / "out.fr").exists()


def test_each_translate_verb_takes_only_its_own_options(tmp_path, tiny_model):
    """translate -m refuses the whole system's options, and the old spelling of translate-system
    refuses translate -m's, each naming the verb whose option it is; neither --help lists the other's."""
    ini, source = tmp_path / "moses.ini", tmp_path / "in.en"
    for path in (ini, source):
        path.write_text("a\n", encoding="utf-8")
    out = tmp_path / "out.fr"
    result = run_both("translate", "-m", tiny_model, source, "-o", out, "--chunk-sentences", 5)
    assert result.exit_code == 1 and "--chunk-sentences is an option of translate-system" in result.stderr
    result = run_both("translate", "--moses", ini, "--reranker", ini, source, "-o", out, "--beam", 3)
    assert result.exit_code == 1 and "--beam is an option of translate -m" in result.stderr
    assert not out.exists()
    model_help = run_both("translate", "--help").output
    system_help = run_both("translate-system", "--help").output
    assert "--reranker" not in model_help and "--chunk-sentences" not in model_help and "--beam" in model_help
    assert "--beam" not in system_help and "--model" not in system_help and "--reranker" in system_help
