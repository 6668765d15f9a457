"""Vocabularies, the pair cache, the validation split and the batch order."""

from __future__ import annotations

import gzip
from collections import Counter

import numpy as np
import pytest

from conftest import A_MAN_TABLE, EXAMPLE_TABLE
from phrase_scorer.data.batches import BatchSampler, KeyedPermutation
from phrase_scorer.data.cache import PairSet
from phrase_scorer.data.phrase_pairs import build_cache, count_words, unique_pairs
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.vocab import EOS_ID, PAD_ID, UNK_ID, Vocabulary


def test_vocabulary_keeps_the_most_frequent_words_and_specials(tmp_path):
    counts = Counter({"le": 5, "chat": 3, "chien": 3, "&apos;": 4, "rare": 1})
    vocab = Vocabulary.from_counts(counts, 3)
    assert vocab.tokens[:3] == ["<pad>", "</s>", "<unk>"]
    assert vocab.tokens[3:] == ["le", "&apos;", "chat"]  # ties broken alphabetically
    assert (PAD_ID, EOS_ID, UNK_ID) == (0, 1, 2)
    assert vocab.encode(["le", "rare", "&apos;"]) == [3, UNK_ID, 4]
    assert vocab.count_unknown(["le", "rare", "chien"]) == 2
    vocab.save(tmp_path / "v.json")
    assert Vocabulary.load(tmp_path / "v.json").tokens == vocab.tokens


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "not valid JSON"),
        ('{"format": "phrase-scorer-vocabulary", "tokens": ["a", "b"]}', "not a phrase-scorer vocabulary"),
        ('{"format": "phrase-scorer-vocabulary", "tokens": ["<pad>", "</s>", "<unk>", "a", "a"]}', "twice"),
    ],
)
def test_bad_vocabulary_files(tmp_path, content, message):
    path = tmp_path / "v.json"
    path.write_text(content)
    with pytest.raises(PhraseScorerError, match=message):
        Vocabulary.load(path)


def test_unique_pairs_drop_adjacent_repeats(tmp_path):
    table = tmp_path / "t.gz"
    table.write_bytes(gzip.compress(b"a ||| x ||| 1\na ||| x ||| 0.5\na ||| y ||| 1\nb ||| x ||| 1\n"))
    assert list(unique_pairs(table)) == [(["a"], ["x"]), (["a"], ["y"]), (["b"], ["x"])]
    source_counts, target_counts, pairs = count_words(table)
    assert pairs == 3 and target_counts["x"] == 2 and source_counts["a"] == 2


def test_cache_holds_every_pair_and_splits_by_source(tmp_path):
    source_counts, target_counts, n = count_words(EXAMPLE_TABLE)
    src_vocab = Vocabulary.from_counts(source_counts, 1000)
    tgt_vocab = Vocabulary.from_counts(target_counts, 1000)
    meta = build_cache(EXAMPLE_TABLE, tmp_path / "cache", src_vocab, tgt_vocab, valid_fraction=0.05, seed=7)
    train, valid = PairSet(tmp_path / "cache", "train"), PairSet(tmp_path / "cache", "valid")
    assert len(train) + len(valid) == n == meta.num_pairs["train"] + meta.num_pairs["valid"]
    assert 0.03 * n < len(valid) < 0.07 * n

    def decode(pairs, vocab_s, vocab_t):
        out = []
        for i in range(len(pairs)):
            s, t = pairs.pair(i)
            out.append((tuple(vocab_s.decode(s)), tuple(vocab_t.decode(t))))
        return out

    cached = decode(train, src_vocab, tgt_vocab) + decode(valid, src_vocab, tgt_vocab)
    table = [
        (tuple(w if w in src_vocab else "<unk>" for w in l.source_words),
         tuple(w if w in tgt_vocab else "<unk>" for w in l.target_words))
        for l in read_phrase_table(EXAMPLE_TABLE)
    ]
    assert sorted(cached) == sorted(table)
    # no source of the validation set appears in training (checked on the raw words)
    valid_sources = {s for s, _ in decode(valid, src_vocab, tgt_vocab)}
    train_sources = {s for s, _ in decode(train, src_vocab, tgt_vocab)}
    assert not ({s for s in valid_sources if "<unk>" not in s} & {s for s in train_sources if "<unk>" not in s})
    # a second build with the same inputs reuses the cache
    again = build_cache(EXAMPLE_TABLE, tmp_path / "cache", src_vocab, tgt_vocab, valid_fraction=0.05, seed=7)
    assert again == meta


def test_split_by_source_on_a_table_with_many_targets_per_source(tmp_path):
    source_counts, target_counts, _ = count_words(A_MAN_TABLE)
    vocab_s = Vocabulary.from_counts(source_counts, 10**6)
    vocab_t = Vocabulary.from_counts(target_counts, 10**6)
    build_cache(A_MAN_TABLE, tmp_path / "c", vocab_s, vocab_t, valid_fraction=0.2, seed=1)
    sources = {}
    for split in ("train", "valid"):
        pairs = PairSet(tmp_path / "c", split)
        sources[split] = {tuple(pairs.pair(i)[0]) for i in range(len(pairs))}
    assert sources["valid"] and not (sources["train"] & sources["valid"])


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4097])
def test_keyed_permutation_is_a_permutation(n):
    perm = KeyedPermutation(n, key=5)(np.arange(n))
    assert sorted(perm.tolist()) == list(range(n))
    if n > 100:
        assert not np.array_equal(perm, np.arange(n))
        assert not np.array_equal(perm, KeyedPermutation(n, key=6)(np.arange(n)))


@pytest.fixture(scope="module")
def example_cache(tmp_path_factory):
    out = tmp_path_factory.mktemp("cache")
    source_counts, target_counts, _ = count_words(EXAMPLE_TABLE)
    build_cache(EXAMPLE_TABLE, out, Vocabulary.from_counts(source_counts, 500),
                Vocabulary.from_counts(target_counts, 500), valid_fraction=0.01, seed=1)
    return PairSet(out, "train")


def test_an_epoch_visits_every_pair_once_in_length_groups(example_cache):
    sampler = BatchSampler(example_cache, batch_size=64, seed=3, window_batches=8)
    batches = list(sampler.epoch(0))
    assert len(batches) == sampler.batches_per_epoch
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(example_cache)))
    # batches group similar lengths: the spread of target lengths in a batch is small
    spreads = [np.ptp(example_cache.lengths_of(b)[:, 1]) for b in batches if len(b) == 64]
    assert np.mean(spreads) <= 1.0
    # epochs differ, and the same (seed, epoch) gives the same order
    assert not np.array_equal(np.concatenate(list(sampler.epoch(1))), seen)
    assert np.array_equal(np.concatenate(list(BatchSampler(example_cache, 64, 3, 8).epoch(0))), seen)


def test_resuming_mid_epoch_continues_the_same_order(example_cache):
    sampler = BatchSampler(example_cache, batch_size=50, seed=9, window_batches=4)
    full = list(sampler.epoch(2))
    for start in (0, 1, 3, 4, 9, len(full) - 1):
        rest = list(sampler.epoch(2, start_batch=start))
        assert len(rest) == len(full) - start
        assert all(np.array_equal(a, b) for a, b in zip(rest, full[start:]))
