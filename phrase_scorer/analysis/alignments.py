"""Soft alignments of an RNNsearch model as heat maps (Bahdanau et al. 2015, Figure 3).

For a sentence pair (x, y), pixel (i, j) shows alpha_ij, the weight the model gives the
annotation of source word x_j when it predicts target word y_i (the last row: ``</s>``), with y
fed teacher-forced, in grey scale from black (0) to white (1). The target may be a reference
translation or the model's own (``phrase-scorer translate``). Source words outside the model's
shortlist are read as ``<unk>`` but labelled as they are written. Each pair is drawn into a PNG
of its own. An encoder-decoder model has no alignment and is refused.
"""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import AlignmentPlotOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.vocab import word_spans

@dataclass
class AlignedPair:
    line: int  # 1-based line number in the source and target files
    source: List[str]
    target: List[str]
    weights: np.ndarray  # (len(target) + 1, len(source)): alpha_ij, the last row for </s>


@dataclass
class AlignmentPlot:
    pair: AlignedPair
    png: str


def require_alignments(loaded) -> None:
    """Refuse a model without soft alignments (the encoder-decoder)."""
    if not getattr(loaded.model, "has_alignments", False):
        raise PhraseScorerError(f"the model in {loaded.directory} ({loaded.config.arch}) has no soft alignment to plot",
                                hint=Text("plot alignments of a model trained with ",
                                          setting("arch", "rnnsearch", verb="train")))


def parse_line_numbers(text: str) -> List[int]:
    """``"1,5,9"`` -> [1, 5, 9]: line numbers from 1, in the order given, without repeats."""
    numbers: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise PhraseScorerError(Text(setting("lines"),
                                         f" takes line numbers from 1 separated by commas, not {text!r}"),
                                    hint=Text("for example ", setting("lines", "1,5,9")))
        if int(part) not in numbers:
            numbers.append(int(part))
    return numbers


def choose_pairs(source: PathLike, target: PathLike, *, lines: Optional[Sequence[int]] = None,
                 count: int = AlignmentPlotOptions.count, seed: int = AlignmentPlotOptions.seed,
                 max_words: int = AlignmentPlotOptions.max_words) -> List[Tuple[int, List[str], List[str]]]:
    """(line, source words, target words) of the chosen pairs of two line-aligned files.

    With ``lines``: those lines, in that order; a line past the end, with an empty side or with a
    side longer than ``max_words`` words is an error. Otherwise ``count`` pairs drawn uniformly
    (fixed by ``seed``) among those with both sides of 1 to ``max_words`` words, in file order.
    The files are read once, streaming.
    """
    from phrase_scorer.data.sentence_pairs import read_sentence_pairs

    wanted = {number: index for index, number in enumerate(lines)} if lines else None
    found: List[Optional[Tuple[int, List[str], List[str]]]] = [None] * len(wanted) if wanted else []
    rng = random.Random(seed)
    eligible = 0
    total = 0
    for number, source_words, target_words in read_sentence_pairs(source, target, desc="reading pairs"):
        total = number
        if wanted is not None:
            if number not in wanted:
                continue
            for path, words in ((source, source_words), (target, target_words)):
                if not words:
                    raise PhraseScorerError("is empty: nothing to align", path=path, line=number,
                                            hint=Text("choose other ", setting("lines")))
                if len(words) > max_words:
                    raise PhraseScorerError(Text(f"has {len(words)} words, more than ",
                                                 setting("max_words", max_words)),
                                            path=path, line=number,
                                            hint=Text("raise ", setting("max_words"), " or choose other ",
                                                      setting("lines")))
            found[wanted[number]] = (number, source_words, target_words)
            continue
        if not 1 <= len(source_words) <= max_words or not 1 <= len(target_words) <= max_words:
            continue
        eligible += 1  # a uniform reservoir of ``count`` eligible pairs
        if len(found) < count:
            found.append((number, source_words, target_words))
        else:
            slot = rng.randrange(eligible)
            if slot < count:
                found[slot] = (number, source_words, target_words)
    if wanted is not None:
        missing = [number for number in wanted if found[wanted[number]] is None]
        if missing:
            raise PhraseScorerError(f"has {total} lines; there is no line {missing[0]}", path=source,
                                    hint=Text(setting("lines"), f" takes numbers from 1 to {total}"))
        return [pair for pair in found if pair is not None]  # all of them: none is missing
    if not found:
        raise PhraseScorerError(f"no line pair has both sides of 1 to {max_words} words", path=source,
                                hint=Text("raise ", setting("max_words")))
    return sorted(pair for pair in found if pair is not None)  # a reservoir holds no None


def alignment_weights(loaded, pairs: Sequence[Tuple[Sequence[str], Sequence[str]]]) -> List[np.ndarray]:
    """alpha of each (source words, target words) pair: (len(target) + 1, len(source)) arrays,
    the model's teacher-forced :meth:`alignments` without the padding rows and columns; row i is
    target word i in reading order (for a right-to-left model too), the last row ``</s>``."""
    import torch

    from phrase_scorer.scoring.batch_scorer import pad

    require_alignments(loaded)
    model = loaded.model
    device = next(model.parameters()).device
    source_ids = [loaded.source_vocab.encode(s) for s, _ in pairs]
    target_ids = [loaded.target_vocab.encode(t) for _, t in pairs]
    src, src_len = pad(source_ids, device)  # (B, S), (B,)
    tgt, tgt_len = pad(target_ids, device)  # (B, T), (B,)
    with torch.inference_mode():
        alpha = model.alignments(src, src_len, tgt, tgt_len).double().cpu().numpy()  # (B, T+1, S)
    order = loaded.target_vocab.in_model_order  # rows of words back into reading order
    weights = []
    for b, (s, t) in enumerate(pairs):
        ns, nt = len(source_ids[b]), len(target_ids[b])  # ids: words, or a subword model's pieces
        pieces = np.concatenate([order(alpha[b, :nt, :ns]), alpha[b, nt : nt + 1, :ns]])  # (nt + 1, ns)
        weights.append(per_word(pieces, word_spans(loaded.source_vocab, s), word_spans(loaded.target_vocab, t)))
    return weights


def per_word(alpha: np.ndarray, source_spans, target_spans) -> np.ndarray:
    """Alignments of ids (rows: target ids in reading order and ``</s>``; columns: source ids) as
    alignments of words: a source word gets the weight of its pieces together, a target word the
    mean of its pieces' rows, so each row still sums to 1. Words of one id each are unchanged."""
    columns = np.stack([alpha[:, start:end].sum(1) for start, end in source_spans], 1)  # (rows, source words)
    rows = [columns[start:end].mean(0) for start, end in target_spans] + [columns[-1]]
    return np.stack(rows)  # (target words + 1, source words)


def output_for_line(output: PathLike, line: int) -> Path:
    """OUT.png -> OUT-LINE.png: the file of one pair's heat map."""
    output = Path(output)
    return output.with_name(f"{output.stem}-{line}{output.suffix or '.png'}")


def plot_alignment(pair: AlignedPair, output: PathLike, *, dpi: int = 100, job=None) -> None:
    """One pair's heat map: source words along the top, target words (and </s>) down the left;
    ``job``: the output's :class:`~phrase_scorer.runtime.job.OutputJob`, written through."""
    from phrase_scorer.analysis.plots import require_matplotlib, save_figure
    from phrase_scorer.generation.sampling import display

    plt = require_matplotlib()
    rows, columns = pair.weights.shape
    cell = 0.3  # inches per word
    fig, ax = plt.subplots(figsize=(max(3.0, 1.6 + cell * columns), max(2.5, 1.6 + cell * rows)), dpi=dpi)
    ax.imshow(pair.weights, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="equal")
    ax.set_xticks(range(columns), [display([w]) for w in pair.source], rotation=90, fontsize=9)
    ax.set_yticks(range(rows), [display([w]) for w in pair.target] + ["</s>"], fontsize=9)
    ax.xaxis.tick_top()
    ax.set_xlabel(f"line {pair.line}", fontsize=9)
    ax.tick_params(length=0)
    fig.tight_layout()
    save_figure(fig, output, job)
    plt.close(fig)


def plot_alignments(loaded, source: PathLike, target: PathLike, output: PathLike,
                    options: AlignmentPlotOptions = AlignmentPlotOptions(), *, overwrite: bool = False,
                    inputs: Sequence = ()) -> List[AlignmentPlot]:
    """Heat maps of the pairs of ``source`` and ``target`` that ``options`` choose (see
    :func:`choose_pairs`), one PNG per pair, named by :func:`output_for_line`. Every PNG is
    checked against the source, the target, the model's files and any other ``inputs``, and for
    an existing file (replaced only with ``overwrite``) before the first is drawn."""
    from phrase_scorer.analysis.plots import figure_job, require_matplotlib
    from phrase_scorer.io.outputs import model_files

    require_alignments(loaded)
    require_matplotlib()
    chosen = choose_pairs(source, target, lines=options.lines, count=options.count, seed=options.seed,
                          max_words=options.max_words)
    inputs = [("the source", source), ("the target", target), *model_files(loaded.directory), *inputs]
    with contextlib.ExitStack() as claims:
        jobs = [claims.enter_context(figure_job(output_for_line(output, line), inputs, overwrite))
                for line, _, _ in chosen]
        weights = alignment_weights(loaded, [(s, t) for _, s, t in chosen])
        plots = []
        for (line, source_words, target_words), alpha, job in zip(chosen, weights, jobs):
            pair = AlignedPair(line, source_words, target_words, alpha)
            png = output_for_line(output, line)
            plot_alignment(pair, png, job=job)
            plots.append(AlignmentPlot(pair, str(png)))
    return plots
