"""The Transformer through the interface every architecture offers and through the commands:
the equations' properties, one pass against step by step, train (sentence and phrase pairs,
--resume, right-to-left, subwords, averaging), score, annotate, rescore, sample, translate."""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from conftest import (
    A_MAN_TABLE, DATA, EXAMPLE_TABLE, TRAIN_EN, TRAIN_FR, assert_beams_batched_as_alone, head_lines, in_fp64,
)
from phrase_scorer.cli import cli
from phrase_scorer.config import TRANSFORMER_PRESETS, ScoringOptions, TrainConfig, TransformerConfig
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.model_dir import load_model
from phrase_scorer.models.architectures import FORWARD_FLOPS, build_model, training_flops_per_pair
from phrase_scorer.models.base import next_word_labels, previous_words
from phrase_scorer.models.transformer import Transformer, sinusoids
from phrase_scorer.scoring.batch_scorer import BatchScorer, log_probs_by_forward
from phrase_scorer.training.optimisation import warmup_factor

TINY = TRANSFORMER_PRESETS["tiny"]
NBEST = DATA / "val.nbest.head.gz"
SOURCE = DATA / "val.tok.en.head"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def model_of(config: TransformerConfig = TINY, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = build_model(config, 40, 50).double().eval()
    assert isinstance(model, Transformer)
    return model


def batch():
    src = torch.tensor([[3, 4, 5, 0, 0], [5, 6, 7, 8, 9], [30, 0, 0, 0, 0]])
    tgt = torch.tensor([[6, 7, 8, 9], [10, 11, 0, 0], [12, 0, 0, 0]])
    return src, torch.tensor([3, 5, 1]), tgt, torch.tensor([4, 2, 1])


def step_by_step(model, src, src_len, tgt, tgt_len) -> torch.Tensor:
    """log p(y|x) from start/step/log_probs, one position at a time (the key/value cache)."""
    memory = model.encode(src, src_len)
    state = model.start(memory)
    labels, valid = next_word_labels(tgt, tgt_len)
    total = torch.zeros(len(src), dtype=torch.float64)
    for i, prev in enumerate(previous_words(tgt).unbind(1)):
        state, features = model.step(memory, state, prev)
        assert state.size(4) == i + 1  # the cache holds every position read
        log_p = model.log_probs(features).gather(1, (labels[:, i] - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        total += torch.where(valid[:, i], log_p, torch.zeros_like(log_p))
    return total


@pytest.mark.parametrize("variant", [{}, {"tie_target_embeddings": False}, {"positions": "learned"}])
def test_the_cache_steps_give_the_teacher_forced_scores(variant):
    model = model_of(replace(TINY, **variant))
    src, src_len, tgt, tgt_len = batch()
    whole = model(src, src_len, tgt, tgt_len)
    assert torch.allclose(step_by_step(model, src, src_len, tgt, tgt_len), whole, atol=1e-12, rtol=0)
    assert bool((whole < 0).all())


def test_a_position_reads_only_the_words_before_it_and_padding_changes_nothing():
    model = model_of()
    src, src_len, tgt, tgt_len = batch()
    memory = model.encode(src, src_len)
    features = model.teacher_forced_features(memory, tgt)  # (B, T+1, d)
    changed = tgt.clone()
    changed[0, 2:] = 20  # words 3.. of the first target
    again = model.teacher_forced_features(memory, changed)
    assert torch.equal(features[0, :3], again[0, :3]) and not torch.allclose(features[0, 3:], again[0, 3:])
    # a source padded wider, and a target padded longer, score the same
    wider = torch.cat([src, torch.zeros((3, 4), dtype=torch.long)], 1)
    longer = torch.cat([tgt, torch.zeros((3, 3), dtype=torch.long)], 1)
    assert torch.allclose(model(wider, src_len, longer, tgt_len), model(src, src_len, tgt, tgt_len), atol=1e-12)


def test_tied_embeddings_share_the_output_matrix_and_positions_are_sinusoids():
    tied, untied = model_of(), model_of(replace(TINY, tie_target_embeddings=False))
    assert tied.target_embed is None and untied.target_embed is not None
    d = TINY.model_dim
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in tied.parameters()) == 50 * d
    ids = torch.tensor([[0, 1, 7]])
    emb = tied.embed_targets(ids, 0)[0]  # sqrt(d) E y + P, E y_0 = 0 for <pad>
    table = sinusoids(3, d, 0, dtype=torch.float64)
    assert torch.allclose(emb[0], table[0]) and torch.allclose(emb[2], tied.output.weight[6] * math.sqrt(d) + table[2])
    assert torch.allclose(table[1, 0::2], torch.sin(1.0 / 10000 ** (torch.arange(0, d, 2) / d)).double())


def test_learned_positions_refuse_a_longer_sequence_and_configs_are_checked():
    model = model_of(replace(TINY, positions="learned", max_positions=4))
    src, src_len, tgt, tgt_len = batch()
    with pytest.raises(PhraseScorerError, match="longer than the model's 4 learned positions"):
        model.encode(torch.ones((1, 5), dtype=torch.long), torch.tensor([5]))
    with pytest.raises(PhraseScorerError, match="model_dim is 18; it must be a multiple of twice model.heads"):
        replace(TINY, model_dim=18, heads=2)
    with pytest.raises(PhraseScorerError, match="model.positions is 'rotary'"):
        replace(TINY, positions="rotary")
    with pytest.raises(PhraseScorerError, match="model.tie_target_embeddings is 1; it must be true or false"):
        replace(TINY, tie_target_embeddings=1)


def test_forward_flops_are_the_products_the_flop_counter_sees_plus_attention():
    """torch's counter does not see the fused attention kernel on a CPU: the analytic count less
    its attention part is what it sees, and the attention part is the scores and weighted sums."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(TINY, 50, 60).eval()
    for source, target in (([3, 4, 5], [6, 7, 8, 9]), ([3] * 7, [6, 7])):
        with FlopCounterMode(display=False) as counter:
            model(torch.tensor([source]), torch.tensor([len(source)]), torch.tensor([target]),
                  torch.tensor([len(target)]))
        analytic = FORWARD_FLOPS["transformer"](TINY, 60, len(source), len(target))
        assert counter.get_total_flops() == analytic["total"] - analytic["attention"]
        S, T, d = len(source), len(target) + 1, TINY.model_dim
        attention = S * S * TINY.encoder_layers + T * ((T + 1) / 2 + S) * TINY.decoder_layers
        assert analytic["attention"] == 4 * d * attention
        assert training_flops_per_pair(TINY, 60, len(source), len(target)) == 3 * analytic["total"]


def test_the_warmup_rises_linearly_then_falls_as_the_inverse_square_root():
    assert [warmup_factor(4, u) for u in (1, 2, 4, 16)] == [0.25, 0.5, 1.0, 0.5]
    assert warmup_factor(0, 7) == 1.0 and warmup_factor(4, 0) == 0.25
    config = TrainConfig(arch="transformer").resolved()
    assert config.recipe == "transformer" and config.warmup == 1000 and config.dropout == 0.1
    assert TrainConfig(arch="rnnsearch").resolved().warmup == 0  # the other recipes: no warm-up


def random_pairs(seed: int, count: int = 300):
    rng = np.random.default_rng(seed)
    distinct = [list(rng.integers(3, 40, rng.integers(1, 9))) for _ in range(count // 6)]
    sources = [distinct[i % len(distinct)] for i in range(count)]
    targets = [list(rng.integers(3, 50, rng.integers(1, 11))) for _ in range(count)]
    return sources, targets


@pytest.mark.parametrize("options", [{}, {"batch_tokens": 40, "chunk_rows": 7}])
def test_one_pass_scores_equal_the_step_by_step_trie_and_the_forward_pass(options):
    """The scorer runs a batch of targets in one pass (signatures say so); the trie's steps and the
    naive forward pass give the same scores within the base-2 softmax's rounding (docs/precision.md)."""
    model = model_of().float()
    sources, targets = random_pairs(1)
    one_pass = BatchScorer(model, ScoringOptions(one_pass=True, **options))
    stepped = BatchScorer(model, ScoringOptions(one_pass=False, **options))
    fast, slow = one_pass.score(sources, targets), stepped.score(sources, targets)
    reference = log_probs_by_forward(model, sources, targets)
    assert np.abs(fast - slow).max() < 1e-4 and np.abs(fast - reference).max() < 1e-4
    assert one_pass.describe()["decoding"] == "one pass" and "decoding" not in stepped.describe()
    tokens = sum(len(t) + 1 for t in targets)
    assert one_pass.stats.target_steps == stepped.stats.target_steps == tokens
    assert stepped.stats.decoder_steps < tokens <= one_pass.stats.decoder_steps  # shared prefixes; padding
    # targets sharing a prefix share its softmax in either path: a shared prefix scores the same
    shared = [[3, 4, 5, 6], [3, 4, 5, 7], [3, 4, 5]]
    same_source = [[8, 9]] * 3
    alone = [BatchScorer(model, ScoringOptions(one_pass=True, **options)).score([[8, 9]], [t])[0] for t in shared]
    together = one_pass.score(same_source, shared)
    assert np.abs(np.array(alone) - together).max() < 1e-5


def test_a_one_pass_plan_crosses_processes_and_scores_the_same():
    import pickle

    from phrase_scorer.scoring.batch_plan import plan_window

    model = model_of().float()
    sources, targets = random_pairs(2)
    scorer = BatchScorer(model, ScoringOptions(batch_tokens=100, one_pass=True))
    plans = list(plan_window(scorer.plan_settings(), sources, targets))
    assert len(plans) > 1 and all(p.one_pass is not None for p in plans)
    # no decoder step is planned: a depth names the positions of the pass its softmax reads
    assert all(d.rows is not None and d.keys is None and d.parents is None for p in plans for d in p.depths)
    again = [pickle.loads(pickle.dumps(p)) for p in plans]
    assert np.array_equal(scorer.score_plans(again, len(sources)), scorer.score(sources, targets))


def test_on_a_cpu_a_batch_runs_in_one_pass_where_it_computes_fewer_positions():
    """By default on a CPU: targets sharing long prefixes (an n-best list's) take the trie, whose
    nodes are few; one target per source (a reverse model's) takes the pass; the scores agree and
    the signature says which rule chose."""
    from phrase_scorer.config import ONE_PASS_POSITIONS_PER_NODE
    from phrase_scorer.scoring.batch_plan import plan_window

    model = model_of().float()
    scorer = BatchScorer(model)
    assert scorer.plan_settings().decoder == "by_batch"
    rule = f"one pass where at most {ONE_PASS_POSITIONS_PER_NODE:g} positions per trie node"
    assert scorer.describe()["decoding"] == rule
    prefix = [5, 6, 7, 8, 9, 10, 11, 12]
    shared = [prefix + [13 + i] for i in range(20)]  # 20 targets of one source: 9 + 20 nodes, 200 positions
    (plan,) = plan_window(scorer.plan_settings(), [[3, 4]] * 20, shared)
    assert plan.one_pass is None
    rng = np.random.default_rng(3)
    distinct = [list(rng.integers(3, 50, 6)) for _ in range(20)]  # a source each, equal lengths: no padding
    (plan,) = plan_window(scorer.plan_settings(), [[3, 4 + i] for i in range(20)], distinct)
    assert plan.one_pass is not None
    for sources, targets in (([[3, 4]] * 20, shared), ([[3, 4 + i] for i in range(20)], distinct)):
        assert np.abs(scorer.score(sources, targets) - log_probs_by_forward(model, sources, targets)).max() < 1e-4
    assert BatchScorer(model, ScoringOptions(one_pass=False)).plan_settings().decoder == "trie"


# --- the commands -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentence_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("transformer") / "model"
    result = run("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", out, "--arch", "transformer", "--preset", "tiny",
                 "--max-length", 14, "--max-steps", 40, "--valid-every", 20, "--valid-pairs", 50, "--seed", 2,
                 "--warmup", 10, "--threads", 1)
    assert result.exit_code == 0, result.output
    return out


def test_train_records_the_architecture_and_its_recipe(sentence_model):
    config = json.loads((sentence_model / "config.json").read_text())
    assert config["model"]["arch"] == "transformer" and config["training"]["recipe"] == "transformer"
    assert config["training"]["warmup"] == 10 and config["model"]["tie_target_embeddings"] is True
    log = [json.loads(line) for line in (sentence_model / "train.log.jsonl").read_text().splitlines()]
    rates = {r["step"]: r["lr"] for r in log if "lr" in r}
    assert rates[20] == pytest.approx(2e-3 * math.sqrt(10 / 20))
    assert rates[40] == pytest.approx(2e-3 * math.sqrt(10 / 40))
    assert isinstance(load_model(sentence_model).model, Transformer)


def test_a_changed_architecture_setting_is_refused_at_load(tmp_path, sentence_model):
    """The weights are tied to the network they were trained as (trained_as): a config.json
    edited to other sizes is refused, naming the file."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(sentence_model, copy)
    config = json.loads((copy / "config.json").read_text())
    config["model"]["heads"] = 4
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(PhraseScorerError) as refused:
        load_model(copy)
    said = str(refused.value)
    assert "model.pt" in said and "trained with other sizes (heads 2, config.json 4)" in said


def test_score_annotate_and_rescore_give_the_models_log_p(tmp_path, sentence_model):
    loaded = load_model(sentence_model)
    table = tmp_path / "pt.txt"
    table.write_bytes(b"".join(head_lines(A_MAN_TABLE, 300)))
    lines = table.read_text(encoding="utf-8").splitlines()
    sources = [loaded.source_vocab.encode(line.split(" ||| ")[0].split()) for line in lines]
    targets = [loaded.target_vocab.encode(line.split(" ||| ")[1].split()) for line in lines]
    want = log_probs_by_forward(loaded.model, sources, targets)

    scored = run("score", "-m", sentence_model, table, "--threads", 1)
    assert scored.exit_code == 0, scored.output
    assert [float(v) for v in scored.stdout.split()] == pytest.approx(list(want), abs=1e-4)

    out = tmp_path / "pt.rnn.gz"
    assert run("annotate", table, "-m", sentence_model, "-o", out, "--threads", 1).exit_code == 0
    with gzip.open(out, "rt", encoding="utf-8") as f:
        rows = f.read().splitlines()
    assert len(rows) == len(lines)
    for row, line, log_p in zip(rows, lines, want):
        assert row.split(" ||| ")[:2] == line.split(" ||| ")[:2]
        assert float(row.split(" ||| ")[2].split()[-2]) == pytest.approx(math.exp(max(log_p, -100)), rel=1e-4)

    rescored = tmp_path / "nbest.out"
    result = run("rescore", NBEST, "--source", SOURCE, "-m", sentence_model, "--name", "TF", "-o", rescored,
                 "--threads", 1)
    assert result.exit_code == 0, result.output
    with gzip.open(NBEST, "rt", encoding="utf-8") as f:
        nbest = f.read().splitlines()
    written = rescored.read_text(encoding="utf-8").splitlines()
    assert len(written) == len(nbest)
    source_lines = SOURCE.read_text(encoding="utf-8").splitlines()
    hypotheses = [line.split(" ||| ") for line in nbest]
    want = log_probs_by_forward(loaded.model,
                                [loaded.source_vocab.encode(source_lines[int(h[0])].split()) for h in hypotheses],
                                [loaded.target_vocab.encode(h[1].split()) for h in hypotheses])
    got = [float(line.split(" ||| ")[2].split("TF= ")[1].split()[0]) for line in written]
    assert got == pytest.approx(list(want), abs=1e-3)


def test_translate_sample_and_beam_search_use_the_cache(tmp_path, sentence_model):
    source = tmp_path / "in.en"
    source.write_text("a man in a blue shirt .\ntwo dogs play .\n", encoding="utf-8")
    out = tmp_path / "out.fr"
    assert run("translate", "-m", sentence_model, source, "-o", out, "--beam", 3, "--threads", 1).exit_code == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    sampled = run("sample", "-m", sentence_model, "a man", "-n", 10, "--top", 3, "--seed", 1)
    assert sampled.exit_code == 0 and "a man" in sampled.stdout
    loaded = in_fp64(load_model(sentence_model))
    sources, batched = assert_beams_batched_as_alone(loaded, ("a man", "a man in a blue shirt", "dog"), 1e-6)
    # a hypothesis's beam score is its teacher-forced log p (the beam sums in fp32)
    for source_ids, hypotheses in zip(sources, batched):
        seqs = [seq for seq, _ in hypotheses]
        want = log_probs_by_forward(loaded.model, [source_ids] * len(seqs), seqs)
        assert [score for _, score in hypotheses] == pytest.approx(list(want), abs=1e-4)


def test_phrase_pairs_resume_right_to_left_and_averaging(tmp_path):
    """On a phrase table: a run stopped and resumed ends where one run ends; a right-to-left
    model and checkpoint averaging train and load."""
    common = ["--arch", "transformer", "--preset", "tiny", "--valid-every", 10, "--valid-pairs", 100,
              "--batch-size", 16, "--seed", 5, "--threads", 1]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run("train", EXAMPLE_TABLE, "-o", whole, "--max-steps", 30, *common).exit_code == 0
    assert run("train", EXAMPLE_TABLE, "-o", parts, "--max-steps", 20, *common).exit_code == 0
    resumed = run("train", EXAMPLE_TABLE, "-o", parts, "--resume", "--max-steps", 30, "--threads", 1)
    assert resumed.exit_code == 0, resumed.output
    a = torch.load(whole / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(parts / "checkpoint.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    backwards = tmp_path / "r2l"
    result = run("train", EXAMPLE_TABLE, "-o", backwards, "--max-steps", 30, "--right-to-left",
                 "--average-checkpoints", 3, *common)
    assert result.exit_code == 0, result.output
    assert load_model(backwards).target_vocab.right_to_left
    assert json.loads((backwards / "config.json").read_text())["training"]["average_checkpoints"] == 3


def test_subword_pieces(tmp_path):
    out = tmp_path / "bpe"
    result = run("train", "--corpus", TRAIN_EN, TRAIN_FR, "-o", out, "--arch", "transformer", "--preset", "tiny",
                 "--vocabulary", "bpe", "--source-shortlist", 300, "--target-shortlist", 300, "--max-length", 12,
                 "--max-steps", 10, "--valid-every", 10, "--valid-pairs", 30, "--threads", 1)
    assert result.exit_code == 0, result.output
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("a man ||| un homme\n", encoding="utf-8")
    scored = run("score", "-m", out, pairs)
    assert scored.exit_code == 0 and float(scored.stdout) < 0


def test_word_maps_show_the_source_embeddings(tmp_path, sentence_model):
    words = tmp_path / "words.png"
    result = run("plot", "embeddings", "-m", sentence_model, "-o", words, "--words", 60, "--method", "tsne")
    assert result.exit_code == 0, result.output
    assert words.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = load_model(sentence_model)
    assert loaded.model.source_embedding is loaded.model.source_embed
