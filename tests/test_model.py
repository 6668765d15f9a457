"""The network against the equations of appendix A, written out step by step."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from phrase_scorer.config import PRESETS, ModelConfig
from phrase_scorer.models.encdec import RNNEncoderDecoder, forward_flops
from phrase_scorer.scoring.batch_scorer import pad
from phrase_scorer.vocab import EOS_ID, PAD_ID

SMALL = ModelConfig(embedding_dim=5, hidden_dim=7, maxout_units=4, output_rank=3, source_shortlist=20,
                    target_shortlist=20)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def appendix_log_prob(model: RNNEncoderDecoder, source, target) -> float:
    """log p(y|x) from appendix A, one unit type at a time, with numpy and explicit loops.

    Every matrix is taken from the model by its role; PyTorch stacks the gates as (r, z, n).
    """
    P = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    H = model.config.hidden_dim

    def gates(matrix):
        return matrix[:H], matrix[H : 2 * H], matrix[2 * H :]

    # --- encoder (A.1) ---
    e_x = P["encoder.embed.weight"]
    W_r, W_z, W = gates(P["encoder.gru.weight_ih_l0"])
    U_r, U_z, U = gates(P["encoder.gru.weight_hh_l0"])
    bW_r, bW_z, bW = gates(P["encoder.gru.bias_ih_l0"])
    bU_r, bU_z, bU = gates(P["encoder.gru.bias_hh_l0"])
    h = np.zeros(H)  # h^(0) = 0
    for x in source:
        e = e_x[x]
        z = np.array([sigmoid(W_z[j] @ e + bW_z[j] + U_z[j] @ h + bU_z[j]) for j in range(H)])
        r = np.array([sigmoid(W_r[j] @ e + bW_r[j] + U_r[j] @ h + bU_r[j]) for j in range(H)])
        h_tilde = np.array([math.tanh(W[j] @ e + bW[j] + r[j] * (U[j] @ h + bU[j])) for j in range(H)])
        h = np.array([z[j] * h[j] + (1 - z[j]) * h_tilde[j] for j in range(H)])
    c = np.tanh(P["encoder.to_context.weight"] @ h + P["encoder.to_context.bias"])
    m_x = np.mean([e_x[x] for x in source], axis=0)

    # --- decoder (A.1.1) ---
    e_y = P["decoder.embed.weight"]
    Wd_r, Wd_z, Wd = gates(P["decoder.input_proj.weight"])
    bd_r, bd_z, bd = gates(P["decoder.input_proj.bias"])
    Ud_r, Ud_z, Ud = gates(P["decoder.recurrent.weight"])
    C_r, C_z, C = gates(P["decoder.context_proj.weight"])
    O_h, b_O = P["readout.hidden.weight"], P["readout.hidden.bias"]
    O_y, O_c, O_w = P["readout.prev_word.weight"], P["readout.context.weight"], P["readout.mean_source.weight"]
    G_r, G_l, b_G = P["readout.rank.weight"], P["readout.output.weight"], P["readout.output.bias"]

    h = np.tanh(P["decoder.init_state.weight"] @ c + P["decoder.init_state.bias"])  # h'^(0) = tanh(V' c)
    prev = np.zeros(model.config.embedding_dim)  # e(y_0) = 0
    total = 0.0
    for word in list(target) + [EOS_ID]:
        z = sigmoid(Wd_z @ prev + bd_z + Ud_z @ h + C_z @ c)
        r = sigmoid(Wd_r @ prev + bd_r + Ud_r @ h + C_r @ c)
        h_tilde = np.tanh(Wd @ prev + bd + r * (Ud @ h + C @ c))
        h = z * h + (1 - z) * h_tilde
        s_wide = O_h @ h + b_O + O_y @ prev + O_c @ c + O_w @ m_x
        s = np.array([max(s_wide[2 * i], s_wide[2 * i + 1]) for i in range(model.config.maxout_units)])
        logits = G_l @ (G_r @ s) + b_G  # over ids 1.. (</s>, <unk>, words)
        log_norm = np.log(np.sum(np.exp(logits - logits.max()))) + logits.max()
        total += logits[word - 1] - log_norm
        prev = e_y[word]
    return total


def random_model(config=SMALL, seed=0, scale=0.5, dtype=torch.float64) -> RNNEncoderDecoder:
    torch.manual_seed(seed)
    model = RNNEncoderDecoder(config, 23, 19).to(dtype)
    with torch.no_grad():  # larger weights than the paper's init, so that every term matters
        for name, p in model.named_parameters():
            p.normal_(0.0, scale)
    return model


PAIRS = [([5], [7]), ([3, 4, 5], [6, 7]), ([9, 2, 9, 10], [3, 3, 2, 8, 18]), ([22], [2]), ([4, 4], [5, 6, 7, 8, 9, 10])]


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-9), (torch.float32, 1e-5)])
def test_forward_matches_the_appendix_equations(dtype, tolerance):
    model = random_model(dtype=dtype)
    sources, targets = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    src, src_len = pad(sources, "cpu")
    tgt, tgt_len = pad(targets, "cpu")
    with torch.no_grad():
        got = model(src, src_len, tgt, tgt_len).double().numpy()
    want = np.array([appendix_log_prob(model, s, t) for s, t in PAIRS])
    assert np.all(want < 0)
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_padding_embedding_is_not_used_as_the_first_input():
    """e(y_0) = 0 and padded source positions do not count, even if the <pad> rows are not zero."""
    model = random_model()
    sources, targets = [[3, 4]], [[5]]
    src, src_len = pad(sources, "cpu")
    tgt, tgt_len = pad(targets, "cpu")
    with torch.no_grad():
        model.encoder.embed.weight[PAD_ID].fill_(3.0)
        model.decoder.embed.weight[PAD_ID].fill_(3.0)
        got = float(model(src, src_len, tgt, tgt_len))
    assert got == pytest.approx(appendix_log_prob(model, [3, 4], [5]), abs=1e-9)


def test_probabilities_of_all_targets_up_to_a_length_sum_to_one():
    """p(y|x) is a distribution over every target, </s> included: with 4 output words (<unk> and 3
    others) the 5,461 targets of 0 to 6 words carry all the mass but what continues past 6 words.
    The </s> bias is raised so that this tail is below 2e-4 (each step stops with p >= 0.6 or so);
    a softmax normalised over the wrong classes, or not at all, misses by far more. The batched
    scorer, with its own chunked softmax, must give the same mass."""
    import itertools

    from phrase_scorer.scoring.batch_scorer import BatchScorer

    torch.manual_seed(0)
    model = RNNEncoderDecoder(SMALL, 23, 6).to(torch.float64)  # classes: </s>, <unk>, 3 words
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
        model.readout.output.bias[EOS_ID - 1] += 3.0
    words = [2, 3, 4, 5]
    targets = [list(t) for n in range(7) for t in itertools.product(words, repeat=n)]
    src, src_len = pad([[4, 5]] * len(targets), "cpu")
    tgt, tgt_len = pad(targets, "cpu")
    with torch.no_grad():
        log_p = model(src, src_len, tgt, tgt_len)
    by_length = [log_p[[len(t) == n for t in targets]].exp().sum().item() for n in range(7)]
    assert all(a > b for a, b in zip(by_length, by_length[1:]))  # every longer length has less mass
    total = sum(by_length)
    assert 1 - 2e-4 < total <= 1 + 1e-12
    scored = BatchScorer(model.float()).score([[4, 5]] * len(targets), targets)
    assert float(np.exp(np.asarray(scored, np.float64)).sum()) == pytest.approx(total, abs=1e-5)


def test_initialisation_follows_section_4_1_1():
    config = ModelConfig(embedding_dim=100, hidden_dim=200, maxout_units=50, output_rank=20)
    torch.manual_seed(0)
    model = RNNEncoderDecoder(config, 3000, 3000)
    for matrix in (model.encoder.gru.weight_hh_l0, model.decoder.recurrent.weight):
        for block in matrix.detach().double().chunk(3):
            # scaled orthogonal: U U^T = 0.01^2 I
            np.testing.assert_allclose((block @ block.T).numpy(), 1e-4 * np.eye(200), atol=1e-10)
    weights = torch.cat([model.decoder.input_proj.weight.flatten(), model.readout.output.weight.flatten()])
    assert weights.std().item() == pytest.approx(0.01, rel=0.02)
    assert abs(weights.mean().item()) < 1e-3
    assert model.readout.output.bias.abs().max().item() == 0
    assert model.encoder.embed.weight[PAD_ID].abs().max().item() == 0


def test_paper_preset_shapes():
    config = PRESETS["paper"]
    assert (config.embedding_dim, config.hidden_dim, config.maxout_units, config.maxout_pieces,
            config.output_rank) == (100, 1000, 500, 2, 100)
    assert config.source_shortlist == config.target_shortlist == 15000
    model = RNNEncoderDecoder(config, 15003, 15003)
    assert model.encoder.gru.hidden_size == 1000
    assert tuple(model.decoder.recurrent.weight.shape) == (3000, 1000)
    assert tuple(model.readout.hidden.weight.shape) == (1000, 1000)  # 500 maxout units of 2 pieces
    assert tuple(model.readout.rank.weight.shape) == (100, 500)  # G_r
    assert tuple(model.readout.output.weight.shape) == (15002, 100)  # G_l: words, <unk>, </s>


def test_analytic_flops_match_counted_flops():
    """forward_flops counts the same matrix products that torch's flop counter sees."""
    from torch.utils.flop_counter import FlopCounterMode

    from phrase_scorer.scoring.batch_scorer import BatchScorer, ScoringOptions

    model = random_model(dtype=torch.float32)
    source, target = [3, 4, 5], [6, 7, 8, 9]
    scorer = BatchScorer(model, ScoringOptions(chunk_rows=10**6))
    with FlopCounterMode(display=False) as counter:
        scorer.score([source], [target])
    counted = counter.get_total_flops()
    analytic = forward_flops(model.config, model.target_vocab_size, len(source), len(target))
    # The scorer embeds words by lookup (not counted) and runs the same products, except that its
    # output product carries two extra columns (bias and shift) per row, 2 * 2 * V per step, and
    # the shift comes from a product with the first K output rows, 2 * (R + 1) * K per step.
    from phrase_scorer.scoring.batch_scorer import OutputSoftmax

    outputs = model.target_vocab_size - 1
    probe = min(OutputSoftmax.PROBE_COLUMNS, outputs) * 2 * (model.config.output_rank + 1)
    extra = (len(target) + 1) * (2 * 2 * outputs + probe)
    assert counted == analytic["total"] + extra


@pytest.mark.parametrize("arch", ["encdec", "rnnsearch"])
def test_forward_flops_of_each_architecture_match_its_training_forward(arch):
    """The FLOPs that training speed is measured against (architectures.FORWARD_FLOPS) are the
    matrix products torch's flop counter sees in the teacher-forced forward pass."""
    from torch.utils.flop_counter import FlopCounterMode

    from phrase_scorer.config import ARCH_PRESETS
    from phrase_scorer.models.architectures import FORWARD_FLOPS, build_model, training_flops_per_pair

    config = ARCH_PRESETS[arch]["tiny"]
    model = build_model(config, 50, 60).eval()
    for source, target in (([3, 4, 5], [6, 7, 8, 9]), ([3] * 7, [6, 7])):
        with FlopCounterMode(display=False) as counter:
            model(torch.tensor([source]), torch.tensor([len(source)]), torch.tensor([target]),
                  torch.tensor([len(target)]))
        analytic = FORWARD_FLOPS[arch](config, 60, len(source), len(target))["total"]
        assert counter.get_total_flops() == analytic
        assert training_flops_per_pair(config, 60, len(source), len(target)) == 3 * analytic
