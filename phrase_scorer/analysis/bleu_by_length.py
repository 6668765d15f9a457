"""BLEU by source sentence length (Bahdanau et al. 2015, Figure 2).

The sentences of a test set are put into buckets by the number of words of their source
sentence: ranges of ``width`` words (1-5, 6-10, ...; an empty source counts in the first), from
the shortest up. A range with fewer than ``min_count`` sentences is joined with the next ones
until the bucket has ``min_count``; what is left at the long end, short of ``min_count``, joins
the last bucket. Each system's BLEU on a bucket is the corpus BLEU of that bucket's sentences,
computed by :func:`phrase_scorer.moses.evaluate.score` with the tokenisation it chooses for the
whole set's references, so every bucket and system is scored the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Sequence

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.paths import PathLike

DEFAULT_WIDTH = 5
DEFAULT_MIN_COUNT = 50


@dataclass
class LengthBucket:
    shortest: int  # source words
    longest: int
    lines: List[int]  # 0-based indices of the sentences in the bucket

    @property
    def label(self) -> str:
        return f"{self.shortest}–{self.longest}" if self.longest != self.shortest else str(self.shortest)


@dataclass
class BleuByLength:
    buckets: List[LengthBucket]
    bleu: Dict[str, List[float]]  # system -> BLEU of each bucket
    bleu_signature: str


def length_buckets(lengths: Sequence[int], width: int = DEFAULT_WIDTH,
                   min_count: int = DEFAULT_MIN_COUNT) -> List[LengthBucket]:
    """The buckets of sentences with source lengths ``lengths``; see the module docstring."""
    if width < 1 or min_count < 1:
        raise PhraseScorerError("bucket width and minimum count must be at least 1")
    if not lengths:
        raise PhraseScorerError("no sentences to put into length buckets")
    ranges: Dict[int, List[int]] = {}
    for index, length in enumerate(lengths):
        ranges.setdefault(max(length - 1, 0) // width, []).append(index)
    buckets: List[LengthBucket] = []
    open_lines: List[int] = []
    start = 0
    for k in range(max(ranges) + 1):
        open_lines += ranges.get(k, [])
        if len(open_lines) >= min_count:
            buckets.append(LengthBucket(start * width + 1, (k + 1) * width, open_lines))
            open_lines, start = [], k + 1
    if open_lines or not buckets:
        if buckets:
            buckets[-1].lines += open_lines
        else:
            buckets.append(LengthBucket(1, 0, open_lines))
    buckets[0].shortest = min(1, min(lengths))
    buckets[-1].longest = max(lengths)
    return buckets


def bleu_by_length(sources: Sequence[str], references: Sequence[str], systems: Mapping[str, Sequence[str]], *,
                   width: int = DEFAULT_WIDTH, min_count: int = DEFAULT_MIN_COUNT, kind: str = "auto",
                   lang: str = "fr") -> BleuByLength:
    """Each system's BLEU on each source-length bucket. ``sources`` and ``references`` are the
    test set's lines, ``systems`` maps a name to its hypotheses (tokenised, line-aligned)."""
    from phrase_scorer.moses.evaluate import references_kind, score

    if len(references) != len(sources):
        raise PhraseScorerError(f"{len(sources)} source sentences but {len(references)} references")
    for name, hypotheses in systems.items():
        if len(hypotheses) != len(sources):
            raise PhraseScorerError(f"system {name!r} has {len(hypotheses)} lines for {len(sources)} source sentences")
    kind = references_kind(references, kind)  # one tokenisation for every bucket
    buckets = length_buckets([len(line.split()) for line in sources], width, min_count)
    bleu: Dict[str, List[float]] = {name: [] for name in systems}
    signature = ""
    for bucket in buckets:
        bucket_references = [references[i] for i in bucket.lines]
        for name, hypotheses in systems.items():
            evaluation = score([hypotheses[i] for i in bucket.lines], bucket_references, kind=kind, lang=lang)
            bleu[name].append(evaluation.bleu)
            signature = evaluation.bleu_signature
    return BleuByLength(buckets=buckets, bleu=bleu, bleu_signature=signature)


def plot_bleu_by_length(result: BleuByLength, output: PathLike, *, title: str = "",
                        width: float = 7.0, height: float = 4.5, dpi: int = 100) -> None:
    """BLEU against source length, a line per system, each bucket labelled with its sentences."""
    from phrase_scorer.analysis.plots import require_matplotlib, save_figure

    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    positions = range(len(result.buckets))
    for (name, values), marker in zip(result.bleu.items(), "osD^v<>p*h"):
        ax.plot(positions, values, marker=marker, label=name)
    ax.set_xticks(positions, [f"{b.label}\n({len(b.lines)})" for b in result.buckets], fontsize=8)
    ax.set_xlabel("source sentence length in words (sentences)")
    ax.set_ylabel("BLEU")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, output)
    plt.close(fig)
