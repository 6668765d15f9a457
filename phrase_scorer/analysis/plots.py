"""Figures 3-5 of the paper: model scores against table scores, and 2-D maps of the learned word
and phrase representations; and the helpers every plot uses to get matplotlib and write a figure.
Needs the ``plots`` extra (matplotlib, scikit-learn; UMAP is used when ``umap-learn`` is installed
and asked for).
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np

from phrase_scorer.config import EmbeddingMapOptions, FigureSize, ScorePlotOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.outputs import Input, OutputKind
from phrase_scorer.io.phrase_table import PhraseTableReader
from phrase_scorer.records import Signature
from phrase_scorer.runtime.job import OutputJob

INSTALL_HINT = "pip install 'phrase-scorer[plots]'"


def require_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PhraseScorerError("plotting needs matplotlib, which is not installed", hint=INSTALL_HINT) from None
    return plt


def save_figure(fig, output: PathLike, job: Optional[OutputJob] = None) -> None:
    """Write ``fig`` to ``output`` under a temporary name, renamed into place when complete; the
    format is the name's extension (PNG without one). ``job``: the output's job (checked and
    claimed), which the figure is written through; without one the caller has checked ``output``."""
    import io

    from phrase_scorer.io.atomic import AtomicOutput

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(output).suffix.lstrip(".").lower() or "png")
    if job is not None:
        job.write(0, buffer.getvalue())
        job.commit()
        return
    with AtomicOutput(output) as out:
        out.write(buffer.getvalue())
        out.commit()


def figure_job(output: PathLike, inputs: Sequence[Input], overwrite: bool, what: str = "the figure") -> OutputJob:
    """The job of a figure (or page) of the ``plot`` verbs: never one of ``inputs``, an existing
    one replaced only with ``overwrite``."""
    return OutputJob(output, inputs, overwrite=overwrite, kind=OutputKind(what))


# --- Fig. 3: scores ----------------------------------------------------------------------------------


@dataclass
class ScoreStats:
    points: int
    lines: int
    pearson: float
    spearman: float
    table_column: int
    model_column: int


def annotated_model_column(table: PathLike) -> Optional[int]:
    try:
        signature = Signature.read(table)
        if signature is None:
            return None
        return int(signature.get("num_scores_before")) + list(signature.get("columns")).index("prob")
    except (PhraseScorerError, ValueError, TypeError):  # damaged, or no p(y|x) column
        return None


def read_score_pairs(table: PathLike, table_column: int, model_column: Optional[int], max_points: int,
                     seed: int) -> Tuple[np.ndarray, np.ndarray, int, Optional[int]]:
    """(table log-probs, model log-probs) of up to ``max_points`` lines (a uniform reservoir)."""
    if model_column is None:
        model_column = annotated_model_column(table)
    rng = random.Random(seed)
    xs = np.empty(max_points, np.float64)
    ys = np.empty(max_points, np.float64)
    kept = 0
    reader = PhraseTableReader(table)
    lines = 0
    for line in reader:
        scores = line.scores
        if model_column is None:
            if len(scores) < 2:
                raise PhraseScorerError("has no model column", path=table, line=line.line_number,
                                        hint="plot a table made by 'phrase-scorer annotate'")
            model_column = len(scores) - 2  # prob, unk appended last
        if max(table_column, model_column) >= len(scores):
            raise PhraseScorerError(f"has {len(scores)} scores, too few for columns {table_column} and {model_column}",
                                    path=table, line=line.line_number,
                                    hint=Text("choose ", setting("table_column"), "/", setting("model_column")))
        lines += 1
        point = (math.log(max(scores[table_column], 1e-300)), math.log(max(scores[model_column], 1e-300)))
        if kept < max_points:
            xs[kept], ys[kept] = point
            kept += 1
        else:
            j = rng.randrange(lines)
            if j < max_points:
                xs[j], ys[j] = point
    return xs[:kept], ys[:kept], lines, model_column


def rank(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    # average ranks of ties
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], len(values)]
    for s, e in zip(starts, ends):
        if e - s > 1:
            ranks[order[s:e]] = (s + e - 1) / 2
    return ranks


def plot_scores(table: PathLike, output: PathLike, options: ScorePlotOptions = ScorePlotOptions(), *,
                overwrite: bool = False) -> ScoreStats:
    """Hexbin density of model log p(y|x) against a table column (Fig. 3), as ``options`` say.
    ``output`` is never the table (nor a link to it); an existing one is replaced only with
    ``overwrite``."""
    with figure_job(output, [("the table", table)], overwrite) as job:
        return _plot_scores(table, output, job, options)


def _plot_scores(table: PathLike, output: PathLike, job: OutputJob, options: ScorePlotOptions) -> ScoreStats:
    plt = require_matplotlib()
    from matplotlib.colors import LogNorm

    table_column, figure = options.table_column, options.figure
    x, y, lines, model_column = read_score_pairs(table, table_column, options.model_column, options.max_points,
                                                 options.seed)
    if len(x) < 2:
        raise PhraseScorerError("needs at least two lines to plot", path=table)
    assert model_column is not None  # found on the first line read
    pearson = float(np.corrcoef(x, y)[0, 1])
    spearman = float(np.corrcoef(rank(x), rank(y))[0, 1])
    fig, ax = plt.subplots(figsize=(figure.width, figure.height), dpi=figure.dpi)
    hb = ax.hexbin(x, y, gridsize=80, norm=LogNorm(), cmap="viridis", mincnt=1)
    fig.colorbar(hb, ax=ax, label="phrase pairs")
    ax.set_xlabel(options.table_label)
    ax.set_ylabel("log p(y|x), RNN Encoder–Decoder")
    ax.set_title(f"{len(x):,} of {lines:,} phrase pairs: Pearson r = {pearson:.3f}, Spearman ρ = {spearman:.3f}",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, output, job)
    plt.close(fig)
    return ScoreStats(points=len(x), lines=lines, pearson=pearson, spearman=spearman, table_column=table_column,
                      model_column=model_column)


# --- Figs. 4-5: representations ----------------------------------------------------------------------


def project(vectors: np.ndarray, method: str, seed: int) -> Tuple[np.ndarray, str]:
    """2-D coordinates of ``vectors`` by t-SNE (scikit-learn) or UMAP (when installed)."""
    if method in ("auto", "umap"):
        try:
            import umap  # type: ignore

            return umap.UMAP(random_state=seed).fit_transform(vectors), "UMAP"
        except ImportError:
            if method == "umap":
                raise PhraseScorerError(Text(setting("method", "umap"), " needs umap-learn"),
                                        hint="pip install umap-learn") from None
    try:
        from sklearn.manifold import TSNE
    except ImportError:
        raise PhraseScorerError("the map needs scikit-learn, which is not installed", hint=INSTALL_HINT) from None
    perplexity = min(30.0, max(2.0, (len(vectors) - 1) / 3))
    coords = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(vectors)
    return coords, "t-SNE"


def spread_labels(coords: np.ndarray, priority: Sequence[int], count: int) -> List[int]:
    """Up to ``count`` points to label, in ``priority`` order, skipping points too close to a
    labelled one so that the labels stay readable."""
    span = np.ptp(coords, axis=0).max() or 1.0
    min_distance = span / (2.5 * math.sqrt(max(count, 1)))
    chosen: List[int] = []
    for i in priority:
        if all(np.hypot(*(coords[i] - coords[j])) >= min_distance for j in chosen):
            chosen.append(i)
            if len(chosen) == count:
                break
    return chosen


@dataclass
class MapResult:
    kind: str
    points: int
    method: str
    png: str
    html: Optional[str]


def sample_phrases(table: PathLike, min_words: int, count: int, seed: int) -> List[List[str]]:
    """A uniform sample of distinct source phrases of at least ``min_words`` words."""
    rng = random.Random(seed)
    sample: List[List[str]] = []
    seen = 0
    last = None
    for line in PhraseTableReader(table):
        words = line.source_words
        if words == last or len(words) < min_words:
            continue
        last = words
        seen += 1
        if len(sample) < count:
            sample.append(words)
        else:
            j = rng.randrange(seen)
            if j < count:
                sample[j] = words
    return sample


def word_vectors(loaded, count: int) -> Tuple[np.ndarray, List[str]]:
    """The source embeddings e(x) of the ``count`` most frequent source words."""
    tokens = loaded.source_vocab.tokens[3 : 3 + count]
    weights = loaded.model.source_embedding.weight.detach().float().cpu().numpy()
    return weights[3 : 3 + len(tokens)], tokens


def phrase_vectors(loaded, phrases: Sequence[Sequence[str]]) -> np.ndarray:
    """The summaries c = tanh(V h_N) of the encoder for ``phrases``."""
    import torch

    from phrase_scorer.scoring.batch_scorer import pad

    from phrase_scorer.models.encdec import RNNEncoderDecoder

    model = loaded.model
    if not isinstance(model, RNNEncoderDecoder):
        raise PhraseScorerError("phrase maps show the encoder-decoder's summary c; this model "
                                f"({model.config.arch}) has no fixed-length summary",
                                hint=Text("use ", setting("kind", "words"), ", or a model trained with ",
                                          setting("arch", "encdec", verb="train")))
    device = next(model.parameters()).device
    out = []
    with torch.inference_mode():
        for start in range(0, len(phrases), 256):
            ids = [loaded.source_vocab.encode(p) for p in phrases[start : start + 256]]
            src, src_len = pad(ids, device)
            c, _ = model.encoder(src, src_len)
            out.append(c.float().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_dim))


def plot_map(coords: np.ndarray, labels: Sequence[str], output: PathLike, *, title: str, labelled: Sequence[int],
             figure: FigureSize = EmbeddingMapOptions.figure, job: Optional[OutputJob] = None) -> None:
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(figure.width, figure.height), dpi=figure.dpi)
    ax.scatter(coords[:, 0], coords[:, 1], s=4, alpha=0.35, color="#31688e", linewidths=0)
    for i in labelled:
        ax.annotate(labels[i], coords[i], fontsize=7, alpha=0.9, xytext=(2, 2), textcoords="offset points")
    ax.set_title(title, fontsize=11)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    save_figure(fig, output, job)
    plt.close(fig)


HTML_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font: 14px sans-serif; margin: 1em; }}
#plot {{ border: 1px solid #ccc; background: #fff; }}
#tip {{ position: absolute; pointer-events: none; background: #333; color: #fff; padding: 2px 6px;
        border-radius: 3px; font-size: 13px; display: none; }}
circle {{ fill: #31688e; fill-opacity: 0.45; }} circle:hover {{ fill: #fde725; fill-opacity: 1; }}
</style></head>
<body>
<h1>{title}</h1>
<p>{subtitle} Hover over a point to read its label.</p>
<svg id="plot" width="960" height="720"></svg>
<div id="tip"></div>
<script id="data" type="application/json">{data}</script>
<script>
const data = JSON.parse(document.getElementById("data").textContent);
const svg = document.getElementById("plot"), tip = document.getElementById("tip");
const W = svg.width.baseVal.value, H = svg.height.baseVal.value, pad = 20;
const xs = data.points.map(p => p[0]), ys = data.points.map(p => p[1]);
const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
const sx = x => pad + (x - x0) / ((x1 - x0) || 1) * (W - 2 * pad);
const sy = y => H - pad - (y - y0) / ((y1 - y0) || 1) * (H - 2 * pad);
data.points.forEach((p, i) => {{
  const c = document.createElementNS("http://www.w3.org/2000/svg", "circle");
  c.setAttribute("cx", sx(p[0])); c.setAttribute("cy", sy(p[1])); c.setAttribute("r", 3);
  c.addEventListener("mouseenter", e => {{ tip.textContent = data.labels[i]; tip.style.display = "block"; }});
  c.addEventListener("mousemove", e => {{ tip.style.left = (e.pageX + 10) + "px"; \
tip.style.top = (e.pageY + 10) + "px"; }});
  c.addEventListener("mouseleave", () => {{ tip.style.display = "none"; }});
  svg.appendChild(c);
}});
document.title = data.title + " (" + data.points.length + " points)";
</script>
</body></html>
"""


def write_html(coords: np.ndarray, labels: Sequence[str], output: PathLike, *, title: str, subtitle: str,
               job: Optional[OutputJob] = None) -> None:
    """The interactive page; ``job`` as for :func:`save_figure`."""
    data = {"title": title, "points": [[round(float(x), 4), round(float(y), 4)] for x, y in coords],
            "labels": list(labels)}
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
    from phrase_scorer.io.atomic import write_text_atomically

    page = HTML_PAGE.format(title=html.escape(title), subtitle=html.escape(subtitle), data=payload)
    if job is not None:
        job.write(0, page.encode("utf-8"))
        job.commit()
    else:
        write_text_atomically(output, page)


def plot_embeddings(loaded, output: PathLike, options: EmbeddingMapOptions = EmbeddingMapOptions(), *,
                    table: Optional[PathLike] = None, html_output: Optional[PathLike] = None,
                    overwrite: bool = False) -> MapResult:
    """A 2-D map of word embeddings (Fig. 4) or of phrase representations c (Fig. 5), as ``options``
    say (phrases are sampled from ``table``), and with ``html_output`` an interactive page of it.
    Neither is the table or a file of the model (nor a link to one), nor are they the same file;
    an existing one is replaced only with ``overwrite``."""
    from phrase_scorer.io.outputs import model_files, same_file

    inputs = [("the table", table), *model_files(loaded.directory)]
    with contextlib.ExitStack() as jobs:
        figure = jobs.enter_context(figure_job(output, inputs, overwrite))
        page = None
        if html_output is not None:
            if os.path.abspath(html_output) == os.path.abspath(output) or same_file(html_output, output):
                raise PhraseScorerError(Text(setting("html_output", html_output), " is the figure ",
                                             setting("output", output, short=True), ": give it another name"))
            page = jobs.enter_context(figure_job(html_output, inputs, overwrite, what="the page"))
        return _plot_embeddings(loaded, output, figure, options, table=table, html_output=html_output, page=page)


def _plot_embeddings(loaded, output: PathLike, figure: OutputJob, options: EmbeddingMapOptions, *,
                     table: Optional[PathLike], html_output: Optional[PathLike],
                     page: Optional[OutputJob]) -> MapResult:
    from phrase_scorer.generation.sampling import display

    require_matplotlib()
    kind, min_words, seed = options.kind, options.min_words, options.seed
    if kind == "words":
        vectors, names = word_vectors(loaded, options.words)
        priority = list(range(len(names)))  # most frequent first
        what = f"the {len(names):,} most frequent source words' embeddings e(x)"
    elif kind == "phrases":
        if table is None:
            raise PhraseScorerError(Text("a map of phrases needs a phrase table to take them from (", setting("table"),
                                         ")"))
        sample = sample_phrases(table, min_words, options.phrases, seed)
        if len(sample) < 5:
            raise PhraseScorerError(f"found only {len(sample)} source phrases of {min_words}+ words", path=table)
        vectors = phrase_vectors(loaded, sample)
        names = [display(p) for p in sample]
        priority = random.Random(seed).sample(range(len(names)), len(names))
        what = f"{len(names):,} source phrases of {min_words}+ words, represented by c = tanh(V h)"
    else:
        raise PhraseScorerError("the map is of 'words' or 'phrases'")
    if len(vectors) < 5:
        raise PhraseScorerError("too few points for a map (the vocabulary is tiny)")
    coords, used = project(np.asarray(vectors, np.float64), options.method, seed)
    title = f"{used} of {what}"
    plot_map(coords, [display([n]) if kind == "words" else n for n in names], output, title=title,
             labelled=spread_labels(coords, priority, options.labels), figure=options.figure, job=figure)
    if html_output:
        write_html(coords, [display([n]) if kind == "words" else n for n in names], html_output, title=title,
                   subtitle=f"Model: {loaded.directory}.", job=page)
    return MapResult(kind=kind, points=len(coords), method=used, png=str(output),
                     html=None if html_output is None else str(html_output))
