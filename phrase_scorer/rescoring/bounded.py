"""Each sentence's best hypothesis under a reranker, scoring a model only where it can change the choice.

``translate-system --moses --reranker`` needs one line per sentence, not every hypothesis's features.
A model feature's value is a log p, or a mean or per-token share of log p's: never above 0. So
while some of a hypothesis's models are still unscored, and the weights of their features are
positive, its weighted sum can only fall as they are scored: the sum with every unscored log p
taken as 0 is an upper bound. Per chunk of sentences (all in memory: a chunk holds at most
``chunk_sentences`` x N hypotheses):

1. the models of features weighted below 0 score every hypothesis (they bound nothing); the
   others score in the order of their features' weights, largest first;
2. before each model, per sentence, the open hypothesis with the highest bound is scored by
   every model left (in batches of PICK_BATCH_TOKENS: these share no source, and small batches
   keep every thread busy): the best exact sum so far, T, is a floor for the sentence's best;
3. the model then scores only the hypotheses whose bound is still at least T (less a margin far
   above the rounding of the sums); a hypothesis whose bound falls below T is out, and can never
   have been the best: its exact sum is below its bound.

The choice is then made as ``apply-reranker`` makes it on the fully rescored list (the same
rows, the same :func:`~phrase_scorer.rescoring.weights.weighted_sum` and
:func:`~phrase_scorer.rescoring.weights.best_of`, each row's values what ``rescore`` would print),
with each hypothesis that was out given its bound in place of the values never computed: the
same choice as on the list rescored with these scores. A feature with a negative weight has no
such bound, so while one of its models is unscored every hypothesis stays in, and a sentence
whose floor is not a finite number keeps every hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

from phrase_scorer.config import ScoringOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.nbest import (
    NBestEntry, dense_features, describe_layout, group_by_sentence, moses_rounded, read_nbest,
)
from phrase_scorer.rescoring.weights import Weights, best_hypothesis, check_layout, weighted_sum
from phrase_scorer.scoring.columns import check_finite, per_token
from phrase_scorer.rescoring.rescore import FeatureModel, feature_members, feature_names
from phrase_scorer.rescoring.nbest_work import model_inputs

# A hypothesis is out only when its bound is below the floor by more than this share of the
# floor's size (plus this much): far above the rounding of a sum of a few dozen terms.
BOUND_MARGIN = 1e-9
# Target tokens per batch of the floors' hypotheses (one per sentence, sharing no source): small
# batches, so that a chunk's picks (about 1,500 tokens for 100 sentences) keep every thread busy.
PICK_BATCH_TOKENS = 512


@dataclass
class BoundedStats:
    """How many (hypothesis, model) scores the chunk needed, of how many a full rescoring computes."""

    scored: int = 0
    full: int = 0


@dataclass(frozen=True)
class Reranking:
    """What picks each sentence's best hypothesis: the tuned weights, the dense features they
    leave out, the models of the features ``rescore`` adds (log p per predicted token with
    ``normalize``) and how those score."""

    weights: Weights
    ignore: Sequence[str]
    models: Sequence[FeatureModel]
    normalize: bool
    scoring_options: ScoringOptions


def best_hypotheses(nbest: Path, source: Path, reranking: Reranking, stats: Optional[BoundedStats] = None,
                    bound: bool = True) -> List[str]:
    """The best hypothesis of each sentence id 0 .. the list's largest (``""`` for an id without
    hypotheses), as ``apply-reranker`` picks it from ``nbest`` rescored with ``reranking.models``;
    see the module docstring. ``bound`` False scores every hypothesis with every model (the same
    choice)."""
    chunk = BoundedChunk(nbest, source, reranking, stats)
    staged = chunk.score_unbounded(bound)
    for stage, model in enumerate(staged):
        chunk.score_the_picks(staged[stage:])
        chunk.rule_out_below_the_floors()
        chunk.score_what_may_win(model)
    return chunk.choose()


class BoundedChunk:
    """The state of :func:`best_hypotheses` over one n-best list (a chunk of sentences), step by
    step: its H hypotheses in S sentences, each model's scores so far, which hypotheses may still
    be their sentence's best, and each sentence's floor."""

    def __init__(self, nbest: Path, source: Path, reranking: Reranking, stats: Optional[BoundedStats] = None) -> None:
        from phrase_scorer.scoring.batch_scorer import BatchScorer

        weights, models = reranking.weights, reranking.models
        self.nbest, self.source, self.weights, self.models = nbest, source, weights, models
        self.normalize, self.stats = reranking.normalize, stats
        sentences = [line.split() for line in source.read_text(encoding="utf-8").splitlines()]
        self.groups = [(sentence_id, list(entries)) for sentence_id, entries in group_by_sentence(read_nbest(nbest))]
        if not self.groups:
            raise PhraseScorerError("the n-best list is empty", path=nbest)
        self.entries: List[NBestEntry] = [e for _, group in self.groups for e in group]
        self.starts = np.cumsum([0] + [len(group) for _, group in self.groups])  # (S+1,) each sentence's first row
        self.names, self.members = feature_names(models), feature_members(models)
        self.w = np.asarray(weights.values, np.float64)
        self.moses_values = moses_rows(self.entries, weights, reranking.ignore, self.names, nbest)  # (H, D - F)
        self.feature_weights = self.w[self.moses_values.shape[1]:]  # (F,)
        self.words = [sentences[e.sentence_id] for e in self.entries]  # a list per sentence: looked up once a model
        self.scores: List[Optional[np.ndarray]] = [None] * len(models)  # per model: (H,) log p, NaN unscored
        self.scorers = [BatchScorer(m.loaded.model, reranking.scoring_options) for m in models]
        self.rounded: Dict[int, tuple] = {}  # per feature: (H,) the last means and (H,) their rounded values
        self.alive = np.ones(len(self.entries), bool)  # (H,) may still be its sentence's best
        self.complete = np.zeros(len(self.entries), bool)  # (H,) scored by every model
        self.floors = np.full(len(self.groups), -np.inf)  # (S,) the best exact sum among each sentence's complete ones

    # --- the steps ---------------------------------------------------------------------------------

    def score_unbounded(self, bound: bool) -> List[int]:
        """Step 1: the models of features that bound nothing (all of them without ``bound``) score
        every hypothesis; returns the other models, in the order they score."""
        if self.stats is not None:
            self.stats.full += len(self.entries) * len(self.models)
        order = scoring_order(self.members, self.feature_weights)
        first = full_prefix(order, self.members, self.feature_weights) if bound else len(order)
        for model in order[:first]:
            self.score(model, np.arange(len(self.entries)))
        return order[first:]

    def score_the_picks(self, models: Sequence[int]) -> None:
        """Step 2: the most promising hypothesis still open in each sentence, scored by every model
        in ``models`` (those left): a higher floor."""
        bounds = bounded_sums(self.sums, self.feature_rows)
        open_bounds = np.where(self.alive & ~self.complete, bounds, -np.inf)
        starts = self.starts
        picks = np.array([starts[s] + first_max(open_bounds[starts[s]:starts[s + 1]])
                          for s in range(len(self.groups))])
        picks = picks[self.alive[picks] & ~self.complete[picks]]
        for later in models:
            scored = self.scores[later]
            self.score(later, picks[np.isnan(scored[picks])] if scored is not None else picks, PICK_BATCH_TOKENS)
        self.complete[picks] = True

    def rule_out_below_the_floors(self) -> None:
        """Step 3a: each sentence's floor from its complete hypotheses; every hypothesis whose
        bound is below it (less the margin) is out."""
        exact = self.sums(self.feature_rows(True))
        bounds = bounded_sums(self.sums, self.feature_rows)
        for s in range(len(self.groups)):
            rows = slice(self.starts[s], self.starts[s + 1])
            if self.complete[rows].any():
                self.floors[s] = max(self.floors[s], float(np.max(exact[rows][self.complete[rows]])))
            floor = self.floors[s]
            if not np.isfinite(floor):
                continue
            below = bounds[rows] < floor - BOUND_MARGIN * (1.0 + abs(floor))  # NaN bounds stay in
            self.alive[rows] &= ~below

    def score_what_may_win(self, model: int) -> None:
        """Step 3b: ``model`` scores what may still win and it has not scored (the picks it has)."""
        self.score(model, np.flatnonzero(self.alive & np.isnan(self.scores[model])))  # type: ignore[arg-type]

    def choose(self) -> List[str]:
        """Each sentence's best, as ``apply-reranker`` chooses on the rescored rows; a hypothesis
        that is out gets its bound in place of the values never computed."""
        values = self.feature_rows(True)
        out_rows = ~self.alive
        if out_rows.any():  # what was never computed: the bound, below the floor, so never chosen
            values[out_rows] = self.feature_rows(False)[out_rows]
        chosen: Dict[int, str] = {}
        rows_all = np.concatenate([self.moses_values, values], 1)
        for s, (sentence_id, group) in enumerate(self.groups):
            chosen[sentence_id] = best_hypothesis(group, rows_all[self.starts[s]:self.starts[s + 1]], self.weights,
                                                  self.w, self.nbest)
        return [chosen.get(i, "") for i in range(self.groups[-1][0] + 1)]

    # --- what the steps share --------------------------------------------------------------------

    def score(self, model: int, rows: np.ndarray, batch_tokens: Optional[int] = None) -> None:
        """``model``'s log p (per token) of the hypotheses ``rows``."""
        if self.scores[model] is None:
            self.scores[model] = np.full(len(self.entries), np.nan)
        if not len(rows):
            return
        subset = [self.entries[i] for i in rows]
        src_ids, tgt_ids, predicted = model_inputs(self.models[model].side(), subset, [self.words[i] for i in rows],
                                                   self.source, self.nbest)
        log_probs = self.scorers[model].score(src_ids, tgt_ids, batch_tokens)
        check_finite(log_probs, str(self.nbest), subset[0].line_number)
        self.scores[model][rows] = per_token(log_probs, predicted) if self.normalize else log_probs  # type: ignore[index]
        if self.stats is not None:
            self.stats.scored += len(rows)

    def feature_rows(self, exact: bool) -> np.ndarray:
        """(H, F): each feature's value as rescore prints it, or with ``exact`` False, its bound
        where a member is unscored (0 for each unscored log p; NaN where no bound holds)."""
        size = len(self.entries)
        out = np.empty((size, len(self.names)))
        for f, model_indices in enumerate(self.members):
            stacked = np.stack([scores if (scores := self.scores[i]) is not None else np.full(size, np.nan)
                                for i in model_indices])  # (members, H)
            unscored = np.isnan(stacked)
            mean = np.mean(np.where(unscored, 0.0, stacked), axis=0) if len(model_indices) > 1 else \
                np.where(unscored[0], 0.0, stacked[0])
            last_mean, values = self.rounded.get(f, (None, np.zeros(size)))
            changed = np.ones(size, bool) if last_mean is None else last_mean != mean  # only scores move it
            values[changed] = [moses_rounded(float(v)) for v in mean[changed]]
            self.rounded[f] = (mean, values)
            out[:, f] = values
            if not exact and self.feature_weights[f] < 0:
                out[unscored.any(0), f] = np.nan  # a negative weight: no upper bound
        return out

    def sums(self, values: np.ndarray) -> np.ndarray:
        """(H,) the weighted sums of the decoder's features and ``values`` (H, F)."""
        return np.asarray(weighted_sum(np.concatenate([self.moses_values, values], 1), self.w), np.float64)


def scoring_order(members: Sequence[Sequence[int]], feature_weights: np.ndarray) -> List[int]:
    """The models in the order they score: those of features weighted below 0 first (they bound
    nothing), then by their feature's weight, largest first (a large weight's log p moves the sums
    most, so it rules most hypotheses out), the models of a feature together."""
    features = sorted(range(len(members)), key=lambda f: (feature_weights[f] >= 0, -feature_weights[f]))
    return [model for f in features for model in members[f]]


def full_prefix(order: Sequence[int], members: Sequence[Sequence[int]], feature_weights: np.ndarray) -> int:
    """How many models of ``order`` score every hypothesis: those of negatively weighted features."""
    negative = {model for f, models in enumerate(members) if feature_weights[f] < 0 for model in models}
    count = 0
    while count < len(order) and order[count] in negative:
        count += 1
    return count


def bounded_sums(sums, feature_rows) -> np.ndarray:
    """(H,) each hypothesis's weighted sum with every unscored log p taken as 0: an upper bound of
    its sum; NaN where a feature with a negative weight is unscored."""
    values = feature_rows(False)
    bounds = sums(np.nan_to_num(values, nan=0.0))
    bounds[np.isnan(values).any(1)] = np.nan
    return bounds


def first_max(values: np.ndarray) -> int:
    """The first of the largest ``values``; NaN (no bound) counts as the largest."""
    if np.isnan(values).any():
        return int(np.flatnonzero(np.isnan(values))[0])
    return int(np.argmax(values))


def moses_rows(entries: Sequence[NBestEntry], weights: Weights, ignore: Sequence[str], names: Sequence[str],
               nbest: Path) -> np.ndarray:
    """(H, D - F): each hypothesis's decoder features, checked to be the weights' layout but for
    the model features ``names`` (which rescore appends last, in that order)."""
    rows = []
    expected = tuple((name, count) for name, count in weights.layout if name not in names)
    if tuple(name for name, _ in weights.layout[len(expected):]) != tuple(names):
        raise PhraseScorerError(f"the reranker's features are {describe_layout(weights.layout)}, but its models add "
                                f"{', '.join(names)} last", hint="tune the reranker again")
    for entry in entries:
        found, values = dense_features(entry, ignore)
        check_layout(found, expected, weights, nbest, entry)
        rows.append(values)
    return np.array(rows, np.float64).reshape(len(entries), sum(count for _, count in expected))
