"""Training on sentence pairs: reading aligned files, the length limit, the paper's batching,
resuming, and learning on a slice of Multi30k."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA, TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR
from test_train import assert_same_state, checkpoint_state
from phrase_scorer.config import TrainConfig
from phrase_scorer.data.sentence_pairs import PAPER_WINDOW_BATCHES, SentenceCorpus, read_sentence_pairs
from phrase_scorer.data.batches import BatchSampler
from phrase_scorer.data.cache import PairSet
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.training.run import train
from phrase_scorer.vocab import Vocabulary

QUICK = dict(preset="tiny", batch_size=16, valid_every=20, seed=11)


def gz_lines(path: Path) -> list:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def write(path: Path, lines, compress: bool = False) -> Path:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def test_plain_and_gzip_files_read_alike(tmp_path):
    en, fr = gz_lines(TRAIN_EN)[:50], gz_lines(TRAIN_FR)[:50]
    plain = list(read_sentence_pairs(write(tmp_path / "en", en), write(tmp_path / "fr", fr)))
    mixed = list(read_sentence_pairs(write(tmp_path / "en.gz", en, True), write(tmp_path / "fr", fr)))
    assert plain == mixed
    assert [n for n, _, _ in plain] == list(range(1, 51))
    assert plain[0][1] == en[0].split(" ") and plain[0][2] == fr[0].split(" ")


@pytest.mark.parametrize("longer", ["source", "target"])
def test_files_of_different_lengths_are_an_error_naming_the_longer_file_and_line(tmp_path, longer):
    source = write(tmp_path / "src", ["a b", "c", "d"] if longer == "source" else ["a b", "c"], compress=True)
    target = write(tmp_path / "tgt", ["x", "y", "z"] if longer == "target" else ["x", "y"])
    longer_path = source if longer == "source" else target
    with pytest.raises(PhraseScorerError, match=f"{longer_path} line 3: has more lines than .* \\(2 lines\\)"):
        list(read_sentence_pairs(source, target))


def test_invalid_utf8_names_the_file_and_line(tmp_path):
    source = write(tmp_path / "src", ["a", "b"])
    target = tmp_path / "tgt"
    target.write_bytes(b"x\n\xff y\n")
    with pytest.raises(PhraseScorerError, match=f"{target} line 2: invalid UTF-8"):
        list(read_sentence_pairs(source, target))


def test_empty_sides_and_long_pairs_are_left_out_and_counted(tmp_path):
    source = write(tmp_path / "src", ["a b c", "", "a b", "a b c d e", "a", "b"])
    target = write(tmp_path / "tgt", ["x y", "x", "", "x", "x y z w", "y"])
    corpus = SentenceCorpus(str(source), str(target))
    counts_s, counts_t, info = corpus.count_words(TrainConfig(max_length=3))
    assert (info["lines"], info["pairs"], info["left_out_empty"], info["left_out_too_long"]) == (6, 2, 2, 2)
    assert counts_s == Counter({"a": 1, "b": 2, "c": 1}) and counts_t == Counter({"x": 1, "y": 2})
    _, _, unlimited = corpus.count_words(TrainConfig())
    assert (unlimited["pairs"], unlimited["left_out_too_long"]) == (4, 0)
    vocab_s, vocab_t = Vocabulary.from_counts(counts_s, 10), Vocabulary.from_counts(counts_t, 10)
    corpus.build_cache(tmp_path / "cache", vocab_s, vocab_t, info, TrainConfig(max_length=3, valid_pairs=0),
                       keep_existing=False)
    kept = PairSet(tmp_path / "cache", "train")
    assert len(kept) == 2 and len(PairSet(tmp_path / "cache", "valid")) == 0
    assert [vocab_s.decode(kept.pair(i)[0]) for i in range(2)] == [["a", "b", "c"], ["b"]]


def test_literal_special_words_in_a_corpus_are_not_special(tmp_path):
    source = write(tmp_path / "src", ["a </s> b", "<pad> <unk>"])
    target = write(tmp_path / "tgt", ["x", "y </s>"])
    counts_s, _, _ = SentenceCorpus(str(source), str(target)).count_words(TrainConfig())
    vocab = Vocabulary.from_counts(counts_s, 10)
    assert vocab.tokens[3:] == ["a", "b"]  # the shortlist never holds a second "</s>"


def test_dev_pairs_are_the_validation_split_without_a_length_limit(tmp_path):
    corpus = SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR), str(VAL_EN), str(VAL_FR))
    config = TrainConfig(max_length=10)
    counts_s, counts_t, info = corpus.count_words(config)
    vocab_s, vocab_t = Vocabulary.from_counts(counts_s, 500), Vocabulary.from_counts(counts_t, 500)
    description = corpus.build_cache(tmp_path / "c", vocab_s, vocab_t, info, config, keep_existing=False)
    valid = PairSet(tmp_path / "c", "valid")
    val_en = VAL_EN.read_text(encoding="utf-8").splitlines()
    assert len(valid) == len(val_en) == description["num_pairs"]["valid"]
    assert valid.all_lengths()[:, 0].tolist() == [len(line.split(" ")) for line in val_en]
    assert description["num_pairs"]["train"] == info["pairs"]
    assert info["left_out_too_long"] > 0 and info["pairs"] + info["left_out_too_long"] == 500
    assert max(PairSet(tmp_path / "c", "train").all_lengths().max(1)) <= 10


def test_without_a_dev_set_validation_pairs_are_held_out_of_training(tmp_path):
    corpus = SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR))
    config = TrainConfig(valid_pairs=50)
    counts_s, counts_t, info = corpus.count_words(config)
    vocab_s, vocab_t = Vocabulary.from_counts(counts_s, 10**6), Vocabulary.from_counts(counts_t, 10**6)
    corpus.build_cache(tmp_path / "c", vocab_s, vocab_t, info, config, keep_existing=False)
    splits = {name: PairSet(tmp_path / "c", name) for name in ("train", "valid")}
    assert len(splits["train"]) + len(splits["valid"]) == 500 and 20 < len(splits["valid"]) < 90
    sources = {name: {tuple(s.pair(i)[0]) for i in range(len(s))} for name, s in splits.items()}
    assert not (sources["train"] & sources["valid"])


def test_batches_sort_20_minibatches_by_length_and_visit_every_pair_once(tmp_path):
    corpus = SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR))
    config = TrainConfig(valid_pairs=0)
    counts_s, counts_t, info = corpus.count_words(config)
    corpus.build_cache(tmp_path / "c", Vocabulary.from_counts(counts_s, 100), Vocabulary.from_counts(counts_t, 100),
                       info, config, keep_existing=False)
    pairs = PairSet(tmp_path / "c", "train")
    batch_size = 8
    sampler = BatchSampler(pairs, batch_size, seed=4, window_batches=corpus.window_batches)
    assert corpus.window_batches == PAPER_WINDOW_BATCHES == 20
    for epoch in (0, 1):
        batches = list(sampler.epoch(epoch))
        seen = np.concatenate(batches)
        assert sorted(seen.tolist()) == list(range(500))
        # within each window of 20 minibatches the pairs were sorted by length before cutting:
        # batches taken in order of their lengths do not overlap in target length
        for start in range(0, len(batches), PAPER_WINDOW_BATCHES):
            in_window = batches[start:start + PAPER_WINDOW_BATCHES]
            spans = sorted((int(pairs.lengths_of(b)[:, 1].min()), int(pairs.lengths_of(b)[:, 1].max()))
                           for b in in_window)
            assert all(high <= next_low for (_, high), (next_low, _) in zip(spans, spans[1:]))
        # the minibatches are shuffled: not in length order
        first_window = batches[:PAPER_WINDOW_BATCHES]
        maxima = [int(pairs.lengths_of(b)[:, 1].max()) for b in first_window]
        assert maxima != sorted(maxima)
    assert not np.array_equal(np.concatenate(list(sampler.epoch(0))), np.concatenate(list(sampler.epoch(1))))


def test_training_on_multi30k_sentences_lowers_the_dev_nll(tmp_path):
    out = tmp_path / "m"
    corpus = SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR), str(VAL_EN), str(VAL_FR))
    train(corpus, out, TrainConfig(max_steps=120, max_length=16, **{**QUICK, "valid_every": 30}))
    records = [json.loads(l) for l in (out / "train.log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [30, 60, 90, 120]
    assert records[-1]["valid_nll_token"] < records[0]["valid_nll_token"] - 0.5
    config = json.loads((out / "config.json").read_text())
    assert "table" not in config and config["corpus"]["max_length"] == 16 == config["training"]["max_length"]
    assert config["corpus"]["source"]["path"] == str(TRAIN_EN.resolve())
    assert config["corpus"]["dev_target"]["size"] == VAL_FR.stat().st_size
    assert config["corpus"]["pairs"] + config["corpus"]["left_out_too_long"] == 500


def test_resume_ends_in_the_same_state_and_refuses_other_data(tmp_path):
    corpus = SentenceCorpus(str(TRAIN_EN), str(TRAIN_FR))
    settings = dict(max_length=12, valid_pairs=40, **QUICK)
    train(corpus, tmp_path / "whole", TrainConfig(max_steps=40, **settings))
    train(corpus, tmp_path / "parts", TrainConfig(max_steps=23, **settings))
    assert checkpoint_state(tmp_path / "parts")["state"]["step"] == 23
    state = train(corpus, tmp_path / "parts", TrainConfig(max_steps=40, **settings), resume=True,
                  explicit={"max_steps"})
    assert state.step == 40
    assert_same_state(tmp_path / "whole", tmp_path / "parts")

    other = SentenceCorpus(str(write(tmp_path / "en", gz_lines(TRAIN_EN))), str(TRAIN_FR))
    with pytest.raises(PhraseScorerError,
                       match="cannot resume: source changed since the interrupted run \\(source.size: "):
        train(other, tmp_path / "parts", TrainConfig(max_steps=60, **settings), resume=True, explicit={"max_steps"})
    with pytest.raises(PhraseScorerError,
                       match="cannot resume: max_length changed since the interrupted run \\(max_length: 12 -> 30\\)"):
        train(corpus, tmp_path / "parts", TrainConfig(max_steps=60, **{**settings, "max_length": 30}), resume=True,
              explicit={"max_steps", "max_length"})
    with pytest.raises(PhraseScorerError, match="interrupted run trained on a sentence corpus"):
        train(DATA / "phrase-table.a-man.gz", tmp_path / "parts", TrainConfig(max_steps=60, **settings), resume=True,
              explicit={"max_steps"})


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "phrase_scorer", "train", *map(str, args)],
                          capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give a phrase TABLE or --corpus SRC TGT to train on"),
        ([DATA / "phrase-table.a-man.gz", "--corpus", TRAIN_EN, TRAIN_FR],
         "give either a phrase TABLE or --corpus SRC TGT \\(not both\\)"),
        ([DATA / "phrase-table.a-man.gz", "--dev", VAL_EN, VAL_FR], "--dev goes with --corpus"),
        ([DATA / "phrase-table.a-man.gz", "--max-length", 30], "--max-length applies to sentence corpora"),
    ],
)
def test_cli_wants_one_kind_of_training_data(tmp_path, args, message):
    result = run_cli(*args, "-o", tmp_path / "m", "--preset", "tiny", "--max-steps", 1)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("phrase-scorer: error: ")
    assert re.search(message, result.stderr), result.stderr


def test_cli_trains_on_a_corpus(tmp_path):
    result = run_cli("--corpus", TRAIN_EN, TRAIN_FR, "--dev", VAL_EN, VAL_FR, "--max-length", 20, "--preset", "tiny",
                     "--batch-size", 32, "--valid-every", 10, "--max-steps", 10, "--threads", 1, "-o", tmp_path / "m")
    assert result.returncode == 0, result.stderr
    assert "500 sentence pairs; 0 left out for an empty side, 44 for a side longer than 20 words" in result.stderr
    assert "development set: 100 pairs" in result.stderr
    assert (tmp_path / "m" / "model.pt").is_file()
