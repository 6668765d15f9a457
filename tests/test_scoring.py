"""BatchScorer: the shared, batched scorer agrees with the teacher-forced model pair by pair."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import A_MAN_TABLE
from phrase_scorer.config import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, ModelConfig, RNNsearchConfig, ScoringOptions
from phrase_scorer.data.padding import IdRows
from phrase_scorer.io.phrase_table import read_phrase_table
from phrase_scorer.models.encdec import RNNEncoderDecoder
from phrase_scorer.models.architectures import build_model
from phrase_scorer.runtime.threads import ONE_THREAD_PARAMETERS, default_threads
from phrase_scorer.scoring.batch_scorer import (
    CPU_CHUNK_BYTES,
    CPU_CHUNK_ROWS,
    GPU_CHUNK_BYTES,
    BatchScorer,
    default_batch_tokens,
    default_chunk_rows,
    log_probs_by_forward,
    pad,
)
from phrase_scorer.scoring.batch_plan import batches, build_trie
from phrase_scorer.vocab import Vocabulary

CONFIG = ModelConfig(embedding_dim=8, hidden_dim=12, maxout_units=6, output_rank=4, source_shortlist=150,
                     target_shortlist=150)


@pytest.fixture(scope="module")
def real_pairs():
    """Id pairs from the real slice, with shortlists small enough to have unknown words."""
    lines = list(read_phrase_table(A_MAN_TABLE))
    from collections import Counter

    src_vocab = Vocabulary.from_counts(Counter(w for l in lines for w in l.source_words), 150)
    tgt_vocab = Vocabulary.from_counts(Counter(w for l in lines for w in l.target_words), 150)
    return ([src_vocab.encode(l.source_words) for l in lines], [tgt_vocab.encode(l.target_words) for l in lines],
            len(src_vocab), len(tgt_vocab))


def make_model(real_pairs, dtype=torch.float64):
    torch.manual_seed(1)
    model = RNNEncoderDecoder(CONFIG, real_pairs[2], real_pairs[3]).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.4)
    return model.eval()


@pytest.mark.parametrize(
    "options",
    [
        ScoringOptions(),
        ScoringOptions(batch_tokens=7, chunk_rows=3),  # sources split over batches, many chunks
        ScoringOptions(share_source_prefixes=False, share_target_prefixes=False),
        ScoringOptions(share_source_prefixes=True, share_target_prefixes=False, batch_tokens=100),
    ],
)
def test_scores_equal_teacher_forcing_in_input_order(real_pairs, options):
    sources, targets = real_pairs[0][:600], real_pairs[1][:600]
    model = make_model(real_pairs)
    want = log_probs_by_forward(model, sources, targets)
    got = BatchScorer(model, options).score(sources, targets)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


def test_shuffled_input_gives_the_same_scores_per_pair(real_pairs):
    sources, targets = real_pairs[0][:400], real_pairs[1][:400]
    model = make_model(real_pairs)
    scorer = BatchScorer(model)
    base = scorer.score(sources, targets)
    order = np.random.default_rng(0).permutation(len(sources))
    shuffled = scorer.score([sources[i] for i in order], [targets[i] for i in order])
    np.testing.assert_allclose(shuffled, base[order], atol=1e-9)


def test_fp32_matches_fp64_closely(real_pairs):
    sources, targets = real_pairs[0], real_pairs[1]
    model = make_model(real_pairs, torch.float64)
    exact = BatchScorer(model).score(sources, targets)
    fast = BatchScorer(model.float()).score(sources, targets)
    np.testing.assert_allclose(fast, exact, rtol=1e-5)


def test_sharing_saves_steps_on_a_real_table(real_pairs):
    sources, targets = real_pairs[0], real_pairs[1]
    model = make_model(real_pairs, torch.float32)
    shared = BatchScorer(model)
    shared.score(sources, targets)
    alone = BatchScorer(model, ScoringOptions(share_source_prefixes=False, share_target_prefixes=False))
    alone.score(sources, targets)
    s, a = shared.stats, alone.stats
    assert s.pairs == a.pairs == len(sources)
    assert s.distinct_sources < len(sources)  # each distinct source is encoded once, either way
    assert a.encoder_steps == a.source_words  # no sharing: one encoder step per source word
    assert s.encoder_steps < 0.5 * a.encoder_steps  # "a man in a ..." shares long prefixes
    assert a.decoder_steps == a.target_steps
    assert s.decoder_steps < a.decoder_steps


def test_trie_counts_nodes_once_per_prefix():
    trie = build_trie([(1, 2, 3), (1, 2), (1, 4), (5,), (1, 2, 3)])
    assert [len(k) for k in trie.keys] == [2, 2, 1]  # {1,5}, {12,14}, {123}
    # every sequence is found at its own nodes
    assert trie.node_of[2][0] == trie.node_of[2][4]
    assert trie.node_of[1][0] == trie.node_of[1][1] != trie.node_of[1][2]
    assert trie.node_of[1][3] == -1
    unshared = build_trie([(1, 2, 3), (1, 2)], share_prefixes=False)
    assert unshared.num_nodes == 5


def inserted_trie(sequences, share_prefixes=True):
    """The trie built one sequence at a time with a dictionary of children (in sorted order when
    sharing, so that node numbers are in order of creation as the scorer numbers them)."""
    depth = max(map(len, sequences))
    keys, parents = [[] for _ in range(depth)], [[] for _ in range(depth)]
    node_of = [[-1] * len(sequences) for _ in range(depth)]
    children = {}
    order = (sorted(range(len(sequences)), key=lambda i: tuple(sequences[i])) if share_prefixes
             else range(len(sequences)))
    for i in order:
        parent = -1
        for d, key in enumerate(sequences[i]):
            node = children.get((d, parent, key)) if share_prefixes else None
            if node is None:
                node = len(keys[d])
                keys[d].append(key)
                parents[d].append(parent)
                children[(d, parent, key)] = node
            node_of[d][i] = parent = node
    return keys, parents, node_of


@pytest.mark.parametrize("share", [True, False])
def test_the_vectorised_trie_is_the_trie_built_one_sequence_at_a_time(share):
    rng = np.random.default_rng(5)
    # a small alphabet: shared prefixes, prefixes that are whole sequences, and repeats
    sequences = [tuple(rng.integers(0, 3, rng.integers(1, 6))) for _ in range(400)]
    trie = build_trie(sequences, share_prefixes=share)
    keys, parents, node_of = inserted_trie(sequences, share)
    assert [k.tolist() for k in trie.keys] == keys
    assert [p.tolist() for p in trie.parents] == parents
    assert [n.tolist() for n in trie.node_of] == node_of


def greedy_batches(sources, targets, budget, shortest_first=False):
    """Pairs grouped by source (sources in sorted order, or shortest first and then sorted; a
    source's pairs in input order), cut into batches of at most ``budget`` target tokens (words +
    </s>), at least one pair each; a batch whose sources each have one pair takes its pairs
    longest target first (ties in the order before)."""
    by_source = {}
    for i, source in enumerate(sources):
        by_source.setdefault(tuple(source), []).append(i)
    batches, batch, tokens = [], [], 0
    for source in sorted(by_source, key=(lambda s: (len(s), s)) if shortest_first else None):
        for i in by_source[source]:
            cost = len(targets[i]) + 1
            if batch and tokens + cost > budget:
                batches.append(batch)
                batch, tokens = [], 0
            batch.append((source, i))
            tokens += cost
    batches = batches + [batch] if batch else batches
    return [sorted(b, key=lambda pair: -len(targets[pair[1]])) if len({source for source, _ in b}) == len(b) else b
            for b in batches]


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
@pytest.mark.parametrize("budget", [1, 7, 30, 10_000])
def test_batches_group_pairs_by_source_in_sorted_order_and_fill_the_token_budget(budget, arch):
    """The encoder-decoder walks the trie of its sources: they come in sorted order. RNNsearch
    encodes padded batches: its sources come shortest first, so a batch pads little."""
    rng = np.random.default_rng(budget)
    sources = [tuple(rng.integers(3, 7, rng.integers(1, 4))) for _ in range(300)]
    targets = [tuple(rng.integers(3, 9, rng.integers(1, 5))) for _ in range(300)]
    model = RNNEncoderDecoder(CONFIG, 10, 10) if arch == "encdec" else build_model(SEARCH_CONFIG, 10, 10)
    scorer = BatchScorer(model, ScoringOptions(batch_tokens=budget))
    from phrase_scorer.data.padding import IdRows

    rows = IdRows.of(sources)
    got = []
    target_lengths = IdRows.of(targets).lengths
    for pair_index, opens_source in batches(scorer.plan_settings(), rows.rows, rows.lengths, target_lengths):
        assert opens_source[0]
        got.append([(sources[i], int(i)) for i in pair_index])
        # a pair opens a source exactly where its source differs from the pair before it
        assert opens_source[1:].tolist() == [sources[a] != sources[b] for a, b in zip(pair_index[1:], pair_index[:-1])]
    assert got == greedy_batches(sources, targets, budget, shortest_first=arch == "rnnsearch")


def test_a_model_too_small_to_split_scores_on_one_thread():
    tiny = RNNEncoderDecoder(CONFIG, 150, 150)
    larger = RNNEncoderDecoder(ModelConfig(embedding_dim=64, hidden_dim=256, maxout_units=128, output_rank=64),
                               6000, 6000)
    assert (sum(p.numel() for p in tiny.parameters()) < ONE_THREAD_PARAMETERS
            < sum(p.numel() for p in larger.parameters()))
    assert default_threads([tiny], 8) == 1
    assert default_threads([tiny, larger], 8) == 8 and default_threads([], 8) == 8


def test_empty_input():
    model = RNNEncoderDecoder(CONFIG, 10, 10)
    assert BatchScorer(model).score([], []).shape == (0,)


def test_softmax_shift_needs_no_exact_pass_with_large_weights(real_pairs):
    """With weights far from their small initial values (as after training), the shift from the
    frequent outputs keeps every row in fp32's range: no row is recomputed."""
    sources, targets = real_pairs[0], real_pairs[1]
    model = make_model(real_pairs, torch.float32)
    with torch.no_grad():
        model.readout.output.weight.mul_(5.0)
    scorer = BatchScorer(model)
    got = scorer.score(sources, targets)
    assert scorer.stats.exact_softmax_rows == 0
    want = log_probs_by_forward(model, sources, targets)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_softmax_overflow_falls_back_to_the_exact_sum(real_pairs):
    """A rare output whose logit dwarfs every frequent one (by more than fp32's exp can hold)
    overflows the shifted sum; those rows are recomputed exactly, so scores still equal
    teacher forcing."""
    from phrase_scorer.scoring.batch_scorer import OutputSoftmax

    sources, targets = real_pairs[0][:300], real_pairs[1][:300]
    model = make_model(real_pairs, torch.float64)
    rare = OutputSoftmax.PROBE_COLUMNS + 20  # an output column outside the probe
    with torch.no_grad():
        model.readout.output.bias[rare] += 150.0
    want = log_probs_by_forward(model, sources, targets)
    scorer = BatchScorer(model.float())
    got = scorer.score(sources, targets)
    assert scorer.stats.exact_softmax_rows > 0
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5)


# --- RNNsearch through the same scorer -------------------------------------------------------------

SEARCH_CONFIG = RNNsearchConfig(embedding_dim=8, hidden_dim=10, alignment_dim=9, maxout_units=6,
                                source_shortlist=150, target_shortlist=150)


def make_search_model(real_pairs, dtype=torch.float64, trained_steps=0):
    """A tiny RNNsearch: random weights (large enough that attention is far from uniform), or
    the paper's initialisation trained for ``trained_steps`` Adam steps on the first pairs."""
    torch.manual_seed(2)
    model = build_model(SEARCH_CONFIG, real_pairs[2], real_pairs[3]).to(dtype)
    if not trained_steps:
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.4)
        return model.eval()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    src, src_len = pad(real_pairs[0][:64], "cpu")
    tgt, tgt_len = pad(real_pairs[1][:64], "cpu")
    for _ in range(trained_steps):
        optimizer.zero_grad()
        (-model(src, src_len, tgt, tgt_len).mean()).backward()
        optimizer.step()
    return model.eval()


@pytest.mark.parametrize("trained_steps", [0, 20])
@pytest.mark.parametrize(
    "options",
    [ScoringOptions(), ScoringOptions(batch_tokens=7, chunk_rows=3), ScoringOptions(share_target_prefixes=False)],
)
def test_rnnsearch_scores_equal_teacher_forcing(real_pairs, options, trained_steps):
    sources, targets = real_pairs[0][:300], real_pairs[1][:300]
    model = make_search_model(real_pairs, trained_steps=trained_steps)
    want = log_probs_by_forward(model, sources, targets)
    got = BatchScorer(model, options).score(sources, targets)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)


def test_rnnsearch_reads_the_sources_of_a_target_each_in_place(real_pairs, monkeypatch):
    """A reverse model's pairs: each source (a hypothesis) with one target. A batch takes them
    longest target first, so the decoder rows of every depth are the batch's first sources in
    order, read where they are (``RNNsearchMemory.first``: views and a batched product, no
    gathered rows); the scores still equal teacher forcing."""
    from phrase_scorer.models.rnnsearch import RNNsearchMemory

    one_target = {}
    for source, target in zip(real_pairs[0], real_pairs[1]):
        one_target.setdefault(tuple(source), target)
    sources, targets = [list(s) for s in one_target][:300], list(one_target.values())[:300]
    assert len({len(t) for t in targets}) > 2  # targets of several lengths
    model = make_search_model(real_pairs)
    read_in_place = []
    first = RNNsearchMemory.first
    monkeypatch.setattr(RNNsearchMemory, "first", lambda self, count: read_in_place.append(count) or first(self, count))
    scorer = BatchScorer(model, ScoringOptions(batch_tokens=200))
    got = scorer.score(sources, targets)
    np.testing.assert_allclose(got, log_probs_by_forward(model, sources, targets), rtol=0, atol=1e-9)
    assert sum(read_in_place) == scorer.stats.decoder_steps  # every row of every depth


def test_rnnsearch_scorer_encodes_each_source_once_and_shares_target_prefixes(real_pairs):
    sources, targets = real_pairs[0][:300], real_pairs[1][:300]
    scorer = BatchScorer(make_search_model(real_pairs))
    scorer.score(sources, targets)
    distinct = set(map(tuple, sources))
    stats = scorer.stats
    assert stats.pairs == 300
    assert stats.distinct_sources == len(distinct)  # one batch: each distinct source once
    assert stats.source_words == sum(map(len, distinct))
    # each direction runs once per node of its trie: the sources' prefixes, and their suffixes
    prefixes = {s[:k] for s in distinct for k in range(1, len(s) + 1)}
    suffixes = {s[k:] for s in distinct for k in range(len(s))}
    assert stats.encoder_steps == (len(prefixes) + len(suffixes)) // 2 < 0.6 * stats.source_words
    n_target_nodes = len({(tuple(s), tuple(t[:k])) for s, t in zip(sources, targets) for k in range(len(t) + 1)})
    assert stats.decoder_steps == n_target_nodes < stats.target_steps


def test_rnnsearch_sources_by_shared_affixes_score_as_padded_batches_and_are_recorded(real_pairs):
    """The tries of prefixes and suffixes give the padded batch's scores (fp64: to rounding), and
    the signature says which encoding ran; without source sharing, one step per source word."""
    sources, targets = real_pairs[0][:300], real_pairs[1][:300]
    model = make_search_model(real_pairs, trained_steps=20)
    shared = BatchScorer(model)
    padded = BatchScorer(model, ScoringOptions(share_source_prefixes=False))
    np.testing.assert_allclose(shared.score(sources, targets), padded.score(sources, targets), rtol=0, atol=1e-9)
    assert padded.stats.encoder_steps == padded.stats.source_words
    assert shared.describe()["source_encoding"] == "shared prefixes and suffixes"
    assert "source_encoding" not in padded.describe()
    fp32 = copy.deepcopy(model).float()
    np.testing.assert_allclose(BatchScorer(fp32).score(sources, targets),
                               BatchScorer(fp32, ScoringOptions(share_source_prefixes=False)).score(sources, targets),
                               rtol=0, atol=2e-5)


def test_chunk_rows_default_to_the_devices_own(loaded_tiny):
    """A CPU forms cache-sized chunks of logits (128 rows for the vocabularies of every preset
    but tiny, more for a small vocabulary); a GPU as many rows as fill the byte budget (few
    kernel launches), whatever the vocabulary; an explicit ``chunk_rows`` wins everywhere."""
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    for outputs in (6002, 15000, 30000):
        assert default_chunk_rows(cpu, outputs) == CPU_CHUNK_ROWS
    rows = default_chunk_rows(cpu, 502)
    assert rows * 502 * 4 <= CPU_CHUNK_BYTES < (rows + 1) * 502 * 4
    for outputs in (500, 15000, 30000):
        rows = default_chunk_rows(gpu, outputs)
        assert rows * outputs * 4 <= GPU_CHUNK_BYTES < (rows + 1) * outputs * 4
    assert default_chunk_rows(gpu, 10**7) == CPU_CHUNK_ROWS  # never fewer rows than on a CPU
    model = loaded_tiny.model
    assert BatchScorer(model).describe()["chunk_rows"] == default_chunk_rows(cpu, model.output_layer.out_features)
    described = BatchScorer(model, ScoringOptions(batch_tokens=99, chunk_rows=7)).describe()
    assert (described["batch_tokens"], described["chunk_rows"]) == (99, 7)


def test_batch_tokens_default_to_the_devices_own(loaded_tiny, tmp_path):
    """8,192 target tokens a batch on a CPU, 65,536 on a GPU (where the host's launches, not the
    arithmetic, bound a batch); the number used is what the signature records, and an explicit
    ``batch_tokens`` wins everywhere."""
    assert default_batch_tokens(torch.device("cpu")) == CPU_BATCH_TOKENS == 8192
    assert default_batch_tokens(torch.device("cuda", 0)) == GPU_BATCH_TOKENS == 65536
    model = loaded_tiny.model
    assert BatchScorer(model).describe()["batch_tokens"] == CPU_BATCH_TOKENS
    assert BatchScorer(model, ScoringOptions(batch_tokens=64)).describe()["batch_tokens"] == 64
    # the batches follow the number used: 40 pairs of 9 target tokens (8 words + </s>) make one
    # batch of the default 8,192 tokens, and 7 pairs a batch (6 batches) of 64
    rows = IdRows.of([[5, 6, 7]] * 40)
    lengths = IdRows.of([[5 + i % 7] * 8 for i in range(40)]).lengths
    for options, count in ((ScoringOptions(), 1), (ScoringOptions(batch_tokens=64), 6)):
        settings = BatchScorer(model, options).plan_settings()
        assert len(list(batches(settings, rows.rows, rows.lengths, lengths))) == count
    # and a call may ask for its own (the bounded reranking's small batches of floors)
    assert len(list(batches(BatchScorer(model).plan_settings(), rows.rows, rows.lengths, lengths, 64))) == 6


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_threads_that_take_whole_batches_give_the_scores_of_one_thread(real_pairs, arch):
    """thread_split="batches": two threads each score whole batches on one core, so every score
    is bit for bit the one-thread score; the work counters add up as on one thread; the caller's
    thread count is kept. Operations split over two threads agree to fp32 rounding."""
    sources, targets = real_pairs[0][:300], real_pairs[1][:300]
    model = make_model(real_pairs, torch.float32) if arch == "encdec" else make_search_model(real_pairs, torch.float32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = BatchScorer(model, ScoringOptions(batch_tokens=64))
        want = one.score(sources, targets)
        assert "thread_split" not in one.describe()  # one thread: nothing to split
        torch.set_num_threads(2)
        split = BatchScorer(model, ScoringOptions(batch_tokens=64))
        got = split.score(sources, targets)
        assert torch.get_num_threads() == 2
        assert split.describe()["thread_split"] == "batches"
        operations = BatchScorer(model, ScoringOptions(batch_tokens=64, thread_split="operations"))
        np.testing.assert_allclose(operations.score(sources, targets), want, rtol=1e-5)
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(got, want) and np.all(want < 0)
    assert split.stats == one.stats and one.stats.pairs == 300


def plan_slots(plan):
    """Every slot a plan's run reads."""
    encoder = plan.encoder
    slots = [encoder.src_len] + ([encoder.src] if encoder.src else []) + encoder.keys + encoder.parents
    slots += [s for ending in encoder.endings if ending for s in ending]
    for keys, parents, positions in encoder.walks:
        slots += keys + parents + [positions]
    for depth in plan.depths:
        slots += [s for s in (depth.sources, depth.keys, depth.parents) if s is not None]
        slots += [s for _, local, classes, pairs in depth.chunks for s in (local, classes, pairs)]
    return slots


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_a_batch_plan_is_one_buffer_of_its_pieces_and_crosses_processes(real_pairs, arch):
    """A plan's buffer is its pieces end to end, each read as a whole; the window's pairs are
    each in one batch; a plan pickled (as a worker sends it) scores as the one built here."""
    import itertools
    import pickle

    from phrase_scorer.scoring.batch_plan import plan_window

    sources, targets = real_pairs[0][:300], real_pairs[1][:300]
    model = make_model(real_pairs, torch.float32) if arch == "encdec" else make_search_model(real_pairs, torch.float32)
    scorer = BatchScorer(model, ScoringOptions(batch_tokens=256))
    plans = list(plan_window(scorer.plan_settings(), sources, targets))
    assert len(plans) > 1
    for plan in plans:
        assert sum(plan.parts) == len(plan.buffer)
        pieces = set(zip(itertools.accumulate(plan.parts, initial=0), plan.parts))
        slots = plan_slots(plan)
        assert set(slots) <= pieces and len(slots) == len(set(slots))  # each piece read once, as a whole
        # each chunk's pairs are distinct: one addition per pair and depth
        for depth in plan.depths:
            pairs = np.concatenate([plan.view(chunk[3]) for chunk in depth.chunks])
            assert len(np.unique(pairs)) == len(pairs)
    assert sorted(np.concatenate([p.pair_index for p in plans]).tolist()) == list(range(300))
    copied = pickle.loads(pickle.dumps(plans))
    assert np.array_equal(scorer.score_plans(copied, 300), scorer.score(sources, targets))
