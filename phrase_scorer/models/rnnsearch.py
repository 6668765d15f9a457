"""RNNsearch: the attention model of Bahdanau, Cho and Bengio (2015), appendices A and B.

Notation follows the paper: a source x_1..x_Tx, a target y_1..y_Ty, embeddings E (one matrix per
side), encoder states ->h_j and <-h_j, decoder state s_i. Tensors are batch-first; B = batch,
S = source positions, N = decoder rows, m = embedding size, n = GRU units (per encoder direction
and in the decoder), n' = alignment units, l = maxout units, V = target vocabulary.

    encoder    ->h_j = (1 - ->z_j) * ->h_{j-1} + ->z_j * tanh(->W E x_j + ->U [->r_j * ->h_{j-1}])
               ->z_j = sigmoid(->W_z E x_j + ->U_z ->h_{j-1}),  ->r_j = sigmoid(->W_r E x_j + ->U_r ->h_{j-1})
               ->h_0 = 0; <-h_j alike over x_Tx..x_1 with its own matrices (E is shared)
               h_j = [->h_j ; <-h_j]                                           (2n)
    decoder    s_0  = tanh(W_s <-h_1)
               e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j)          (U_a h_j once per source)
               a_ij = exp(e_ij) / sum_k exp(e_ik), over the real source words only
               c_i  = sum_j a_ij h_j
               s_i  = (1 - z_i) * s_{i-1} + z_i * tanh(W E y_{i-1} + U [r_i * s_{i-1}] + C c_i)
               z_i  = sigmoid(W_z E y_{i-1} + U_z s_{i-1} + C_z c_i)
               r_i  = sigmoid(W_r E y_{i-1} + U_r s_{i-1} + C_r c_i),   E y_0 = 0
    readout    t~_i = U_o s_{i-1} + V_o E y_{i-1} + C_o c_i                  (2l)
               t_i,k = max(t~_i,2k-1, t~_i,2k)                               (l)
               p(y_i | y_<i, x) = softmax(W_o t_i)     over </s>, <unk> and the words

The reset gate multiplies the state *before* U (unlike ``torch.nn.GRU``, which applies it to
U h + b), and z weights the new candidate, so the recurrences are written out here. The paper
omits biases from its equations; each input-side affine term carries one (W, W_z, W_r of every
GRU, W_s, U_a, U_o, W_o), all starting at 0. Initialisation (appendix B): U, U_z, U_r of every
GRU random orthogonal; W_a and U_a from N(0, 0.001^2); v_a and the biases 0; every other weight
from N(0, 0.01^2). Note s_{i-1}, not s_i, in the alignment model and in the readout: the
features that predict y_i come from the state *before* the step that reads y_{i-1}.

c_i enters the decoder only through linear maps (C_o, and C_z, C_r, C), so the encoder computes
[C_o; C_z; C_r; C] h_j once per source word and a step takes the a_ij-weighted sum of those
projected rows (a sum over S rows of 2l + 3n numbers) instead of forming c_i and multiplying it
by the (2l + 3n) x 2n matrix: the same value up to the order of the additions, and about S/(S+2n)
of the work. Decoder rows that read the same source share its memory: selecting rows
(:meth:`RNNsearchMemory.select`) records which source each row reads, and without autograd the
weighted sums of every row are one sparse x dense product over the sources' projected rows. When
a step's rows are the first sources themselves, in order (:meth:`RNNsearchMemory.first`: a reverse
model's batch, one target per source, longest first), they are read in place: views of the
sources' tensors, and the weighted sums one batched product. On a CPU the alignment's energies
go through one cache-sized buffer a few rows at a time (:meth:`Alignment._energy_by_chunks`).
Likewise y_{i-1} enters only through W E y_{i-1} (+ b) and V_o E y_{i-1}: without autograd a step
reads them from a table of the whole target vocabulary, computed once for the current weights
(:meth:`RNNsearch.word_terms`), instead of multiplying its rows' embeddings.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from phrase_scorer.config import RNNsearchConfig
from phrase_scorer.models.base import (
    FIRST_OUTPUT_ID,
    Memory,
    TranslationModel,
    TrieWalk,
    embed_previous,
    next_word_labels,
    glorot_initialise,
    orthogonal_like,
    previous_words,
)
from phrase_scorer.vocab import PAD_ID

# The sparse product of RNNsearchMemory.weighted_context_terms: torch calls its sparse layouts beta.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)


class GatedUnit(nn.Module):
    """The paper's GRU: h = (1 - z) * h_prev + z * tanh(W x + U [r * h_prev]).

    ``input_proj`` holds W_z, W_r and W (with their biases) stacked in that order, (z, r, new).
    """

    def __init__(self, input_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.input_proj = nn.Linear(input_dim, 3 * hidden_dim)  # W_z, W_r, W (+ biases)
        self.gate_recurrent = nn.Linear(hidden_dim, 2 * hidden_dim, bias=False)  # U_z, U_r
        self.recurrent = nn.Linear(hidden_dim, hidden_dim, bias=False)  # U

    def step(self, x_proj: Tensor, h: Tensor) -> Tensor:
        """x_proj: every input term, W x (+ C c) (N, 3n); h: h_prev (N, n) -> the new state (N, n)."""
        n = self.hidden_dim
        z, r = torch.sigmoid(x_proj[:, : 2 * n] + self.gate_recurrent(h)).chunk(2, -1)  # (N, n) each
        candidate = torch.tanh(x_proj[:, 2 * n :] + self.recurrent(r * h))  # (N, n)
        return h + z * (candidate - h)  # (1 - z) h + z candidate

    def scan(self, x: Tensor, mask: Tensor, reverse: bool = False) -> Tensor:
        """States over a padded batch: x (B, S, in), mask (B, S) -> (B, S, n), 0 at padding.

        ``reverse`` reads each sequence from its last real word back to its first; the state
        stays at h_0 = 0 across the padding, so padding changes nothing.
        """
        B, S, _ = x.shape
        x_proj = self.input_proj(x)  # (B, S, 3n)
        h = x_proj.new_zeros((B, self.hidden_dim))  # h_0 = 0
        states = [h] * S
        for j in (reversed(range(S)) if reverse else range(S)):
            h = torch.where(mask[:, j : j + 1], self.step(x_proj[:, j], h), h)  # (B, n)
            states[j] = h
        return torch.stack(states, 1) * mask.unsqueeze(2).to(x_proj.dtype)  # (B, S, n)


class BidirectionalEncoder(nn.Module):
    """Annotations h_j = [->h_j ; <-h_j] of a padded batch of sources."""

    def __init__(self, config: RNNsearchConfig, vocab_size: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, config.embedding_dim, padding_idx=PAD_ID)  # E, both directions
        self.forward_unit = GatedUnit(config.embedding_dim, config.hidden_dim)
        self.backward_unit = GatedUnit(config.embedding_dim, config.hidden_dim)

    def forward(self, src: Tensor, src_len: Tensor, drop=lambda x: x) -> Tuple[Tensor, Tensor]:
        """src (B, S), src_len (B,) -> annotations (B, S, 2n) (0 at padding), mask (B, S).
        ``drop`` is the model's training dropout, applied to the embeddings and the annotations."""
        mask = torch.arange(src.size(1), device=src.device) < src_len.unsqueeze(1)  # (B, S)
        emb = drop(self.embed(src))  # (B, S, m)
        forward_states = self.forward_unit.scan(emb, mask)  # (B, S, n)
        backward_states = self.backward_unit.scan(emb, mask, reverse=True)  # (B, S, n)
        return drop(torch.cat([forward_states, backward_states], 2)), mask  # (B, S, 2n)


class Alignment(nn.Module):
    """a_ij = softmax_j v_a^T tanh(W_a s_{i-1} + U_a h_j), over the real source words.

    Without autograd it computes e'_ij = 2 v_a^T sigmoid(2 (W_a s_{i-1} + U_a h_j)) instead:
    tanh(u) = 2 sigmoid(2u) - 1, so e'_ij = e_ij + sum(v_a), the same shift for every j, which the
    softmax removes. The (N, S, n') elementwise function is a step's largest, and torch's sigmoid
    runs about four times faster than its tanh on a CPU; a_ij moves in its 7th significant digit."""

    # On a CPU without autograd, the energies' (rows, S, n') buffer, within a core's L2 cache
    # (docs/benchmarks.md, "Rescoring": chunks of 0.6-1 MiB ran fastest of 0.2-3.5 MiB)
    CHUNK_BYTES = 768 << 10

    def __init__(self, config: RNNsearchConfig) -> None:
        super().__init__()
        n, n_a = config.hidden_dim, config.alignment_dim
        self.query = nn.Linear(n, n_a, bias=False)  # W_a
        self.key = nn.Linear(2 * n, n_a)  # U_a (+ bias)
        self.score = nn.Linear(n_a, 1, bias=False)  # v_a

    def forward(self, s_prev: Tensor, keys: Tensor, mask: Tensor) -> Tensor:
        """s_prev (N, n), keys U_a h_j (N, S, n'), mask (N, S) -> a_i. (N, S), 0 at padding."""
        query = self.query(s_prev).unsqueeze(1)  # (N, 1, n')
        if torch.is_grad_enabled():
            energy = self.score(torch.tanh(query + keys)).squeeze(2)  # (N, S) e_ij
        else:  # a CPU: a few rows at a time in a buffer within the cache; a GPU: every row at once
            energy = self._energy_by_chunks(query, keys)  # (N, S) e_ij + sum(v_a)
        energy = energy.masked_fill(~mask, float("-inf"))
        return torch.softmax(energy, 1)  # (N, S)

    def _energy_by_chunks(self, query: Tensor, keys: Tensor) -> Tensor:
        """2 v_a^T sigmoid(2 (W_a s_{i-1} + U_a h_j)) of query (N, 1, n') and keys (N, S, n') -> (N, S),
        made and transformed in place in one (rows, S, n') buffer. On a CPU the buffer holds a few
        rows at a time, about ``CHUNK_BYTES``: the sum, the sigmoid and the product with v_a find
        it in the cache instead of passing three times over an (N, S, n') tensor in memory. The
        sum and the sigmoid give the same values; the product's kernel may add a row's n' terms
        in another order for a chunk's shape than for the whole tensor's (a_ij within a few units
        of fp32's last place). On a GPU the buffer holds every row: one kernel each."""
        rows, width, units = keys.shape
        per_chunk = self.CHUNK_BYTES // (keys.element_size() * width * units) if keys.device.type == "cpu" else rows
        chunk = max(1, per_chunk)
        buffer = keys.new_empty((min(chunk, rows), width, units))  # (chunk, S, n')
        weights = self.score.weight.t() * 2  # (n', 1) 2 v_a
        twice_query = query * 2  # (N, 1, n')
        energy = keys.new_empty((rows, width))  # (N, S)
        for start in range(0, rows, chunk):
            stop = min(rows, start + chunk)
            hidden = buffer[: stop - start]
            torch.add(twice_query[start:stop], keys[start:stop], alpha=2, out=hidden).sigmoid_()  # sigmoid(2u)
            torch.mm(hidden.view(-1, units), weights, out=energy[start:stop].view(-1, 1))
        return energy


class MaxoutReadout(nn.Module):
    """t_i = maxout(U_o s_{i-1} + V_o E y_{i-1} + C_o c_i): the features (l) of W_o's softmax."""

    def __init__(self, config: RNNsearchConfig, vocab_size: int) -> None:
        super().__init__()
        n, m = config.hidden_dim, config.embedding_dim
        self.units, self.pieces = config.maxout_units, config.maxout_pieces
        width = self.units * self.pieces
        self.state = nn.Linear(n, width)  # U_o (+ bias)
        self.prev_word = nn.Linear(m, width, bias=False)  # V_o
        self.context = nn.Linear(2 * n, width, bias=False)  # C_o
        self.output = nn.Linear(self.units, vocab_size - FIRST_OUTPUT_ID)  # W_o (+ bias)

    def features(self, s_prev: Tensor, prev_emb: Tensor, context_term: Tensor) -> Tensor:
        """(N, n), (N, m), C_o c_i (N, 2l) -> t_i (N, l)."""
        return self.features_from_terms(s_prev, self.prev_word(prev_emb), context_term)

    def features_from_terms(self, s_prev: Tensor, word_term: Tensor, context_term: Tensor) -> Tensor:
        """(N, n), V_o E y_{i-1} (N, 2l), C_o c_i (N, 2l) -> t_i (N, l)."""
        t = self.state(s_prev) + word_term + context_term  # (N, 2l)
        return t.unflatten(-1, (self.units, self.pieces)).amax(-1)  # (N, l)


@dataclass
class RNNsearchMemory(Memory):
    """An encoded batch of B sources, read by N decoder rows: row r reads source ``rows[r]``, or
    source r when ``rows`` is None (then N = B). Selecting rows composes ``rows`` and copies
    nothing; a step gathers what it needs of its rows' sources."""

    mask: Tensor  # (B, S) True at real source words
    keys: Tensor  # (B, S, n') U_a h_j
    init_state: Tensor  # (B, n) s_0 = tanh(W_s <-h_1)
    context_terms: Tensor  # (B, S, 2l + 3n) [C_o; C_z; C_r; C] h_j, 0 at padding
    rows: Optional[Tensor] = None  # (N,) the source of each decoder row

    def select(self, index: Tensor) -> "RNNsearchMemory":
        return replace(self, rows=index if self.rows is None else self.rows.index_select(0, index))

    def first(self, count: int) -> "RNNsearchMemory":
        """The first ``count`` rows in order; of unselected sources, views of the sources' own
        tensors (no rows recorded: a step reads them in place)."""
        if self.rows is not None:
            return self.select(torch.arange(count, device=self.mask.device))
        return RNNsearchMemory(mask=self.mask[:count], keys=self.keys[:count], init_state=self.init_state[:count],
                               context_terms=self.context_terms[:count])

    def __len__(self) -> int:
        return self.mask.size(0) if self.rows is None else self.rows.size(0)

    def per_row(self, tensor: Tensor) -> Tensor:
        """A per-source tensor (B, ...) as one row per decoder row (N, ...)."""
        return tensor if self.rows is None else tensor.index_select(0, self.rows)

    def weighted_context_terms(self, alpha: Tensor) -> Tensor:
        """sum_j a_ij [C_o; C_z; C_r; C] h_j: alpha (N, S) -> (N, 2l + 3n).

        With selected rows, on a CPU without autograd: one sparse (N, B*S) x dense (B*S, 2l + 3n) product,
        row r's S weights in the columns of its source's words; the sources' rows are read
        where they are, not copied once per decoder row."""
        if self.rows is None:
            return torch.bmm(alpha.unsqueeze(1), self.context_terms).squeeze(1)
        if torch.is_grad_enabled() or alpha.device.type != "cpu":  # a CPU without autograd takes the sparse product
            return torch.bmm(alpha.unsqueeze(1).to(self.context_terms.dtype),
                             self.per_row(self.context_terms)).squeeze(1)
        sources, words, width = self.context_terms.shape
        rows = alpha.size(0)
        columns = (self.rows.unsqueeze(1) * words + torch.arange(words, device=alpha.device)).reshape(-1)  # (N*S,)
        row_starts = torch.arange(0, rows * words + 1, words, device=alpha.device)  # (N+1,)
        weights = torch.sparse_csr_tensor(row_starts, columns, alpha.reshape(-1), (rows, sources * words),
                                          check_invariants=False)
        return weights @ self.context_terms.reshape(sources * words, width)


class RNNsearch(TranslationModel[RNNsearchMemory]):
    """p(y|x) by RNNsearch; see the module docstring."""

    has_alignments = True
    shares_source_affixes = True
    # module docstring
    inference_method = ("context terms per source word; alignment by 2 sigmoid(2u); word terms per vocabulary word; "
                        "the first sources' rows read in place; alignment energies by row chunks on a CPU")

    def __init__(self, config: RNNsearchConfig, source_vocab_size: int, target_vocab_size: int,
                 initialise: bool = True) -> None:
        super().__init__()
        n, m = config.hidden_dim, config.embedding_dim
        self.config = config
        self.source_vocab_size = source_vocab_size
        self.target_vocab_size = target_vocab_size
        self.encoder = BidirectionalEncoder(config, source_vocab_size)
        self.init_state = nn.Linear(n, n)  # W_s (+ bias)
        self.alignment = Alignment(config)
        self.embed = nn.Embedding(target_vocab_size, m, padding_idx=PAD_ID)  # target E
        self.unit = GatedUnit(m, n)  # W, W_z, W_r, U, U_z, U_r of the decoder
        self.context_proj = nn.Linear(2 * n, 3 * n, bias=False)  # C_z, C_r, C
        self.readout = MaxoutReadout(config, target_vocab_size)
        self._word_terms: Optional[Tuple[tuple, Tensor]] = None  # (weights' versions, table): word_terms
        if initialise:  # else the weights are loaded next (model_dir), or the model is a skeleton
            self.reset_parameters()

    def reset_parameters(self, init: str = "paper") -> None:
        """``paper`` (appendix B): orthogonal U's; N(0, 0.001^2) W_a, U_a; v_a and biases 0;
        others N(0, 0.01^2). ``glorot``: :func:`~phrase_scorer.models.base.glorot_initialise`."""
        cfg = self.config
        units = (self.encoder.forward_unit, self.encoder.backward_unit, self.unit)
        recurrent = {id(u.gate_recurrent.weight) for u in units} | {id(u.recurrent.weight) for u in units}
        alignment = {id(self.alignment.query.weight), id(self.alignment.key.weight)}
        with torch.no_grad():
            if init == "glorot":
                glorot_initialise(self, dict.fromkeys(recurrent, cfg.hidden_dim))
            else:
                for name, param in self.named_parameters():
                    if id(param) in recurrent:
                        for block in param.split(cfg.hidden_dim, 0):  # U_z, U_r, U: n x n each
                            block.copy_(orthogonal_like(block))
                    elif id(param) in alignment:
                        param.normal_(0.0, cfg.alignment_init_std)
                    elif name.endswith("bias") or param is self.alignment.score.weight:
                        param.zero_()
                    else:
                        param.normal_(0.0, cfg.init_std)
            self.encoder.embed.weight[PAD_ID].zero_()
            self.embed.weight[PAD_ID].zero_()

    # --- the interface ---------------------------------------------------------------------------

    @property
    def output_layer(self) -> nn.Linear:
        return self.readout.output

    def encode(self, src: Tensor, src_len: Tensor) -> RNNsearchMemory:
        """src (B, S), src_len (B,) -> annotations, mask, U_a h_j and s_0 of each source."""
        annotations, mask = self.encoder(src, src_len, self.drop)  # (B, S, 2n), (B, S)
        first_backward = annotations[:, 0, self.config.hidden_dim :]  # (B, n) <-h_1
        projection = torch.cat([self.readout.context.weight, self.context_proj.weight])  # (2l + 3n, 2n)
        return RNNsearchMemory(
            mask=mask,
            keys=self.alignment.key(annotations),  # (B, S, n')
            init_state=torch.tanh(self.init_state(first_backward)),  # (B, n)
            context_terms=annotations @ projection.t(),  # (B, S, 2l + 3n)
        )

    def encode_by_affixes(self, prefixes: TrieWalk, suffixes: TrieWalk, src_len: Tensor) -> RNNsearchMemory:
        """:meth:`encode` of a batch (B sources, S positions) from the trie of its sources
        (``prefixes``) and that of their reversals (``suffixes``): each direction's GRU runs once
        per node, and so does each direction's half of U_a h_j and [C_o; C_z; C_r; C] h_j (a
        product with h_j = [->h_j; <-h_j] is the sum of the products with its halves), which a
        position then gathers from its two nodes: one bag of two rows per position
        (``embedding_bag``'s sum, the same additions as gathering both halves and adding them,
        with one pass over the result instead of three). Inference only (no dropout)."""
        n = self.config.hidden_dim
        forward_states = self._states_by_trie(self.encoder.forward_unit, prefixes)  # (nodes + 1, n), 0 last
        backward_states = self._states_by_trie(self.encoder.backward_unit, suffixes)  # (nodes' + 1, n)
        context = torch.cat([self.readout.context.weight, self.context_proj.weight])  # (2l + 3n, 2n): C_o, C_z, C_r, C
        batch, width = prefixes.positions.shape
        forward_at, backward_at = prefixes.positions.reshape(-1), suffixes.positions.reshape(-1)  # (B*S,)

        nodes = forward_states.size(0)
        both_at = torch.stack([forward_at, backward_at + nodes], 1)  # (B*S, 2) rows of the two products stacked

        def at_positions(weight: Tensor) -> Tensor:  # weight (k, 2n) -> weight h_j of every position (B, S, k)
            by_node = forward_states.new_empty((nodes + backward_states.size(0), weight.size(0)))
            torch.mm(forward_states, weight[:, :n].t(), out=by_node[:nodes])  # (nodes + 1, k)
            torch.mm(backward_states, weight[:, n:].t(), out=by_node[nodes:])  # (nodes' + 1, k)
            return nn.functional.embedding_bag(both_at, by_node, mode="sum").view(batch, width, -1)

        first_backward = backward_states.index_select(0, suffixes.positions[:, 0])  # (B, n) <-h_1
        mask = torch.arange(width, device=src_len.device) < src_len.unsqueeze(1)  # (B, S)
        return RNNsearchMemory(
            mask=mask,
            keys=at_positions(self.alignment.key.weight).add_(self.alignment.key.bias),  # (B, S, n') U_a h_j + b
            init_state=torch.tanh(self.init_state(first_backward)),  # (B, n)
            context_terms=at_positions(context),  # (B, S, 2l + 3n), 0 at padding
        )

    def _states_by_trie(self, unit: GatedUnit, walk: TrieWalk) -> Tensor:
        """The states of ``unit`` at every node of ``walk``'s trie, depth by depth, then a row of
        zeros (the padding's node): (nodes + 1, n)."""
        states: List[Tensor] = []
        previous: Optional[Tensor] = None
        for keys, parents in zip(walk.keys, walk.parents):
            inputs = unit.input_proj(self.encoder.embed(keys))  # (n_d, 3n)
            before = inputs.new_zeros((keys.size(0), unit.hidden_dim)) if previous is None else previous[parents]
            previous = unit.step(inputs, before)  # (n_d, n)
            states.append(previous)
        states.append(torch.zeros((1, unit.hidden_dim), dtype=self.encoder.embed.weight.dtype,
                                  device=self.encoder.embed.weight.device))
        return torch.cat(states)

    def start(self, memory: RNNsearchMemory) -> Tensor:
        return memory.per_row(memory.init_state)  # (N, n) s_0

    def step(self, memory: RNNsearchMemory, state: Tensor, prev: Tensor) -> Tuple[Tensor, Tensor]:
        """memory (N rows), s_{i-1} (N, n), y_{i-1} (N,) -> s_i (N, n), t_i (N, l)."""
        state, features, _ = self.step_with_alignment(memory, state, prev)
        return state, features

    def step_with_alignment(self, memory: RNNsearchMemory, state: Tensor,
                            prev: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """As :meth:`step`, with the alignment weights a_i. (N, S) used for c_i."""
        if torch.is_grad_enabled():
            prev_emb = self.drop(embed_previous(self.embed, prev))  # (N, m) E y_{i-1}, 0 for y_0
            word_input, word_readout = self.unit.input_proj(prev_emb), self.readout.prev_word(prev_emb)
        else:  # a word's terms are the same at every step: read from a table of the vocabulary's
            word_input, word_readout = self.word_terms().index_select(0, prev).split(
                [self.unit.input_proj.out_features, self.readout.prev_word.out_features], 1)
        # word_input (N, 3n) W E y_{i-1} (+ b), word_readout (N, 2l) V_o E y_{i-1}
        alpha = self.alignment(state, memory.per_row(memory.keys), memory.per_row(memory.mask))  # (N, S)
        readout_term, unit_term = memory.weighted_context_terms(alpha).split(
            [self.readout.context.out_features, self.context_proj.out_features], 1)  # C_o c_i (N, 2l), C c_i (N, 3n)
        features = self.readout.features_from_terms(state, word_readout, readout_term)  # (N, l) from s_{i-1}
        return self.unit.step(word_input + unit_term, state), features, alpha

    def word_terms(self) -> Tensor:
        """[W E y (+ b), V_o E y] of every target id y (V, 3n + 2l), with E y_0 = 0 for <pad>
        (no previous word): what a step adds for its previous word, computed once for the current
        weights (and autocast setting) and kept until they change. Without autograd only."""
        weights = (self.embed.weight, self.unit.input_proj.weight, self.unit.input_proj.bias,
                   self.readout.prev_word.weight)
        # an inference tensor has no version counter (weights made in inference mode stay as made)
        key = (tuple((-1 if w.is_inference() else w._version, w.data_ptr()) for w in weights),
               torch.is_autocast_enabled(), self.embed.weight.device)
        cached = self._word_terms
        if cached is None or cached[0] != key:
            embeddings = embed_previous(self.embed, torch.arange(self.target_vocab_size, device=key[2]))  # (V, m)
            table = torch.cat([self.unit.input_proj(embeddings), self.readout.prev_word(embeddings)], 1)
            cached = self._word_terms = (key, table)
        return cached[1]

    def alignments(self, src: Tensor, src_len: Tensor, tgt: Tensor, tgt_len: Tensor) -> Tensor:
        """Teacher-forced a_ij: (B, T+1, S); row i is the step that predicts y_i (then </s>).
        Rows past a target's </s> and columns past its source are 0."""
        memory = self.encode(src, src_len)
        state = self.start(memory)
        weights = []
        for prev in previous_words(tgt).unbind(1):  # (B,) each
            state, _, alpha = self.step_with_alignment(memory, state, prev)
            weights.append(alpha)
        _, valid = next_word_labels(tgt, tgt_len)  # (B, T+1)
        return torch.stack(weights, 1) * valid.unsqueeze(2).to(weights[0].dtype)  # (B, T+1, S)


def forward_flops(config: RNNsearchConfig, target_vocab_size: int, source_length: float,
                  target_length: float) -> Dict[str, float]:
    """Analytic multiply-add FLOPs (2 per MAC) of the teacher-forced forward pass of one pair.

    ``target_length`` counts words; the decoder runs one more step for </s>. Parts: ``encoder``
    (both directions' GRU, U_a h_j and [C_o; C_z; C_r; C] h_j per source word, and s_0), ``decoder``
    (``decoder_step`` per target step: W_a s, the scores v_a and the weighted sum of the projected
    context rows over the source words, the GRU, the maxout readout and the softmax's W_o).
    Elementwise work is left out.
    """
    m, n, n_a = config.embedding_dim, config.hidden_dim, config.alignment_dim
    width, l, V = config.maxout_units * config.maxout_pieces, config.maxout_units, target_vocab_size - FIRST_OUTPUT_ID
    projected = width + 3 * n  # [C_o; C_z; C_r; C] h_j
    encoder_step = 2 * 2 * (m * 3 * n + n * 2 * n + n * n) + 2 * (2 * n * n_a) + 2 * 2 * n * projected
    encoder = source_length * encoder_step + 2 * n * n  # s_0 = tanh(W_s <-h_1)
    attention = 2 * n * n_a + source_length * (2 * n_a + 2 * projected)  # W_a s; v_a tanh(.), a_ij-weighted rows
    readout = 2 * (n * width + m * width) + 2 * l * V
    unit = 2 * (m * 3 * n + n * 2 * n + n * n)
    decoder_step = attention + readout + unit
    decoder = (target_length + 1) * decoder_step
    return {"encoder": encoder, "encoder_step": encoder_step, "decoder": decoder, "decoder_step": decoder_step,
            "total": encoder + decoder}
