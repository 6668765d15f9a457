"""Decoding a test set with Moses and scoring it with sacrebleu.

The decoder runs in the directory of the moses.ini, so configs with paths relative to their own
folder work as they do for the user. Scores are sacrebleu's BLEU and chrF, each with its
signature. When the references are tokenised, Moses-escaped text (as a Moses pipeline makes it),
the hypotheses are scored as they are with ``--tokenize none``; when they are raw text, the
hypotheses are first de-escaped and detokenised with sacremoses and scored with sacrebleu's
default tokeniser. Scores computed one way are comparable only with scores computed the same way.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from phrase_scorer.config import EvaluateOptions
from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.outputs import OutputKind
from phrase_scorer.runtime.job import OutputJob
from phrase_scorer.runtime.programs import run_logged
from phrase_scorer.moses.installation import MosesGiven, MosesInstallation, read_lines

log = logging.getLogger(__name__)

_ESCAPES = re.compile(r"&(apos|quot|amp|lt|gt|#124|#91|#93);")


@dataclass
class Evaluation:
    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    sentences: int
    references: str  # "tokenized" or "raw"
    hypotheses_path: str

    def to_dict(self) -> dict:
        return asdict(self)


def references_kind(references: Sequence[str], kind: str = "auto") -> str:
    """'tokenized' if the references carry Moses escapes (or kind says so), else 'raw'."""
    if kind != "auto":
        return kind
    return "tokenized" if any(_ESCAPES.search(line) for line in references) else "raw"


DECODED_COMPANIONS = (".part", ".log")  # the decoder's log goes beside its output
DECODER_OUTPUT = OutputKind("the decoder output", regular_only=True)  # a file: its log goes beside it


@dataclass(frozen=True)
class Decoding:
    """How Moses decodes a source: with how many threads, which more options and which decoder,
    where its log goes, and whether it also writes an n-best list."""

    threads: Optional[int] = None  # None: the cores
    decoder_flags: str = ""  # checked before anything is made (moses/decoder_flags.py)
    decoder: str = "moses"  # the decoder program in the installation's bin/
    log_path: Optional[PathLike] = None  # None: OUT.log beside the output
    # (FILE, N): Moses also writes its N distinct best to FILE, a file the caller made room for
    # (-n-best-list, which the flags may not set)
    nbest_list: Optional[Tuple[PathLike, int]] = None


def decode(ini: PathLike, source: PathLike, output: PathLike, *, moses: MosesInstallation,
           decoding: Decoding = Decoding(), overwrite: bool = False) -> List[str]:
    """Translate ``source`` (plain or gzip) with ``ini`` as ``decoding`` says; returns the
    hypotheses, also written to ``output`` (an existing one is replaced only with ``overwrite``;
    never one of the inputs)."""
    check_decoder_flags(decoding.decoder_flags)
    with OutputJob(output, [("the moses.ini", ini), ("the source", source)], overwrite=overwrite,
                   companions=DECODED_COMPANIONS, kind=DECODER_OUTPUT) as job:
        return decode_into(job, ini, source, moses=moses, decoding=decoding)


def decode_into(job: OutputJob, ini: PathLike, source: PathLike, *, moses: MosesInstallation,
                decoding: Decoding = Decoding()) -> List[str]:
    """:func:`decode` into the output ``job`` holds (a regular file): the decoder writes its
    temporary file, which is put in place once it has one line per sentence. Moses reads the
    sentences from an anonymous temporary file; its log goes to ``decoding.log_path`` (default
    OUT.log)."""
    ini = Path(ini).resolve()
    lines = read_lines(source)
    output = Path(job.output)
    threads = decoding.threads or os.cpu_count() or 1
    args: List[PathLike] = [moses.decoder(decoding.decoder), "-f", ini, "-threads", str(threads),
                            *decoding.decoder_flags.split()]
    nbest_list = decoding.nbest_list
    if nbest_list is not None:  # one argument each: a path with spaces stays one path
        args += ["-n-best-list", os.fspath(nbest_list[0]), str(nbest_list[1]), "distinct"]
    log.info("decoding %d sentences with %s", len(lines), ini)
    assert job.out is not None and job.temporary is not None  # a regular file: written under a temporary name
    with tempfile.TemporaryFile("w+", encoding="utf-8") as stdin:
        stdin.writelines(line + "\n" for line in lines)
        stdin.flush()
        stdin.seek(0)
        run_logged(args, decoding.log_path or output.with_name(output.name + ".log"), cwd=ini.parent, stdin=stdin,
                   stdout=job.out.file)
    hypotheses = read_lines(job.temporary)
    if len(hypotheses) != len(lines):
        raise PhraseScorerError(f"the decoder wrote {len(hypotheses)} lines for {len(lines)} sentences",
                                path=job.temporary)
    job.commit()
    return hypotheses


def score(hypotheses: Sequence[str], references: Sequence[str], *, kind: str = "auto", lang: str = "fr",
          hypotheses_path: str = "") -> Evaluation:
    """sacrebleu BLEU and chrF of tokenised Moses output against ``references``."""
    import sacrebleu
    from sacremoses import MosesDetokenizer

    if len(hypotheses) != len(references):
        raise PhraseScorerError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    kind = references_kind(references, kind)
    if kind == "raw":
        detokenizer = MosesDetokenizer(lang=lang)
        hypotheses = [detokenizer.detokenize(h.split()) for h in hypotheses]
        bleu = sacrebleu.BLEU()
    else:
        bleu = sacrebleu.BLEU(tokenize="none", force=True)  # tokenised on purpose: no warning
    chrf = sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return Evaluation(
        bleu=bleu_score.score, chrf=chrf_score.score,
        bleu_signature=str(bleu.get_signature()), chrf_signature=str(chrf.get_signature()),
        sentences=len(hypotheses), references=kind, hypotheses_path=hypotheses_path,
    )


def evaluate(ini: PathLike, source: PathLike, reference: PathLike, output: PathLike, *, moses: MosesGiven = None,
             options: EvaluateOptions = EvaluateOptions(), overwrite: bool = False) -> Evaluation:
    """Decode ``source`` with ``ini`` into ``output`` and score it against ``reference``, as
    ``options`` say.

    ``output`` is checked before anything runs: never one of the inputs (nor its log beside it),
    an existing one replaced only with ``overwrite``. Moses (an installation, or the folder of one;
    None: ``MOSES_HOME``) is found once the output is known to be writable."""
    check_decoder_flags(options.decoder_flags)  # before anything is made
    inputs = [("the moses.ini", ini), ("the test source", source), ("the test reference", reference)]
    with OutputJob(output, inputs, overwrite=overwrite, companions=DECODED_COMPANIONS, kind=DECODER_OUTPUT) as job:
        installation = MosesInstallation.given(moses)
        references = read_lines(reference)
        sources = read_lines(source)
        if len(sources) != len(references):
            raise PhraseScorerError(f"the test source has {len(sources)} lines but the reference has "
                                    f"{len(references)}", path=reference)
        hypotheses = decode_into(job, ini, source, moses=installation,
                                 decoding=Decoding(options.threads, options.decoder_flags, options.decoder))
    return score(hypotheses, references, kind=options.references, lang=options.lang, hypotheses_path=os.fspath(output))
