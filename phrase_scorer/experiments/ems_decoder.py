"""The decoder EMS's evaluation runs to translate through the reranked system: ``ems-decoder``.

One EMS config line::

    [EVALUATION]
    decoder = "phrase-scorer ems-decoder --preset small -- $moses-bin-dir/moses"

EMS's ``decode`` step runs ``$decoder $decoder-settings -v 0 -f CONFIG < INPUT > OUTPUT`` from its
working folder, CONFIG being the system evaluation decodes with (the tuned weights; its tables
filtered for INPUT unless ``binarize-all`` is set). What the wrapper does with it:

1. **Finds EMS's own tuning.** Among the scripts of EMS's ``TUNING:tune`` steps
   (``steps/<run>/TUNING_tune.<run>``: ``TUNING-SCRIPT INPUT REFERENCE DECODER CONFIG ...``, then
   ``cp TMP/moses.ini TUNED``), the finished one whose tuned weights are CONFIG's: its input and
   reference are the tuning set as Moses read it, and its ``TUNED`` the tuned system on the tuning
   set's tables.
2. **Finds the training corpus** in the newest finished script that ran ``train-model.perl
   -corpus STEM -f S -e T``, unless ``--corpus`` names one (a config that starts from a given
   moses.ini has no such step).
3. **Builds the reranker** (:func:`~phrase_scorer.experiments.build_reranker.build_reranker`) in
   ``rescoring/`` under the working folder: every step reused when its inputs are the same, so
   that a changed rescoring option re-runs only what depends on it, and a second test set
   reuses the first's reranker. Two sets decoding at once wait for each other (``rescoring.lock``
   beside that folder).
4. **Translates** INPUT through Moses with CONFIG and the reranker (``translate-system --moses
   --reranker``) and writes the 1-best to standard output, one line per input line.

EMS re-runs ``decode`` (and what follows it: scoring, the report) when the ``decoder`` value
changes; nothing upstream re-runs for a rescoring option, and no file under Moses' folder changes.
Moses' own options among EMS's: ``-f``/``-config`` (the system), ``-threads``; ``-v`` and
``-text-type`` are accepted and have no effect on the reranked output; any other is refused with
one line naming it (an n-best list, a trace: outputs the reranked path does not write).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from phrase_scorer.config import BuildRerankerOptions, ScoringOptions, TranslateSystemOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.file_identity import file_sha256
from phrase_scorer.io.output_lock import OutputLock
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni

log = logging.getLogger(__name__)

WORK_FOLDER = "rescoring"  # under EMS's working folder
IGNORED_WITH_VALUE = ("-v", "-verbose", "-text-type")


@dataclass(frozen=True)
class DecoderCall:
    """What EMS asked of the decoder: the program, the system, the threads."""

    program: str
    config: str
    threads: Optional[int] = None


def parse_decoder_call(args: Sequence[str]) -> DecoderCall:
    """``MOSES [EMS's decoder settings] -v 0 -f CONFIG`` -> the call; refuses a Moses option
    whose output the reranked path does not write."""
    if not args:
        raise PhraseScorerError("no decoder after --", hint="end the decoder value with -- $moses-bin-dir/moses")
    program, rest = args[0], list(args[1:])
    config: Optional[str] = None
    threads: Optional[int] = None
    i = 0
    while i < len(rest):
        flag = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) else None
        if flag in ("-f", "-config", "--config") and value is not None:
            config = value
        elif flag in ("-threads", "-th") and value is not None:
            if not value.isdigit() or int(value) < 1:
                raise PhraseScorerError(f"-threads {value}: not a number of threads",
                                        hint="give -threads N in EMS's decoder-settings, or none")
            threads = int(value)
        elif flag in IGNORED_WITH_VALUE and value is not None:
            pass
        else:
            raise PhraseScorerError(f"the reranked decoder does not take Moses' option {flag}",
                                    hint="leave it out of EMS's decoder-settings, nbest and report settings "
                                         "for this evaluation")
        i += 2
    if config is None:
        raise PhraseScorerError("EMS gave the decoder no -f CONFIG",
                                hint="run ems-decoder as EMS's [EVALUATION] decoder")
    return DecoderCall(program, config, threads)


def ini_weights(path: PathLike) -> Dict[str, List[float]]:
    ini = MosesIni.read(path)
    return {name: ini.weight_line(name).weights for name in ini.weight_names()}


@dataclass(frozen=True)
class EmsTuning:
    """EMS's tuning run: the tuning set as Moses read it, and the tuned system on its tables."""

    input: str
    reference: str
    tuned_ini: str
    run: int


def step_scripts(ems_dir: Path, pattern: str) -> List[Tuple[int, Path]]:
    """EMS's finished step scripts ``steps/<run>/<pattern>.<run>`` (those with a ``.DONE`` beside
    them), newest run first."""
    found = []
    for script in glob.glob(os.fspath(ems_dir / "steps" / "*" / f"{pattern}.*")):
        match = re.fullmatch(r".*\.(\d+)", script)
        if match and os.path.isfile(script + ".DONE"):
            found.append((int(match.group(1)), Path(script)))
    return sorted(found, reverse=True)


def absolute(path: str, ems_dir: Path) -> str:
    return path if os.path.isabs(path) else os.fspath(ems_dir / path)


def find_tuning(ems_dir: Path, config: PathLike) -> EmsTuning:
    """The finished EMS tuning whose tuned weights are ``config``'s (see the module docstring)."""
    wanted = ini_weights(config)
    looked = 0
    for run, script in step_scripts(ems_dir, "TUNING_tune"):
        lines = script.read_text(encoding="utf-8", errors="replace").splitlines()
        tune = next((line for line in lines if "--working-dir" in line), None)
        copy = next((line for line in lines if line.startswith("cp ")), None)
        if tune is None or copy is None:
            continue
        words, copied = shlex.split(tune), shlex.split(copy)
        if len(words) < 5 or len(copied) != 3:
            continue
        looked += 1
        tuned = absolute(copied[2], ems_dir)
        if os.path.isfile(tuned) and ini_weights(tuned) == wanted:
            return EmsTuning(absolute(words[1], ems_dir), absolute(words[2], ems_dir), tuned, run)
    raise PhraseScorerError(f"no finished EMS tuning step ({looked} looked at) has the weights of {config}",
                            path=os.fspath(ems_dir / "steps"),
                            hint="run ems-decoder as EMS's [EVALUATION] decoder, in an EMS run that tunes")


def find_corpus(ems_dir: Path) -> Tuple[str, str]:
    """The training corpus of the newest finished step that ran train-model.perl."""
    for _, script in step_scripts(ems_dir, "TRAINING_*"):
        for line in script.read_text(encoding="utf-8", errors="replace").splitlines():
            if "train-model.perl" not in line:
                continue
            words = shlex.split(line, comments=False)
            options = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-corpus", "-f", "-e")}
            if len(options) == 3:
                stem = absolute(options["-corpus"], ems_dir)
                return f"{stem}.{options['-f']}", f"{stem}.{options['-e']}"
    raise PhraseScorerError("no finished EMS training step names the training corpus", path=os.fspath(ems_dir),
                            hint=Text("give ", setting("corpus"), " SRC TGT: the corpus, tokenised as Moses reads it"))


@dataclass(frozen=True)
class EmsProcess:
    """What EMS runs its decoder with besides the arguments: its working folder (where its step
    scripts are) and the standard input (the sentences) and output (their 1-best); None: this
    process's own."""

    ems_dir: Optional[PathLike] = None
    stdin: Any = None  # a binary file
    stdout: Any = None  # a binary file


def ems_decode(args: Sequence[str], *, options: BuildRerankerOptions, scoring_options: ScoringOptions,
               corpus: Optional[Tuple[str, str]] = None, work_dir: Optional[PathLike] = None,
               given_models: Optional[Dict[str, str]] = None, moses_home: Optional[PathLike] = None,
               process: EmsProcess = EmsProcess()) -> str:
    """EMS's decode step (see the module docstring): ``args`` are the decoder and the options EMS
    gave it, run in ``process``: the input comes from its standard input and the 1-best goes to
    its standard output. Returns the reranker."""
    from phrase_scorer.experiments.build_reranker import build_reranker
    from phrase_scorer.experiments.preflight import check_ini
    from phrase_scorer.moses.installation import MosesInstallation
    from phrase_scorer.rescoring.translation import TunedSystem, translate_reranked
    from phrase_scorer.runtime.device import resolve_device

    stdin = process.stdin if process.stdin is not None else sys.stdin.buffer
    stdout = process.stdout if process.stdout is not None else sys.stdout.buffer
    call = parse_decoder_call(args)
    folder = Path(process.ems_dir or os.getcwd()).resolve()
    config = absolute(call.config, folder)
    tuning = find_tuning(folder, config)
    corpus = corpus or find_corpus(folder)
    check_ini(config)  # the system the translation decodes with: checked before the build, as the build checks its own
    # the Moses EMS names (its bin/ folder's parent), else the one given
    home = Path(call.program).resolve().parent.parent if os.path.isfile(call.program) else moses_home
    moses = MosesInstallation.find(home)
    decoder = os.path.basename(call.program)
    work = Path(work_dir or folder / WORK_FOLDER).resolve()
    log.info("EMS tuning run %d: tuning set %s, tuned system %s; corpus %s", tuning.run, tuning.input,
             tuning.tuned_ini, " ".join(corpus))
    work.parent.mkdir(parents=True, exist_ok=True)
    with OutputLock(work, wait=True):  # rescoring.lock beside the folder: claimed and built by one at a time
        built = build_reranker(tuning.tuned_ini, corpus, (tuning.input, tuning.reference), work, options=options,
                               scoring_options=scoring_options, given_models=given_models, moses=moses)
    (work / "evaluation").mkdir(exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="decode.", dir=work / "evaluation"))  # this run's own folder
    try:
        source, output = run / "input", run / "output"
        with open(source, "xb") as f:
            shutil.copyfileobj(stdin, f)
        how = TranslateSystemOptions(decoder_threads=call.threads, decoder=decoder, working_dir=str(run / "work"))
        translate_reranked(source, output, TunedSystem(moses, config, built.reranker), options=how,
                           scoring_options=scoring_options, device=resolve_device(options.device))
        with open(output, "rb") as f:
            shutil.copyfileobj(f, stdout)
        stdout.flush()
    finally:
        shutil.rmtree(run, ignore_errors=True)
    log.info("reranked with %s (reranker sha256 %s)", built.chosen, file_sha256(built.reranker)[:16])
    return built.reranker
