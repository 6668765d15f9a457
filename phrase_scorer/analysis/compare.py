"""Table 2 of the paper: for long source phrases, the top targets by the phrase table's direct
translation probability p(e|f) next to the top targets by the model.

The table is read once, in order, as Moses writes it (lines grouped by source). Sources of at
least ``min_words`` words with at least ``min_targets`` targets are candidates; the ``frequent``
ones have the largest source counts (the second number of the counts field), the ``rare`` ones
the smallest; a table without a candidate is refused, naming the limits. Only the chosen groups
are kept in memory. The model's score of a pair comes from
the table's own model column when the table was annotated by this model (its signature says
so), and from :class:`~phrase_scorer.scoring.batch_scorer.BatchScorer` otherwise.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple, cast

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.phrase_table import PhraseTableReader, TableLine
from phrase_scorer.records import Signature

DIRECT_PROBABILITY_COLUMN = 2  # p(e|f) in the four columns train-model.perl writes


@dataclass(frozen=True)
class CompareOptions:
    min_words: int = 4
    min_targets: int = 3
    top: int = 3
    frequent: int = 5  # sources with the largest counts
    rare: int = 5  # sources with the smallest counts
    table_column: int = DIRECT_PROBABILITY_COLUMN


@dataclass
class Comparison:
    source: str
    group: str  # "frequent", "rare" or "chosen"
    source_count: Optional[float]
    targets: int
    by_table: List[Tuple[str, float]] = field(default_factory=list)  # (target, p(e|f))
    by_model: List[Tuple[str, float]] = field(default_factory=list)  # (target, log p(y|x))


@dataclass
class _Group:
    source: str
    count: Optional[float]
    lines: List[Tuple[str, List[str], float, Optional[float]]]  # target, words, table score, annotated log p


def source_count(line: TableLine) -> Optional[float]:
    """The source phrase's corpus count from the counts field (target, source, pair counts)."""
    if len(line.fields) < 5:
        return None
    counts = line.fields[4].split()
    try:
        return float(counts[1]) if len(counts) >= 2 else None
    except ValueError:
        return None


def model_column(table: PathLike, weights_sha256: str) -> Optional[int]:
    """Index of the model's p(y|x) column if ``table`` was annotated with these weights."""
    try:
        signature = Signature.read(table)
        if signature is None or signature.model().weights_sha256 != weights_sha256:
            return None
    except PhraseScorerError:  # a damaged signature: the column is not known to be the model's
        return None
    columns, options = signature.get("columns", []), signature.get("options", {})
    if "prob" not in columns or options.get("length_normalize"):
        return None
    return int(signature.get("num_scores_before")) + columns.index("prob")


def groups(table: PathLike, options: CompareOptions, annotated_column: Optional[int]) -> Iterator[_Group]:
    """Consecutive runs of lines with one source phrase."""
    reader = PhraseTableReader(table)
    current: Optional[_Group] = None
    for line in reader:
        source = line.source
        scores = line.scores
        if options.table_column >= len(scores):
            raise PhraseScorerError(f"has {len(scores)} scores; there is no column {options.table_column}",
                                    path=table, line=line.line_number, hint=Text("choose ", setting("table_column")))
        annotated = None
        if annotated_column is not None and annotated_column < len(scores):
            annotated = math.log(max(scores[annotated_column], 1e-300))
        entry = (line.target, line.target_words, scores[options.table_column], annotated)
        if current is None or current.source != source:
            if current is not None:
                yield current
            current = _Group(source, source_count(line), [entry])
        else:
            current.lines.append(entry)
    if current is not None:
        yield current


def select(table: PathLike, options: CompareOptions, annotated_column: Optional[int],
           chosen: Sequence[str] = ()) -> List[Tuple[str, _Group]]:
    """The groups to show: the chosen sources, or the most frequent and the rarest candidates."""
    wanted = {" ".join(s.split()) for s in chosen}
    frequent: List[Tuple[float, str, int, _Group]] = []  # min-heap on count
    rare: List[Tuple[float, str, int, _Group]] = []  # min-heap on -count
    picked: List[Tuple[str, _Group]] = []
    for index, group in enumerate(groups(table, options, annotated_column)):
        if wanted:
            if group.source in wanted:
                picked.append(("chosen", group))
            continue
        if len(group.source.split()) < options.min_words or len(group.lines) < options.min_targets:
            continue
        count = group.count if group.count is not None else float(len(group.lines))
        for heap, key, size in ((frequent, count, options.frequent), (rare, -count, options.rare)):
            if size <= 0:
                continue
            item = (key, group.source, -index, group)
            if len(heap) < size:
                heapq.heappush(heap, item)
            elif item[:3] > heap[0][:3]:
                heapq.heapreplace(heap, item)
    if wanted:
        missing = wanted - {g.source for _, g in picked}
        if missing:
            raise PhraseScorerError(f"source phrase not in the table: {sorted(missing)[0]!r}", path=table,
                                    hint="give it tokenised and escaped as the table has it")
        return picked
    picked += [("frequent", g) for *_, g in sorted(frequent, reverse=True)]
    picked += [("rare", g) for *_, g in sorted(rare, reverse=True)]
    if not picked:  # an empty table would say nothing: name what qualifies instead
        if options.frequent <= 0 and options.rare <= 0:
            raise PhraseScorerError(Text(setting("frequent", 0), " and ", setting("rare", 0), " show no source phrase"),
                                    hint=Text("give ", setting("frequent"), " or ", setting("rare"),
                                              " a count, or choose sources with ", setting("sources")))
        raise PhraseScorerError(f"no source phrase of {options.min_words} words or more has {options.min_targets} "
                                "targets or more", path=table,
                                hint=Text("lower ", setting("min_words"), " or ", setting("min_targets"),
                                          ", or choose sources with ", setting("sources")))
    return picked


def compare(table: PathLike, loaded, options: CompareOptions = CompareOptions(),
            chosen: Sequence[str] = ()) -> List[Comparison]:
    """Top targets by table and by model for the selected sources of ``table``."""
    column = model_column(table, loaded.weights_sha256)
    picked = select(table, options, column, chosen)
    missing = [(g, i) for _, g in picked for i, entry in enumerate(g.lines) if entry[3] is None]
    if missing:
        from phrase_scorer.scoring.batch_scorer import BatchScorer

        scores = BatchScorer(loaded.model).score(
            [loaded.source_vocab.encode(g.source.split()) for g, _ in missing],
            [loaded.target_vocab.encode(g.lines[i][1]) for g, i in missing],
        )
        for (g, i), value in zip(missing, scores):
            target, words, table_score, _ = g.lines[i]
            g.lines[i] = (target, words, table_score, float(value))
    out = []
    for kind, g in picked:
        lines = [(target, words, table_score, cast(float, log_p))  # every log p is known now (scored above)
                 for target, words, table_score, log_p in g.lines]
        by_table = sorted(lines, key=lambda e: (-e[2], e[0]))[: options.top]
        by_model = sorted(lines, key=lambda e: (-e[3], e[0]))[: options.top]
        out.append(Comparison(
            source=g.source, group=kind, source_count=g.count, targets=len(lines),
            by_table=[(e[0], e[2]) for e in by_table], by_model=[(e[0], e[3]) for e in by_model],
        ))
    return out


def to_markdown(comparisons: Sequence[Comparison], display=lambda s: s) -> str:
    """One table per group, shaped like Table 2 of the paper."""
    parts = []
    titles = {"frequent": "Long, frequent source phrases", "rare": "Long, rare source phrases",
              "chosen": "Chosen source phrases"}
    for group in ("frequent", "rare", "chosen"):
        rows = [c for c in comparisons if c.group == group]
        if not rows:
            continue
        parts.append(f"**{titles[group]}**\n\n"
                     "| Source | Translation model, p(e\\|f) | RNN Encoder–Decoder, log p(y\\|x) |\n|---|---|---|")
        for c in rows:
            table = "<br>".join(f"{display(t)} ({p:.3g})" for t, p in c.by_table)
            model = "<br>".join(f"{display(t)} ({lp:.2f})" for t, lp in c.by_model)
            count = "" if c.source_count is None else f" (count {c.source_count:g}, {c.targets} targets)"
            parts.append(f"| {display(c.source)}{count} | {table} | {model} |")
        parts.append("")
    return "\n".join(parts)


def to_json(comparisons: Sequence[Comparison]) -> str:
    return json.dumps([asdict(c) for c in comparisons], ensure_ascii=False, indent=1)
