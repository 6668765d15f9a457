"""The RNN Encoder-Decoder of Cho et al. (2014), appendix A.

Notation follows the appendix: a source phrase x_1..x_N, a target phrase y_1..y_M, embeddings
e(.), encoder state h, decoder state h'. Tensors are batch-first; B = batch, S = source length,
T = target steps (M + 1: the words, then ``</s>``), E = embedding size, H = hidden units,
M = maxout units, P = maxout pieces, R = output rank, V = target vocabulary.

    encoder   h_t  = GRU(h_{t-1}, e(x_t)),  h_0 = 0          (reset gate on U h, eq. A.1)
              c    = tanh(V h_N),  m_x = mean_t e(x_t)
    decoder   h'_0 = tanh(V' c)
              h'_t = z' * h'_{t-1} + (1 - z') * tanh(W' e(y_{t-1}) + r' * (U' h'_{t-1} + C c))
              z', r' = sigmoid(W'_{z,r} e(y_{t-1}) + U'_{z,r} h'_{t-1} + C_{z,r} c),  e(y_0) = 0
    readout   s_t  = O_h h'_t + O_y e(y_{t-1}) + O_c c + O_w m_x,  maxout over pairs -> M units
              p(y_t | y_<t, x) = softmax(G_l G_r s_t)           (G_l: V x R, G_r: R x M)

log p(y|x) sums log p(y_t | ...) over the M words and the final ``</s>``.

:class:`RNNEncoderDecoder` offers the interface of :mod:`phrase_scorer.models.base`; its encoder
reads left to right, so it also shares source prefixes (``shares_source_prefixes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple, cast

import torch
from torch import Tensor, nn

from phrase_scorer.config import ModelConfig
from phrase_scorer.models.base import (
    FIRST_OUTPUT_ID,
    Memory,
    TranslationModel,
    embed_previous,
    glorot_initialise,
    orthogonal_like,
    previous_words,
)
from phrase_scorer.vocab import PAD_ID


class Encoder(nn.Module):
    """Reads the source phrase; returns its summary c and the mean source embedding m_x.

    PyTorch's GRU applies the reset gate to (U h + b) after the product, which is exactly the
    encoder unit of appendix A.1, so the encoder is a plain ``nn.GRU``.
    """

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, config.embedding_dim, padding_idx=PAD_ID)
        self.gru = nn.GRU(config.embedding_dim, config.hidden_dim, batch_first=True)
        self.to_context = nn.Linear(config.hidden_dim, config.hidden_dim)  # V

    def forward(self, src: Tensor, src_len: Tensor, drop=lambda x: x) -> Tuple[Tensor, Tensor]:
        """src: (B, S) ids padded with <pad>; src_len: (B,). Returns c (B, H), m_x (B, E).
        ``drop`` is the model's training dropout, applied to the embeddings."""
        emb = drop(self.embed(src))  # (B, S, E)
        states, _ = self.gru(emb)  # (B, S, H); state t depends on x_1..x_t only
        last = (src_len - 1).clamp(min=0)
        h_last = states[torch.arange(src.size(0), device=src.device), last]  # (B, H)
        return self.summarize(h_last), mean_embedding(emb, src_len)

    def summarize(self, h_last: Tensor) -> Tensor:
        """c = tanh(V h_N)."""
        return torch.tanh(self.to_context(h_last))

    def step(self, emb: Tensor, h: Tensor) -> Tensor:
        """One GRU step for a batch of prefixes: emb (N, E), h (N, H) -> (N, H)."""
        gru = self.gru  # its parameters, Module attributes typed Tensor | Module, are Tensors
        return torch.gru_cell(emb, h, cast(Tensor, gru.weight_ih_l0), cast(Tensor, gru.weight_hh_l0),
                              cast(Tensor, gru.bias_ih_l0), cast(Tensor, gru.bias_hh_l0))


class Decoder(nn.Module):
    """The decoder GRU of appendix A.1.1, with c fed to the update gate, reset gate and candidate.

    The three gates are stacked in the order (r, z, n) in every 3H-wide matrix, as in PyTorch.
    """

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        E, H = config.embedding_dim, config.hidden_dim
        self.hidden_dim = H
        self.embed = nn.Embedding(vocab_size, E, padding_idx=PAD_ID)
        self.init_state = nn.Linear(H, H)  # V'
        self.input_proj = nn.Linear(E, 3 * H)  # W'_r, W'_z, W'
        self.recurrent = nn.Linear(H, 3 * H, bias=False)  # U'_r, U'_z, U'
        self.context_proj = nn.Linear(H, 3 * H, bias=False)  # C_r, C_z, C

    def start(self, c: Tensor) -> Tuple[Tensor, Tensor]:
        """Per-source terms: h'_0 = tanh(V' c) (B, H) and the context gate inputs C c (B, 3H)."""
        return torch.tanh(self.init_state(c)), self.context_proj(c)

    def step(self, x_proj: Tensor, h: Tensor, ctx: Tensor) -> Tensor:
        """x_proj = W' e(y_{t-1}) (N, 3H), h = h'_{t-1} (N, H), ctx = C c (N, 3H) -> h'_t (N, H)."""
        H = self.hidden_dim
        rec = self.recurrent(h)  # (N, 3H)
        gates = torch.sigmoid(x_proj[:, : 2 * H] + rec[:, : 2 * H] + ctx[:, : 2 * H])  # (N, 2H)
        r, z = gates[:, :H], gates[:, H:]
        candidate = torch.tanh(x_proj[:, 2 * H :] + r * (rec[:, 2 * H :] + ctx[:, 2 * H :]))  # (N, H)
        return candidate + z * (h - candidate)  # z h + (1 - z) candidate


class Readout(nn.Module):
    """The deep output of appendix A: maxout layer, then a rank-R factored softmax."""

    def __init__(self, config: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        E, H, R = config.embedding_dim, config.hidden_dim, config.output_rank
        self.units, self.pieces = config.maxout_units, config.maxout_pieces
        width = self.units * self.pieces
        self.hidden = nn.Linear(H, width)  # O_h
        self.prev_word = nn.Linear(E, width, bias=False)  # O_y
        self.context = nn.Linear(H, width, bias=False)  # O_c
        self.mean_source = nn.Linear(E, width, bias=False)  # O_w
        self.rank = nn.Linear(self.units, R, bias=False)  # G_r
        self.output = nn.Linear(R, vocab_size - FIRST_OUTPUT_ID)  # G_l (+ bias)

    def source_term(self, c: Tensor, mean_emb: Tensor) -> Tensor:
        """O_c c + O_w m_x, constant over the target: (B, H), (B, E) -> (B, P*M)."""
        return self.context(c) + self.mean_source(mean_emb)

    def features(self, h: Tensor, prev_emb: Tensor, source_term: Tensor) -> Tensor:
        """G_r maxout(s_t): h (..., H), prev_emb (..., E), source_term (..., P*M) -> (..., R)."""
        s = self.hidden(h) + self.prev_word(prev_emb) + source_term  # (..., P*M)
        s = s.unflatten(-1, (self.units, self.pieces)).amax(-1)  # (..., M): max of s_{2i-1}, s_{2i}
        return self.rank(s)


@dataclass
class EncDecMemory(Memory):
    """An encoded batch of sources: the decoder's per-source terms, all that its steps read of c
    and m_x (so that selecting a decoder row's source copies nothing else)."""

    init_state: Tensor  # (B, H) h'_0 = tanh(V' c)
    context_gates: Tensor  # (B, 3H) C_r c, C_z c, C c
    source_term: Tensor  # (B, P*M) O_c c + O_w m_x


class RNNEncoderDecoder(TranslationModel[EncDecMemory]):
    """p(target phrase | source phrase), appendix A of Cho et al. (2014)."""

    shares_source_prefixes = True

    def __init__(self, config: ModelConfig, source_vocab_size: int, target_vocab_size: int,
                 initialise: bool = True) -> None:
        super().__init__()
        self.config = config
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        self.encoder = Encoder(config, source_vocab_size)
        self.decoder = Decoder(config, target_vocab_size)
        self.readout = Readout(config, target_vocab_size)
        if initialise:  # else the weights are loaded next (model_dir), or the model is a skeleton
            self.reset_parameters()

    def reset_parameters(self, init: str = "paper") -> None:
        """``paper`` (section 4.1.1): N(0, std^2) weights, zero biases; recurrent matrices
        orthogonal * scale. ``glorot``: :func:`~phrase_scorer.models.base.glorot_initialise`."""
        cfg = self.config
        recurrent = {id(self.encoder.gru.weight_hh_l0), id(self.decoder.recurrent.weight)}
        with torch.no_grad():
            if init == "glorot":
                glorot_initialise(self, dict.fromkeys(recurrent, cfg.hidden_dim))
            else:
                for name, param in self.named_parameters():
                    if id(param) in recurrent:
                        for block in param.chunk(3, 0):  # one H x H matrix per gate
                            block.copy_(orthogonal_like(block) * cfg.recurrent_init_scale)
                    elif name.endswith("bias") or "bias_" in name:
                        param.zero_()
                    else:
                        param.normal_(0.0, cfg.init_std)
            self.encoder.embed.weight[PAD_ID].zero_()
            self.decoder.embed.weight[PAD_ID].zero_()

    # --- the interface of phrase_scorer.models.base ---------------------------------------------

    @property
    def output_layer(self) -> nn.Linear:
        return self.readout.output  # G_l (+ bias)

    def encode(self, src: Tensor, src_len: Tensor) -> EncDecMemory:
        """src (B, S), src_len (B,) -> c, m_x and the per-source decoder terms."""
        return self.memory(*self.encoder(src, src_len, self.drop))

    def encode_from_final_states(self, final_states: Tensor, src: Tensor, src_len: Tensor) -> EncDecMemory:
        """The memory from the encoder states after each source's last word (B, H), as
        :meth:`source_prefix_step` leaves them; src (B, S) and src_len (B,) give m_x."""
        mean_emb = mean_embedding(self.encoder.embed(src), src_len)  # (B, E)
        return self.memory(self.encoder.summarize(final_states), mean_emb)

    def source_prefix_step(self, words: Tensor, parent_states: Optional[Tensor]) -> Tensor:
        """The encoder state after x_t (N, H): words x_t (N,), parent_states the states after
        x_1..x_{t-1} (N, H), or None at t = 1 (h_0 = 0)."""
        emb = self.encoder.embed(words)  # (N, E)
        if parent_states is None:
            parent_states = emb.new_zeros((words.size(0), self.config.hidden_dim))
        return self.encoder.step(emb, parent_states)

    def memory(self, c: Tensor, mean_emb: Tensor) -> EncDecMemory:
        """c (B, H), m_x (B, E) -> the memory with h'_0, C c and O_c c + O_w m_x computed once."""
        init_state, context_gates = self.decoder.start(c)  # (B, H), (B, 3H)
        source_term = self.readout.source_term(c, mean_emb)  # (B, P*M)
        return EncDecMemory(init_state, context_gates, source_term)

    def start(self, memory: EncDecMemory) -> Tensor:
        return memory.init_state  # (N, H) h'_0

    def step(self, memory: EncDecMemory, state: Tensor, prev: Tensor) -> Tuple[Tensor, Tensor]:
        """memory (N rows), h'_{t-1} (N, H), y_{t-1} (N,) -> h'_t (N, H), features (N, R)."""
        decoder = self.decoder
        prev_emb = self.drop(embed_previous(decoder.embed, prev))  # (N, E), 0 for y_0
        state = decoder.step(decoder.input_proj(prev_emb), state, memory.context_gates)  # (N, H)
        return state, self.readout.features(state, prev_emb, memory.source_term)  # (N, R)

    def teacher_forced_features(self, memory: EncDecMemory, tgt: Tensor) -> Tensor:
        """The features :meth:`step` gives at each step, for all steps at once: (B, T) -> (B, T+1, R).

        The decoder's input products and the readout do not depend on the state, so they run
        on the whole target in one product each; only the GRU recurrence is stepped.
        """
        decoder = self.decoder
        prev_emb = self.drop(embed_previous(decoder.embed, previous_words(tgt)))  # (B, T+1, E), 0 for y_0
        x_proj = decoder.input_proj(prev_emb)  # (B, T+1, 3H)
        state = self.start(memory)  # (B, H)
        steps = []
        for t in range(x_proj.size(1)):
            state = decoder.step(x_proj[:, t], state, memory.context_gates)  # (B, H)
            steps.append(state)
        states = torch.stack(steps, 1)  # (B, T+1, H)
        return self.readout.features(states, prev_emb, memory.source_term.unsqueeze(1))  # (B, T+1, R)


def mean_embedding(emb: Tensor, lengths: Tensor) -> Tensor:
    """m_x: the mean of the first ``lengths`` rows of each (B, L, E) sequence -> (B, E)."""
    mask = torch.arange(emb.size(1), device=emb.device) < lengths.unsqueeze(1)  # (B, L)
    return (emb * mask.unsqueeze(2).to(emb.dtype)).sum(1) / lengths.unsqueeze(1).to(emb.dtype)


def forward_flops(config: ModelConfig, target_vocab_size: int, source_length: float,
                  target_length: float) -> Dict[str, float]:
    """Analytic multiply-add FLOPs (2 per MAC) of scoring one pair the naive way.

    ``target_length`` counts words; the decoder runs one more step for </s>. Parts:
    ``encoder`` (``encoder_step`` per source word, plus ``context`` for c = tanh(V h)),
    ``per_source`` (V', C, O_c, O_w: once per source), ``decoder`` (``decoder_step`` per target
    step: GRU, readout and softmax). Elementwise work is left out.
    """
    E, H = config.embedding_dim, config.hidden_dim
    W, R, V = config.maxout_units * config.maxout_pieces, config.output_rank, target_vocab_size - FIRST_OUTPUT_ID
    encoder_step = 2 * (E * 3 * H + H * 3 * H)
    context = 2 * H * H  # c = tanh(V h_N)
    encoder = source_length * encoder_step + context
    per_source = 2 * (H * H + H * 3 * H + H * W + E * W)
    decoder_step = 2 * (E * 3 * H + H * 3 * H + H * W + E * W + config.maxout_units * R + R * V)
    decoder = (target_length + 1) * decoder_step
    return {
        "encoder": encoder,
        "per_source": per_source,
        "decoder": decoder,
        "encoder_step": encoder_step,
        "context": context,
        "decoder_step": decoder_step,
        "total": encoder + per_source + decoder,
    }
