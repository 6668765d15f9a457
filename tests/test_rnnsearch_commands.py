"""RNNsearch through the commands: train --arch rnnsearch, annotate, score, sample, and --resume."""

from __future__ import annotations

import gzip
import json
import math

import pytest
from click.testing import CliRunner

from conftest import A_MAN_TABLE, EXAMPLE_TABLE, assert_beams_batched_as_alone, head_lines, in_fp64
from phrase_scorer.cli import cli
from phrase_scorer.model_dir import load_model
from phrase_scorer.models.rnnsearch import RNNsearch
from phrase_scorer.scoring.batch_scorer import log_probs_by_forward


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def search_model(tmp_path_factory):
    """A tiny RNNsearch trained for a few dozen steps on the bundled example table."""
    out = tmp_path_factory.mktemp("search") / "model"
    result = run("train", EXAMPLE_TABLE, "-o", out, "--arch", "rnnsearch", "--preset", "tiny", "--max-steps", 40,
                 "--valid-every", 20, "--valid-pairs", 200, "--seed", 3)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def table_slice(tmp_path_factory):
    path = tmp_path_factory.mktemp("slice") / "pt.txt"
    path.write_bytes(b"".join(head_lines(A_MAN_TABLE, 400)))
    return path


def test_config_records_the_architecture_and_loads_it(search_model):
    config = json.loads((search_model / "config.json").read_text())
    assert config["model"]["arch"] == "rnnsearch" and config["training"]["arch"] == "rnnsearch"
    assert isinstance(load_model(search_model).model, RNNsearch)


def test_score_and_annotate_equal_the_forward_pass(tmp_path, search_model, table_slice):
    loaded = load_model(search_model)
    lines = table_slice.read_text(encoding="utf-8").splitlines()
    sources = [loaded.source_vocab.encode(l.split(" ||| ")[0].split()) for l in lines]
    targets = [loaded.target_vocab.encode(l.split(" ||| ")[1].split()) for l in lines]
    want = log_probs_by_forward(loaded.model, sources, targets)

    scored = run("score", "-m", search_model, table_slice)
    assert scored.exit_code == 0, scored.output
    values = [float(v) for v in scored.stdout.split("\n") if v]
    assert len(values) == len(lines)
    assert values == pytest.approx(list(want), abs=1e-4)

    out = tmp_path / "pt.rnn.gz"
    annotated = run("annotate", table_slice, "-m", search_model, "-o", out)
    assert annotated.exit_code == 0, annotated.output
    with gzip.open(out, "rt", encoding="utf-8") as f:
        rows = f.read().splitlines()
    assert len(rows) == len(lines)
    for row, line, log_p, tgt in zip(rows, lines, want, targets):
        assert row.split(" ||| ")[:2] == line.split(" ||| ")[:2]
        prob, unk = map(float, row.split(" ||| ")[2].split()[-2:])
        assert prob == pytest.approx(math.exp(max(log_p, -100)), rel=1e-4)
        assert unk == pytest.approx(math.exp(sum(1 for w in line.split(" ||| ")[1].split()
                                                 if w not in loaded.target_vocab)), rel=1e-6)


def test_sentence_pairs_score_like_phrase_pairs(tmp_path, search_model):
    pairs = tmp_path / "sentences.txt"
    pairs.write_text("a man in a blue shirt is standing on a ladder . "
                     "||| un homme en chemise bleue est debout sur une échelle .\n"
                     "two dogs play . ||| deux chiens jouent .\n", encoding="utf-8")
    loaded = load_model(search_model)
    result = run("score", "-m", search_model, pairs)
    assert result.exit_code == 0, result.output
    got = [float(v) for v in result.stdout.split()]
    lines = [l.split(" ||| ") for l in pairs.read_text(encoding="utf-8").splitlines()]
    want = log_probs_by_forward(loaded.model, [loaded.source_vocab.encode(s.split()) for s, _ in lines],
                                [loaded.target_vocab.encode(t.split()) for _, t in lines])
    assert got == pytest.approx(list(want), abs=1e-4)


def test_sample_and_beam_search_run_through_the_interface(search_model):
    result = run("sample", "-m", search_model, "a man in a blue shirt", "--beam", 3, "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    assert 1 <= len(entry["candidates"]) <= 3
    sampled = run("sample", "-m", search_model, "a man", "-n", 20, "--top", 4, "--seed", 1)
    assert sampled.exit_code == 0 and "a man" in sampled.stdout

    # batched and alone in fp64, where the batch shape cannot flip a near-tie (conftest.in_fp64)
    assert_beams_batched_as_alone(in_fp64(load_model(search_model)), ("a man", "a man in a blue shirt", "dog"),
                                  1e-5)


def test_resume_keeps_the_architecture_and_refuses_another(tmp_path):
    out = tmp_path / "model"
    args = ["train", EXAMPLE_TABLE, "-o", out, "--arch", "rnnsearch", "--preset", "tiny", "--valid-every", 5,
            "--valid-pairs", 100]
    assert run(*args, "--max-steps", 5).exit_code == 0
    refused = CliRunner().invoke(cli, [str(a) for a in ["train", EXAMPLE_TABLE, "-o", out, "--resume",
                                                          "--arch", "encdec", "--max-steps", 10]])
    assert refused.exit_code != 0
    assert "--arch" in refused.output and "rnnsearch -> encdec" in refused.output
    resumed = run("train", EXAMPLE_TABLE, "-o", out, "--resume", "--max-steps", 10)
    assert resumed.exit_code == 0, resumed.output
    assert isinstance(load_model(out).model, RNNsearch)
    assert json.loads((out / "config.json").read_text())["model"]["arch"] == "rnnsearch"


def test_compare_ranks_targets_by_the_rnnsearch_score(search_model):
    """compare (Table 2) with an RNNsearch model: each source's top targets by the model are the
    targets with the highest teacher-forced log p, with those scores."""
    from phrase_scorer.analysis.compare import CompareOptions, compare
    from phrase_scorer.io.phrase_table import read_phrase_table

    loaded = load_model(search_model)
    result = compare(A_MAN_TABLE, loaded, CompareOptions(frequent=2, rare=2, top=3))
    assert [c.group for c in result] == ["frequent"] * 2 + ["rare"] * 2
    lines = list(read_phrase_table(A_MAN_TABLE))
    for c in result:
        pairs = [l for l in lines if l.source == c.source]
        scores = log_probs_by_forward(loaded.model, [loaded.source_vocab.encode(l.source_words) for l in pairs],
                                      [loaded.target_vocab.encode(l.target_words) for l in pairs])
        best = sorted(zip(scores, (l.target for l in pairs)), key=lambda x: (-x[0], x[1]))[:3]
        assert [t for t, _ in c.by_model] == [t for _, t in best]
        assert [s for _, s in c.by_model] == pytest.approx([float(s) for s, _ in best], abs=1e-4)
    shown = run("compare", "-m", search_model, A_MAN_TABLE, "--source", "a man in a blue shirt", "--json", "--top", 2)
    assert shown.exit_code == 0, shown.output
    (entry,) = json.loads(shown.stdout)
    assert entry["source"] == "a man in a blue shirt" and len(entry["by_model"]) == 2


def test_word_maps_work_and_phrase_maps_are_refused(tmp_path, search_model):
    """RNNsearch has word embeddings to map, but no fixed-length summary c of a phrase."""
    words = tmp_path / "words.png"
    result = run("plot", "embeddings", "-m", search_model, "-o", words, "--words", 60, "--method", "tsne")
    assert result.exit_code == 0, result.output
    assert words.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    phrases = tmp_path / "phrases.png"
    refused = CliRunner().invoke(cli, ["plot", "embeddings", "-m", str(search_model), "-o", str(phrases), "--kind",
                                       "phrases", "--table", str(A_MAN_TABLE), "--method", "tsne"])
    assert refused.exit_code == 1
    (line,) = refused.stderr.strip().splitlines()
    assert "(rnnsearch) has no fixed-length summary" in line and "--kind words" in line
    assert not phrases.exists()
