"""``compare`` and ``plot``: looking inside a model."""

from __future__ import annotations

import click

from phrase_scorer.config import AlignmentPlotOptions, EmbeddingMapOptions, ScorePlotOptions
from phrase_scorer.cli.group import UserError, cli
from phrase_scorer.cli.options import (
    Count, PathName, SEED, device_option, model_option, overwrite_option, threads_option,
)
from phrase_scorer.runtime.threads import set_threads

#: The most points a density plot samples: its reservoir holds two 8-byte numbers a point, set
#: aside before the table is read (1.6 GB at this many).
MAX_POINTS = 100_000_000


@cli.command()
@model_option
@click.argument("table", type=PathName(dir_okay=False, exists=True))
@click.option("--frequent", type=Count(min=0), default=5, help="Long sources with the largest counts.")
@click.option("--rare", type=Count(min=0), default=5, help="Long sources with the smallest counts.")
@click.option("--source", "sources", multiple=True,
              help="Show this source phrase (as the table writes it); repeatable.")
@click.option("--top", type=Count(min=1), default=3, help="Targets shown per source and side.")
@click.option("--min-words", type=Count(min=1), default=4, help="Shortest source considered.")
@click.option("--min-targets", type=Count(min=1), default=3, help="Fewest targets a source must have.")
@click.option("--table-column", type=Count(min=0), default=2,
              help="Score column of the table to rank by (2: p(e|f), the direct translation probability).")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of Markdown.")
@device_option
@threads_option
def compare(model_dir, table, frequent, rare, sources, top, min_words, min_targets, table_column, as_json, device,
            threads):
    """Top targets of long source phrases by the table and by the model (paper, Table 2)."""
    set_threads(threads)
    from phrase_scorer.analysis.compare import CompareOptions, compare as run_compare, to_json, to_markdown
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.generation.sampling import display
    from phrase_scorer.runtime.device import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    options = CompareOptions(min_words=min_words, min_targets=min_targets, top=top, frequent=frequent, rare=rare,
                             table_column=table_column)
    result = run_compare(table, loaded, options, sources)
    click.echo(to_json(result) if as_json else to_markdown(result, display=lambda s: display(s.split())))


@cli.group()
def plot():
    """Figures: model against table scores (Fig. 3), maps of representations (Figs. 4-5), and
    RNNsearch's soft alignments."""


@plot.command("scores")
@click.argument("table", type=PathName(dir_okay=False, exists=True))
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False), help="PNG file to write.")
@click.option("--table-column", type=Count(min=0), default=ScorePlotOptions.table_column,
              help="Table score on the x axis (0: p(f|e)).")
@click.option("--model-column", type=Count(min=0), default=None,
              help="The model's p(y|x) column [default: from the table's signature, else the second last].")
@click.option("--max-points", type=Count(min=2, limit=MAX_POINTS, what="points (16 bytes each, held in memory)"),
              default=ScorePlotOptions.max_points, help="Plot a uniform sample of this many pairs.")
@click.option("--seed", type=SEED, default=ScorePlotOptions.seed)
@overwrite_option
def plot_scores(table, output, table_column, model_column, max_points, seed, overwrite):
    """Density of model log p(y|x) against a table score for an annotated TABLE."""
    from phrase_scorer.analysis.plots import plot_scores as run

    names = {0: "log p(f|e)", 1: "log lex(f|e)", 2: "log p(e|f)", 3: "log lex(e|f)"}
    options = ScorePlotOptions(table_column=table_column, model_column=model_column, max_points=max_points, seed=seed,
                               table_label=f"{names.get(table_column, f'log column {table_column}')}, phrase table")
    stats = run(table, output, options, overwrite=overwrite)
    click.echo(f"{output}: {stats.points:,} of {stats.lines:,} pairs; correlation of model and table scores: "
               f"Pearson {stats.pearson:.3f}, Spearman {stats.spearman:.3f}")


@plot.command("embeddings")
@model_option
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False), help="PNG file to write.")
@click.option("--html", "html_output", type=PathName(dir_okay=False), default=None,
              help="Also write an interactive page (hover to read labels).")
@click.option("--kind", type=click.Choice(["words", "phrases"]), default=EmbeddingMapOptions.kind,
              help="Word embeddings e(x) (Fig. 4) or phrase representations c (Fig. 5).")
@click.option("--table", type=PathName(dir_okay=False, exists=True), default=None,
              help="Phrase table to take source phrases from (for --kind phrases).")
@click.option("--words", type=Count(min=5), default=EmbeddingMapOptions.words,
              help="Most frequent source words to map.")
@click.option("--phrases", type=Count(min=5), default=EmbeddingMapOptions.phrases, help="Source phrases to map.")
@click.option("--min-words", type=Count(min=1), default=EmbeddingMapOptions.min_words, help="Shortest phrase mapped.")
@click.option("--method", type=click.Choice(["auto", "tsne", "umap"]), default=EmbeddingMapOptions.method,
              help="auto: UMAP where installed, else t-SNE.")
@click.option("--labels", type=Count(min=0), default=EmbeddingMapOptions.labels, help="Points labelled in the PNG.")
@click.option("--seed", type=SEED, default=EmbeddingMapOptions.seed)
@overwrite_option
@device_option
def plot_embeddings(model_dir, output, html_output, kind, table, words, phrases, min_words, method, labels, seed,
                    overwrite, device):
    """A 2-D map of the model's word or phrase representations."""
    from phrase_scorer.analysis.plots import plot_embeddings as run
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.runtime.device import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    options = EmbeddingMapOptions(kind=kind, words=words, phrases=phrases, min_words=min_words, method=method,
                                  seed=seed, labels=labels)
    result = run(loaded, output, options, table=table, html_output=html_output, overwrite=overwrite)
    click.echo(f"{output}: {result.method} map of {result.points:,} {kind}"
               + (f"; {html_output}" if html_output else ""))


@plot.command("alignments")
@model_option
@click.option("--source", "source", required=True, type=PathName(dir_okay=False, exists=True),
              help="Tokenised source sentences (plain or gzip), one per line.")
@click.option("--target", "target", required=True, type=PathName(dir_okay=False, exists=True),
              help="Their translations, line n translating line n: references or 'translate' output.")
@click.option("-o", "--output", required=True, type=PathName(dir_okay=False),
              help="OUT.png: each pair is drawn into OUT-LINE.png.")
@click.option("--lines", default=None, help="Plot these lines (numbers from 1, comma-separated), e.g. 1,5,9.")
@click.option("--count", type=Count(min=1), default=None,
              help="Without --lines: plot this many pairs drawn at random (fixed by --seed) [default: 4].")
@click.option("--seed", type=SEED, default=AlignmentPlotOptions.seed)
@click.option("--max-words", type=Count(min=1), default=AlignmentPlotOptions.max_words,
              help="Longest side plotted; --count draws among the pairs within it.")
@overwrite_option
@device_option
def plot_alignments(model_dir, source, target, output, lines, count, seed, max_words, overwrite, device):
    """Heat maps of an RNNsearch model's soft alignments (Bahdanau et al. 2015, Fig. 3).

    For each chosen pair of SOURCE and TARGET, one PNG: the weight alpha_ij of source word j
    (along the top) when the model predicts target word i (down the left, then </s>), fed the
    TARGET words, in grey scale from black (0) to white (1). An encoder-decoder model has no
    alignment and is refused.
    """
    from phrase_scorer.analysis.alignments import parse_line_numbers, plot_alignments as run
    from phrase_scorer.runtime.device import resolve_device
    from phrase_scorer.model_dir import load_model

    if lines is not None and count is not None:
        raise UserError("give --lines or --count, not both")
    numbers = tuple(parse_line_numbers(lines)) if lines is not None else None
    loaded = load_model(model_dir, resolve_device(device))
    options = AlignmentPlotOptions(lines=numbers, count=count or AlignmentPlotOptions.count, seed=seed,
                                   max_words=max_words)
    plots = run(loaded, source, target, output, options, overwrite=overwrite)
    for p in plots:
        click.echo(f"{p.png}: line {p.pair.line}, {len(p.pair.source)} source and {len(p.pair.target)} target words")
