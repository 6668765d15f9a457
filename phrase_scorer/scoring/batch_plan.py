"""The plan of a batch: every index array the batch scorer's device work reads, built with numpy
alone.

:class:`~phrase_scorer.scoring.batch_scorer.BatchScorer` scores a window of pairs in two halves:

    plan (here, numpy, no torch):  ids -> batches -> tries -> per-depth index arrays, in one buffer
    run (batch_scorer, torch):     one copy of the buffer to the device -> encoder, decoder steps
                                   and softmax, reading slices of it -> scores

A plan depends only on the window's ids and the scorer's :class:`PlanSettings`, so a worker
process (``annotate``'s, ``rescore``'s) builds the plans of window k + 1 while the scorer runs
window k: the process that feeds the device then only launches its work, and ids and indices
cross to a GPU once per batch (one pinned copy of one int64 buffer) instead of once per array.

The steps, as the scorer's module docstring describes them:

1. :func:`batches`: the pairs sorted by source and cut into batches of about ``batch_tokens``
   target tokens;
2. :func:`plan_encoder`: the sources' trie (a left-to-right encoder), the tries of their
   prefixes and suffixes (a bidirectional one), or the padded sources;
3. :func:`plan_batch`: the trie of each source's targets, and per depth the nodes' sources,
   parents and previous words, the pairs that reach the depth, and the softmax's chunks (their
   rows, labels and where their log p go); for a model that scores in one pass
   (``decoder="one_pass"``), the padded targets and each pair's source (:class:`OnePassPlan`),
   and per depth of the trie its softmax's chunks and the position of the pass each node's
   features are read from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.data.padding import NO_ID, IdRows, pad_ids
from phrase_scorer.vocab import EOS_ID, FIRST_OUTPUT_ID, PAD_ID

Slot = Tuple[int, int]  # (offset, length) of an int64 array in a plan's buffer


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


# --- what a plan depends on ------------------------------------------------------------------------

ENCODERS = ("prefixes", "affixes", "padded")
DECODERS = ("trie", "one_pass", "by_batch")  # by_batch: one pass where it computes few enough positions


@dataclass(frozen=True)
class PlanSettings:
    """What a batch's plan depends on besides its ids: the scorer's batch size and softmax chunk,
    and how its model reads sources (:meth:`BatchScorer.plan_settings`). Workers are given it."""

    batch_tokens: int
    chunk_rows: int
    encoder: str  # "prefixes": the sources' trie; "affixes": the tries of prefixes and suffixes; "padded"
    sorted_sources: bool  # batches take sources in lexicographic order (else shortest first)
    share_source_prefixes: bool = True  # "prefixes": without, every source gets nodes of its own
    share_target_prefixes: bool = True
    decoder: str = "trie"  # "trie": the targets' trie depth by depth; "one_pass": padded targets at once;
    #                        "by_batch": one pass where its positions are at most one_pass_ratio x the trie's nodes
    one_pass_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise ValueError(f"encoder must be one of {ENCODERS}")
        if self.decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}")


# --- the plan ------------------------------------------------------------------------------------------


class _Buffer:
    """Int64 arrays laid end to end; each added array's :data:`Slot`."""

    def __init__(self) -> None:
        self.parts: List[np.ndarray] = []
        self.size = 0

    def add(self, array: np.ndarray) -> Slot:
        flat = np.ascontiguousarray(array, dtype=np.int64).reshape(-1)
        slot = (self.size, flat.size)
        self.parts.append(flat)
        self.size += flat.size
        return slot

    def array(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.zeros(0, np.int64)

    def lengths(self) -> List[int]:
        return [len(part) for part in self.parts]


@dataclass
class EncoderPlan:
    """How the batch's S distinct sources are encoded (slots into the plan's buffer).

    ``"padded"``: ``src`` (S, width) ids padded with ``<pad>``, ``src_len`` (S,). ``"prefixes"``:
    those, and the trie of the sources: per depth ``keys``, ``parents`` (unused at depth 0) and
    ``endings`` (the sources that end there and their nodes, or None). ``"affixes"``: ``src_len``
    and two walks (the tries of the sources and of their reversals), each (keys, parents,
    positions (S, width))."""

    kind: str
    sources: int
    width: int
    src_len: Slot
    src: Optional[Slot] = None
    keys: List[Slot] = field(default_factory=list)
    parents: List[Slot] = field(default_factory=list)
    endings: List[Optional[Tuple[Slot, Slot]]] = field(default_factory=list)
    walks: List[Tuple[List[Slot], List[Slot], Slot]] = field(default_factory=list)


@dataclass
class DepthPlan:
    """One depth of the targets' trie: its ``nodes`` decoder steps, the sources they read (None:
    the first ``nodes`` sources in order), their previous words and parents (depth > 0), and
    the softmax's chunks: (first row, the rows of the chunk's edges relative to it, the edges'
    labels less :data:`FIRST_OUTPUT_ID`, the pairs the edges belong to). An edge is a pair
    that reaches the depth: its next word, or ``</s>`` after its last; its log p is added to
    its pair's score."""

    nodes: int
    sources: Optional[Slot]
    keys: Optional[Slot]
    parents: Optional[Slot]
    chunks: List[Tuple[int, Slot, Slot, Slot]]
    # a one-pass plan's: each node's row among the pass's k * (width + 1) positions (a pair
    # reaching it, at this depth), whose features are the node's; its steps are not run
    rows: Optional[Slot] = None


@dataclass
class OnePassPlan:
    """A batch's targets run in one teacher-forced pass: ``tgt`` (k, width) ids padded with
    ``<pad>`` and ``sources`` (k,) each pair's source (None: pair i reads source i). The softmax
    still runs once per node of the targets' trie (the plan's depths, each node's features read
    from one of its pairs' positions): targets sharing a prefix share its softmax."""

    pairs: int
    width: int
    tgt: Slot
    sources: Optional[Slot]


@dataclass
class BatchPlan:
    """Everything one batch's device work reads: ``buffer`` (one int64 array, its pieces end to
    end) and where each piece lies in it; ``pair_index`` (k,) the window positions of the batch's pairs (the host's,
    to put the scores back in order); and the work it counts (for :class:`ScoringStats`)."""

    pair_index: np.ndarray
    buffer: np.ndarray
    parts: List[int]  # the lengths of the buffer's pieces, in order (each a slot)
    encoder: EncoderPlan
    depths: List[DepthPlan]  # the targets' trie (a one-pass plan's: its softmax's chunks and positions only)
    counts: Tuple[int, int, int, int, int, int]  # pairs, distinct sources, source words, encoder steps,
    #                                             target steps, decoder steps
    one_pass: Optional[OnePassPlan] = None

    def view(self, slot: Slot) -> np.ndarray:
        offset, length = slot
        return self.buffer[offset : offset + length]


def batches(settings: PlanSettings, source_rows: np.ndarray, source_lengths: np.ndarray,
            target_lengths: np.ndarray, batch_tokens: Optional[int] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Yield (pair indices (k,), whether each opens a new source (k,)) of about batch_tokens
    target tokens each: the pairs sorted by source (a source's pairs in input order), cut
    greedily (a batch takes pairs while their words + </s> fit, and at least one pair).

    A model that walks the trie of its sources (``sorted_sources``) gets them in lexicographic
    order, so that prefixes sit together; any other model encodes a padded batch (or the tries
    of both ends), so its sources come shortest first (then lexicographic), each batch padded to
    little more than its own lengths: the ``rescore`` of a reverse model encodes a hypothesis
    per pair. A batch whose sources each have one pair (a reverse model's) then takes them
    longest target first, so that the decoder rows of each depth are its first sources in
    order (the memory's rows read in place)."""
    if settings.sorted_sources:
        order = sorted_rows(source_rows)  # (n,)
    else:
        order = np.lexsort(np.vstack([source_rows[:, ::-1].T, source_lengths[None]])) if len(source_rows) \
            else np.zeros(0, np.int64)
    ordered = source_rows[order]
    opens_source = np.ones(len(order), bool)
    opens_source[1:] = (ordered[1:] != ordered[:-1]).any(1)
    tokens_through = np.cumsum(target_lengths[order] + 1)  # (n,) tokens of the sorted pairs up to each
    budget = batch_tokens or settings.batch_tokens
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


def plan_window(settings: PlanSettings, sources: "Sequence[Sequence[int]] | IdRows",
                targets: "Sequence[Sequence[int]] | IdRows", batch_tokens: Optional[int] = None) -> Iterator[BatchPlan]:
    """The plans of a window of pairs, batch by batch (lazily: a caller that runs each plan as it
    comes plans batch k + 1 while the device runs batch k)."""
    sources, targets = IdRows.of(sources), IdRows.of(targets)
    source_rows, source_lengths = sources.rows, sources.lengths  # (n, S), (n,)
    target_rows, target_lengths = targets.rows, targets.lengths  # (n, T), (n,)
    for pair_index, opens_source in batches(settings, source_rows, source_lengths, target_lengths, batch_tokens):
        pair_source = np.cumsum(opens_source) - 1  # (k,) each pair's source among the batch's
        firsts = pair_index[opens_source]
        yield plan_batch(settings, pair_index, source_rows[firsts], source_lengths[firsts],
                         target_rows[pair_index], target_lengths[pair_index], pair_source)


def plan_encoder(settings: PlanSettings, buffer: _Buffer, source_rows: np.ndarray,
                 lengths: np.ndarray) -> Tuple[EncoderPlan, int]:
    """The encoder's part of a plan for distinct sources ``source_rows`` (S, L) padded with
    :data:`NO_ID`, ``lengths`` (S,); and the encoder steps it runs."""
    width = max(int(lengths.max()), 1)
    rows = source_rows[:, :width]
    if settings.encoder == "affixes":
        return _plan_affixes(buffer, rows, lengths, width)
    src = buffer.add(np.where(rows == NO_ID, PAD_ID, rows))  # (S, width)
    plan = EncoderPlan(settings.encoder, len(rows), width, src_len=buffer.add(lengths), src=src)
    if settings.encoder == "padded":
        return plan, int(lengths.sum())
    trie = trie_of_rows(rows, lengths, settings.share_source_prefixes)
    for d, (keys, parents) in enumerate(zip(trie.keys, trie.parents)):
        plan.keys.append(buffer.add(keys))
        plan.parents.append(buffer.add(parents))
        ending = np.flatnonzero(lengths == d + 1)
        plan.endings.append((buffer.add(ending), buffer.add(trie.node_of[d][ending])) if len(ending) else None)
    return plan, trie.num_nodes


def _plan_affixes(buffer: _Buffer, rows: np.ndarray, lengths: np.ndarray, width: int) -> Tuple[EncoderPlan, int]:
    """A bidirectional encoder's part: the trie of the sources (``rows`` (B, S)) and the trie of
    their reversals, each shared prefix and each shared suffix run once. The encoder steps are
    the nodes of both tries, halved (a padded batch's step runs both directions)."""
    positions = np.arange(rows.shape[1])  # (S,)
    reaching = positions < lengths[:, None]  # (B, S)
    mirrored = np.where(reaching, lengths[:, None] - 1 - positions, 0)  # (B, S) the position read at depth j
    reversed_rows = np.where(reaching, np.take_along_axis(rows, mirrored, 1), NO_ID)  # (B, S)
    plan = EncoderPlan("affixes", len(rows), width, src_len=buffer.add(lengths))

    def walk(trie: PrefixTrie, mirror: bool) -> Tuple[List[Slot], List[Slot], Slot]:
        offsets = np.cumsum([0] + [len(k) for k in trie.keys])  # the first node of each depth
        nodes = np.full(rows.shape, trie.num_nodes, np.int64)  # (B, S) each position's node; padding: past them
        for d, node_of in enumerate(trie.node_of):
            ends = np.flatnonzero(lengths > d)  # the sources that reach depth d
            nodes[ends, lengths[ends] - 1 - d if mirror else d] = offsets[d] + node_of[ends]
        return [buffer.add(k) for k in trie.keys], [buffer.add(p) for p in trie.parents], buffer.add(nodes)

    prefixes, suffixes = trie_of_rows(rows, lengths), trie_of_rows(reversed_rows, lengths)
    plan.walks = [walk(prefixes, False), walk(suffixes, True)]
    return plan, (prefixes.num_nodes + suffixes.num_nodes) // 2


def plan_batch(settings: PlanSettings, pair_index: np.ndarray, source_rows: np.ndarray, source_lengths: np.ndarray,
               target_rows: np.ndarray, lengths: np.ndarray, pair_source: np.ndarray) -> BatchPlan:
    """The plan of one batch: ``source_rows`` (S, Ls) the distinct sources and ``target_rows``
    (k, Lt) the targets, padded with :data:`NO_ID`; ``lengths`` (k,) the target lengths M,
    ``pair_source`` (k,) each pair's source row."""
    buffer = _Buffer()
    encoder, encoder_steps = plan_encoder(settings, buffer, source_rows, source_lengths)
    targets = len(lengths)
    width = int(lengths.max())
    # the trie of (source, y_1 .. y_M): depth 0 is the source's root (previous word: none)
    sequences = np.concatenate([pair_source[:, None], target_rows[:, :width]], 1)  # (k, 1 + M_max)
    trie = trie_of_rows(sequences, lengths + 1, settings.share_target_prefixes)
    one_pass = settings.decoder == "one_pass" or (
        settings.decoder == "by_batch" and targets * (width + 1) <= settings.one_pass_ratio * trie.num_nodes)
    labels_at = np.full((targets, width + 1), NO_ID, np.int64)  # (k, M_max + 1): y_1 .. y_M, </s>
    labels_at[:, :width] = target_rows[:, :width]
    labels_at[np.arange(targets), lengths] = EOS_ID
    depths: List[DepthPlan] = []
    node_sources = np.zeros(0, np.int64)
    rows = settings.chunk_rows
    for d, (keys, parents) in enumerate(zip(trie.keys, trie.parents)):
        node_sources = keys if d == 0 else node_sources[parents]  # (n_d,) each node's source; a root's key is it
        in_place = np.array_equal(node_sources, np.arange(len(node_sources)))
        # one edge per pair reaching this depth: the next word, or </s> after the last one
        reaching = np.flatnonzero(lengths >= d)
        labels = labels_at[reaching, d]
        edge_nodes = trie.node_of[d][reaching]
        order = np.argsort(edge_nodes, kind="stable")  # the edges by node: each chunk of nodes owns a run
        sorted_nodes = edge_nodes[order]
        classes = labels[order] - FIRST_OUTPUT_ID
        chunks = []
        for start in range(0, len(keys), rows):
            lo, hi = np.searchsorted(sorted_nodes, [start, start + rows])
            if lo == hi:
                continue
            chunks.append((start, buffer.add(sorted_nodes[lo:hi] - start), buffer.add(classes[lo:hi]),
                           buffer.add(reaching[order[lo:hi]])))
        if one_pass:  # the nodes' features are read from the pass: a pair's position at each node
            representative = np.zeros(len(keys), np.int64)
            representative[edge_nodes] = reaching * (width + 1) + d
            depths.append(DepthPlan(nodes=len(keys), sources=None, keys=None, parents=None, chunks=chunks,
                                    rows=buffer.add(representative)))
            continue
        depths.append(DepthPlan(
            nodes=len(keys), sources=None if in_place else buffer.add(node_sources),
            keys=buffer.add(keys) if d else None, parents=buffer.add(parents) if d else None, chunks=chunks))
    counts = (targets, len(source_rows), int(source_lengths.sum()), encoder_steps, int(lengths.sum()) + targets,
              targets * (width + 1) if one_pass else trie.num_nodes)
    passed = plan_one_pass(buffer, target_rows[:, :width], pair_source) if one_pass else None  # before the buffer
    return BatchPlan(pair_index=pair_index, buffer=buffer.array(), parts=buffer.lengths(), encoder=encoder,
                     depths=depths, counts=counts, one_pass=passed)


def plan_one_pass(buffer: _Buffer, target_rows: np.ndarray, pair_source: np.ndarray) -> OnePassPlan:
    """The one pass's inputs: ``target_rows`` (k, width) padded with :data:`NO_ID`,
    ``pair_source`` (k,) each pair's source row."""
    k, width = target_rows.shape
    tgt = buffer.add(np.where(target_rows == NO_ID, PAD_ID, target_rows))  # (k, width)
    in_place = np.array_equal(pair_source, np.arange(k))
    return OnePassPlan(pairs=k, width=width, tgt=tgt, sources=None if in_place else buffer.add(pair_source))
