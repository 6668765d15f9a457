"""Subword models (`train --vocabulary bpe|unigram`): every verb takes words and gives words, and a
hypothesis's score is the sum of its pieces' log p.

The reference for a score is computed here apart from the package's vocabularies and scorer: the
sentencepiece model file read by sentencepiece itself, each word segmented on its own, the ids
run through the model's teacher-forced forward pass one pair at a time.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import A_MAN_TABLE, DATA, EXAMPLE_TABLE, TRAIN_EN, TRAIN_FR, VAL_EN, VAL_FR, error_line, run_cli
from phrase_scorer.io.nbest import read_nbest
from phrase_scorer.model_dir import load_model

NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"
WORD_START = "\u2581"


def run(*args, input=None):
    result = run_cli(*args, input=input)
    assert result.exit_code == 0, result.stderr
    return result


def train(out: Path, *flags, reverse: bool = False) -> Path:
    """A tiny RNNsearch model on the 500 Multi30k pairs, English→French (``reverse``: French→English)."""
    corpus, dev = ((TRAIN_FR, TRAIN_EN), (VAL_FR, VAL_EN)) if reverse else ((TRAIN_EN, TRAIN_FR), (VAL_EN, VAL_FR))
    run("-q", "train", "--corpus", *corpus, "--dev", *dev, "--arch", "rnnsearch",
        "--preset", "tiny", "--max-length", 12, "--max-steps", 20, "--valid-every", 20, *flags, "-o", out)
    return out


@pytest.fixture(scope="module")
def bpe_model(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("bpe") / "model", "--vocabulary", "bpe")


@pytest.fixture(scope="module")
def bpe_reverse(tmp_path_factory) -> Path:
    """French→English: what a reverse feature reads."""
    return train(tmp_path_factory.mktemp("bpe-reverse") / "model", "--vocabulary", "bpe", reverse=True)


@pytest.fixture(scope="module")
def bpe_right_to_left(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("bpe-rtl") / "model", "--vocabulary", "bpe", "--right-to-left")


def reference_log_probs(model_dir: Path, pairs, right_to_left: bool = False) -> list:
    """log p(target words | source words) of each pair: the pieces sentencepiece gives each word
    (the model's files read by sentencepiece), summed over by the model's forward pass."""
    import sentencepiece

    pieces = {side: sentencepiece.SentencePieceProcessor(model_file=str(model_dir / f"subwords.{side}.model"))
              for side in ("source", "target")}
    loaded = load_model(model_dir)
    out = []
    for source, target in pairs:
        src = [i for w in source for i in pieces["source"].encode(w)]
        tgt = [i for w in target for i in pieces["target"].encode(w)]
        if right_to_left:
            tgt = tgt[::-1]
        with torch.inference_mode():
            log_p = loaded.model(torch.tensor([src]), torch.tensor([len(src)]), torch.tensor([tgt]),
                                 torch.tensor([len(tgt)]))
        out.append(float(log_p[0]))
    return out


def table_lines(n: int) -> list:
    with gzip.open(EXAMPLE_TABLE, "rt", encoding="utf-8") as f:
        return [next(f) for _ in range(n)]


def test_train_stores_the_segmentation_and_records_its_hash(bpe_model):
    import hashlib

    config = json.loads((bpe_model / "config.json").read_text())
    assert config["training"]["vocabulary"] == "bpe"
    for side in ("source", "target"):
        data = (bpe_model / f"subwords.{side}.model").read_bytes()
        assert config["subwords"][side]["sha256"] == hashlib.sha256(data).hexdigest()
        assert config["subwords"][side]["model_type"] == "bpe"
        assert config["corpus"][f"{side}_pieces_per_word"] > 1.0
    loaded = load_model(bpe_model)
    assert any(t.startswith(WORD_START) for t in loaded.target_vocab.tokens)
    assert len(loaded.target_vocab) == config["target_vocab_size"]


def test_a_word_model_records_no_segmentation(tmp_path):
    out = train(tmp_path / "words")
    config = json.loads((out / "config.json").read_text())
    assert "subwords" not in config and config["training"]["vocabulary"] == "words"
    assert not list(out.glob("subwords.*"))


def test_words_come_back_from_their_pieces(bpe_model):
    vocab = load_model(bpe_model).target_vocab
    with gzip.open(TRAIN_EN, "rt", encoding="utf-8") as en, gzip.open(TRAIN_FR, "rt", encoding="utf-8") as fr:
        sentences = [t.split() for s, t in zip(en, fr) if max(len(s.split()), len(t.split())) <= 12]  # as trained
    pieces = 0
    for words in sentences:
        ids = vocab.encode(words)
        pieces += len(ids)
        assert vocab.decode(ids) == words and vocab.count_unknown(words) == 0
    assert pieces > sum(map(len, sentences))  # some words are cut
    # a character never seen in training is an <unk> piece, counted; the rest of the word is read
    assert vocab.count_unknown(["mot\u4e2d", "chat"]) == 1 and len(vocab.encode(["mot\u4e2d"])) > 1
    # a word its pieces cannot spell (it holds the word-start mark) is one <unk>
    assert vocab.encode([f"a{WORD_START}b"]) == [2]


def test_score_is_the_sum_of_the_pieces_log_p(tmp_path, bpe_model):
    lines = table_lines(60)
    table = tmp_path / "pt.txt"
    table.write_text("".join(lines), encoding="utf-8")
    run("score", "-m", bpe_model, table, "-o", tmp_path / "scores")
    ours = np.loadtxt(tmp_path / "scores")
    pairs = [(line.split(" ||| ")[0].split(), line.split(" ||| ")[1].split()) for line in lines]
    np.testing.assert_allclose(ours, reference_log_probs(bpe_model, pairs), rtol=0, atol=2e-4)


def test_a_right_to_left_model_reads_the_pieces_last_first(tmp_path, bpe_right_to_left):
    lines = table_lines(40)
    table = tmp_path / "pt.txt"
    table.write_text("".join(lines), encoding="utf-8")
    run("score", "-m", bpe_right_to_left, table, "-o", tmp_path / "scores")
    pairs = [(line.split(" ||| ")[0].split(), line.split(" ||| ")[1].split()) for line in lines]
    np.testing.assert_allclose(np.loadtxt(tmp_path / "scores"),
                               reference_log_probs(bpe_right_to_left, pairs, right_to_left=True), rtol=0, atol=2e-4)
    run("translate", "-m", bpe_right_to_left, SOURCE, "-o", tmp_path / "out.fr", "--beam", 2)
    assert_word_level(tmp_path / "out.fr", SOURCE)


def test_annotate_writes_the_same_log_p_and_counts_unknown_pieces(tmp_path, bpe_model):
    lines = table_lines(60)
    lines[3] = lines[3].replace(" ||| ", " \u4e2d ||| ", 1).replace(" ||| ", " ||| \u4e2d\u4e2d ", 1)
    table = tmp_path / "pt.txt"
    table.write_text("".join(lines), encoding="utf-8")
    run("annotate", table, "-m", bpe_model, "-o", tmp_path / "pt.rnn", "--unk-side", "both")
    run("score", "-m", bpe_model, table, "-o", tmp_path / "scores")
    out = (tmp_path / "pt.rnn").read_text(encoding="utf-8").splitlines()
    columns = [[float(v) for v in line.split(" ||| ")[2].split()[-2:]] for line in out]
    np.testing.assert_allclose(np.log([c[0] for c in columns]), np.maximum(np.loadtxt(tmp_path / "scores"), -100),
                               atol=1e-5)  # Moses' floor
    import sentencepiece

    pieces = {side: sentencepiece.SentencePieceProcessor(model_file=str(bpe_model / f"subwords.{side}.model"))
              for side in ("source", "target")}
    expected = [sum(pieces[side].encode(w).count(2) for side, field in (("source", 0), ("target", 1))
                    for w in line.split(" ||| ")[field].split()) for line in lines]
    assert [round(np.log(c[1])) for c in columns] == expected
    # line 3's two new <unk> pieces: the source's new character, and the target's run of two (one piece)
    assert expected[3] == 2 + sum(pieces[side].encode(w).count(2) for side, field in (("source", 0), ("target", 1))
                                  for w in table_lines(4)[3].split(" ||| ")[field].split())
    signature = json.loads((tmp_path / "pt.rnn.json").read_text())
    assert "<unk> pieces" in signature["column_values"]["unk"]
    assert signature["model"]["subwords"]["target"]["model_type"] == "bpe"


def test_rescore_feature_is_the_sum_of_the_pieces_log_p(tmp_path, bpe_model, bpe_reverse):
    run("rescore", NBEST, "--source", SOURCE, "-m", bpe_model, "-o", tmp_path / "out.nbest")
    sources = SOURCE.read_text(encoding="utf-8").splitlines()
    entries = list(read_nbest(tmp_path / "out.nbest"))
    assert len(entries) == sum(1 for _ in gzip.open(NBEST, "rt"))
    chosen = entries[::25]
    pairs = [(sources[e.sentence_id].split(), e.hypothesis.split()) for e in chosen]
    np.testing.assert_allclose([dict(e.features)["RNN0"][0] for e in chosen], reference_log_probs(bpe_model, pairs),
                               rtol=1e-5)  # the list's 6 significant digits
    # the reverse direction: log p(source | hypothesis), a hypothesis's pieces as the source
    run("rescore", NBEST, "--source", SOURCE, "-r", bpe_reverse, "-o", tmp_path / "rev.nbest")
    reverse = list(read_nbest(tmp_path / "rev.nbest"))[::25]
    swapped = [(e.hypothesis.split(), sources[e.sentence_id].split()) for e in reverse]
    np.testing.assert_allclose([e.features[-1][1][0] for e in reverse], reference_log_probs(bpe_reverse, swapped),
                               rtol=1e-5)
    # per word, not per piece: --normalize divides by the hypothesis's words and </s>
    run("rescore", NBEST, "--source", SOURCE, "-m", bpe_model, "--normalize", "-o", tmp_path / "norm.nbest")
    normalised = list(read_nbest(tmp_path / "norm.nbest"))[::25]
    np.testing.assert_allclose([dict(e.features)["RNN0"][0] for e in normalised],
                               [dict(e.features)["RNN0"][0] / (len(e.hypothesis.split()) + 1) for e in chosen],
                               rtol=2e-5)


def assert_word_level(output: Path, source: Path):
    lines = output.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(source.read_text(encoding="utf-8").splitlines())
    assert any(lines) and not any(WORD_START in line or "<unk>" in line for line in lines)
    assert all(line == " ".join(line.split()) for line in lines)


def test_translate_writes_words(tmp_path, bpe_model):
    run("translate", "-m", bpe_model, SOURCE, "-o", tmp_path / "out.fr", "--beam", 3)
    assert_word_level(tmp_path / "out.fr", SOURCE)


def test_sample_proposes_words(bpe_model):
    result = run("sample", "-m", bpe_model, "--no-tokenize", "--samples", 30, "a man in a blue shirt")
    assert result.stdout.strip() and WORD_START not in result.stdout
    result = run("sample", "-m", bpe_model, "--no-tokenize", "--beam", 4, "a man")
    assert result.stdout.strip() and WORD_START not in result.stdout


def test_sampled_segmentations_of_one_word_sequence_are_one_candidate(bpe_model):
    from phrase_scorer.generation.sampling import as_words

    vocab = load_model(bpe_model).target_vocab
    word = next(w[1:] for w in vocab.tokens[3:] if w.startswith(WORD_START) and len(w) > 4
                and WORD_START + w[1] in vocab.index and w[2:] in vocab.index)
    whole = tuple(vocab.encode([word]))
    split = (vocab.index[WORD_START + word[0]], vocab.index[word[1:]])  # the same word, cut in two
    assert len(whole) == 1 and vocab.decode(split) == [word]
    assert as_words({whole: (2, False), split: (3, True)}, vocab) == {whole: (5, True)}


def test_compare_and_alignments_show_words(tmp_path, bpe_model):
    result = run("compare", "-m", bpe_model, A_MAN_TABLE, "--frequent", 2, "--rare", 1)
    assert "a man in a" in result.stdout and WORD_START not in result.stdout
    from phrase_scorer.analysis.alignments import alignment_weights

    loaded = load_model(bpe_model)
    source = VAL_EN.read_text(encoding="utf-8").splitlines()[0].split()
    target = VAL_FR.read_text(encoding="utf-8").splitlines()[0].split()
    assert len(loaded.source_vocab.encode(source)) + len(loaded.target_vocab.encode(target)) > len(source) + len(
        target)  # some words are cut into pieces here
    weights = alignment_weights(loaded, [(source, target)])[0]
    assert weights.shape == (len(target) + 1, len(source))
    # an fp32 model's a_ij: each row sums to 1 within a few units of fp32's last place (~1e-7); a piece
    # left out of its word or counted twice moves the rows' sums by its weight
    np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-6)


def test_a_changed_segmentation_is_refused(tmp_path, bpe_model):
    copy = tmp_path / "model"
    shutil.copytree(bpe_model, copy)
    other = train(tmp_path / "other", "--vocabulary", "unigram")
    shutil.copy(other / "subwords.target.model", copy / "subwords.target.model")
    line = error_line(run_cli("translate", "-m", copy, SOURCE))
    assert "subwords.target.model" in line and "SHA-256" in line
    # the vocabulary's record changed to match the new file: config.json's record still refuses it
    vocab = json.loads((copy / "vocab.target.json").read_text(encoding="utf-8"))
    vocab["subwords"]["sha256"] = json.loads((other / "vocab.target.json").read_text())["subwords"]["sha256"]
    vocab["tokens"] = json.loads((other / "vocab.target.json").read_text())["tokens"]
    (copy / "vocab.target.json").write_text(json.dumps(vocab), encoding="utf-8")
    line = error_line(run_cli("translate", "-m", copy, SOURCE))
    assert "vocab.target.json" in line or "subwords.target.model" in line
    (copy / "subwords.target.model").unlink()
    line = error_line(run_cli("score", "-m", copy, SOURCE))
    assert "subwords.target.model" in line and "missing" in line


def test_resume_keeps_the_vocabulary(tmp_path, bpe_model):
    copy = tmp_path / "model"
    shutil.copytree(bpe_model, copy)
    result = run_cli("-q", "train", "--corpus", TRAIN_EN, TRAIN_FR, "--dev", VAL_EN, VAL_FR, "--arch", "rnnsearch",
                     "--preset", "tiny", "--max-length", 12, "--max-steps", 30, "--valid-every", 20,
                     "--vocabulary", "unigram", "-o", copy, "--resume")
    assert "vocabulary" in error_line(result)


def test_the_segmentation_is_learnt_the_same_every_time(tmp_path):
    from collections import Counter

    from phrase_scorer.subwords import learn

    with gzip.open(TRAIN_FR, "rt", encoding="utf-8") as f:
        counts = Counter(w for line in f for w in line.split())
    assert learn(counts, 300, "bpe") == learn(Counter(dict(reversed(list(counts.items())))), 300, "bpe")


def test_the_word_cache_stays_bounded(bpe_model, monkeypatch):
    import phrase_scorer.subwords as subwords
    from phrase_scorer.scoring.annotate_work import PieceIds

    monkeypatch.setattr(subwords, "CACHED_WORDS", 50)
    monkeypatch.setattr("phrase_scorer.scoring.annotate_work.CACHED_WORDS", 50)
    vocab = load_model(bpe_model).target_vocab
    lookup = PieceIds(vocab)
    for n in range(500):
        word = f"m{'aeiou'[n % 5]}{'tsrnl'[n // 5 % 5]}{'aeiou'[n // 25 % 5]}{'tsrnl'[n // 125]}"  # 500 words
        assert vocab.decode(vocab.encode([word])) == [word]
        assert lookup[word.encode()] == tuple(vocab.encode([word]))
        assert len(vocab._word_ids) <= 50 and len(lookup) <= 50
