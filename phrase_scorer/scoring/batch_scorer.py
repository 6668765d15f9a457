"""BatchScorer: log p(y|x) for many phrase pairs at once, doing each piece of work once.

Every command that needs a model score (``score``, ``annotate``, ``sample``, ``compare``) asks
this scorer; nothing else computes one. Steps 1-4's index work is the batch's *plan*, built with
numpy alone (:mod:`phrase_scorer.scoring.batch_plan`), in a worker process where a command has
them (``annotate``, ``rescore``); this class runs plans on the device. Given a window of pairs it

1. groups the pairs by source and sorts the distinct sources, so that sources sharing a prefix
   (``a man``, ``a man in``, ``a man in a``: a phrase table lists every sub-phrase) sit together
   (a model that pads its sources instead takes them shortest first: :func:`batch_plan.batches`);
2. cuts the window into batches of about ``batch_tokens`` target tokens, keeping a source's
   targets together (a batch whose sources each have one target, a reverse model's, takes them
   longest target first);
3. encodes each distinct source of a batch once (``model.encode``: a memory of one row per
   source, holding every per-source term of the decoder); a model whose encoder reads left to
   right (``shares_source_prefixes``: the encoder-decoder) walks the *trie* of the sources depth
   by depth instead, so a shared prefix is run through the encoder once; a bidirectional encoder
   (``shares_source_affixes``: RNNsearch) walks the trie of the sources and that of their
   reversals, so a shared prefix and a shared suffix each run once (:meth:`_encode`);
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

On a GPU a batch's plan goes over in one copy through pinned memory, without waiting; the host
reads a batch's scores (copied back as the device finishes them) once the next batch is
launched, so the device never waits for the host's reading; and a batch with a score that is not
finite (the softmax's rare overflow, below) is scored again with those rows summed exactly.

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

import itertools
import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, cast

import numpy as np
import torch
from torch import Tensor

from phrase_scorer.config import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, ONE_PASS_POSITIONS_PER_NODE, ScoringOptions
from phrase_scorer.data.padding import IdRows, pad_ids
from phrase_scorer.runtime.device import HALF_PRECISIONS, device_label, precision_context, resolve_precision
from phrase_scorer.models.base import Memory, TranslationModel, TrieWalk, at_least_fp32
from phrase_scorer.scoring.batch_plan import (BatchPlan, DepthPlan, EncoderPlan, PlanSettings, Slot,
                                              plan_window)
from phrase_scorer.scoring.int8_output import Int8Product, int8_engine
from phrase_scorer.vocab import PAD_ID

if TYPE_CHECKING:  # the encoders that share work between sources (imported for their types only)
    from phrase_scorer.models.encdec import RNNEncoderDecoder
    from phrase_scorer.models.rnnsearch import RNNsearch


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


def default_batch_tokens(device: torch.device) -> int:
    """Target tokens per batch on ``device`` when ``ScoringOptions.batch_tokens`` is None
    (config.CPU_BATCH_TOKENS, config.GPU_BATCH_TOKENS)."""
    return CPU_BATCH_TOKENS if device.type == "cpu" else GPU_BATCH_TOKENS


CPU_CHUNK_ROWS = 128  # at least this many rows of logits at once
CPU_CHUNK_BYTES = 2 << 20  # on a CPU, more rows while a chunk's fp32 logits fit in this much cache
GPU_CHUNK_BYTES = 256 << 20  # on a GPU, a chunk's fp32 logits fill this much: few, large kernels
BATCHES_IN_FLIGHT = 1  # on a GPU, batches launched ahead of the one whose scores the host waits for


def default_chunk_rows(device: torch.device, outputs: int) -> int:
    """Rows of logits formed at once on ``device`` for a softmax over ``outputs`` words when
    ``ScoringOptions.chunk_rows`` is None. Each chunk costs a dozen operations' fixed cost (on a
    GPU, kernel launches), which outweighs the arithmetic of a few rows over a small vocabulary.
    On a CPU a large vocabulary's chunk stays at 128 rows (every preset but ``tiny``: 6,000 words
    and more); ``tiny``'s 500 words get about 1,000 rows."""
    budget = CPU_CHUNK_BYTES if device.type == "cpu" else GPU_CHUNK_BYTES
    return max(CPU_CHUNK_ROWS, budget // (4 * outputs))


Scored = Tuple[BatchPlan, Tuple[np.ndarray, ScoringStats]]  # a batch's plan, its scores and its work


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
        (:func:`phrase_scorer.scoring.batch_plan.plan_encoder`)."""
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
        if self.decoding == "one_pass":  # every position at once, not step by step: last digits move
            described["decoding"] = "one pass"
        elif self.decoding == "by_batch":
            described["decoding"] = f"one pass where at most {ONE_PASS_POSITIONS_PER_NODE:g} positions per trie node"
        if self.device.type == "cpu":
            described["threads"] = threads = torch.get_num_threads()
            if threads > 1:  # whole batches per thread give one thread's scores
                described["thread_split"] = self.options.thread_split
        return described

    def plan_settings(self) -> PlanSettings:
        """What this scorer's batch plans depend on (:mod:`phrase_scorer.scoring.batch_plan`):
        a worker given it plans windows that :meth:`score_plans` runs."""
        model = self.model
        encoder = "affixes" if self.encodes_by_affixes else "prefixes" if model.shares_source_prefixes else "padded"
        return PlanSettings(batch_tokens=self.batch_tokens, chunk_rows=self.chunk_rows, encoder=encoder,
                            sorted_sources=model.shares_source_prefixes,
                            share_source_prefixes=self.options.share_source_prefixes,
                            share_target_prefixes=self.options.share_target_prefixes,
                            decoder=self.decoding, one_pass_ratio=ONE_PASS_POSITIONS_PER_NODE)

    @property
    def decoding(self) -> str:
        """How a batch's targets are decoded (:data:`batch_plan.DECODERS`): step by step through
        their trie; in one teacher-forced pass (a model that offers it, ``scores_in_one_pass``,
        with ``options.one_pass`` True, or None on a GPU); or, on a CPU by default, each batch
        the way that computes less (config.ONE_PASS_POSITIONS_PER_NODE)."""
        one_pass = self.options.one_pass
        if not self.model.scores_in_one_pass or one_pass is False:
            return "trie"
        return "one_pass" if one_pass or self.device.type != "cpu" else "by_batch"

    def score(self, sources: "Sequence[Sequence[int]] | IdRows",
              targets: "Sequence[Sequence[int]] | IdRows", batch_tokens: Optional[int] = None) -> np.ndarray:
        """Natural-log log p(target | source) for each pair, float64, in input order.

        Ids are vocabulary ids (unknown words as ``<unk>``), as sequences or :class:`IdRows`;
        phrases must not be empty. ``batch_tokens``: this call's batches instead of the scorer's.
        The batches are planned here, each while the device runs the one before.
        """
        if len(sources) != len(targets):
            raise ValueError("sources and targets differ in length")
        if not len(sources):
            return np.zeros(0, np.float64)
        return self.score_plans(plan_window(self.plan_settings(), sources, targets, batch_tokens), len(sources))

    def score_plans(self, plans: Iterable[BatchPlan], pairs: int) -> np.ndarray:
        """The scores of a window of ``pairs`` pairs from its batches' plans (built by
        :func:`~phrase_scorer.scoring.batch_plan.plan_window` with :meth:`plan_settings`, here or
        in a worker), in the window's order.

        On a GPU the host waits for batch k's scores only once batch k + 1 is on its way (the
        scores come back in pinned memory as the device finishes them); on a CPU with several
        threads, each thread scores whole batches (the module docstring)."""
        out = np.zeros(pairs, np.float64)
        self.model.eval()  # no training dropout, whatever mode a caller left the model in
        scored: Iterable[Scored]
        threads = torch.get_num_threads() if self.device.type == "cpu" else 1
        if self.device.type == "cuda":
            scored = self._score_overlapped(plans)
        elif threads > 1 and self.options.thread_split == "batches":
            plans = list(plans)
            scored = batches_on_threads(self._score_plan, plans, threads) if len(plans) > 1 else \
                ((plan, self._score_plan(plan)) for plan in plans)
        else:
            scored = ((plan, self._score_plan(plan)) for plan in plans)
        for plan, (scores, stats) in scored:
            out[plan.pair_index] = scores
            self.stats.add(stats)
        return out

    # --- running a plan ----------------------------------------------------------------------------

    def _score_plan(self, plan: BatchPlan) -> Tuple[np.ndarray, ScoringStats]:
        """A batch's scores (its one wait for the device) and its work."""
        with torch.inference_mode(), precision_context(self.device, self.precision):
            scores, not_finite = self._run(plan)
            return self._finished(plan, scores.cpu().numpy(), int(not_finite))

    def _finished(self, plan: BatchPlan, scores: np.ndarray, not_finite: int) -> Tuple[np.ndarray, ScoringStats]:
        """A batch's scores and work once they are back; a batch with a score that is not finite
        (rare: a softmax row whose shifted sum overflowed, see :class:`OutputSoftmax`) is scored
        again with those rows' normaliser computed exactly."""
        stats = ScoringStats(*plan.counts)
        if not_finite:
            exact_rows: List[int] = []
            with torch.inference_mode(), precision_context(self.device, self.precision):
                scores = self._run(plan, exact_rows)[0].cpu().numpy()
            stats.exact_softmax_rows += sum(exact_rows)
        return scores, stats

    def _score_overlapped(self, plans: Iterable[BatchPlan]) -> Iterator["Scored"]:
        """On a GPU: each batch's scores, and how many of them are not finite, copied back into
        pinned memory as the device finishes them, read once the next batch is launched (an event
        per batch)."""
        pending: Deque[Tuple[BatchPlan, Tensor, Tensor, Any]] = deque()
        for plan in plans:
            with torch.inference_mode(), precision_context(self.device, self.precision):
                scores, not_finite = self._run(plan)
                host_scores = torch.empty(scores.shape, dtype=scores.dtype, pin_memory=True)
                host_not_finite = torch.empty((), dtype=not_finite.dtype, pin_memory=True)
                host_scores.copy_(scores, non_blocking=True)
                host_not_finite.copy_(not_finite, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
            pending.append((plan, host_scores, host_not_finite, done))
            while len(pending) > BATCHES_IN_FLIGHT:
                yield self._collected(*pending.popleft())
        while pending:
            yield self._collected(*pending.popleft())

    def _collected(self, plan: BatchPlan, host_scores: Tensor, host_not_finite: Tensor, done: Any) -> "Scored":
        done.synchronize()
        return plan, self._finished(plan, host_scores.numpy(), int(host_not_finite))

    def _slots(self, plan: BatchPlan) -> Callable[..., Tensor]:
        """``take(slot, shape=None)``: a piece of the plan's buffer as a long tensor on the device,
        a view of one split of the buffer (one operator for all the pieces, not a tensor made per
        piece). The buffer goes to a GPU in one copy through pinned memory, without waiting; on the
        CPU the pieces are the plan's own memory (no copy)."""
        buffer = torch.from_numpy(plan.buffer)
        if self.device.type == "cuda":
            buffer = buffer.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            buffer = buffer.to(self.device)
        pieces = dict(zip(itertools.accumulate(plan.parts, initial=0), buffer.split(plan.parts)))  # one operator
        empty = buffer[:0]

        def take(slot: Slot, shape: Optional[Tuple[int, int]] = None) -> Tensor:
            piece = pieces[slot[0]] if slot[1] else empty
            return piece if shape is None else piece.view(shape)

        return take

    def _run(self, plan: BatchPlan, exact_rows: Optional[List[int]] = None) -> Tuple[Tensor, Tensor]:
        """log p of each pair of the plan's batch (float64, on the device) and the number of those
        that are not finite (a 0-dim tensor, read after the batch: a pair through a softmax row
        whose shifted sum overflowed, see :class:`OutputSoftmax`, unless ``exact_rows`` asks for
        such rows to be recomputed exactly). Without ``exact_rows`` nothing here waits for the
        device.

        The decoder runs step by step through the targets' trie (:meth:`_run_steps`) or, for a
        one-pass plan, once over the padded targets (:meth:`_run_one_pass`)."""
        take = self._slots(plan)
        memory = self._encode(plan.encoder, take)  # S rows
        scores = torch.zeros(plan.counts[0], dtype=torch.float64, device=self.device)
        if plan.one_pass is not None:
            self._run_one_pass(memory, plan, scores, take, exact_rows)
        else:
            self._run_steps(memory, plan, scores, take, exact_rows)
        return scores, (~torch.isfinite(scores)).sum()

    def _run_steps(self, memory: Memory, plan: BatchPlan, scores: Tensor, take: Callable[..., Tensor],
                   exact_rows: Optional[List[int]]) -> None:
        """Add log p of every word and ``</s>`` of the batch's targets to their pairs' scores,
        decoding their trie depth by depth: ``memory.select`` the nodes' sources (or
        ``memory.first`` when they are the batch's first sources in order), one ``model.step``
        per depth, and the softmax at each edge's label in chunks of ``chunk_rows`` nodes."""
        model = self.model
        states: Optional[Tensor] = None  # the last depth's (n_d, D)
        for d, depth in enumerate(plan.depths):
            rows = memory.first(depth.nodes) if depth.sources is None else memory.select(take(depth.sources))
            if d == 0:
                prev = torch.full((depth.nodes,), PAD_ID, dtype=torch.long, device=self.device)  # no y_0
                parent_states = model.start(rows)  # (n_0, D)
            else:
                assert states is not None  # set at depth 0
                parent_states = states[take(depth.parents)]  # (n_d, D)
                prev = take(depth.keys)  # (n_d,) y_d
            states, features = model.step(rows, parent_states, prev)  # (n_d, D), (n_d, R)
            self._add_edge_log_probs(scores, features, depth, take, exact_rows)

    def _run_one_pass(self, memory: Memory, plan: BatchPlan, scores: Tensor, take: Callable[..., Tensor],
                      exact_rows: Optional[List[int]]) -> None:
        """Add log p of every word and ``</s>`` of the batch's targets to their pairs' scores: the
        decoder runs once over the padded targets (a model that ``scores_in_one_pass``), and the
        softmax once per node of the targets' trie, at one of its pairs' positions."""
        one_pass = plan.one_pass
        assert one_pass is not None
        rows = memory.first(one_pass.pairs) if one_pass.sources is None else memory.select(take(one_pass.sources))
        tgt = take(one_pass.tgt, (one_pass.pairs, one_pass.width))  # (k, width)
        features = self.model.teacher_forced_features(rows, tgt).flatten(0, 1)  # (k * (width + 1), R)
        for depth in plan.depths:
            assert depth.rows is not None  # a one-pass plan's depths name their positions
            self._add_edge_log_probs(scores, features.index_select(0, take(depth.rows)), depth, take, exact_rows)

    def _encode(self, plan: EncoderPlan, take: Callable[..., Tensor]) -> Memory:
        """The memory of the batch's distinct sources (one row each): a left-to-right encoder
        (``"prefixes"``) walks the trie of the sources, running each shared prefix once; a
        bidirectional one (``"affixes"``) the tries of their prefixes and suffixes; any other
        encodes the padded sources."""
        model = self.model
        shape = (plan.sources, plan.width)
        if plan.kind == "affixes":
            src_len = take(plan.src_len)
            prefixes, suffixes = (TrieWalk([take(k) for k in keys], [take(p) for p in parents], take(positions, shape))
                                  for keys, parents, positions in plan.walks)
            return cast("RNNsearch", model).encode_by_affixes(prefixes, suffixes, src_len)  # its encoder's kind
        assert plan.src is not None
        src, src_len = take(plan.src, shape), take(plan.src_len)  # (S, L), (S,)
        if plan.kind == "padded":
            return model.encode(src, src_len)
        prefix_model = cast("RNNEncoderDecoder", model)  # "prefixes": a left-to-right encoder's kind
        final_states: Optional[Tensor] = None
        states: Optional[Tensor] = None
        for d, (keys, parents, ending) in enumerate(zip(plan.keys, plan.parents, plan.endings)):
            states = prefix_model.source_prefix_step(take(keys), states[take(parents)] if states is not None and d
                                                     else None)  # (n_d, H)
            if final_states is None:
                final_states = states.new_zeros((plan.sources, states.size(1)))  # (S, H)
            if ending is not None:  # the sources that end at this depth, and their nodes
                final_states[take(ending[0])] = states[take(ending[1])]
        assert final_states is not None  # every source ends at some depth
        return prefix_model.encode_from_final_states(final_states, src, src_len)

    def _add_edge_log_probs(self, scores: Tensor, features: Tensor, depth: DepthPlan, take: Callable[..., Tensor],
                            exact_rows: Optional[List[int]]) -> None:
        """Add log p(label | node) of each edge of a depth to its pair's score (``scores`` (k,)),
        with logits formed ``chunk_rows`` nodes at a time (each chunk owns a run of the edges
        sorted by node). A pair has one edge per depth, so each addition lands on its own score.
        ``exact_rows``: see :meth:`OutputSoftmax.log_probs`."""
        rows = self.chunk_rows
        whole = features.size(0) <= rows
        for start, local, classes, pairs in depth.chunks:
            picked = self.softmax.log_probs(features if whole else features[start : start + rows], take(local),
                                            take(classes), exact_rows)
            scores.index_add_(0, take(pairs), picked.double())

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
                  exact_rows: Optional[List[int]] = None) -> Tensor:
        """log p(classes[i] | features[rows[i]]): features (n, R); rows, classes (k,) -> (k,).
        The log p of a row whose shifted sum overflowed is not finite, unless ``exact_rows`` (a
        list) is given: those rows' normaliser is then recomputed exactly and their number
        appended to it, which waits for the device; without it nothing here does."""
        if features.dtype not in (torch.float32, torch.float64) or torch.is_autocast_enabled():
            logits = at_least_fp32(self.output_layer(features))  # (n, V')
            return logits[rows, classes] - torch.logsumexp(logits, -1)[rows]
        with_bias = torch.cat([features, features.new_ones((features.size(0), 1))], 1)  # (n, R+1)
        shift = (with_bias @ self.probe_t).amax(1, keepdim=True)  # (n, 1) = U, in bits
        if self.int8 is not None:  # U from fp32 logits is a reference point, not a bound, for int8 ones
            shifted = self.int8(features).sub_(shift)  # (n, V') = logits - U, in bits
        else:
            assert self.weight_t is not None  # None only beside an int8 product
            shifted = torch.cat([with_bias, -shift], 1) @ self.weight_t  # (n, V') = logits - U, in bits
        picked = shifted[rows, classes]  # (k,)
        log_sum = shifted.exp2_().sum(1).log2_()  # (n,) = log2-sum-exp2 - U, >= 0 unless it overflowed
        if exact_rows is not None:
            overflowed = ~torch.isfinite(log_sum)  # (n,)
            exact_rows.append(int(overflowed.sum()))
            if exact_rows[-1]:
                log_sum[overflowed] = self.exact(features[overflowed]) * LOG2_E - shift[overflowed, 0]
        return (picked - log_sum[rows]) * LN_2


def batches_on_threads(score_plan: Callable[[BatchPlan], Any], plans: Sequence[BatchPlan],
                       threads: int) -> List[Tuple[BatchPlan, Any]]:
    """(plan, ``score_plan(plan)``) of every batch, scored by ``threads`` threads that each take
    whole batches and run torch's operations on one thread: a batch's scores are those one
    thread computes, whichever thread scores it. The caller's thread count is kept. Torch's modes
    are per thread: each batch enters its own (inference mode, precision), and a mode the caller
    entered (a flop counter, say) does not see the work."""
    caller_threads = torch.get_num_threads()

    def one_thread() -> None:
        torch.set_num_threads(1)

    try:
        with ThreadPoolExecutor(threads, initializer=one_thread, thread_name_prefix="phrase-scorer-batches") as pool:
            futures = [(plan, pool.submit(score_plan, plan)) for plan in plans]
            return [(plan, future.result()) for plan, future in futures]
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
