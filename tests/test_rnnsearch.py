"""RNNsearch against the paper's equations written out step by step, and the model interface that
every architecture offers (the encoder-decoder included)."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from phrase_scorer.config import (
    PRESETS,
    RNNSEARCH_PRESETS,
    ModelConfig,
    RNNsearchConfig,
    model_config_from_dict,
)
from phrase_scorer.models.encdec import RNNEncoderDecoder
from phrase_scorer.model_dir import SOURCE_VOCAB, TARGET_VOCAB, BEST_WEIGHTS, ModelDirectory, load_model
from phrase_scorer.models.architectures import ARCHITECTURES, build_model
from phrase_scorer.models.base import FIRST_OUTPUT_ID, next_word_labels, previous_words
from phrase_scorer.models.rnnsearch import Alignment, RNNsearch
from phrase_scorer.scoring.batch_scorer import pad
from phrase_scorer.vocab import EOS_ID, PAD_ID, Vocabulary

TINY_SEARCH = RNNsearchConfig(embedding_dim=5, hidden_dim=6, alignment_dim=4, maxout_units=3,
                              source_shortlist=20, target_shortlist=20)
TINY_ENCDEC = ModelConfig(embedding_dim=5, hidden_dim=7, maxout_units=4, output_rank=3,
                          source_shortlist=20, target_shortlist=20)
SOURCE_VOCAB_SIZE, TARGET_VOCAB_SIZE = 23, 19
ROOT = Path(__file__).resolve().parent.parent
PAIRS = [([5], [7]), ([3, 4, 5], [6, 7]), ([9, 2, 9, 10], [3, 3, 2, 8, 18]), ([22], [2]), ([4, 4], [5, 6, 7, 8, 9, 10])]


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models gain nothing from more threads, and several threads on a busy machine spend
    their time waiting for each other (a hundredfold slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def paper_equations(model: RNNsearch, source, target):
    """log p(y|x) and the alignment matrix (Ty + 1, Tx) by appendix A, with numpy and loops.

    Every matrix is taken from the model by its role; each GRU's input matrices are stacked as
    (z, r, candidate), its recurrent ones as (U_z, U_r) and U.
    """
    P = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    n = model.config.hidden_dim

    def unit(prefix):
        W_z, W_r, W = np.split(P[prefix + "input_proj.weight"], 3)
        b_z, b_r, b = np.split(P[prefix + "input_proj.bias"], 3)
        U_z, U_r = np.split(P[prefix + "gate_recurrent.weight"], 2)
        return W_z, W_r, W, b_z, b_r, b, U_z, U_r, P[prefix + "recurrent.weight"]

    def gru(params, h, x_terms):
        """One step of the paper's unit; x_terms = (input terms of z, of r, of the candidate)."""
        *_, U_z, U_r, U = params
        z = sigmoid(x_terms[0] + U_z @ h)
        r = sigmoid(x_terms[1] + U_r @ h)
        h_tilde = np.tanh(x_terms[2] + U @ (r * h))
        return (1 - z) * h + z * h_tilde

    def input_terms(params, e):
        W_z, W_r, W, b_z, b_r, b, *_ = params
        return W_z @ e + b_z, W_r @ e + b_r, W @ e + b

    # --- encoder (A.2.1): forward and backward over the source words ---
    E_x = P["encoder.embed.weight"]
    forward_unit, backward_unit = unit("encoder.forward_unit."), unit("encoder.backward_unit.")
    Tx = len(source)
    h_fwd, h_bwd = [None] * Tx, [None] * Tx
    h = np.zeros(n)
    for j in range(Tx):
        h = gru(forward_unit, h, input_terms(forward_unit, E_x[source[j]]))
        h_fwd[j] = h
    h = np.zeros(n)
    for j in reversed(range(Tx)):
        h = gru(backward_unit, h, input_terms(backward_unit, E_x[source[j]]))
        h_bwd[j] = h
    annotations = [np.concatenate([h_fwd[j], h_bwd[j]]) for j in range(Tx)]

    # --- decoder (A.2.2) ---
    E_y = P["embed.weight"]
    decoder_unit = unit("unit.")
    C_z, C_r, C = np.split(P["context_proj.weight"], 3)
    W_a, U_a, b_Ua, v_a = (P["alignment.query.weight"], P["alignment.key.weight"], P["alignment.key.bias"],
                           P["alignment.score.weight"][0])
    U_o, b_o = P["readout.state.weight"], P["readout.state.bias"]
    V_o, C_o = P["readout.prev_word.weight"], P["readout.context.weight"]
    W_o, b_W = P["readout.output.weight"], P["readout.output.bias"]
    l = model.config.maxout_units

    s = np.tanh(P["init_state.weight"] @ h_bwd[0] + P["init_state.bias"])  # s_0 = tanh(W_s <-h_1)
    prev = np.zeros(model.config.embedding_dim)  # E y_0 = 0
    total, alignment_rows = 0.0, []
    for word in list(target) + [EOS_ID]:
        e = np.array([v_a @ np.tanh(W_a @ s + U_a @ annotations[j] + b_Ua) for j in range(Tx)])
        alpha = np.array([np.exp(e[j]) / np.sum(np.exp(e)) for j in range(Tx)])
        c = sum(alpha[j] * annotations[j] for j in range(Tx))
        t_tilde = U_o @ s + b_o + V_o @ prev + C_o @ c
        t = np.array([max(t_tilde[2 * k], t_tilde[2 * k + 1]) for k in range(l)])
        logits = W_o @ t + b_W  # over ids 1.. (</s>, <unk>, words)
        log_norm = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
        total += logits[word - FIRST_OUTPUT_ID] - log_norm
        alignment_rows.append(alpha)
        W_terms = input_terms(decoder_unit, prev)
        s = gru(decoder_unit, s, (W_terms[0] + C_z @ c, W_terms[1] + C_r @ c, W_terms[2] + C @ c))
        prev = E_y[word]
    return total, np.array(alignment_rows)


def random_model(arch="rnnsearch", seed=0, scale=0.5, dtype=torch.float64, target_vocab_size=TARGET_VOCAB_SIZE):
    """A model with larger weights than the paper's init (v_a = 0 would make every alignment
    uniform), so that every term matters."""
    torch.manual_seed(seed)
    config = TINY_SEARCH if arch == "rnnsearch" else TINY_ENCDEC
    model = build_model(config, SOURCE_VOCAB_SIZE, target_vocab_size).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, scale)
    return model


@torch.no_grad()
def interface_log_probs(model, sources, targets):
    """log p(y|x) pair by pair through encode / select / start / step / log_probs, each distinct
    source encoded once and its memory rows picked by source index."""
    distinct = sorted(set(map(tuple, sources)))
    src, src_len = pad(distinct, "cpu")
    memory = model.encode(src, src_len)
    rows = memory.select(torch.tensor([distinct.index(tuple(s)) for s in sources]))
    tgt, tgt_len = pad(targets, "cpu")
    labels, valid = next_word_labels(tgt, tgt_len)  # (B, T+1)
    state = model.start(rows)
    total = torch.zeros(len(targets), dtype=torch.float64)
    for i, prev in enumerate(previous_words(tgt).unbind(1)):
        state, features = model.step(rows, state, prev)
        log_p = model.log_probs(features)  # (B, V - 1)
        picked = log_p.gather(1, (labels[:, i].clamp(min=FIRST_OUTPUT_ID) - FIRST_OUTPUT_ID).unsqueeze(1)).squeeze(1)
        total += torch.where(valid[:, i], picked, torch.zeros_like(picked)).double()
    return total.numpy()


def forward_log_probs(model, sources, targets, extra_source_padding=0):
    src, src_len = pad(sources, "cpu")
    src = torch.cat([src, src.new_full((src.size(0), extra_source_padding), PAD_ID)], 1)
    tgt, tgt_len = pad(targets, "cpu")
    with torch.no_grad():
        return model(src, src_len, tgt, tgt_len).double().numpy()


# --- the paper's equations ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_forward_matches_the_papers_equations(dtype, tolerance):
    model = random_model(dtype=dtype)
    sources, targets = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    got = forward_log_probs(model, sources, targets)
    want = np.array([paper_equations(model, s, t)[0] for s, t in PAIRS])
    assert np.all(want < 0)
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_alignments_match_the_papers_equations_and_sum_to_one_over_real_words():
    model = random_model()
    sources, targets = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    src, src_len = pad(sources, "cpu")
    tgt, tgt_len = pad(targets, "cpu")
    with torch.no_grad():
        alpha = model.alignments(src, src_len, tgt, tgt_len).numpy()  # (B, T+1, S)
    assert alpha.shape == (len(PAIRS), tgt.size(1) + 1, src.size(1))
    for b, (source, target) in enumerate(PAIRS):
        want = paper_equations(model, source, target)[1]  # (Ty + 1, Tx)
        got = alpha[b, : len(target) + 1]
        np.testing.assert_allclose(got[:, : len(source)], want, atol=1e-12)
        np.testing.assert_allclose(got[:, : len(source)].sum(1), 1.0, atol=1e-12)
        assert np.all(got[:, len(source):] == 0.0)  # no weight on padding
        assert np.all(alpha[b, len(target) + 1 :] == 0.0)  # no rows past </s>
        if len(source) > 1:  # the weights are not uniform: the test sees them
            assert got[:, : len(source)].std() > 0.01


def test_the_gru_is_the_papers_unit_not_torchs():
    """Reset gate on h before U, and z on the new state: torch.nn.GRU computes something else."""
    model = random_model()
    unit = model.encoder.forward_unit
    n = unit.hidden_dim
    gru = torch.nn.GRU(5, n, batch_first=True).double()
    with torch.no_grad():
        W_z, W_r, W = unit.input_proj.weight.split(n)
        b_z, b_r, b = unit.input_proj.bias.split(n)
        U_z, U_r = unit.gate_recurrent.weight.split(n)
        gru.weight_ih_l0.copy_(torch.cat([W_r, W_z, W]))  # torch stacks (r, z, n)
        gru.bias_ih_l0.copy_(torch.cat([b_r, b_z, b]))
        gru.weight_hh_l0.copy_(torch.cat([U_r, U_z, unit.recurrent.weight]))
        gru.bias_hh_l0.zero_()
        x = torch.randn(1, 4, 5, dtype=torch.float64)
        ours = unit.scan(x, torch.ones(1, 4, dtype=torch.bool))
        theirs, _ = gru(x)
    assert (ours - theirs).abs().max() > 1e-3


# --- the interface -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["rnnsearch", "encdec"])
def test_stepping_through_the_interface_equals_the_forward_pass(arch):
    model = random_model(arch)
    sources = [p[0] for p in PAIRS] + [PAIRS[1][0], PAIRS[1][0]]  # a source with three targets
    targets = [p[1] for p in PAIRS] + [[6], [6, 7, 8]]
    np.testing.assert_allclose(interface_log_probs(model, sources, targets),
                               forward_log_probs(model, sources, targets), rtol=1e-12, atol=1e-12)


def test_inference_without_autograd_computes_the_training_step():
    """Without autograd a step takes the alignment through 2 sigmoid(2u) and the context as the
    weighted sum of projected source rows (a sparse product over the selected rows' sources);
    with autograd, through tanh and the gathered rows. Same a_ij, state and readout, in fp32
    (what a CPU scores in) and in fp64."""
    for dtype, tolerance in ((torch.float32, 2e-6), (torch.float64, 1e-12)):
        model = random_model(dtype=dtype).eval()
        distinct = [p[0] for p in PAIRS]
        src, src_len = pad(distinct, "cpu")
        memory = model.encode(src, src_len).select(torch.tensor([4, 1, 1, 2, 0, 2, 2, 3]))  # repeats, any order
        memory = memory.select(torch.tensor([7, 0, 1, 1, 5, 3]))  # selecting again composes
        assert len(memory) == 6 and memory.rows.tolist() == [3, 4, 1, 1, 2, 2]
        torch.manual_seed(1)
        state = torch.randn(6, TINY_SEARCH.hidden_dim, dtype=dtype)
        prev = torch.tensor([3, 4, 5, 6, 0, 7])  # <pad>: no previous word
        with torch.enable_grad():
            trained = [t.detach() for t in model.step_with_alignment(memory, state, prev)]
        with torch.no_grad():
            inferred = model.step_with_alignment(memory, state, prev)
        for want, got in zip(trained, inferred):  # s_i, t_i, a_i.
            assert got.dtype == dtype
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=tolerance, atol=tolerance)
        alpha = trained[2]
        assert alpha[0, : len(PAIRS[3][0])].sum() == pytest.approx(1.0) and alpha[0, len(PAIRS[3][0]):].sum() == 0
        assert alpha[3].std() > 0.01  # the alignment is not uniform: the test sees it


@pytest.mark.parametrize("rows_per_chunk", [1, 3, 100])
def test_alignment_energies_by_row_chunks_give_every_rows_weights(monkeypatch, rows_per_chunk):
    """On a CPU without autograd the energies go through a buffer of a few rows at a time
    (``Alignment.CHUNK_BYTES``): one row, three rows with a shorter last chunk, or every row at
    once, each row gets the a_ij of the training step's tanh form over its real words."""
    model = random_model(dtype=torch.float64).eval()
    rows, width, units = 7, 5, TINY_SEARCH.alignment_dim
    monkeypatch.setattr(Alignment, "CHUNK_BYTES", rows_per_chunk * width * units * 8)  # fp64
    torch.manual_seed(3)
    keys = torch.randn(rows, width, units, dtype=torch.float64)  # (N, S, n')
    state = torch.randn(rows, TINY_SEARCH.hidden_dim, dtype=torch.float64)  # (N, n)
    mask = torch.arange(width) < torch.tensor([5, 3, 1, 5, 2, 4, 5]).unsqueeze(1)  # (N, S)
    with torch.enable_grad():
        want = model.alignment(state, keys, mask).detach()
    with torch.no_grad():
        got = model.alignment(state, keys, mask)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    assert got[2, 1:].sum() == 0 and got[:, 0].std() > 0.01  # padding gets nothing; the weights vary by row


@pytest.mark.parametrize("arch", ["rnnsearch", "encdec"])
def test_the_first_sources_read_in_place_step_as_selected_rows(arch):
    """``memory.first(k)``, the rows a scorer reads when its rows at a depth are its first sources
    in order, takes the same step as ``memory.select(arange(k))``: RNNsearch's context then comes
    from a batched product over the sources' own rows instead of the sparse one, the same sums."""
    for dtype, tolerance in ((torch.float32, 2e-6), (torch.float64, 1e-12)):
        model = random_model(arch, dtype=dtype).eval()
        src, src_len = pad([p[0] for p in PAIRS], "cpu")
        torch.manual_seed(2)
        prev = torch.tensor([3, 0, 5])  # <pad>: no previous word
        with torch.no_grad():
            memory = model.encode(src, src_len)
            in_place, selected = memory.first(3), memory.select(torch.arange(3))
            assert len(in_place) == len(selected) == 3
            state = model.start(selected) + 0.1 * torch.randn(3, model.start(selected).size(1), dtype=dtype)
            for want, got in zip(model.step(selected, state, prev), model.step(in_place, state, prev)):
                np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=tolerance, atol=tolerance)
            np.testing.assert_allclose(model.start(in_place).numpy(), model.start(selected).numpy(), rtol=0, atol=0)
            # the first rows of rows already selected are selected rows again
            again = memory.select(torch.tensor([4, 2, 2, 0])).first(2)
            want = model.step(memory.select(torch.tensor([4, 2])), state[:2], prev[:2])
            for w, g in zip(want, model.step(again, state[:2], prev[:2])):
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("arch", ["rnnsearch", "encdec"])
def test_padding_changes_nothing(arch):
    """More padding after a source, longer neighbours in the batch, or a pair on its own: the
    same log p; <pad>'s embedding rows are never read as words."""
    model = random_model(arch)
    with torch.no_grad():
        model.get_submodule("encoder").embed.weight[PAD_ID].fill_(3.0)
    sources, targets = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    batched = forward_log_probs(model, sources, targets)
    padded = forward_log_probs(model, sources, targets, extra_source_padding=3)
    alone = np.array([forward_log_probs(model, [s], [t])[0] for s, t in PAIRS])
    np.testing.assert_allclose(padded, batched, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(alone, batched, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ["rnnsearch", "encdec"])
def test_probabilities_normalise(arch):
    """Over a 3-word vocabulary (with </s> and <unk>), the targets of up to L words and the
    prefixes of L + 1 words (every longer target starts with one) carry all the mass."""
    model = random_model(arch, scale=0.4, target_vocab_size=5)
    words, L = range(EOS_ID + 1, 5), 3  # <unk> and two words can be generated
    complete = [list(t) for k in range(L + 1) for t in itertools.product(words, repeat=k)]
    mass = np.exp(forward_log_probs(model, [[4, 5]] * len(complete), complete)).sum()

    # prefixes: log p of their words without </s>, through the interface
    longer = [list(t) for t in itertools.product(words, repeat=L + 1)]
    src, src_len = pad([[4, 5]], "cpu")
    with torch.no_grad():
        rows = model.encode(src, src_len).select(torch.zeros(len(longer), dtype=torch.long))
        state, total = model.start(rows), torch.zeros(len(longer), dtype=torch.float64)
        tgt = torch.tensor(longer)
        for i, prev in enumerate(previous_words(tgt)[:, : L + 1].unbind(1)):
            state, features = model.step(rows, state, prev)
            total += model.log_probs(features).gather(1, (tgt[:, i] - FIRST_OUTPUT_ID).unsqueeze(1)).squeeze(1)
    mass += total.exp().sum().item()
    assert mass == pytest.approx(1.0, abs=1e-12)


def test_source_prefix_sharing_gives_the_same_memory():
    """The encoder-decoder's source trie: states after x_1..x_t, then the memory from the states
    after each last word, equal the memory of encode()."""
    model = random_model("encdec")
    sources = [[3, 4], [3, 4, 5], [3]]
    assert model.shares_source_prefixes and not RNNsearch.shares_source_prefixes
    states = None
    final = {}
    for t, word in enumerate([3, 4, 5]):  # the trie of these sources is one path
        states = model.source_prefix_step(torch.tensor([word]), states)
        final[t + 1] = states[0]
    src, src_len = pad(sources, "cpu")
    shared = model.encode_from_final_states(torch.stack([final[len(s)] for s in sources]), src, src_len)
    direct = model.encode(src, src_len)
    for name in ("init_state", "context_gates", "source_term"):
        torch.testing.assert_close(getattr(shared, name), getattr(direct, name), rtol=1e-12, atol=1e-12)


def test_rnnsearch_learns_a_few_pairs():
    """Gradients flow through attention, both encoder directions and the readout."""
    torch.manual_seed(1)
    model = RNNsearch(TINY_SEARCH, SOURCE_VOCAB_SIZE, TARGET_VOCAB_SIZE)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    src, src_len = pad([p[0] for p in PAIRS], "cpu")
    tgt, tgt_len = pad([p[1] for p in PAIRS], "cpu")
    before = -model(src, src_len, tgt, tgt_len).mean().item()
    for _ in range(15):
        optimizer.zero_grad()
        loss = -model(src, src_len, tgt, tgt_len).mean()
        loss.backward()
        optimizer.step()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert loss.item() < 0.8 * before


# --- initialisation, presets and configs ---------------------------------------------------------


def test_initialisation_follows_appendix_b():
    config = RNNsearchConfig(embedding_dim=100, hidden_dim=200, alignment_dim=150, maxout_units=50)
    torch.manual_seed(0)
    model = RNNsearch(config, 3000, 3000)
    units = (model.encoder.forward_unit, model.encoder.backward_unit, model.unit)
    for unit in units:  # U_z, U_r, U: orthogonal
        for block in (list(unit.gate_recurrent.weight.detach().double().split(200))
                      + [unit.recurrent.weight.detach().double()]):
            np.testing.assert_allclose((block @ block.T).numpy(), np.eye(200), atol=1e-6)  # fp32 weights
    alignment = torch.cat([model.alignment.query.weight.flatten(), model.alignment.key.weight.flatten()])
    assert alignment.std().item() == pytest.approx(0.001, rel=0.02)
    assert model.alignment.score.weight.abs().max().item() == 0  # v_a
    others = torch.cat([model.encoder.embed.weight[1:].flatten(), model.embed.weight[1:].flatten(),
                        model.unit.input_proj.weight.flatten(), model.context_proj.weight.flatten(),
                        model.init_state.weight.flatten(), model.readout.state.weight.flatten(),
                        model.readout.output.weight.flatten()])
    assert others.std().item() == pytest.approx(0.01, rel=0.02)
    assert abs(others.mean().item()) < 1e-3
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    assert len(biases) == 7 and all(b.abs().max().item() == 0 for b in biases)
    assert model.encoder.embed.weight[PAD_ID].abs().max().item() == 0


def test_paper_preset_shapes():
    config = RNNSEARCH_PRESETS["paper"]
    assert (config.embedding_dim, config.hidden_dim, config.alignment_dim, config.maxout_units,
            config.maxout_pieces) == (620, 1000, 1000, 500, 2)
    assert config.source_shortlist == config.target_shortlist == 30000
    with torch.device("meta"):  # shapes only
        model = RNNsearch(config, 30003, 30003)
    assert tuple(model.encoder.forward_unit.input_proj.weight.shape) == (3000, 620)
    assert tuple(model.unit.gate_recurrent.weight.shape) == (2000, 1000)
    assert tuple(model.context_proj.weight.shape) == (3000, 2000)  # C c_i, c_i of 2n
    assert tuple(model.alignment.key.weight.shape) == (1000, 2000)  # U_a
    assert tuple(model.readout.state.weight.shape) == (1000, 1000)  # 500 maxout units of 2 pieces
    assert tuple(model.readout.output.weight.shape) == (30002, 500)  # W_o: words, <unk>, </s>


def test_configs_record_their_architecture():
    from phrase_scorer.config import TRANSFORMER_PRESETS

    for config in (PRESETS["tiny"], RNNSEARCH_PRESETS["tiny"], TRANSFORMER_PRESETS["tiny"]):
        data = json.loads(json.dumps(config.to_dict()))
        assert data["arch"] == config.arch and model_config_from_dict(data) == config
        assert isinstance(build_model(config, 30, 30), ARCHITECTURES[config.arch])
    old = {k: v for k, v in PRESETS["tiny"].to_dict().items() if k != "arch"}  # config.json before "arch"
    assert model_config_from_dict(old) == PRESETS["tiny"]
    with pytest.raises(ValueError, match="unknown architecture 'conformer'"):
        model_config_from_dict({**old, "arch": "conformer"})
    with pytest.raises(ValueError, match="unknown model settings: alignment_dim"):
        model_config_from_dict({**old, "alignment_dim": 3})
    with pytest.raises(ValueError, match="not 'rnnsearch'"):
        ModelConfig(arch="rnnsearch")


@pytest.mark.parametrize("arch", ["rnnsearch", "encdec"])
def test_model_directory_builds_the_recorded_architecture(tmp_path, arch):
    model = random_model(arch, dtype=torch.float32)
    directory = ModelDirectory(tmp_path)
    directory.write_config({"preset": "custom", "model": model.config.to_dict()})
    Vocabulary([f"s{i}" for i in range(SOURCE_VOCAB_SIZE - 3)]).save(tmp_path / SOURCE_VOCAB)
    Vocabulary([f"t{i}" for i in range(TARGET_VOCAB_SIZE - 3)]).save(tmp_path / TARGET_VOCAB)
    directory.save_weights(model.state_dict(), BEST_WEIGHTS)
    loaded = load_model(tmp_path)
    assert type(loaded.model) is type(model) and loaded.config == model.config
    sources, targets = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    np.testing.assert_array_equal(forward_log_probs(loaded.model, sources, targets),
                                  forward_log_probs(model, sources, targets))


def test_encdec_names_the_encoder_decoder():
    assert ARCHITECTURES["encdec"] is RNNEncoderDecoder


def test_docs_tables_follow_the_code():
    """docs/rnnsearch.md's parameter counts are tools/model_sizes.py's, its presets config.py's."""
    spec = importlib.util.spec_from_file_location("model_sizes", ROOT / "tools" / "model_sizes.py")
    model_sizes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_sizes)
    doc = (ROOT / "docs" / "rnnsearch.md").read_text(encoding="utf-8")
    assert f"{model_sizes.BEGIN}\n{model_sizes.sizes_table()}{model_sizes.END}" in doc
    for name, c in RNNSEARCH_PRESETS.items():
        assert c.source_shortlist == c.target_shortlist
        row = (f"| {name} | {c.embedding_dim} | {c.hidden_dim} | {c.alignment_dim} | {c.maxout_units} | "
               f"{c.source_shortlist:,} |")
        assert row in doc


def test_training_doc_lists_each_architectures_presets():
    """docs/training.md's --arch table names every architecture with exactly its presets."""
    from phrase_scorer.config import ARCH_PRESETS, DEFAULT_PRESET

    doc = (ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    for arch, presets in ARCH_PRESETS.items():
        (row,) = [line for line in doc.splitlines() if line.startswith(f"| `{arch}` |")]
        listed = row.split(" | ")[1]
        assert set(re.findall(r"`(\w+)`", listed)) == set(presets)
        assert f"`{DEFAULT_PRESET}` (default)" in listed


def test_the_word_terms_table_follows_the_weights():
    """Without autograd a step reads W E y (+ b) and V_o E y from a table of the vocabulary: it is
    made again when a weight changes (a training step, a load), so scores never use stale terms."""
    torch.manual_seed(0)
    model = RNNsearch(RNNsearchConfig(embedding_dim=8, hidden_dim=6, alignment_dim=5, maxout_units=4), 12, 11).eval()
    src, src_len = torch.tensor([[3, 4, 5]]), torch.tensor([3])
    tgt, tgt_len = torch.tensor([[2, 7, 9]]), torch.tensor([3])

    def scored_without_autograd():
        with torch.no_grad():
            return model(src, src_len, tgt, tgt_len)

    first = scored_without_autograd()
    assert torch.allclose(first, model(src, src_len, tgt, tgt_len).detach(), atol=1e-6)
    with torch.no_grad():
        model.embed.weight[7] += 1.0  # as an optimiser step would
    changed = scored_without_autograd()
    assert not torch.allclose(changed, first)
    assert torch.allclose(changed, model(src, src_len, tgt, tgt_len).detach(), atol=1e-6)
