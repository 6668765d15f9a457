"""The encoder-decoder Transformer of Vaswani et al. (2017), in its pre-norm form.

Notation: d = model width, f = feed-forward width, h = heads (each d/h wide), L_e / L_d the
encoder's and decoder's layers. Tensors are batch-first; B = sources, S = source positions,
N = decoder rows, T = target steps (the words, then ``</s>``), V = target vocabulary.

    input      x_j = sqrt(d) E x_j + P_j       (P: sinusoids, or a learned table; E y_0 = 0)
    encoder    a = x + SelfAttention(LN(x))              each of L_e layers, over the real words only
               x = a + FF(LN(a)),  FF(u) = W_2 relu(W_1 u + b_1) + b_2
               H = LN(x)                                  (B, S, d)
    decoder    a = y + SelfAttention(LN(y))              each of L_d layers; position i sees 0..i
               c = a + Attention(LN(a), H)               the source's real words only
               y = c + FF(LN(c))
               t_i = LN(y_i)                              readout features (d)
               p(y_i | y_<i, x) = softmax(W_o t_i + b_o)  over </s>, <unk> and the words

With ``tie_target_embeddings`` the target embedding of id k (k >= 1) is row k - 1 of W_o, the
output layer's matrix (ids start at ``</s>``; <pad>, the "no previous word" of the first step,
embeds as 0). Dropout (training only) falls on the embeddings, the attention weights, the
feed-forward layer's hidden units and every sublayer's output before it is added.

Decoding one word at a time keeps, per decoder row, the keys and values of every position it
has read (a key/value cache) as its state: (N, L_d, 2, h, t, d/h) after t words, reordered by
``state[index]`` like any state, so beam search, sampling and the scorer's trie run unchanged.
Each source's cross-attention keys and values are computed once by ``encode``, for every decoder
layer. Teacher-forced, the whole target runs in one pass per layer (``scores_in_one_pass``),
which the scorer uses for a batch of hypotheses instead of its trie's depth-by-depth steps; the
two paths agree up to the order of floating-point additions (docs/precision.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, cast

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from phrase_scorer.config import TransformerConfig
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.models.base import FIRST_OUTPUT_ID, Memory, TranslationModel, previous_words
from phrase_scorer.vocab import PAD_ID


def sinusoids(length: int, dim: int, offset: int = 0, device=None, dtype=torch.float32) -> Tensor:
    """P_j for j = offset .. offset + length - 1: (length, dim), sin and cos of j / 10000^(2i/d)
    interleaved (P_j,2i = sin, P_j,2i+1 = cos)."""
    positions = torch.arange(offset, offset + length, device=device, dtype=torch.float64).unsqueeze(1)  # (L, 1)
    rates = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float64) * (-math.log(10000.0) / dim))
    angles = positions * rates  # (L, d/2)
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(1).to(dtype)  # (L, d)


class Positions(nn.Module):
    """What a position adds to an embedding: sinusoids, or rows of a learned table."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.dim, self.limit = config.model_dim, config.max_positions
        self.table = nn.Embedding(config.max_positions, config.model_dim) if config.positions == "learned" else None

    def forward(self, length: int, offset: int, like: Tensor) -> Tensor:
        """Positions offset .. offset + length - 1: (length, d), in ``like``'s dtype and device."""
        if self.table is None:
            return sinusoids(length, self.dim, offset, like.device, like.dtype)
        if offset + length > self.limit:
            raise PhraseScorerError(f"a sequence of {offset + length} words is longer than the model's "
                                    f"{self.limit} learned positions", hint="score shorter sentences, or train with "
                                    "model positions 'sinusoidal', which take any length")
        return self.table.weight[offset : offset + length].to(like.dtype)


class Attention(nn.Module):
    """Multi-head scaled dot-product attention: queries from one sequence, keys and values from
    itself or another. ``key_value`` holds the key and value maps stacked, (2d, d)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.model_dim
        self.heads = config.heads
        self.query = nn.Linear(d, d)
        self.key_value = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def keys_values(self, x: Tensor) -> Tensor:
        """(N, L, d) -> the keys and values by head, (N, 2, h, L, d/h)."""
        N, L, _ = x.shape
        return self.key_value(x).view(N, L, 2, self.heads, -1).permute(0, 2, 3, 1, 4)

    def attend(self, x: Tensor, keys: Tensor, values: Tensor, mask: Optional[Tensor] = None, causal: bool = False,
               dropout: float = 0.0) -> Tensor:
        """x (N, L, d) queries; keys, values (N, h, K, d/h); mask (N, 1, 1, K) True where a key
        may be read, or ``causal`` (K = L: position i reads 0..i) -> (N, L, d)."""
        N, L, d = x.shape
        q = self.query(x).view(N, L, self.heads, -1).transpose(1, 2)  # (N, h, L, d/h)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        return self.out(out.transpose(1, 2).reshape(N, L, d))


class FeedForward(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.inner = nn.Linear(config.model_dim, config.ff_dim)  # W_1, b_1
        self.outer = nn.Linear(config.ff_dim, config.model_dim)  # W_2, b_2

    def forward(self, x: Tensor, drop) -> Tensor:
        return self.outer(drop(torch.relu(self.inner(x))))


class EncoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.model_dim)
        self.attention = Attention(config)
        self.ff_norm = nn.LayerNorm(config.model_dim)
        self.ff = FeedForward(config)

    def forward(self, x: Tensor, mask: Tensor, drop, attention_dropout: float) -> Tensor:
        h = self.attention_norm(x)
        kv = self.attention.keys_values(h)  # (B, 2, h, S, d/h)
        x = x + drop(self.attention.attend(h, kv[:, 0], kv[:, 1], mask, dropout=attention_dropout))
        return x + drop(self.ff(self.ff_norm(x), drop))


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        d = config.model_dim
        self.self_norm, self.self_attention = nn.LayerNorm(d), Attention(config)
        self.cross_norm, self.cross_attention = nn.LayerNorm(d), Attention(config)
        self.ff_norm, self.ff = nn.LayerNorm(d), FeedForward(config)


@dataclass
class TransformerMemory(Memory):
    """An encoded batch of sources: every decoder layer's cross-attention keys and values, and
    which positions hold words."""

    cross: Tensor  # (B, L_d, 2, h, S, d/h)
    mask: Tensor  # (B, 1, 1, S) True at a real word


class Transformer(TranslationModel[TransformerMemory]):
    """p(target | source) by the encoder-decoder Transformer; see the module docstring."""

    scores_in_one_pass = True

    def __init__(self, config: TransformerConfig, source_vocab_size: int, target_vocab_size: int,
                 initialise: bool = True) -> None:
        super().__init__()
        self.config = config
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        d = config.model_dim
        self.scale = math.sqrt(d)
        self.source_embed = nn.Embedding(source_vocab_size, d, padding_idx=PAD_ID)
        self.target_embed = None if config.tie_target_embeddings else \
            nn.Embedding(target_vocab_size, d, padding_idx=PAD_ID)
        self.positions = Positions(config)
        self.encoder_layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.encoder_norm = nn.LayerNorm(d)
        self.decoder_layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        self.decoder_norm = nn.LayerNorm(d)
        self.output = nn.Linear(d, target_vocab_size - FIRST_OUTPUT_ID)  # W_o, b_o
        if initialise:
            self.reset_parameters()

    def reset_parameters(self, init: str = "paper") -> None:
        """Glorot-uniform matrices, zero biases, layer norms at (1, 0), embeddings (and a tied
        output matrix) from N(0, 1/d) so that sqrt(d) E x starts at unit variance; ``paper`` and
        ``glorot`` alike (the paper's initialisation is Glorot's)."""
        d = self.config.model_dim
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    module.reset_parameters()
                elif isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    nn.init.zeros_(module.bias)
                elif isinstance(module, nn.Embedding):
                    module.weight.normal_(0.0, d ** -0.5)
            if self.config.tie_target_embeddings:
                self.output.weight.normal_(0.0, d ** -0.5)
            self.source_embed.weight[PAD_ID].zero_()
            if self.target_embed is not None:
                self.target_embed.weight[PAD_ID].zero_()

    @property
    def output_layer(self) -> nn.Linear:
        return self.output

    @property
    def source_embedding(self) -> nn.Embedding:
        return self.source_embed

    def decoders(self) -> List[DecoderLayer]:
        return cast(List[DecoderLayer], list(self.decoder_layers))

    def attention_dropout(self) -> float:
        return self.dropout_p if self.training else 0.0

    def embed_targets(self, ids: Tensor, offset: int) -> Tensor:
        """sqrt(d) E y + P for ids (N, L) at positions offset.. (PAD_ID: no word, E = 0) -> (N, L, d)."""
        if self.target_embed is None:  # row k - 1 of the output matrix
            emb = F.embedding((ids - FIRST_OUTPUT_ID).clamp(min=0), self.output.weight)
        else:
            emb = self.target_embed(ids)
        emb = emb * (ids != PAD_ID).unsqueeze(-1).to(emb.dtype)
        return self.drop(emb * self.scale + self.positions(ids.size(1), offset, emb))

    # --- the interface of phrase_scorer.models.base ---------------------------------------------

    def encode(self, src: Tensor, src_len: Tensor) -> TransformerMemory:
        """src (B, S), src_len (B,) -> the cross-attention keys and values of every decoder layer."""
        B, S = src.shape
        mask = (torch.arange(S, device=src.device) < src_len.unsqueeze(1)).view(B, 1, 1, S)  # (B, 1, 1, S)
        emb = self.source_embed(src)
        x = self.drop(emb * self.scale + self.positions(S, 0, emb))  # (B, S, d)
        for layer in self.encoder_layers:
            x = layer(x, mask, self.drop, self.attention_dropout())
        annotations = self.encoder_norm(x)  # (B, S, d)
        cross = torch.stack([layer.cross_attention.keys_values(annotations) for layer in self.decoders()], 1)
        return TransformerMemory(cross=cross, mask=mask)  # (B, L_d, 2, h, S, d/h)

    def start(self, memory: TransformerMemory) -> Tensor:
        """No position read yet: an empty cache (N, L_d, 2, h, 0, d/h)."""
        N, L, _, h, _, width = memory.cross.shape
        return memory.cross.new_zeros((N, L, 2, h, 0, width))

    def step(self, memory: TransformerMemory, state: Tensor, prev: Tensor) -> Tuple[Tensor, Tensor]:
        """The decoder at the next position: state (N, L_d, 2, h, t, d/h) the cache of the t
        positions read, prev (N,) -> (the cache with this one, (N, L_d, 2, h, t + 1, d/h); features (N, d))."""
        y = self.embed_targets(prev.unsqueeze(1), state.size(4))  # (N, 1, d)
        y, cache = self.decode(memory, y, state)
        return cache, y[:, 0]

    def teacher_forced_features(self, memory: TransformerMemory, tgt: Tensor) -> Tensor:
        """Every position of every target in one pass per layer: (B, T) -> (B, T + 1, d). Padding
        follows the words, and a position reads only those before it, so it changes nothing."""
        return self.decode(memory, self.embed_targets(previous_words(tgt), 0))[0]

    def decode(self, memory: TransformerMemory, y: Tensor, past: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        """The decoder layers over inputs y (N, L, d): with ``past`` (N, L_d, 2, h, t, d/h), the
        keys and values of the t positions before them (L = 1), else from the first position,
        causally. -> (features (N, L, d), the keys and values of all positions (N, L_d, 2, h, t + L, d/h))."""
        dropout = self.attention_dropout()
        caches: List[Tensor] = []
        for k, layer in enumerate(self.decoders()):
            h = layer.self_norm(y)
            kv = layer.self_attention.keys_values(h)  # (N, 2, h, L, d/h)
            if past is not None:
                kv = torch.cat([past[:, k], kv], 3)  # (N, 2, h, t + 1, d/h)
            caches.append(kv)
            y = y + self.drop(layer.self_attention.attend(h, kv[:, 0], kv[:, 1], causal=past is None,
                                                          dropout=dropout))
            cross = memory.cross[:, k]  # (N, 2, h, S, d/h)
            y = y + self.drop(layer.cross_attention.attend(layer.cross_norm(y), cross[:, 0], cross[:, 1], memory.mask,
                                                           dropout=dropout))
            y = y + self.drop(layer.ff(layer.ff_norm(y), self.drop))
        return self.decoder_norm(y), torch.stack(caches, 1)


def forward_flops(config: TransformerConfig, target_vocab_size: int, source_length: float,
                  target_length: float) -> Dict[str, float]:
    """Analytic multiply-add FLOPs (2 per MAC) of the teacher-forced forward pass of one pair.

    ``target_length`` counts words; the decoder reads one more position (y_0) and predicts
    ``</s>`` there. Parts: ``encoder`` (per source word: the self-attention's maps and its scores
    and weighted sums over the source, the feed-forward layer; then every decoder layer's cross
    keys and values), ``decoder`` (per target position: its self-attention over the positions
    up to it, on average (T + 2) / 2, its cross-attention over the source, the feed-forward
    layer, the output layer). Elementwise work is left out.
    """
    d, f, V = config.model_dim, config.ff_dim, target_vocab_size - FIRST_OUTPUT_ID
    S, T = source_length, target_length + 1
    seen = (T + 1) / 2  # the mean number of positions a causal position reads
    encoder_attention = S * config.encoder_layers * 2 * 2 * S * d  # scores and weighted sums
    decoder_attention = T * config.decoder_layers * 2 * 2 * (seen + S) * d
    encoder_step = config.encoder_layers * (2 * 4 * d * d + 2 * 2 * S * d + 2 * 2 * d * f)
    encoder = S * encoder_step + S * config.decoder_layers * 2 * 2 * d * d
    decoder_step = config.decoder_layers * (2 * 4 * d * d + 2 * 2 * seen * d + 2 * 2 * d * d + 2 * 2 * S * d
                                            + 2 * 2 * d * f) + 2 * d * V
    decoder = T * decoder_step
    return {"encoder": encoder, "encoder_step": encoder_step, "decoder": decoder, "decoder_step": decoder_step,
            "attention": encoder_attention + decoder_attention, "total": encoder + decoder}
