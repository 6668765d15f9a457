"""BatchScorer: log p(y|x) for many phrase pairs at once, doing each piece of work once.

Every command that needs a model score (``score``, ``annotate``, ``sample``, ``compare``) asks
this scorer; nothing else computes one. Given a window of pairs it

1. groups the pairs by source and sorts the distinct sources, so that sources sharing a prefix
   (``a man``, ``a man in``, ``a man in a``: a phrase table lists every sub-phrase) sit together
   (a model that pads its sources instead takes them shortest first: :meth:`BatchScorer._batches`);
2. cuts the window into batches of about ``batch_tokens`` target tokens, keeping a source's
   targets together (a batch whose sources each have one target, a reverse model's, takes them
   longest target first);
3. encodes each distinct source of a batch once (``model.encode``: a memory of one row per
   source, holding every per-source term of the decoder); a model whose encoder reads left to
   right (``shares_source_prefixes``: the encoder-decoder) walks the *trie* of the sources depth
   by depth instead, so a shared prefix is run through the encoder once; a bidirectional encoder
   (``shares_source_affixes``: RNNsearch) walks the trie of the sources and that of their
   reversals, so a shared prefix and a shared suffix each run once (:meth:`_encode_by_affixes`);
4. decodes the trie of each source's targets depth by depth (``memory.select`` the nodes'
   sources, or ``memory.first`` when they are the batch's first sources in order, which then
   need not be gathered; one ``model.step`` per depth): targets sharing a prefix share their
   decoder steps and their softmax, and no step is spent on padding;
5. forms the N x V logits of ``model.output_layer`` in chunks of ``chunk_rows`` rows
   (log-softmax in fp32, in base 2: :class:`OutputSoftmax`; by default on a CPU 128 rows, or as
   many as fill 2 MiB for a small vocabulary, and on a GPU as many as fill 256 MiB, so that a
   chunk's dozen operations are few), and
6. returns the scores in the input order.

On a CPU with several threads (``torch.get_num_threads()``) each thread scores whole batches
with torch's operations on one core (``thread_split="batches"``, the default): a batch's scores
are then those of one thread, and the cores stay busy, where splitting every operation of a
decoder step over the cores (``"operations"``) leaves them waiting on each other between the
step's many small operations (docs/benchmarks.md, "Rescoring").

On a GPU the host waits for the device once per batch, when it reads the batch's scores: ids
and indices go over in pinned memory without waiting, and the softmax's rare overflow (below)
is counted on the device and handled by scoring that batch again.

The scorer talks to the model only through :mod:`phrase_scorer.models.base`, so it scores with
either architecture.

It runs in ``options.precision``: fp32 by default; on a GPU bf16 or fp16 autocast (see
:mod:`phrase_scorer.runtime.device`), on a CPU int8 for the output layer's product
(:mod:`phrase_scorer.scoring.int8_output`).

The result equals the teacher-forced :meth:`TranslationModel.forward` pair by pair (the tests
check it against step-by-step implementations of each paper's equations). Setting
``share_source_prefixes`` / ``share_target_prefixes`` to False turns the sharing off, for
benchmarks; each distinct source is still encoded only once.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from phrase_scorer.config import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, ScoringOptions
from phrase_scorer.data.padding import NO_ID, IdRows, pad_ids
from phrase_scorer.runtime.device import HALF_PRECISIONS, device_label, precision_context, resolve_precision
from phrase_scorer.models.base import FIRST_OUTPUT_ID, Memory, TranslationModel, TrieWalk, at_least_fp32
from phrase_scorer.scoring.int8_output import Int8Product, int8_engine
from phrase_scorer.vocab import EOS_ID, PAD_ID


@dataclass
class ScoringStats:
    """Work counters, for benchmarks: how much sharing saved."""

    pairs: int = 0
    distinct_sources: int = 0
    source_words: int = 0  # what encoding every pair on its own would run
    encoder_steps: int = 0  # what the scorer ran
    target_steps: int = 0  # words + </s> over all pairs
    decoder_steps: int = 0
    exact_softmax_rows: int = 0  # decoder steps whose normaliser was recomputed exactly

    def add(self, other: "ScoringStats") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class PrefixTrie:
    """The trie of a list of id sequences, stored depth by depth.

    ``keys[d]`` holds the id at depth d of each node of that depth, ``parents[d]`` the index of
    its parent among the nodes of depth d - 1 (depth 0 nodes have no parent), and
    ``node_of[d]`` the node at depth d of each sequence long enough to reach it (-1 otherwise).
    """

    keys: List[np.ndarray] = field(default_factory=list)
    parents: List[np.ndarray] = field(default_factory=list)
    node_of: List[np.ndarray] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return sum(len(k) for k in self.keys)


def build_trie(sequences: Sequence[Sequence[int]], share_prefixes: bool = True) -> PrefixTrie:
    """Trie of ``sequences``; without sharing, every sequence gets nodes of its own."""
    rows, lengths = pad_ids(sequences, fill=NO_ID)
    return trie_of_rows(rows, lengths, share_prefixes)


def sorted_rows(rows: np.ndarray) -> np.ndarray:
    """The order of ``rows`` (n, L), padded with :data:`NO_ID`, as Python sorts their id tuples
    (a prefix before its extensions; equal rows in input order): a stable lexicographic sort."""
    return np.lexsort(rows[:, ::-1].T) if len(rows) else np.zeros(0, np.int64)


def trie_of_rows(rows: np.ndarray, lengths: np.ndarray, share_prefixes: bool = True) -> PrefixTrie:
    """Trie of the sequences in ``rows`` (n, L) padded with :data:`NO_ID`, ``lengths`` (n,), built
    with a few array operations per depth.

    The sequences are visited in sorted order (input order without sharing); a sequence creates
    the nodes below the prefix it shares with the one before it, so a node's index at its depth
    is the number of nodes created there before it (the same trie as inserting the sequences one
    by one in that order).
    """
    n = len(lengths)
    depth = int(lengths.max(initial=0))
    order = sorted_rows(rows) if share_prefixes else np.arange(n)
    ordered, ordered_lengths = rows[order], lengths[order]
    shared = np.zeros(n, np.int64)  # (n,) leading ids each sorted sequence shares with the one before
    if share_prefixes and n > 1:
        differs = ordered[1:] != ordered[:-1]  # (n-1, L)
        first_difference = np.where(differs.any(1), differs.argmax(1), rows.shape[1])
        shared[1:] = np.minimum(first_difference, np.minimum(ordered_lengths[1:], ordered_lengths[:-1]))
    keys: List[np.ndarray] = []
    parents: List[np.ndarray] = []
    node_of = np.full((depth, n), -1, np.int64)
    nodes = np.zeros(0, np.int64)
    for d in range(depth):
        reaching = ordered_lengths > d
        created = reaching & (shared <= d)  # (n,) the sorted sequences that open a node at depth d
        parent_nodes = nodes
        nodes = np.cumsum(created) - 1  # (n,) each reaching sequence's node: the last one opened
        keys.append(ordered[created, d])
        parents.append(parent_nodes[created] if d else np.full(int(created.sum()), -1, np.int64))
        node_of[d, order[reaching]] = nodes[reaching]
    return PrefixTrie(keys=keys, parents=parents, node_of=list(node_of))


def default_batch_tokens(device: torch.device) -> int:
    """Target tokens per batch on ``device`` when ``ScoringOptions.batch_tokens`` is None
    (config.CPU_BATCH_TOKENS, config.GPU_BATCH_TOKENS)."""
    return CPU_BATCH_TOKENS if device.type == "cpu" else GPU_BATCH_TOKENS


CPU_CHUNK_ROWS = 128  # at least this many rows of logits at once
CPU_CHUNK_BYTES = 2 << 20  # on a CPU, more rows while a chunk's fp32 logits fit in this much cache
GPU_CHUNK_BYTES = 256 << 20  # on a GPU, a chunk's fp32 logits fill this much: few, large kernels


def default_chunk_rows(device: torch.device, outputs: int) -> int:
    """Rows of logits formed at once on ``device`` for a softmax over ``outputs`` words when
    ``ScoringOptions.chunk_rows`` is None. Each chunk costs a dozen operations' fixed cost (on a
    GPU, kernel launches), which outweighs the arithmetic of a few rows over a small vocabulary.
    On a CPU a large vocabulary's chunk stays at 128 rows (every preset but ``tiny``: 6,000 words
    and more); ``tiny``'s 500 words get about 1,000 rows."""
    budget = CPU_CHUNK_BYTES if device.type == "cpu" else GPU_CHUNK_BYTES
    return max(CPU_CHUNK_ROWS, budget // (4 * outputs))


class BatchScorer:
    """Scores (source ids, target ids) pairs with ``model``; see the module docstring."""

    def __init__(self, model: TranslationModel, options: ScoringOptions = ScoringOptions()) -> None:
        self.model = model.eval()
        self.options = options
        self.device = next(model.parameters()).device
        self.precision = resolve_precision(self.device, options.precision)  # fp32 | bf16 | fp16 | int8
        self.chunk_rows = options.chunk_rows or default_chunk_rows(self.device, model.output_layer.out_features)
        self.batch_tokens = options.batch_tokens or default_batch_tokens(self.device)
        self.stats = ScoringStats()
        self._softmax: Optional[OutputSoftmax] = None

    # --- public --------------------------------------------------------------------------------

    @property
    def encodes_by_affixes(self) -> bool:
        """Whether the sources are encoded by the tries of their prefixes and suffixes
        (:meth:`_encode_by_affixes`)."""
        return self.model.shares_source_affixes and self.options.share_source_prefixes

    def describe(self) -> Dict[str, object]:
        """Where, in which precision, in which batches (and, for a model that pads its sources,
        in which order they are batched) and by which method (the model's ``inference_method``)
        the scores are computed, and on a CPU with how many threads (for
        signatures: each of these can change an fp32 score's last digits; a CPU's matrix
        products split their work by the thread count)."""
        described = {"device": device_label(self.device), "precision": self.precision,
                     "batch_tokens": self.batch_tokens, "chunk_rows": self.chunk_rows}
        if self.precision == "int8":  # another engine's kernels may round otherwise
            described["int8_engine"] = int8_engine()
        softmax = OutputSoftmax.method(self.precision)
        if softmax is not None:
            described["softmax"] = softmax
        if self.model.inference_method is not None:
            described["inference_method"] = self.model.inference_method
        if not self.model.shares_source_prefixes:  # the batches' sources: :meth:`_batches`
            described["source_order"] = "shortest first"
        if self.encodes_by_affixes:  # each direction's sums run in other batches: last digits move
            described["source_encoding"] = "shared prefixes and suffixes"
        if self.device.type == "cpu":
            described["threads"] = torch.get_num_threads()
            if described["threads"] > 1:  # whole batches per thread give one thread's scores
                described["thread_split"] = self.options.thread_split
        return described

    def score(self, sources: "Sequence[Sequence[int]] | IdRows",
              targets: "Sequence[Sequence[int]] | IdRows", batch_tokens: Optional[int] = None) -> np.ndarray:
        """Natural-log log p(target | source) for each pair, float64, in input order.

        Ids are vocabulary ids (unknown words as ``<unk>``), as sequences or :class:`IdRows`;
        phrases must not be empty. ``batch_tokens``: this call's batches instead of the scorer's.
        """
        if len(sources) != len(targets):
            raise ValueError("sources and targets differ in length")
        out = np.zeros(len(sources), np.float64)
        if not len(sources):
            return out
        sources, targets = IdRows.of(sources), IdRows.of(targets)
        source_rows, source_lengths = sources.rows, sources.lengths  # (n, S), (n,)
        target_rows, target_lengths = targets.rows, targets.lengths  # (n, T), (n,)
        self.model.eval()  # no training dropout, whatever mode a caller left the model in
        batches = list(self._batches(source_rows, source_lengths, target_lengths, batch_tokens))

        def score_batch(pair_index: np.ndarray, opens_source: np.ndarray) -> Tuple[np.ndarray, ScoringStats]:
            pair_source = np.cumsum(opens_source) - 1  # (k,) each pair's source among the batch's
            firsts = pair_index[opens_source]
            batch = (source_rows[firsts], source_lengths[firsts], target_rows[pair_index],
                     target_lengths[pair_index], pair_source)
            stats = ScoringStats()
            with torch.inference_mode(), precision_context(self.device, self.precision):
                scores, overflowed = self._score_batch(*batch, stats=stats)
                scores = scores.cpu().numpy()  # the batch's one wait for the device
                overflowed_rows = int(overflowed)
                if overflowed_rows:  # rare: score the batch again, those rows' normaliser exactly
                    scores = self._score_batch(*batch, stats=ScoringStats(), exact_overflow=True)[0].cpu().numpy()
                    stats.exact_softmax_rows += overflowed_rows
            return scores, stats

        threads = torch.get_num_threads() if self.device.type == "cpu" else 1
        if threads > 1 and self.options.thread_split == "batches" and len(batches) > 1:
            scored = batches_on_threads(score_batch, batches, threads)
        else:
            scored = ((pair_index, score_batch(pair_index, opens)) for pair_index, opens in batches)
        for pair_index, (scores, stats) in scored:
            out[pair_index] = scores
            self.stats.add(stats)
        return out

    # --- batching ------------------------------------------------------------------------------

    def _batches(self, source_rows: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray,
                 batch_tokens: Optional[int] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """Yield (pair indices (k,), whether each opens a new source (k,)) of about batch_tokens
        target tokens each: the pairs sorted by source (a source's pairs in input order), cut
        greedily (a batch takes pairs while their words + </s> fit, and at least one pair).

        A model that walks the trie of its sources (``shares_source_prefixes``) gets them in
        lexicographic order, so that prefixes sit together; any other model encodes a padded
        batch, so its sources come shortest first (then lexicographic), each batch padded to
        little more than its own lengths: the ``rescore`` of a reverse model encodes a hypothesis
        per pair. A batch whose sources each have one pair (a reverse model's) then takes them
        longest target first, so that the decoder rows of each depth are its first sources in
        order (:meth:`_rows`)."""
        if self.model.shares_source_prefixes:
            order = sorted_rows(source_rows)  # (n,)
        else:
            order = np.lexsort(np.vstack([source_rows[:, ::-1].T, source_lengths[None]])) if len(source_rows) \
                else np.zeros(0, np.int64)
        ordered = source_rows[order]
        opens_source = np.ones(len(order), bool)
        opens_source[1:] = (ordered[1:] != ordered[:-1]).any(1)
        tokens_through = np.cumsum(target_lengths[order] + 1)  # (n,) tokens of the sorted pairs up to each
        budget = batch_tokens or self.batch_tokens
        start = 0
        while start < len(order):
            before = int(tokens_through[start - 1]) if start else 0
            stop = max(int(np.searchsorted(tokens_through, before + budget, side="right")), start + 1)
            opens = opens_source[start:stop].copy()
            opens[0] = True
            pairs = order[start:stop]
            if opens.all():  # a target per source: longest first, so the rows at each depth are the first sources
                pairs = pairs[np.argsort(-target_lengths[pairs], kind="stable")]
            yield pairs, opens
            start = stop

    # --- the model, trie by trie -----------------------------------------------------------------

    def _tensor(self, array) -> Tensor:
        """Ids or indices as a long tensor on the device. To a GPU the copy goes through pinned
        memory without waiting (a plain copy from pageable memory would wait for the device
        at every depth of every trie)."""
        if isinstance(array, np.ndarray) and array.dtype == np.int64 and min(array.strides, default=0) >= 0:
            tensor = torch.from_numpy(array)  # the same memory, without dispatching an operator
        else:
            tensor = torch.as_tensor(array, dtype=torch.long)
        if self.device.type == "cuda":
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor if self.device.type == "cpu" else tensor.to(self.device)  # on the CPU: no copy, no operator

    def _encode(self, source_rows: np.ndarray, lengths: np.ndarray, stats: ScoringStats) -> Memory:
        """The memory of distinct sources (``source_rows`` (S, L) padded with :data:`NO_ID`, one
        row each). A model whose encoder reads left to right (``shares_source_prefixes``) walks
        the trie of the sources, running each shared prefix once; a bidirectional one
        (``shares_source_affixes``) the tries of their prefixes and suffixes; any other model
        encodes the padded batch of distinct sources."""
        model = self.model
        width = max(int(lengths.max()), 1)
        rows = source_rows[:, :width]
        stats.source_words += int(lengths.sum())
        if self.encodes_by_affixes:  # the tries' ids: no padded batch
            return self._encode_by_affixes(rows, lengths, self._tensor(lengths), stats)
        src, src_len = self._tensor(np.where(rows == NO_ID, PAD_ID, rows)), self._tensor(lengths)  # (S, L), (S,)
        if not model.shares_source_prefixes:
            stats.encoder_steps += int(lengths.sum())
            return model.encode(src, src_len)
        trie = trie_of_rows(rows, lengths, self.options.share_source_prefixes)
        final_states = None
        states = None
        for d, (keys, parents) in enumerate(zip(trie.keys, trie.parents)):
            states = model.source_prefix_step(self._tensor(keys),
                                              states[self._tensor(parents)] if d else None)  # (n_d, H)
            if final_states is None:
                final_states = states.new_zeros((len(rows), states.size(1)))  # (S, H)
            ending = np.flatnonzero(lengths == d + 1)
            if len(ending):
                final_states[self._tensor(ending)] = states[self._tensor(trie.node_of[d][ending])]
        stats.encoder_steps += trie.num_nodes
        return model.encode_from_final_states(final_states, src, src_len)

    def _encode_by_affixes(self, rows: np.ndarray, lengths: np.ndarray, src_len: Tensor,
                           stats: ScoringStats) -> Memory:
        """The memory of a bidirectional encoder (``shares_source_affixes``) from the trie of the
        sources (``rows`` (B, S), ``lengths`` (B,)) and the trie of their reversals: each shared
        prefix and each shared suffix runs once. ``encoder_steps`` counts the nodes of both tries,
        halved (a padded batch's step runs both directions)."""
        positions = np.arange(rows.shape[1])  # (S,)
        reaching = positions < lengths[:, None]  # (B, S)
        mirrored = np.where(reaching, lengths[:, None] - 1 - positions, 0)  # (B, S) the position read at depth j
        reversed_rows = np.where(reaching, np.take_along_axis(rows, mirrored, 1), NO_ID)  # (B, S)

        def walk(trie: PrefixTrie, mirror: bool) -> TrieWalk:
            offsets = np.cumsum([0] + [len(k) for k in trie.keys])  # the first node of each depth
            nodes = np.full(rows.shape, trie.num_nodes, np.int64)  # (B, S) each position's node; padding: past them
            for d, node_of in enumerate(trie.node_of):
                ends = np.flatnonzero(lengths > d)  # the sources that reach depth d
                nodes[ends, lengths[ends] - 1 - d if mirror else d] = offsets[d] + node_of[ends]
            return TrieWalk([self._tensor(k) for k in trie.keys], [self._tensor(p) for p in trie.parents],
                            self._tensor(nodes))

        prefixes, suffixes = trie_of_rows(rows, lengths), trie_of_rows(reversed_rows, lengths)
        stats.encoder_steps += (prefixes.num_nodes + suffixes.num_nodes) // 2
        return self.model.encode_by_affixes(walk(prefixes, False), walk(suffixes, True), src_len)

    def _score_batch(self, source_rows: np.ndarray, source_lengths: np.ndarray, target_rows: np.ndarray,
                     lengths: np.ndarray, pair_source: np.ndarray, *, stats: ScoringStats,
                     exact_overflow: bool = False) -> Tuple[Tensor, Tensor]:
        """log p of each pair (float64, on the device) and the number of softmax rows whose
        shifted sum overflowed (a 0-dim tensor, read after the batch: their pairs' scores are
        not finite unless ``exact_overflow``, which recomputes those rows exactly, see
        :class:`OutputSoftmax`). Nothing here waits for the device.

        ``source_rows`` (S, Ls) and ``target_rows`` (k, Lt) are padded with :data:`NO_ID`;
        ``lengths`` (k,) are the target lengths M, ``pair_source`` (k,) each pair's source row.
        The work is counted in ``stats``.
        """
        model = self.model
        memory = self._encode(source_rows, source_lengths, stats)  # S rows
        targets = len(lengths)
        width = int(lengths.max())
        # the trie of (source, y_1 .. y_M): depth 0 is the source's root (previous word: none)
        sequences = np.concatenate([pair_source[:, None], target_rows[:, :width]], 1)  # (k, 1 + M_max)
        trie = trie_of_rows(sequences, lengths + 1, self.options.share_target_prefixes)
        labels_at = np.full((targets, width + 1), NO_ID, np.int64)  # (k, M_max + 1): y_1 .. y_M, </s>
        labels_at[:, :width] = target_rows[:, :width]
        labels_at[np.arange(targets), lengths] = EOS_ID
        scores = torch.zeros(targets, dtype=torch.float64, device=self.device)
        overflowed = torch.zeros((), dtype=torch.long, device=self.device)
        states = None
        node_sources = np.zeros(0, np.int64)
        for d, (keys, parents) in enumerate(zip(trie.keys, trie.parents)):
            node_sources = keys if d == 0 else node_sources[parents]  # (n_d,) each node's source; a root's key is it
            rows = self._rows(memory, node_sources)
            if d == 0:
                prev = torch.full((len(keys),), PAD_ID, dtype=torch.long, device=self.device)  # no y_0
                parent_states = model.start(rows)  # (n_0, D)
            else:
                parent_index = self._tensor(parents)
                prev = self._tensor(keys)  # (n_d,) y_d
                parent_states = states[parent_index]  # (n_d, D)
            states, features = model.step(rows, parent_states, prev)  # (n_d, D), (n_d, R)

            # one edge per pair reaching this depth: the next word, or </s> after the last one
            reaching = np.flatnonzero(lengths >= d)
            labels = labels_at[reaching, d]
            edge_nodes = trie.node_of[d][reaching]
            log_probs, depth_overflowed = self._edge_log_probs(features, edge_nodes, labels, exact_overflow)
            scores[self._tensor(reaching)] += log_probs
            overflowed += depth_overflowed
        stats.pairs += targets
        stats.distinct_sources += len(source_rows)
        stats.target_steps += int(lengths.sum()) + targets
        stats.decoder_steps += trie.num_nodes
        return scores, overflowed

    def _rows(self, memory: Memory, node_sources: np.ndarray) -> Memory:
        """The memory's rows for decoder nodes reading ``node_sources`` (n,): when those are the
        first n sources in order (a batch of one target per source, longest first, at every
        depth: a reverse model's), the sources' own rows read in place (``memory.first``), else
        the selected rows."""
        if np.array_equal(node_sources, np.arange(len(node_sources))):
            return memory.first(len(node_sources))
        return memory.select(self._tensor(node_sources))

    def _edge_log_probs(self, features: Tensor, edge_nodes: np.ndarray, labels: np.ndarray,
                        exact_overflow: bool) -> Tuple[Tensor, Tensor]:
        """log p(label | node) for each edge, and the count of overflowed rows (0-dim tensor);
        logits formed ``chunk_rows`` nodes at a time.

        ``edge_nodes`` is sorted (pairs are visited in trie order), so each chunk of nodes owns a
        contiguous run of edges.
        """
        out = torch.empty(len(edge_nodes), dtype=torch.float64, device=self.device)
        overflowed = torch.zeros((), dtype=torch.long, device=self.device)
        rows = self.chunk_rows
        order = np.argsort(edge_nodes, kind="stable")
        sorted_nodes = edge_nodes[order]
        classes = self._tensor(labels[order] - FIRST_OUTPUT_ID)
        for start in range(0, features.size(0), rows):
            lo, hi = np.searchsorted(sorted_nodes, [start, start + rows])
            if lo == hi:
                continue
            local = self._tensor(sorted_nodes[lo:hi] - start)
            picked, chunk_overflowed = self.softmax.log_probs(features[start : start + rows], local, classes[lo:hi],
                                                              exact_overflow)
            out[self._tensor(order[lo:hi])] = picked.double()
            overflowed += chunk_overflowed
        return out, overflowed

    @property
    def softmax(self) -> "OutputSoftmax":
        if self._softmax is None:
            self._softmax = OutputSoftmax(self.model.output_layer, int8=self.precision == "int8")
        return self._softmax


LOG2_E = 1.0 / math.log(2.0)  # a logit in nats times this is in bits
LN_2 = math.log(2.0)


class OutputSoftmax:
    """log softmax(G_l f + b) at a few labels per row, with two passes over the logits, not six.

    Each row's logits are shifted by a reference value U folded into the product itself: with
    f' = (f, 1, -U) and g'_j = (g_j, b_j, 1), one matrix product gives logits - U, which are
    exponentiated in place and summed. This saves the bias copy, the max pass and the
    subtraction of ``torch.logsumexp``. The pass runs in base 2: G and b are scaled by log2(e)
    once, so the product gives the logits in bits, which ``exp2`` raises (torch's exp2 takes
    about half the time of its exp on a CPU, and the exponential is a fifth of the softmax's
    time there), and the picked logit less the row's log2-sum comes back to nats by one
    multiplication by ln 2. log p moves by at most a few 1e-05 nats (docs/precision.md);
    signatures record ``softmax: base 2``.

    U is the row's largest logit among the first ``PROBE_COLUMNS`` outputs (``</s>``, ``<unk>``
    and the most frequent words, which hold the largest logit of almost every row), from a
    product about a hundredth the size of the full one. It is a lower bound of the row's
    maximum, so the shifted sum is at least 1 and never underflows, and it stays close to the
    maximum whatever the weights (a bound from the norms of the weights, tight for an untrained
    network, is tens of nats too high for a trained one). A row whose largest logit exceeds U by
    so much that exp overflows in fp32 (more than about 88 nats) is recomputed exactly. In half
    precision (bf16/fp16 autocast on a GPU) the exact log-sum-exp, in fp32, is used throughout.
    In int8 (a CPU) the product is :class:`~phrase_scorer.scoring.int8_output.Int8Product`'s and U
    still comes from the fp32 probe: a reference within a few hundredths of a nat of the int8
    logits, not an exact bound, which only the overflow check relies on.
    """

    PROBE_COLUMNS = 64

    @staticmethod
    def method(precision: str) -> Optional[str]:
        """How the log-sum-exp is computed in ``precision``, as a signature records it
        (:meth:`BatchScorer.describe`): in base 2, or None for half precision's exact one."""
        return None if precision in HALF_PRECISIONS else "base 2"

    def __init__(self, output_layer: torch.nn.Linear, int8: bool = False) -> None:
        self.output_layer = output_layer
        with torch.no_grad():
            weight, bias = output_layer.weight * LOG2_E, output_layer.bias * LOG2_E  # (V', R), (V',) in bits
            rows = torch.cat([weight, bias.unsqueeze(1)], 1)  # (V', R+1)
            self.probe_t = rows[: self.PROBE_COLUMNS].t().contiguous()  # (R+1, K)
            # the logits' product: in fp32, or with --precision int8 (a CPU) in 8-bit integers (scoring/int8_output.py)
            self.int8 = Int8Product(weight, bias) if int8 else None
            self.weight_t = None if int8 else \
                torch.cat([rows, torch.ones_like(bias).unsqueeze(1)], 1).t().contiguous()  # (R+2, V'); int8: unused

    def exact(self, features: Tensor) -> Tensor:
        return torch.logsumexp(at_least_fp32(self.output_layer(features)), -1)

    def log_probs(self, features: Tensor, rows: Tensor, classes: Tensor,
                  exact_overflow: bool = False) -> Tuple[Tensor, Tensor]:
        """log p(classes[i] | features[rows[i]]): features (n, R); rows, classes (k,) -> (k,);
        and the number of rows whose shifted sum overflowed (a 0-dim tensor). Their log p is
        not finite unless ``exact_overflow`` recomputes their normaliser exactly, which waits for
        the device; without it nothing here does."""
        if features.dtype not in (torch.float32, torch.float64) or torch.is_autocast_enabled():
            logits = at_least_fp32(self.output_layer(features))  # (n, V')
            return logits[rows, classes] - torch.logsumexp(logits, -1)[rows], features.new_zeros((), dtype=torch.long)
        with_bias = torch.cat([features, features.new_ones((features.size(0), 1))], 1)  # (n, R+1)
        shift = (with_bias @ self.probe_t).amax(1, keepdim=True)  # (n, 1) = U, in bits
        if self.int8 is not None:  # U from fp32 logits is a reference point, not a bound, for int8 ones
            shifted = self.int8(features).sub_(shift)  # (n, V') = logits - U, in bits
        else:
            shifted = torch.cat([with_bias, -shift], 1) @ self.weight_t  # (n, V') = logits - U, in bits
        picked = shifted[rows, classes]  # (k,)
        log_sum = shifted.exp2_().sum(1).log2_()  # (n,) = log2-sum-exp2 - U, >= 0 unless it overflowed
        overflowed = ~torch.isfinite(log_sum)  # (n,)
        if exact_overflow and bool(overflowed.any()):
            log_sum[overflowed] = self.exact(features[overflowed]) * LOG2_E - shift[overflowed, 0]
        return (picked - log_sum[rows]) * LN_2, overflowed.sum()


def batches_on_threads(score_batch: Callable[[np.ndarray, np.ndarray], Any],
                       batches: Sequence[Tuple[np.ndarray, np.ndarray]], threads: int) -> List[Tuple[np.ndarray, Any]]:
    """(pair indices, ``score_batch(pair indices, opens_source)``) of every batch, scored by
    ``threads`` threads that each take whole batches and run torch's operations on one thread:
    a batch's scores are those one thread computes, whichever thread scores it. The caller's
    thread count is kept. Torch's modes are per thread: each batch enters its own (inference
    mode, precision), and a mode the caller entered (a flop counter, say) does not see the work."""
    caller_threads = torch.get_num_threads()

    def one_thread() -> None:
        torch.set_num_threads(1)

    try:
        with ThreadPoolExecutor(threads, initializer=one_thread, thread_name_prefix="phrase-scorer-batches") as pool:
            futures = [(pair_index, pool.submit(score_batch, pair_index, opens)) for pair_index, opens in batches]
            return [(pair_index, future.result()) for pair_index, future in futures]
    finally:
        torch.set_num_threads(caller_threads)


def scorer_for_worker(scoring) -> BatchScorer:
    """A worker process's scorer (:class:`phrase_scorer.scoring.annotate_work.WorkerScoring`): the model
    loaded on the CPU, scoring with one thread, refused if its weights are not the ones the run
    records."""
    from phrase_scorer.errors import PhraseScorerError
    from phrase_scorer.model_dir import load_model

    torch.set_num_threads(1)
    loaded = load_model(scoring.directory, "cpu")
    if loaded.weights_sha256 != scoring.weights_sha256:
        raise PhraseScorerError("the model's weights changed while this run used them", path=loaded.weights_path,
                                hint="run again once the model is no longer being written")
    return BatchScorer(loaded.model, scoring.options)


def log_probs_by_forward(model: TranslationModel, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                         batch_size: int = 64) -> np.ndarray:
    """Scores from the teacher-forced forward pass, ``batch_size`` pairs at a time, in input
    order, each pair encoded on its own (the naive way: validation during training, and the
    reference of tests and benchmarks). Runs in the caller's precision context."""
    device = next(model.parameters()).device
    out = np.zeros(len(sources), np.float64)
    with torch.inference_mode():
        for start in range(0, len(sources), batch_size):
            src, src_len = pad(sources[start : start + batch_size], device)
            tgt, tgt_len = pad(targets[start : start + batch_size], device)
            out[start : start + len(src)] = model(src, src_len, tgt, tgt_len).double().cpu().numpy()
    return out


def pad(sequences: Sequence[Sequence[int]], device) -> Tuple[Tensor, Tensor]:
    """:func:`phrase_scorer.data.padding.pad_ids` as tensors on ``device``: (B, L) ids and (B,) lengths."""
    matrix, lengths = pad_ids(sequences)
    return torch.as_tensor(matrix, device=device), torch.as_tensor(lengths, device=device)
