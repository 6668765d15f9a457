"""Scoring: the batch scorer, the columns Moses reads, and the score, annotate and rescore verbs."""

# ``phrase_scorer.scoring`` was the batch scorer's module before it became this package.
_BATCH_SCORER_NAMES = {"BatchScorer", "ScoringStats", "pad", "build_trie", "scorer_for_worker", "default_chunk_rows",
                       "log_probs_by_forward", "default_threads"}


def __getattr__(name: str):
    if name in _BATCH_SCORER_NAMES:
        home = "runtime.threads" if name == "default_threads" else "scoring.batch_scorer"
        raise ImportError(f"phrase_scorer.scoring.{name} moved to phrase_scorer.{home} (docs/layout.md)", name=__name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
