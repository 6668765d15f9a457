"""plot alignments: RNNsearch's soft alignments as heat maps (Bahdanau et al. 2015, Fig. 3)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import VAL_EN, VAL_FR
from phrase_scorer.analysis.alignments import alignment_weights, choose_pairs, plot_alignments
from phrase_scorer.cli import cli
from phrase_scorer.config import AlignmentPlotOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model_dir import load_model
from phrase_scorer.scoring.batch_scorer import pad

from test_analysis import png_size


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def search_model(sentence_models):
    return sentence_models("rnnsearch")


@pytest.fixture(scope="module")
def val_lines():
    return VAL_EN.read_text(encoding="utf-8").splitlines(), VAL_FR.read_text(encoding="utf-8").splitlines()


def test_heat_maps_are_written_one_png_per_pair(tmp_path, search_model, val_lines):
    target = tmp_path / "val.fr.gz"  # a gzip target file reads as a plain one
    target.write_bytes(gzip.compress(VAL_FR.read_bytes()))
    result = run("plot", "alignments", "-m", search_model, "--source", VAL_EN, "--target", target,
                 "-o", tmp_path / "align.png", "--lines", "3,1")
    assert result.exit_code == 0, result.output
    for line in (3, 1):
        png = tmp_path / f"align-{line}.png"
        width, height = png_size(png)
        source_words, target_words = (side[line - 1].split() for side in val_lines)
        # a cell per word: wider for a longer source, taller for a longer target
        assert width > 12 * len(source_words) and height > 12 * (len(target_words) + 1)
        assert png.stat().st_size > 2000
        assert f"{png}: line {line}, {len(source_words)} source and {len(target_words)} target words" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["align-1.png", "align-3.png", "val.fr.gz"]  # no leftovers


def test_drawn_matrix_is_the_models_alignment_of_the_pair(tmp_path, search_model, val_lines):
    """The weights drawn for each pair equal model.alignments of that pair alone, cut to its
    words: a row per target word and </s>, a column per source word, each row summing to 1."""
    loaded = load_model(search_model)
    plots = plot_alignments(loaded, VAL_EN, VAL_FR, tmp_path / "a.png",
                            AlignmentPlotOptions(count=3, seed=5, max_words=12))
    assert len(plots) == 3 and [p.pair.line for p in plots] == sorted(p.pair.line for p in plots)
    sources, targets = val_lines
    for p in plots:
        source_words, target_words = sources[p.pair.line - 1].split(), targets[p.pair.line - 1].split()
        assert (p.pair.source, p.pair.target) == (source_words, target_words)
        assert len(source_words) <= 12 and len(target_words) <= 12
        src, src_len = pad([loaded.source_vocab.encode(source_words)], "cpu")
        tgt, tgt_len = pad([loaded.target_vocab.encode(target_words)], "cpu")
        with torch.inference_mode():
            alone = loaded.model.alignments(src, src_len, tgt, tgt_len)[0].double().numpy()  # (T+1, S)
        assert p.pair.weights.shape == (len(target_words) + 1, len(source_words)) == alone.shape
        np.testing.assert_allclose(p.pair.weights, alone, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(p.pair.weights.sum(1), 1.0, atol=1e-5)
        assert (tmp_path / f"a-{p.pair.line}.png").exists()
    # batched with pairs of other lengths (padding), the weights are the same
    pairs = [(p.pair.source, p.pair.target) for p in plots]
    for p, weights in zip(plots, alignment_weights(loaded, pairs[::-1])[::-1]):
        np.testing.assert_allclose(weights, p.pair.weights, rtol=1e-5, atol=1e-7)


def test_drawing_is_deterministic_by_seed(search_model):
    first = choose_pairs(VAL_EN, VAL_FR, count=4, seed=7)
    assert choose_pairs(VAL_EN, VAL_FR, count=4, seed=7) == first
    assert [line for line, _, _ in choose_pairs(VAL_EN, VAL_FR, count=4, seed=8)] != [line for line, _, _ in first]


def test_encoder_decoder_is_refused(tmp_path, sentence_models):
    result = run("plot", "alignments", "-m", sentence_models("encdec"), "--source", VAL_EN, "--target", VAL_FR,
                 "-o", tmp_path / "a.png")
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert "has no soft alignment to plot" in line and "--arch rnnsearch" in line
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("lines, message", [
    ("0", "--lines takes line numbers from 1"),
    ("1,x", "--lines takes line numbers from 1"),
    ("2,101", "multi30k.val100.en: has 100 lines; there is no line 101"),
])
def test_bad_line_numbers_are_refused(tmp_path, search_model, lines, message):
    result = run("plot", "alignments", "-m", search_model, "--source", VAL_EN, "--target", VAL_FR,
                 "-o", tmp_path / "a.png", "--lines", lines)
    assert result.exit_code == 1
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_lines_that_cannot_be_plotted_are_refused(tmp_path, search_model):
    source = tmp_path / "src.txt"
    source.write_text("a man .\n\n" + " ".join(["dog"] * 40) + "\n", encoding="utf-8")
    target = tmp_path / "tgt.txt"
    target.write_text("un homme .\nun chien .\nchien\n", encoding="utf-8")
    with pytest.raises(PhraseScorerError, match=r"src.txt line 2: is empty"):
        choose_pairs(source, target, lines=[2])
    with pytest.raises(PhraseScorerError, match=r"src.txt line 3: has 40 words, more than max_words=30"):
        choose_pairs(source, target, lines=[3])
    assert [line for line, _, _ in choose_pairs(source, target, count=5)] == [1]  # the only pair that fits
    both = run("plot", "alignments", "-m", search_model, "--source", source, "--target", target, "-o",
               tmp_path / "a.png", "--lines", "1", "--count", "2")
    assert both.exit_code != 0 and "give --lines or --count, not both" in both.stderr
