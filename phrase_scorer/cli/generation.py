"""``sample``, ``translate`` (a model alone) and ``translate-system`` (the whole tuned system): what is written."""

from __future__ import annotations


import click

from phrase_scorer.config import (
    MIN_TEMPERATURE, SampleOptions, ScoringOptions, TranslateOptions, TranslateSystemOptions,
)
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.cli.group import UserError, cli, interrupted_resumable
from phrase_scorer.cli.options import (
    PARALLEL, SEED, Count, FiniteFloat, PathName, batch_tokens_option, device_option, model_option, moses_home_option,
    overwrite_option, precision_option, resume_option, threads_option,
)
from phrase_scorer.io.descriptors import writes_directly
from phrase_scorer.runtime.threads import set_threads


@cli.command()
@model_option
@click.argument("phrases", nargs=-1)
@click.option("-i", "--input", "input_file", type=PathName(dir_okay=False, allow_dash=True), default=None,
              help="Read source phrases from this file, one per line ('-': stdin).")
@click.option("-n", "--samples", type=Count(min=1), default=SampleOptions.samples,
              help="Ancestral samples per source.")
@click.option("--top", type=Count(min=1), default=SampleOptions.top, help="Candidates shown per source.")
@click.option("--beam", type=Count(min=1), default=None, help="Beam search of this width instead of sampling.")
@click.option("--temperature", type=FiniteFloat(min=MIN_TEMPERATURE), default=SampleOptions.temperature,
              help="The logits are divided by it before sampling (1: the model's own distribution; lower: nearer "
                   "the most probable word).")
@click.option("--max-length", type=Count(min=1), default=SampleOptions.max_length, help="Most target words.")
@click.option("--seed", type=SEED, default=SampleOptions.seed)
@click.option("--lang", default="en", help="Language of the source phrases, for the tokenizer.")
@click.option("--tokenize/--no-tokenize", default=True,
              help="Tokenize and escape raw text as Moses does (--no-tokenize: phrases are already in table form).")
@click.option("--lowercase/--no-lowercase", default=None,
              help="Lowercase the input [default: when the model's source words have no capitals].")
@click.option("--allow-unk/--no-allow-unk", default=SampleOptions.allow_unk, help="May <unk> be generated?")
@click.option("--lm", "language_model", type=PathName(dir_okay=False, exists=True), default=None,
              help="Target language model (ARPA or KenLM binary): adds its log-probability.")
@click.option("--rank-by", type=click.Choice(["model", "model+lm"]), default=SampleOptions.rank_by)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@device_option
@threads_option
def sample(model_dir, phrases, input_file, samples, top, beam, temperature, max_length, seed, lang, tokenize, lowercase,
           allow_unk, language_model, rank_by, as_json, device, threads):
    """Propose target phrases for source PHRASES (raw text), ranked by log p(y|x) (paper, Table 3)."""
    set_threads(threads)
    import json

    from phrase_scorer.model_dir import load_model
    from phrase_scorer.generation.sampling import (
        SourcePreparer, TargetLanguageModel, display, propose, read_source_phrases,
    )
    from phrase_scorer.runtime.device import resolve_device

    sources = list(phrases)
    if input_file:
        sources += read_source_phrases(input_file)
    if not sources:
        raise PhraseScorerError("no source phrase given",
                                hint='e.g. phrase-scorer sample -m MODEL "a man in a blue shirt"')
    loaded = load_model(model_dir, resolve_device(device))
    options = SampleOptions(samples=samples, top=top, beam=beam, temperature=temperature, max_length=max_length,
                            seed=seed, allow_unk=allow_unk, rank_by=rank_by)
    lm = TargetLanguageModel(language_model) if language_model else None
    preparer = SourcePreparer(loaded.source_vocab, lang=lang, tokenize=tokenize, lowercase=lowercase)
    results = propose(loaded, sources, options, preparer=preparer, language_model=lm)
    if as_json:
        click.echo(json.dumps([{
            "source": r.source, "words": r.words, "unknown_words": r.unknown_words,
            "candidates": [{"target": c.text, "display": display(c.words), "log_prob": c.log_prob, "count": c.count,
                            "complete": c.complete, **({"lm_log_prob": c.lm_log_prob} if lm else {})}
                           for c in r.candidates],
        } for r in results], ensure_ascii=False, indent=1))
        return
    for r in results:
        how = f"beam {beam}" if beam else f"{samples} samples"
        click.echo(f"{display(r.words)}    [{how}"
                   + (f"; unknown: {' '.join(r.unknown_words)}" if r.unknown_words else "") + "]")
        for c in r.candidates:
            extra = f"  lm {c.lm_log_prob:8.3f}" if lm else ""
            seen = "" if beam else f"  x{c.count}"
            cut = "" if c.complete else "  (length limit)"
            click.echo(f"  {c.log_prob:8.3f}{extra}  {display(c.words)}{seen}{cut}")
        click.echo("")


def system_options(function):
    """The options of ``translate-system``'s own: the tuned Moses system, its reranker and how the
    chunks run (also read, hidden, by ``translate``, which passes its old spelling on)."""
    for option in reversed([
        click.option("--moses", "moses_ini", type=PathName(dir_okay=False, exists=True), default=None,
                     help="The tuned moses.ini whose n-best lists the reranker rescores (required)."),
        click.option("--reranker", type=PathName(dir_okay=False, exists=True), default=None,
                     help="The reranker 'rerank --dev ...' or 'build-reranker' wrote (its OUTPUT.json; required)."),
        click.option("--chunk-sentences", type=Count(min=1), default=TranslateSystemOptions.chunk_sentences,
                     help="Sentences decoded, rescored and reranked at a time (also the resume granularity)."),
        click.option("--decoder-threads", type=PARALLEL, default=None,
                     help="The decoder's threads [default: all cores]."),
        click.option("--working-dir", type=PathName(file_okay=False), default=None,
                     help="For the chunks being translated, made fresh [default: OUTPUT.work]."),
        click.option("--pipeline/--no-pipeline", default=TranslateSystemOptions.pipeline, show_default=True,
                     help="Moses decodes the next chunk while the models rescore this one "
                          "(--no-pipeline: one after the other; the same output either way)."),
        click.option("--bound/--no-bound", default=TranslateSystemOptions.bound,
                     help="A model scores a hypothesis only while it can still be its sentence's best "
                          "(--no-bound: every hypothesis with every model; the same choices) [default: bound on a "
                          "CPU, no bound on a GPU, where the staged scoring's extra batches cost more than they "
                          "save]."),
        resume_option, precision_option, batch_tokens_option, moses_home_option,
    ]):
        function = option(function)
    return function


SYSTEM_PARAMETERS = ("moses_ini", "reranker", "chunk_sentences", "decoder_threads", "working_dir", "pipeline",
                     "bound", "resume", "precision", "batch_tokens", "moses_home")  # system_options' parameters
MODEL_PARAMETERS = ("model_dir", "beam", "length_normalize", "max_length_ratio", "batch_sentences")  # translate -m's


def hidden_system_options(function):
    """:func:`system_options`, left out of ``translate``'s --help: its old spelling
    (``translate --moses ...``) still parses and is passed on to ``translate-system``."""
    function = system_options(function)
    for param in function.__click_params__[-len(SYSTEM_PARAMETERS):]:
        param.hidden = True
    return function


def given_on_command_line(ctx: click.Context, names) -> list:
    """The options among ``names`` (parameter names) given on the command line, as their flags."""
    from click.core import ParameterSource

    params = {p.name: p for p in ctx.command.params}
    return [max(params[name].opts, key=len) for name in names
            if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]


@cli.command()
@click.option("-m", "--model", "model_dir", type=PathName(file_okay=False), default=None,
              help="Model directory made by 'phrase-scorer train' (required).")
@click.argument("input", type=PathName(dir_okay=False, allow_dash=True), default="-")
@click.option("-o", "--output", type=PathName(dir_okay=False, allow_dash=True), default="-",
              help="Where to write the translations (a name ending in .gz is gzipped).")
@click.option("--beam", type=Count(min=1), default=TranslateOptions.beam,
              help="Beam width (1: greedy search).")
@click.option("--length-normalize/--no-length-normalize", default=TranslateOptions.length_normalize,
              help="Rank the ended hypotheses by log p per token (</s> included) instead of log p.")
@click.option("--max-length-ratio", type=FiniteFloat(min=0, min_open=True),
              default=TranslateOptions.max_length_ratio,
              help="A translation has at most ceil(RATIO * source words) words.")
@click.option("--batch-sentences", type=Count(min=1), default=TranslateOptions.batch_sentences,
              help="Sentences searched together.")
@overwrite_option
@device_option
@threads_option
@hidden_system_options
@click.pass_context
def translate(ctx, model_dir, input, output, beam, length_normalize, max_length_ratio, batch_sentences, overwrite,
              device, threads, **system):
    """Translate the tokenised sentences of INPUT (plain or gzip; '-': stdin) by beam search with
    the model -m alone (the whole tuned system: translate-system).

    One output line per input line, in order: the words joined by single spaces, tokenised as the
    model's target vocabulary holds them (like Moses' output). <unk> is never generated; source
    words outside the model's shortlist are read as <unk>. An empty line gives an empty line.
    """
    if model_dir is None and system["moses_ini"] is not None:  # the old spelling of translate-system
        stray = given_on_command_line(ctx, MODEL_PARAMETERS)
        if stray:
            raise UserError(f"{stray[0]} is an option of translate -m (the model alone), not of translate-system")
        click.echo("note: 'translate --moses' is now 'phrase-scorer translate-system' (the same options); "
                   "the old spelling still works", err=True)
        params = {"input": input, "output": output, "overwrite": overwrite, "device": device, "threads": threads,
                  **system}
        sub = click.Context(translate_system, info_name="translate-system", parent=ctx.parent)
        sub.params = params
        with sub:
            return translate_system.invoke(sub)
    if model_dir is None:
        raise UserError("give -m MODEL (the model alone); the whole tuned system is "
                        "translate-system --moses INI --reranker RERANKER")
    stray = given_on_command_line(ctx, SYSTEM_PARAMETERS)
    if stray:
        raise UserError(f"{stray[0]} is an option of translate-system (the whole tuned system), not of translate -m")
    set_threads(threads)
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.generation.translate import translate_file
    from phrase_scorer.runtime.device import resolve_device

    loaded = load_model(model_dir, resolve_device(device))
    options = TranslateOptions(beam=beam, length_normalize=length_normalize, max_length_ratio=max_length_ratio,
                               batch_sentences=batch_sentences)
    translate_file(input, output, loaded, options, overwrite=overwrite)


@cli.command("translate-system")
@click.argument("input", type=PathName(dir_okay=False, allow_dash=True), default="-")
@click.option("-o", "--output", type=PathName(dir_okay=False, allow_dash=True), default="-",
              help="Where to write the translations, a named file (a name ending in .gz is gzipped).")
@system_options
@overwrite_option
@device_option
@threads_option
def translate_system(input, output, moses_ini, reranker, chunk_sentences, decoder_threads, working_dir, pipeline,
                     bound, resume, precision, batch_tokens, moses_home, overwrite, device, threads):
    """Translate the tokenised sentences of INPUT with the whole tuned system (--moses INI
    --reranker RERANKER): Moses' n-best lists, rescored by the reranker's models and reranked by its
    weights; chunked, resumable, with a signature OUTPUT.json.

    One output line per input line, in order; an empty line gives an empty line.
    """
    set_threads(threads)
    if moses_ini is None or reranker is None:
        raise UserError("translate-system needs --moses INI (the tuned moses.ini) and --reranker RERANKER "
                        "(the OUTPUT.json of 'rerank --dev ...' or build-reranker's reranker.json)")
    if output == "-" or input == "-":
        raise UserError("translate-system translates a named INPUT into a named -o OUTPUT (resumable, with a "
                        "signature)")
    from phrase_scorer.moses.installation import MosesInstallation
    from phrase_scorer.rescoring.translation import PHASES, WAITING, TunedSystem, translate_reranked
    from phrase_scorer.runtime.device import resolve_device

    try:
        options = TranslateSystemOptions(chunk_sentences=chunk_sentences, pipeline=pipeline, bound=bound,
                                         decoder_threads=decoder_threads, working_dir=working_dir)
        system = TunedSystem(MosesInstallation.find(moses_home), moses_ini, reranker)
        result = translate_reranked(input, output, system, options=options,
                                    scoring_options=ScoringOptions(batch_tokens=batch_tokens, precision=precision),
                                    device=resolve_device(device), resume=resume, overwrite=overwrite)
    except KeyboardInterrupt:
        raise interrupted_resumable(output) from None
    phases = ", ".join(f"{name} {result.phase_seconds.get(name, 0.0):.1f} s" for name in PHASES)
    phases += f"; {WAITING} {result.phase_seconds.get(WAITING, 0.0):.1f} s"
    click.echo(f"translated {result.sentences:,} sentences in {result.seconds:.0f}s ({phases}): {output}"
               + ("" if writes_directly(output) else f", signature {output}.json"), err=True)
    click.echo(f"signature: {result.signature_line}", err=True)
