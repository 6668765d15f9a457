"""New text translated by the whole tuned system: Moses' n-best lists, rescored, reranked.

::

    source, a chunk of sentences at a time
      --the user's Moses, -n-best-list N distinct (N and the decoder flags the reranker records)--> n-best list
      --rescore with the reranker's models (checked by the SHA-256 of their weights)--> rescored list
      --the reranker's weights (phrase_scorer.moses.rerank.apply_weights)--> one line per sentence

``phrase-scorer translate --moses moses.tuned.ini --reranker RERANKER`` runs it. A chunk's files
live in the working directory only while the chunk is translated, so a long input never has all
its n-best lists on disk. The output is written as the resumable outputs of annotate and rescore
are: atomically, with a resume record after each chunk (``--resume`` continues after the last
finished chunk, to the bytes an uninterrupted run writes) and a signature ``OUT.json``. An empty
input line is not decoded (the models cannot score a translation of nothing); it gets an empty
output line, so line k of the output always translates line k of the input.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from phrase_scorer import __version__
from phrase_scorer.config import RescoreOptions, ScoringOptions, TranslateOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import PathLike, file_sha256, text_lines
from phrase_scorer.io.outputs import RESUMABLE_COMPANIONS, check_output, model_files
from phrase_scorer.moses.evaluate import decode
from phrase_scorer.moses.installation import MosesInstallation, write_lines
from phrase_scorer.moses.reranker import Reranker
from phrase_scorer.moses.weights import apply_weights
from phrase_scorer.moses.tune import fresh_directory
from phrase_scorer.runtime.progress import step_bar
from phrase_scorer.records import Signature, as_recorded
from phrase_scorer.runtime.resumable import (
    ChunkWriter, finish_resumable, input_identity, resumable_output, start_resumable,
)

log = logging.getLogger(__name__)


@dataclass
class RerankedTranslation:
    output: str
    sentences: int
    chunks: int
    seconds: float
    phase_seconds: Dict[str, float] = field(default_factory=dict)  # PHASES -> seconds spent in it


PHASES = ("Moses", "rescoring", "reranking")  # where a chunk's time goes


def reranker_models(reranker: Reranker, device: Any = "cpu") -> Tuple[list, bool]:
    """The models behind the reranker's added features, in the order of its weights, each checked
    to be the bytes the reranker was tuned with; and whether the features are per token."""
    from phrase_scorer.model_dir import load_model
    from phrase_scorer.scoring.rescore import FeatureModel

    models, normalize = [], set()
    for name, _ in reranker.weights.layout:
        record = reranker.models.get(name)
        if record is None or name in reranker.ignore_features:
            continue  # one of the decoder's features
        ensemble = isinstance(record["directory"], list)
        directories = record["directory"] if ensemble else [record["directory"]]
        digests = record["weights_sha256"] if ensemble else [record["weights_sha256"]]
        for directory, digest in zip(directories, digests):
            loaded = load_model(directory, device)
            if loaded.weights_sha256 != digest:
                raise PhraseScorerError(
                    f"the model of feature {name} changed since the reranker was tuned (weights sha256 "
                    f"{loaded.weights_sha256[:12]}..., tuned with {digest[:12]}...)", path=directory,
                    hint="use the model the reranker was tuned with, or tune a new reranker")
            models.append(FeatureModel(name, loaded, reverse=bool(record["reverse"]), ensemble=ensemble))
        normalize.add(bool(record.get("normalize", False)))
    if len(normalize) > 1:
        raise PhraseScorerError("the reranker's features mix log p and log p per token", path=reranker.path,
                                hint="tune a reranker on a list rescored in one run")
    return models, normalize == {True}


def source_chunks(source: PathLike, size: int, skip: int) -> Iterator[List[str]]:
    """The source's lines (without newlines), ``size`` at a time, after the first ``skip``."""
    chunk: List[str] = []
    for number, text in text_lines(source):
        if number <= skip:
            continue
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def translate_chunk(lines: Sequence[str], work: Path, *, ini: PathLike, moses: MosesInstallation, reranker: Reranker,
                    models: list, normalize: bool, scoring_options: ScoringOptions, threads: Optional[int],
                    decoder: str, phase_seconds: Dict[str, float]) -> bytes:
    """One line per input line: the reranked translation of each non-empty line, empty for an
    empty one. The seconds of each of PHASES are added to ``phase_seconds``."""
    from phrase_scorer.scoring.rescore import rescore

    kept = [i for i, line in enumerate(lines) if line.strip()]
    best: List[str] = [""] * len(lines)
    if kept:
        source = work / "chunk.src"
        write_lines(source, [lines[i] for i in kept])
        nbest, rescored, chosen = work / "chunk.nbest", work / "chunk.rescored", work / "chunk.best"
        size = reranker.decoder.get("nbest_size")
        flags = f"{reranker.decoder.get('decoder_flags') or ''} -n-best-list {nbest} {size} distinct".strip()
        started = time.monotonic()
        decode(ini, source, work / "chunk.1best", moses=moses, threads=threads, decoder_flags=flags, decoder=decoder)
        decoded = time.monotonic()
        if models:
            rescore(nbest, source, rescored, models, RescoreOptions(normalize=normalize), scoring_options,
                    overwrite=True)
        else:
            rescored = nbest
        scored = time.monotonic()
        written = apply_weights(rescored, reranker.weights, chosen, reranker.ignore_features)
        for phase, seconds in zip(PHASES, (decoded - started, scored - decoded, time.monotonic() - scored)):
            phase_seconds[phase] = phase_seconds.get(phase, 0.0) + seconds
        chosen_lines = chosen.read_text(encoding="utf-8").split("\n")[:written]
        chosen_lines += [""] * (len(kept) - len(chosen_lines))  # sentences after the list's last id
        for i, line in zip(kept, chosen_lines):
            best[i] = line
        for leftover in work.iterdir():
            if leftover.name.startswith("chunk."):
                leftover.unlink()
    return "".join(line + "\n" for line in best).encode("utf-8")


def translate_reranked(source: PathLike, output: PathLike, *, ini: PathLike, reranker: PathLike,
                       moses: MosesInstallation, scoring_options: Optional[ScoringOptions] = None,
                       device: Any = "cpu", chunk_sentences: int = TranslateOptions.chunk_sentences,
                       threads: Optional[int] = None, decoder: str = "moses", working_dir: Optional[PathLike] = None,
                       resume: bool = False, overwrite: bool = False) -> RerankedTranslation:
    """Translate ``source`` (tokenised as for the Moses system, one sentence per line) with
    ``ini`` and the reranker file ``reranker`` into ``output``, one line per input line."""
    output = os.fspath(output)
    scoring_options = scoring_options or ScoringOptions()
    tuned = Reranker.read(reranker)
    if not tuned.decoder.get("nbest_size"):
        raise PhraseScorerError("the reranker does not record the n-best size it was tuned with", path=reranker,
                                hint="tune it again with this version's rerank")
    models, normalize = reranker_models(tuned, device)
    inputs = [("the source", source), ("the moses.ini", ini), ("the reranker", reranker)]
    for m in models:
        inputs += model_files(m.loaded.directory)
    program = moses.decoder(decoder)
    settings = as_recorded({
        "source": input_identity(source),
        "moses.ini sha256": file_sha256(ini),
        "decoder": os.fspath(program),
        "reranker sha256": file_sha256(reranker),
        "models": [m.describe() for m in models],
        "scoring": asdict(scoring_options),
        "chunk_sentences": chunk_sentences,
        "package_version": __version__,
    })
    started = time.monotonic()
    chunks = 0
    phase_seconds: Dict[str, float] = {}
    with check_output(output, inputs, overwrite=overwrite, resume=resume, companions=RESUMABLE_COMPANIONS):
        done_lines, done_bytes, progress_path = start_resumable(source, output, settings, resume, overwrite=overwrite)
        work = fresh_directory(Path(working_dir or output + ".work").resolve(), verb="translate")
        with resumable_output(output, done_bytes, progress_path) as out:
            writer = ChunkWriter(out, progress_path, settings, done_lines)
            with step_bar("translating", None, initial=done_lines, unit="sentence") as progress:
                for lines in source_chunks(source, chunk_sentences, done_lines):
                    writer.write(len(lines), translate_chunk(
                        lines, work, ini=ini, moses=moses, reranker=tuned, models=models, normalize=normalize,
                        scoring_options=scoring_options, threads=threads, decoder=decoder,
                        phase_seconds=phase_seconds))
                    chunks += 1
                    progress.update(len(lines))
                    log.info("translated %d sentences", writer.lines_done)
            if writer.lines_done == 0:
                raise PhraseScorerError("the source is empty", path=source)
            record = Signature.build("phrase-scorer translate --moses --reranker", settings, output=output,
                                     lines=writer.lines_done, **{"moses.ini": os.path.abspath(ini),
                                                                 "reranker": os.path.abspath(reranker)})
            out.commit()
        finish_resumable(output, progress_path, record)
        shutil.rmtree(work, ignore_errors=True)
    return RerankedTranslation(output, writer.lines_done, chunks, time.monotonic() - started, phase_seconds)
