"""sample: reproducible ancestral sampling, beam search that agrees with score, clear errors."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from phrase_scorer.cli import cli
from phrase_scorer.config import SampleOptions
from phrase_scorer.generation.sampling import SourcePreparer, ancestral_samples, beam_search, display, propose
from phrase_scorer.scoring.batch_scorer import BatchScorer
from phrase_scorer.vocab import EOS_ID


def run(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, **kwargs)


def test_samples_are_reproducible_and_end_properly(loaded_tiny):
    ids = [loaded_tiny.source_vocab.encode("a man in a".split())]
    first = ancestral_samples(loaded_tiny.model, ids, 40, seed=5, max_length=4)
    again = ancestral_samples(loaded_tiny.model, ids, 40, seed=5, max_length=4)
    other = ancestral_samples(loaded_tiny.model, ids, 40, seed=6, max_length=4)
    assert first == again and first != other
    for seq, ended in first[0]:
        assert EOS_ID not in seq
        assert ended or len(seq) == 4  # </s> drawn, or stopped at the length limit
    assert any(ended for _, ended in first[0])


def test_beam_search_returns_distinct_best_first_with_scorer_scores(loaded_tiny):
    ids = loaded_tiny.source_vocab.encode("a man in a blue shirt".split())
    found = beam_search(loaded_tiny.model, ids, 6, max_length=8)
    assert len(found) == 6
    sequences = [seq for seq, _ in found]
    assert len(set(sequences)) == 6
    scores = [score for _, score in found]
    assert scores == sorted(scores, reverse=True)
    exact = BatchScorer(loaded_tiny.model).score([ids] * 6, [list(s) for s in sequences])
    for beam_score, scorer_score in zip(scores, exact):
        assert beam_score == pytest.approx(scorer_score, abs=1e-4)


def test_beam_search_finds_the_best_one_word_target(loaded_tiny):
    """With width V, beam search is exact at length 1: its best one-word phrase must beat every other."""
    ids = loaded_tiny.source_vocab.encode(["man"])
    words = list(range(3, len(loaded_tiny.target_vocab)))
    all_scores = BatchScorer(loaded_tiny.model).score([ids] * len(words), [[w] for w in words])
    found = beam_search(loaded_tiny.model, ids, len(words) + 2, max_length=1, allow_unk=False)
    best_one_word = max(score for seq, score in found if len(seq) == 1)
    assert best_one_word == pytest.approx(max(all_scores), abs=1e-4)


def test_cli_scores_equal_the_score_command(tmp_path, tiny_model):
    result = run("sample", "-m", tiny_model, "a man in a blue shirt", "--beam", 4, "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    assert entry["words"] == "a man in a blue shirt".split()
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("".join(f"a man in a blue shirt ||| {c['target']}\n" for c in entry["candidates"]))
    scored = [float(v) for v in run("score", "-m", tiny_model, pairs).stdout.split()]
    assert [c["log_prob"] for c in entry["candidates"]] == pytest.approx(scored, abs=1e-4)
    assert len(entry["candidates"]) == 4


def test_sampling_output_merges_duplicates_and_ranks_by_model(loaded_tiny):
    (result,) = propose(loaded_tiny, ["a man"], SampleOptions(samples=200, top=50, seed=2))
    texts = [c.text for c in result.candidates]
    assert len(texts) == len(set(texts))
    assert sum(c.count for c in result.candidates) <= 200
    complete = [c.log_prob for c in result.candidates if c.complete]
    assert complete == sorted(complete, reverse=True)
    assert max(c.count for c in result.candidates) > 1  # a small model repeats itself


def test_text_output_is_readable(tiny_model):
    result = run("sample", "-m", tiny_model, "A man's dog", "-n", 20, "--top", 3, "--seed", 3)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("a man 's dog")  # lowercased and tokenised like the table, escapes undone
    assert 1 <= len(lines) - 1 <= 3


def test_source_preparation_matches_the_table(loaded_tiny):
    prepare = SourcePreparer(loaded_tiny.source_vocab, lang="en")
    assert prepare.lowercase  # the Multi30k table is lowercased
    assert prepare("A man's \"big\" dog.") == ["a", "man", "&apos;s", "&quot;", "big", "&quot;", "dog", "."]
    assert SourcePreparer(loaded_tiny.source_vocab, tokenize=False, lowercase=False)("a  b") == ["a", "b"]
    assert display(["man", "&apos;s", "<unk>"]) == "man 's <unk>"


def test_language_model_column_and_ranking(tmp_path, loaded_tiny):
    arpa = tmp_path / "lm.arpa"
    arpa.write_text(
        "\\data\\\nngram 1=6\nngram 2=1\n\n\\1-grams:\n-1.0\t<unk>\t0\n-99\t<s>\t0\n-1.0\t</s>\t0\n"
        "-0.3\tun\t0\n-0.4\thomme\t0\n-2.0\tfemme\t0\n\n\\2-grams:\n-0.1\tun homme\n\n\\end\\\n")
    from phrase_scorer.generation.sampling import TargetLanguageModel

    lm = TargetLanguageModel(str(arpa))
    assert lm.log_prob(["un", "homme"]) == pytest.approx(-0.4 * math.log(10), abs=1e-4)  # p(un) p(homme | un)
    results = propose(loaded_tiny, ["a man"], SampleOptions(samples=60, top=10, rank_by="model+lm"), language_model=lm)
    candidates = [c for c in results[0].candidates if c.complete]
    assert all(c.lm_log_prob is not None for c in candidates)
    ranked = [c.log_prob + c.lm_log_prob for c in candidates]
    assert ranked == sorted(ranked, reverse=True)


@pytest.mark.parametrize("args, message", [
    (["   "], "empty source phrase"),
    (["zzqx qqzv"], "every word of 'zzqx qqzv' is outside the model's source shortlist"),
])
def test_bad_sources(tiny_model, args, message):
    result = run("sample", "-m", tiny_model, *args)
    assert result.exit_code == 1 and message in result.stderr


def test_missing_model(tmp_path):
    result = run("sample", "-m", tmp_path / "nope", "a man")
    assert result.exit_code == 1 and "model directory does not exist" in result.stderr


def test_sources_from_a_file(tmp_path, tiny_model):
    sources = tmp_path / "s.txt"
    sources.write_text("a man\n\nthe dog\n")
    result = run("sample", "-m", tiny_model, "-i", sources, "--json", "-n", 10)
    assert [e["source"] for e in json.loads(result.stdout)] == ["a man", "the dog"]
