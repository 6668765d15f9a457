"""BLEU by source sentence length (Bahdanau et al. 2015, Fig. 2)."""

from __future__ import annotations

import pytest
import sacrebleu

from conftest import VAL_EN, VAL_FR
from phrase_scorer.analysis.bleu_by_length import bleu_by_length, length_buckets, plot_bleu_by_length
from phrase_scorer.errors import PhraseScorerError

from test_analysis import png_size


@pytest.mark.parametrize("lengths, min_count, expected", [
    # ranges 1-5 (3 sentences), 6-10 (2), 11-15 (1), 26-30 (1): the short end closes buckets as
    # soon as they are full, the rest of the long end joins the last one
    ([1, 2, 3, 6, 7, 12, 30], 2, [(1, 5, 3), (6, 10, 2), (11, 30, 2)]),
    ([1, 2, 3, 6, 7, 12, 30], 3, [(1, 5, 3), (6, 30, 4)]),
    ([30, 12, 7, 6, 3, 2, 1], 1, [(1, 5, 3), (6, 10, 2), (11, 15, 1), (16, 30, 1)]),
    ([0, 4, 5, 9], 10, [(0, 9, 4)]),  # fewer sentences than the minimum: one bucket; empty sources count
    ([5, 6, 10, 11], 1, [(1, 5, 1), (6, 10, 2), (11, 11, 1)]),
])
def test_buckets(lengths, min_count, expected):
    buckets = length_buckets(lengths, width=5, min_count=min_count)
    assert [(b.shortest, b.longest, len(b.lines)) for b in buckets] == expected
    assert sorted(i for b in buckets for i in b.lines) == list(range(len(lengths)))
    for b in buckets:
        assert all(b.shortest <= lengths[i] <= b.longest for i in b.lines)


@pytest.fixture(scope="module")
def val():
    return VAL_EN.read_text(encoding="utf-8").splitlines(), VAL_FR.read_text(encoding="utf-8").splitlines()


def test_bleu_per_bucket_on_real_sentences(tmp_path, val):
    sources, references = val
    shortened = [" ".join(r.split()[:-2]) for r in references]  # each hypothesis misses its last two words
    result = bleu_by_length(sources, references, {"reference": references, "shortened": shortened},
                            width=5, min_count=15)
    assert len(result.buckets) >= 3
    assert sum(len(b.lines) for b in result.buckets) == len(sources) == 100
    assert all(len(b.lines) >= 15 for b in result.buckets)
    assert [b.shortest for b in result.buckets[1:]] == [b.longest + 1 for b in result.buckets[:-1]]
    assert result.bleu["reference"] == pytest.approx([100.0] * len(result.buckets), abs=1e-9)
    # each bucket's BLEU is sacrebleu's corpus BLEU of its sentences, untokenised (the references
    # are Moses-tokenised: they carry &apos; escapes)
    assert "tok:none" in result.bleu_signature
    for bucket, value in zip(result.buckets, result.bleu["shortened"]):
        expected = sacrebleu.BLEU(tokenize="none").corpus_score([shortened[i] for i in bucket.lines],
                                                                 [[references[i] for i in bucket.lines]]).score
        assert value == pytest.approx(expected, abs=1e-9) and 0 < value < 100
    png = tmp_path / "bleu.png"
    plot_bleu_by_length(result, png, title="val, 100 sentences")
    assert png_size(png) == (700, 450) and png.stat().st_size > 10_000


def test_systems_must_have_a_line_per_sentence(val):
    sources, references = val
    with pytest.raises(PhraseScorerError, match="system 'short' has 99 lines for 100 source sentences"):
        bleu_by_length(sources, references, {"full": references, "short": references[:-1]})
    with pytest.raises(PhraseScorerError, match="100 source sentences but 99 references"):
        bleu_by_length(sources, references[:-1], {"full": references})
