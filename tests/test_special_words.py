"""Words that look like the model's reserved tokens (<pad>, </s>, <unk>) are ordinary unknown words.

Moses escapes < and > in the tables it writes, but tables from other tools or written by hand need
not: a literal ``</s>`` must not end a phrase, ``<pad>`` must not become the padding id (class -1
of the softmax), and all three count as words outside the shortlist.
"""

from __future__ import annotations

import gzip
import math

import numpy as np

from conftest import EXAMPLE_TABLE, head_lines
from phrase_scorer.scoring.annotate import annotate
from phrase_scorer.scoring.score import score_file
from phrase_scorer.config import AnnotateOptions, SampleOptions, TrainConfig
from phrase_scorer.data.cache import PairSet
from phrase_scorer.generation.sampling import SourcePreparer, propose
from phrase_scorer.training.run import train
from phrase_scorer.vocab import EOS_ID, PAD_ID, SPECIALS, UNK_ID, Vocabulary

LITERAL = " ".join(SPECIALS)  # "<pad> </s> <unk>"


def test_vocabulary_treats_reserved_strings_as_unknown_words():
    vocab = Vocabulary(["a", "man"])
    assert vocab.encode(["a", "<pad>", "</s>", "<unk>", "man"]) == [3, UNK_ID, UNK_ID, UNK_ID, 4]
    assert vocab.count_unknown(["a", "<pad>", "</s>", "<unk>", "zebra"]) == 4
    assert all(word not in vocab for word in SPECIALS)
    assert vocab.decode([PAD_ID, EOS_ID, UNK_ID]) == list(SPECIALS)  # ids still name their tokens


def test_training_on_a_table_with_literal_reserved_words(tmp_path):
    lines = head_lines(EXAMPLE_TABLE, 200)
    lines += [
        f"zz {LITERAL} ||| zz <pad> ||| 0.5 0.5 0.5 0.5 ||| ||| |||\n".encode(),
        "zz </s> end ||| </s> fin </s> ||| 0.5 0.5 0.5 0.5 ||| ||| |||\n".encode(),
        f"zz <unk> ||| {LITERAL} ||| 0.5 0.5 0.5 0.5 ||| ||| |||\n".encode(),
    ]
    table = tmp_path / "t.gz"
    with gzip.open(table, "wb") as f:
        f.writelines(lines)
    out = tmp_path / "m"
    # valid_pairs=0 keeps every pair in training; 30 batches of 16 visit each pair at least twice
    state = train(table, out, TrainConfig(preset="tiny", batch_size=16, max_steps=30, valid_every=30, valid_pairs=0))
    assert state.step == 30 and math.isfinite(state.best_valid_nll)
    pairs = PairSet(out / "cache", "train")
    assert len(pairs) == len(lines)
    ids = [pairs.pair(i) for i in range(len(pairs))]
    assert all(side.min() >= UNK_ID for pair in ids for side in pair)  # no <pad> or </s> id in any phrase
    targets = [line.split(b"|||")[1].decode().split() for line in lines[-3:]]
    for words, (_, cached) in zip(targets, ids[-3:]):
        assert len(cached) == len(words)  # a literal </s> did not end the phrase
        assert all(i == UNK_ID for w, i in zip(words, cached) if w in SPECIALS)


def write_pairs(path, pairs):
    path.write_text("".join(f"{s} ||| {t} ||| 0.5 0.5 0.5 0.5\n" for s, t in pairs), encoding="utf-8")


def test_scores_of_reserved_strings_equal_those_of_unknown_words(tmp_path, loaded_tiny):
    literal = [("a <pad> man", "un </s> homme"), ("a man", "<pad>"), ("<unk> man", "un homme </s>"),
               ("a </s>", "<pad> </s> <unk>")]
    unknown = [(s.replace("<pad>", "qq1").replace("</s>", "qq2").replace("<unk>", "qq3"),
                t.replace("<pad>", "qq1").replace("</s>", "qq2").replace("<unk>", "qq3")) for s, t in literal]
    write_pairs(tmp_path / "literal.txt", literal)
    write_pairs(tmp_path / "unknown.txt", unknown)
    score_file(tmp_path / "literal.txt", tmp_path / "literal.scores", loaded_tiny)
    score_file(tmp_path / "unknown.txt", tmp_path / "unknown.scores", loaded_tiny)
    got = np.loadtxt(tmp_path / "literal.scores")
    want = np.loadtxt(tmp_path / "unknown.scores")
    assert np.isfinite(got).all()
    assert got.tolist() == want.tolist()


def test_annotate_counts_reserved_strings_as_unknown(tmp_path, loaded_tiny):
    table = tmp_path / "t.txt"
    write_pairs(table, [("a <pad>", "un </s> <unk> homme"), ("a man", "un homme")])
    out = tmp_path / "o.txt"
    annotate(table, out, loaded_tiny, AnnotateOptions(unk_side="both"))
    lines = out.read_text(encoding="utf-8").splitlines()
    unk = [float(line.split("|||")[2].split()[-1]) for line in lines]
    assert unk[0] == float("%.9g" % math.exp(3)) and unk[1] == 1.0
    prob = [float(line.split("|||")[2].split()[-2]) for line in lines]
    assert all(0 < p < 1 for p in prob)


def test_sample_treats_reserved_strings_as_unknown(loaded_tiny):
    preparer = SourcePreparer(loaded_tiny.source_vocab, tokenize=False, lowercase=False)
    options = SampleOptions(samples=8, top=8, max_length=4)
    (literal,) = propose(loaded_tiny, ["a </s> <pad> man"], options, preparer=preparer)
    (unknown,) = propose(loaded_tiny, ["a qq1 qq2 man"], options, preparer=preparer)
    assert literal.unknown_words == ["</s>", "<pad>"]
    assert literal.candidates
    assert [(c.words, c.log_prob) for c in literal.candidates] == [(c.words, c.log_prob) for c in unknown.candidates]
