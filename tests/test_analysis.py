"""compare (Table 2) and the plots (Figs. 3-5): real files, checked outputs."""

from __future__ import annotations

import json
import re
import struct
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats
from click.testing import CliRunner

from conftest import A_MAN_TABLE
from phrase_scorer.analysis.compare import CompareOptions, compare, to_markdown
from phrase_scorer.scoring.annotate import annotate
from phrase_scorer.cli import cli
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.scoring.batch_scorer import BatchScorer


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
    missing = CliRunner().invoke(cli, ["compare", "-m", str(tiny_model), str(A_MAN_TABLE),
                                       "--source", "no such phrase"])
    assert missing.exit_code == 1 and "not in the table" in missing.stderr


def test_plot_scores(tmp_path, loaded_tiny, tiny_model):
    annotated = tmp_path / "pt.rnn.gz"
    annotate(A_MAN_TABLE, annotated, loaded_tiny)
    png = tmp_path / "scores.png"
    result = run("plot", "scores", annotated, "-o", png)
    assert result.exit_code == 0, result.output
    assert png_size(png) == (700, 600)
    assert png.stat().st_size > 10_000
    assert "2,020 of 2,020 pairs" in result.stdout
    # the printed correlations are those of the table's log p(f|e) and the model's column,
    # computed here independently from the annotated file
    lines = list(read_phrase_table(annotated))
    x = np.log([l.scores[0] for l in lines])
    y = np.log([l.scores[4] for l in lines])
    pearson = float(re.search(r"Pearson (-?[\d.]+)", result.stdout).group(1))
    spearman = float(re.search(r"Spearman (-?[\d.]+)", result.stdout).group(1))
    assert pearson == pytest.approx(np.corrcoef(x, y)[0, 1], abs=6e-4)
    assert spearman == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=6e-4)


@pytest.mark.parametrize("relation, expected", [(lambda p: p ** 2, 1.0), (lambda p: 1e-3 / p, -1.0)])
def test_plot_scores_draws_the_table_against_the_model_column(tmp_path, monkeypatch, relation, expected):
    """A model column that is a power of the table's p(f|e) lies on a line in log space: r = +-1,
    and every pair lands in the figure's hexbins at its own (x, y)."""
    import matplotlib.axes

    from phrase_scorer.analysis.plots import plot_scores

    rng = np.random.default_rng(0)
    probs = rng.uniform(0.01, 1.0, 300)
    table = tmp_path / "t.txt"
    table.write_text("".join(f"a{i} ||| b ||| {p:.9g} 0.5 0.5 0.5 {relation(p):.9g} 1\n" for i, p in enumerate(probs)))
    drawn = {}
    original = matplotlib.axes.Axes.hexbin

    def hexbin(self, x, y, *args, **kwargs):
        drawn["x"], drawn["y"] = np.asarray(x), np.asarray(y)
        drawn["bins"] = original(self, x, y, *args, **kwargs)
        return drawn["bins"]

    monkeypatch.setattr(matplotlib.axes.Axes, "hexbin", hexbin)
    stats = plot_scores(table, tmp_path / "s.png")
    assert stats.model_column == 4 and stats.points == stats.lines == 300
    assert stats.pearson == pytest.approx(expected, abs=1e-9)
    assert stats.spearman == pytest.approx(expected, abs=1e-9)
    written = np.array([float("%.9g" % p) for p in probs])
    assert np.allclose(np.sort(drawn["x"]), np.sort(np.log(written)))
    assert np.allclose(np.sort(drawn["y"]), np.sort(np.log([float("%.9g" % relation(p)) for p in written])), rtol=1e-6)
    assert drawn["bins"].get_array().sum() == 300  # every pair is counted in a bin


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
