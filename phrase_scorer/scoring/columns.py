"""The columns Moses reads: how a model's log p and a count of unknown words become values in a
phrase table (Moses takes the natural log of every column and floors it at -100), and the rules
every written score follows (finite; per predicted token when asked). One home for annotate's
columns and rescore's features."""

from __future__ import annotations

from typing import Dict, List

import numpy as np

from phrase_scorer.config import AnnotateOptions
from phrase_scorer.errors import PhraseScorerError

LOG_FLOOR = -100.0  # Moses floors the log of every column here (LOWEST_SCORE in moses/TypeDef.h)
UNK_CAP = 88  # the unk column is exp(min(n, UNK_CAP)): e^88 < 3.4e38, the largest 32-bit float Moses reads


def check_finite(log_probs: np.ndarray, path: str, first_line: int) -> None:
    """Refuse a NaN or infinite score; ``first_line`` is the input line of ``log_probs[0]``."""
    if not np.isfinite(log_probs).all():
        bad = int(np.flatnonzero(~np.isfinite(log_probs))[0])
        raise PhraseScorerError("the model gave a non-finite score", path=path, line=first_line + bad,
                                hint="the model weights are damaged")


def per_token(log_probs: np.ndarray, target_lengths: np.ndarray) -> np.ndarray:
    """log p divided by the number of predicted tokens: the ``target_lengths`` target words and ``</s>``."""
    return log_probs / (np.asarray(target_lengths, np.float64) + 1)


def column_values(log_probs: np.ndarray, unknown: np.ndarray, target_lengths: np.ndarray,
                  options: AnnotateOptions) -> List[List[float]]:
    """The values of each appended column (``options.columns``, in order), one per pair: the
    probability (per token with ``length_normalize``) with its log floored at LOG_FLOOR, and
    e^(unknown words) capped at e^UNK_CAP."""
    if options.length_normalize:
        log_probs = per_token(log_probs, target_lengths)
    probs = np.exp(np.maximum(log_probs, LOG_FLOOR)).tolist()
    counts = np.exp(np.minimum(unknown, UNK_CAP).astype(np.float64)).tolist()
    return [probs if column == "prob" else counts for column in options.columns]


def column_encoding(options: AnnotateOptions, unknown_unit: str = "words") -> Dict[str, str]:
    """What each appended column holds, as the signature records it; ``unknown_unit``: what the
    unknown-word count counts, ``words`` outside the shortlists, or a subword model's ``pieces``
    (``<unk>`` pieces: characters never seen in training)."""
    prob = "exp(log p / (target words + 1))" if options.length_normalize else "exp(log p)"
    unknown = ("unknown words" if unknown_unit == "words"
               else "<unk> pieces (characters the subword model never saw)")
    described = {"prob": f"{prob}, log p floored at {LOG_FLOOR:g}",
                 "unk": f"exp(min({unknown}, {UNK_CAP})), {unknown} on the {options.unk_side} side"}
    return {column: described[column] for column in options.columns}
