"""compare (Table 2) and the plots (Figs. 3-5): real files, checked outputs."""

from __future__ import annotations

import json
import re
import struct
import sys

import pytest
from click.testing import CliRunner

from conftest import A_MAN_TABLE
from phrase_scorer.analysis.compare import CompareOptions, compare, to_markdown
from phrase_scorer.annotate import annotate
from phrase_scorer.cli import cli
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.scoring import BatchScorer


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_compare_ranks_by_table_and_by_model(loaded_tiny):
    result = compare(A_MAN_TABLE, loaded_tiny, CompareOptions(frequent=3, rare=3, top=3))
    assert [c.group for c in result] == ["frequent"] * 3 + ["rare"] * 3
    counts = [c.source_count for c in result]
    assert counts[:3] == sorted(counts[:3], reverse=True) and counts[3:] == sorted(counts[3:])
    assert min(counts[:3]) >= max(counts[3:])
    lines = list(read_phrase_table(A_MAN_TABLE))
    for c in result:
        assert len(c.source.split()) >= 4 and c.targets >= 3
        pairs = [l for l in lines if l.source == c.source]
        best_table = sorted(pairs, key=lambda l: (-l.scores[2], l.target))[:3]
        assert [t for t, _ in c.by_table] == [l.target for l in best_table]
        model = BatchScorer(loaded_tiny.model).score([loaded_tiny.source_vocab.encode(l.source_words) for l in pairs],
                                                      [loaded_tiny.target_vocab.encode(l.target_words) for l in pairs])
        best_model = sorted(zip(model, (l.target for l in pairs)), key=lambda x: (-x[0], x[1]))[:3]
        assert [t for t, _ in c.by_model] == [t for _, t in best_model]
    markdown = to_markdown(result)
    assert "Long, frequent source phrases" in markdown and "| Source | Translation model" in markdown


def test_compare_reads_the_annotated_column(tmp_path, loaded_tiny):
    annotated = tmp_path / "pt.rnn.gz"
    annotate(A_MAN_TABLE, annotated, loaded_tiny)
    from_column = compare(annotated, loaded_tiny, CompareOptions(frequent=2, rare=2))
    computed = compare(A_MAN_TABLE, loaded_tiny, CompareOptions(frequent=2, rare=2))
    for a, b in zip(from_column, computed):
        assert [t for t, _ in a.by_model] == [t for t, _ in b.by_model]
        assert [s for _, s in a.by_model] == pytest.approx([s for _, s in b.by_model], rel=1e-4)


def test_compare_chosen_sources_and_cli(tiny_model):
    result = run("compare", "-m", tiny_model, A_MAN_TABLE, "--source", "a man in a blue shirt", "--json", "--top", 2)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    assert entry["source"] == "a man in a blue shirt" and len(entry["by_model"]) == 2
    missing = CliRunner().invoke(cli, ["compare", "-m", str(tiny_model), str(A_MAN_TABLE), "--source", "no such phrase"])
    assert missing.exit_code == 1 and "not in the table" in missing.stderr


def test_plot_scores(tmp_path, loaded_tiny, tiny_model):
    annotated = tmp_path / "pt.rnn.gz"
    annotate(A_MAN_TABLE, annotated, loaded_tiny)
    png = tmp_path / "scores.png"
    result = run("plot", "scores", annotated, "-o", png)
    assert result.exit_code == 0, result.output
    assert png_size(png) == (700, 600)
    assert png.stat().st_size > 10_000
    pearson = float(re.search(r"Pearson (-?[\d.]+)", result.stdout).group(1))
    assert -1 <= pearson <= 1 and "2,020 of 2,020 pairs" in result.stdout


def test_plot_embeddings_png_and_html(tmp_path, tiny_model, loaded_tiny):
    png, page = tmp_path / "words.png", tmp_path / "words.html"
    result = run("plot", "embeddings", "-m", tiny_model, "-o", png, "--html", page, "--words", 120, "--method", "tsne")
    assert result.exit_code == 0, result.output
    assert png_size(png) == (1000, 800)
    html = page.read_text()
    payload = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S).group(1)
    data = json.loads(payload.replace("<\\/", "</"))
    assert len(data["points"]) == len(data["labels"]) == 120
    assert data["labels"][0] == loaded_tiny.source_vocab.tokens[3]
    assert all(len(p) == 2 for p in data["points"])

    phrases = tmp_path / "phrases.png"
    result = run("plot", "embeddings", "-m", tiny_model, "-o", phrases, "--kind", "phrases", "--table", A_MAN_TABLE,
                 "--phrases", 150, "--method", "tsne")
    assert result.exit_code == 0, result.output
    assert png_size(phrases) == (1000, 800)


def test_missing_plot_extra_gives_an_install_hint(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = CliRunner().invoke(cli, ["plot", "embeddings", "-m", str(tiny_model), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    assert "pip install 'phrase-scorer[plots]'" in result.stderr
