"""What every architecture offers the rest of the package: :class:`TranslationModel`.

A model gives p(y|x) for a target phrase or sentence y = y_1..y_M given a source x = x_1..x_N,
one word at a time, ending with ``</s>``. The scorer, sampling, beam search and training talk to
a model only through this interface:

    memory = model.encode(src, src_len)          # once per distinct source: a Memory of B rows
    rows = memory.select(index)                  # (N,) source index of each decoder row
    state = model.start(rows)                    # (N, D) decoder state before the first word
    state, features = model.step(rows, state, prev)   # prev (N,) ids; PAD_ID: no previous word
    logits = model.logits(features)              # (N, V - 1): column k is target id k + 1
    log_p = model(src, src_len, tgt, tgt_len)    # (B,) teacher-forced log p(y|x), </s> included

``step`` takes the decoder state *before* reading ``prev`` and returns the state after it with
the readout features of the distribution of the next word. The first step of a target reads
``prev = PAD_ID``, whose embedding is taken as 0 (e(y_0) = 0), whatever the embedding row holds.
``forward`` runs exactly these steps, teacher-forced, so a score built from start/step/logits
equals the forward pass. The state is one tensor whose first dimension is the row (an
architecture whose state has several parts concatenates them), so a trie or a beam reorders it
with ``state[index]``.

Optional capabilities, each named by a class attribute:

- ``shares_source_prefixes``: the encoder reads the source left to right only, so the state after
  x_1..x_t is shared by every source starting with x_1..x_t. Such a model also offers
  ``source_prefix_step`` and ``encode_from_final_states`` so a trie of sources runs each shared
  prefix once. (A bidirectional encoder cannot offer this.)
- ``shares_source_affixes``: the encoder reads the source in both directions, so the left-to-right
  state at x_j is shared by every source starting with x_1..x_j and the right-to-left one by every
  source ending with x_j..x_S. Such a model offers ``encode_by_affixes``: the memory from a walk of
  the trie of the sources and one of the trie of their reversals (:class:`TrieWalk`), running
  each shared prefix and each shared suffix once (a reverse model's sources are the hypotheses of
  an n-best list, which share most of both).
- ``scores_in_one_pass``: ``teacher_forced_features`` runs every position of a batch of targets
  at once (a Transformer's decoder), so the scorer scores a batch of pairs by one teacher-forced
  pass instead of stepping through the trie of their targets.
- ``has_alignments``: ``alignments(src, src_len, tgt, tgt_len)`` gives the soft alignment weights
  alpha (B, T + 1, S) of the teacher-forced pass, and ``step_with_alignment`` those of one step.

Shapes: B sources, S source positions, N decoder rows, D decoder state size, R readout features,
V target vocabulary (the output layer covers ids 1..V-1: ``</s>``, ``<unk>`` and the words).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Generic, List, Optional, Tuple, TypeVar

import torch
from torch import Tensor, nn

from phrase_scorer.vocab import EOS_ID, FIRST_OUTPUT_ID, PAD_ID


@dataclass
class TrieWalk:
    """A trie of a batch's sources (or of their reversals), depth by depth, and where each source
    position sits in it. ``keys[d]`` (n_d,) are the ids of the nodes at depth d, ``parents[d]``
    (n_d,) their parents' indices among the nodes of depth d - 1 (unused at depth 0), and
    ``positions`` (B, S) the node of each source position among all nodes numbered depth by
    depth; padding points past the last node (at a zero state)."""

    keys: List[Tensor]
    parents: List[Tensor]
    positions: Tensor


@dataclass
class Memory:
    """What the decoder needs of a batch of encoded sources: tensors whose first dimension is the
    source. Architectures subclass it with their own fields."""

    def select(self, index: Tensor) -> "Memory":
        """The rows ``index`` (N,) of every tensor, in that order (repeats allowed).
        ``index_select`` copies whole rows: on a CPU about four times faster than ``tensor[index]``
        for the same values."""
        return type(self)(**{f.name: getattr(self, f.name).index_select(0, index) for f in fields(self)})

    def first(self, count: int) -> "Memory":
        """The first ``count`` rows, in order: ``select(arange(count))`` without copying (views)."""
        return type(self)(**{f.name: getattr(self, f.name)[:count] for f in fields(self)})

    def __len__(self) -> int:
        return getattr(self, fields(self)[0].name).size(0)


MemoryT = TypeVar("MemoryT", bound=Memory)  # what a model's encode gives and its decoder reads


class TranslationModel(nn.Module, Generic[MemoryT]):
    """The interface; see the module docstring. Subclasses implement ``encode``, ``start``,
    ``step`` and ``output_layer`` and inherit the rest (``MemoryT``: their :class:`Memory`)."""

    shares_source_prefixes = False
    shares_source_affixes = False
    scores_in_one_pass = False
    has_alignments = False
    # How inference (no autograd) computes p when it rearranges the equations' operations (None:
    # as they are written): a changed method can move a score's last digits, so outputs record it
    # (BatchScorer.describe).
    inference_method: Optional[str] = None
    # Dropout rate of training (set by the training loop; the modules' eval mode turns it off, and
    # a model loaded for scoring, sampling or translating keeps 0).
    dropout_p = 0.0

    source_vocab_size: int
    target_vocab_size: int

    # --- to implement ------------------------------------------------------------------------

    def encode(self, src: Tensor, src_len: Tensor) -> MemoryT:
        """src: (B, S) ids padded with <pad>; src_len: (B,) word counts (>= 1) -> B rows."""
        raise NotImplementedError

    def start(self, memory: MemoryT) -> Tensor:
        """The decoder state before the first target word: (N, D) for a memory of N rows."""
        raise NotImplementedError

    def step(self, memory: MemoryT, state: Tensor, prev: Tensor) -> Tuple[Tensor, Tensor]:
        """memory (N rows), state (N, D), prev (N,) ids -> (new state (N, D), features (N, R))."""
        raise NotImplementedError

    @property
    def output_layer(self) -> nn.Linear:
        """The final affine map from readout features (R) to the V - 1 output logits."""
        raise NotImplementedError

    def reset_parameters(self, init: str = "paper") -> None:
        """Initialise every weight: ``paper`` as the architecture's paper, ``glorot`` by
        :func:`glorot_initialise`."""
        raise NotImplementedError

    @property
    def source_embedding(self) -> nn.Embedding:
        """The source words' embedding E (what ``plot embeddings`` maps): the encoder's, by default."""
        return self.encoder.embed  # type: ignore[union-attr,return-value]  # the RNNs' encoders hold it

    # --- shared ---------------------------------------------------------------------------------

    def drop(self, x: Tensor) -> Tensor:
        """Dropout at the training rate, in training mode only."""
        return nn.functional.dropout(x, self.dropout_p, self.training) if self.dropout_p else x

    def logits(self, features: Tensor) -> Tensor:
        """(N, R) -> (N, V - 1); column k is target id k + FIRST_OUTPUT_ID."""
        return self.output_layer(features)

    def log_probs(self, features: Tensor) -> Tensor:
        """log p over the output ids, in at least fp32: (N, R) -> (N, V - 1)."""
        return torch.log_softmax(at_least_fp32(self.logits(features)), -1)

    def forward(self, src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor, label_smoothing: float = 0.0):
        """log p(y|x) for each pair, teacher-forced, by ``start`` and ``step``.

        src: (B, S), tgt: (B, T) ids padded with <pad>; src_len, tgt_len: (B,) word counts.
        Returns (B,) fp32 (fp64 for an fp64 model) natural-log probabilities, </s> included.
        With ``label_smoothing`` e > 0 it returns them with the smoothed log-likelihood (B,):
        the sum over the target's steps of (1 - e) log p(y_i) + e * mean_k log p(k), the
        objective of a target distribution that spreads e uniformly over the output ids.
        """
        memory = self.encode(src, src_len)
        features = self.drop(self.teacher_forced_features(memory, tgt))  # (B, T+1, R)
        labels, valid = next_word_labels(tgt, tgt_len)  # (B, T+1)
        log_p = self.log_probs(features[valid])  # (n_valid, V - 1)
        token_lp = log_p.gather(1, (labels[valid] - FIRST_OUTPUT_ID).unsqueeze(1)).squeeze(1)  # (n_valid,)
        out = token_lp.new_zeros(valid.shape)
        out[valid] = token_lp
        if not label_smoothing:
            return out.sum(1)  # (B,)
        smoothed = out.new_zeros(valid.shape)
        smoothed[valid] = (1.0 - label_smoothing) * token_lp + label_smoothing * log_p.mean(1)
        return out.sum(1), smoothed.sum(1)  # (B,), (B,)

    def teacher_forced_features(self, memory: MemoryT, tgt: Tensor) -> Tensor:
        """Readout features for predicting y_1..y_T and then </s>: (B, T) -> (B, T+1, R)."""
        state = self.start(memory)
        features = []
        for prev in previous_words(tgt).unbind(1):  # (B,) each
            state, feat = self.step(memory, state, prev)
            features.append(feat)
        return torch.stack(features, 1)  # (B, T+1, R)


def previous_words(tgt: Tensor) -> Tensor:
    """The word each step reads: PAD_ID (no word) then y_1..y_T: (B, T) -> (B, T+1)."""
    return torch.cat([tgt.new_full((tgt.size(0), 1), PAD_ID), tgt], 1)


def next_word_labels(tgt: Tensor, tgt_len: Tensor) -> Tuple[Tensor, Tensor]:
    """The word each step predicts, y_1..y_M then </s>, and which steps count: (B, T+1) each."""
    B, T = tgt.shape
    steps = torch.arange(T + 1, device=tgt.device)
    labels = torch.cat([tgt, tgt.new_full((B, 1), PAD_ID)], 1)  # (B, T+1)
    labels = labels.masked_fill(steps == tgt_len.unsqueeze(1), EOS_ID)  # </s> after y_M
    valid = steps <= tgt_len.unsqueeze(1)  # (B, T+1)
    return labels, valid


def embed_previous(embed: nn.Embedding, prev: Tensor) -> Tensor:
    """E y_{i-1} for ids (...,), with 0 for PAD_ID (no previous word): (...,) -> (..., E)."""
    emb = embed(prev)
    return emb * (prev != PAD_ID).unsqueeze(-1).to(emb.dtype)


def at_least_fp32(x: Tensor) -> Tensor:
    """Half-precision values (autocast on GPU) in fp32; fp32 and fp64 as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def orthogonal_like(block: Tensor) -> Tensor:
    """Left singular vectors of a white Gaussian matrix of ``block``'s shape."""
    u, _, _ = torch.linalg.svd(torch.randn(block.shape, dtype=torch.float64), full_matrices=False)
    return u.to(block.dtype)


def glorot_initialise(model: nn.Module, recurrent: dict) -> None:
    """Glorot-uniform matrices (embeddings included), orthogonal recurrent blocks, zero biases.

    ``recurrent`` maps the id of each recurrent weight to the size of its square blocks; each
    block is a random orthogonal matrix (gain 1). Unlike the papers' N(0, 0.01^2) and
    N(0, 0.001^2), no weight starts near 0, so an alignment model (v_a^T tanh(W_a s + U_a h))
    does not start at the saddle where v_a = 0 and its gradient to W_a and U_a vanishes.
    """
    with torch.no_grad():
        for name, param in model.named_parameters():
            if id(param) in recurrent:
                for block in param.split(recurrent[id(param)], 0):
                    block.copy_(orthogonal_like(block))
            elif param.dim() < 2 or name.endswith("bias") or "bias_" in name:
                param.zero_()
            else:
                nn.init.xavier_uniform_(param)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
