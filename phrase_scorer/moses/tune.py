"""Re-tuning a Moses system with the user's ``mert-moses.pl``.

Every run gets a fresh working directory (mert-moses.pl silently reuses ``features.list`` and
``filtered/`` from an old one). The starting moses.ini is copied there with every ``path=`` made
absolute, since Moses resolves relative paths against the directory it runs in, and with its
phrase table's score count checked against ``num-features``. Decoder threads go into
``--decoder-flags`` (mert-moses.pl's own ``--threads`` only threads the optimiser). MERT and batch
MIRA are offered; PRO is not, because mert-moses.pl downloads its optimiser at run time. The seed
reaches the optimiser (``mert -r`` / ``kbmira --random-seed``), so runs with different seeds explore
different random restarts and runs with the same seed repeat.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Tuple

from phrase_scorer.config import MosesIniOptions, TuneOptions
from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.paths import PathLike
from phrase_scorer.io.moses_ini import MosesIni
from phrase_scorer.moses.decoder_flags import check_decoder_flags
from phrase_scorer.moses.ini_patch import patch_moses_ini
from phrase_scorer.io.outputs import OutputKind
from phrase_scorer.runtime.job import OutputJob
from phrase_scorer.runtime.programs import fresh_directory, run_logged
from phrase_scorer.moses.installation import MosesGiven, MosesInstallation, parse_mert_progress, read_lines, write_lines

log = logging.getLogger(__name__)



@dataclass
class TuneResult:
    tuned_ini: str
    working_dir: str
    iterations: List[Tuple[int, float]] = field(default_factory=list)  # (iteration, dev BLEU x 100)
    dev_bleu: Optional[float] = None  # of the weights written to tuned_ini, x 100

    def to_dict(self) -> dict:
        return asdict(self)


def with_absolute_paths(ini: PathLike, output: PathLike) -> None:
    """Copy ``ini`` with every relative ``path=`` resolved against the ini's folder."""
    parsed = MosesIni.read(ini)
    table = parsed.find_phrase_table()
    absolute_table = parsed.table_path(table)
    patch_moses_ini(ini, output, phrase_table=absolute_table,
                    options=MosesIniOptions(add_features=0, feature_name=table.name, absolute_paths=True),
                    overwrite=True)


_DEV_BLEU = re.compile(r"^# BLEU ([-\d.eE]+) on dev")


def tune(ini: PathLike, dev_source: PathLike, dev_reference: PathLike, output_ini: PathLike, *,
         moses: MosesGiven = None, options: TuneOptions = TuneOptions(), working_dir: Optional[PathLike] = None,
         overwrite: bool = False) -> TuneResult:
    """Tune ``ini``'s weights on the dev set; the tuned config is written to ``output_ini``.

    ``output_ini`` is checked before anything runs: a regular file, never one of the inputs, an
    existing one replaced only with ``overwrite``. Moses (an installation, or the folder of one;
    None: ``MOSES_HOME``) is found once the output is known to be writable."""
    check_decoder_flags(options.decoder_flags)  # before anything is made
    inputs = [("the moses.ini", ini), ("the dev source", dev_source), ("the dev reference", dev_reference)]
    with OutputJob(output_ini, inputs, overwrite=overwrite,
                   kind=OutputKind("the tuned moses.ini", regular_only=True)) as job:
        result = run_tuning(ini, dev_source, dev_reference, output_ini, moses=MosesInstallation.given(moses),
                            options=options, working_dir=working_dir)
        job.write(0, (Path(result.working_dir) / "mert" / "moses.ini").read_bytes())
        job.commit()
    log.info("tuned config: %s (dev BLEU %s)", output_ini, "?" if result.dev_bleu is None else f"{result.dev_bleu:.2f}")
    return result


def run_tuning(ini: PathLike, dev_source: PathLike, dev_reference: PathLike, output_ini: PathLike, *,
               moses: MosesInstallation, options: TuneOptions, working_dir: Optional[PathLike]) -> TuneResult:
    """mert-moses.pl on the dev set, in a fresh working directory (default ``output_ini.work``);
    the tuned config is left in its ``mert/moses.ini``."""
    if options.method not in ("mert", "mira"):
        raise PhraseScorerError(Text(setting("method"),
                                     " takes mert or mira (PRO downloads its optimiser at run time)"))
    check_decoder_flags(options.decoder_flags)
    mertdir = moses.check_mert(options.mertdir)
    decoder = moses.decoder(options.decoder)
    script = moses.script("training/mert-moses.pl")
    MosesIni.read(ini).check_files()  # Moses would fail on a missing table only at its first decoding
    source_lines, reference_lines = read_lines(dev_source), read_lines(dev_reference)
    if len(source_lines) != len(reference_lines):
        raise PhraseScorerError(
            f"the dev source has {len(source_lines)} lines but the reference has {len(reference_lines)}",
            path=dev_reference, hint="give a line-aligned dev set",
        )
    log.info("checked before the first step: the options, the moses.ini and its files, the dev set (%d sentences), "
             "Moses", len(source_lines))
    work = fresh_directory(Path(working_dir) if working_dir else Path(str(output_ini) + ".work"))
    write_lines(work / "dev.src", source_lines)
    write_lines(work / "dev.ref", reference_lines)
    with_absolute_paths(ini, work / "start.ini")

    threads = options.threads or os.cpu_count() or 1
    flags = f"-threads {threads} {options.decoder_flags}".strip()
    args: List[PathLike] = ["perl", script, work / "dev.src", work / "dev.ref", decoder, work / "start.ini",
            "--working-dir", work / "mert", "--mertdir", mertdir, "--decoder-flags", flags,
            "--maximum-iterations", str(options.max_iterations), "--nbest", str(options.nbest)]
    if options.return_best_dev:
        args.append("--return-best-dev")
    if options.method == "mira":
        args += ["--batch-mira", "--batch-mira-args", f"--random-seed {options.seed}"]
    else:
        args += ["--mertmertargs", f"-r {options.seed}"]

    result = TuneResult(tuned_ini=os.fspath(output_ini), working_dir=os.fspath(work))

    def progress(line: str) -> None:
        event = parse_mert_progress(line)
        if not event:
            return
        if "bleu" in event:
            result.iterations.append((int(event["iteration"]), 100 * event["bleu"]))
            log.info("tuning iteration %d: dev BLEU %.2f", event["iteration"], 100 * event["bleu"])
        else:
            log.info("tuning iteration %d: decoding the dev set", event["iteration"])

    log.info("tuning %s with %s (%s, seed %d) in %s", ini, script.name, options.method, options.seed, work)
    run_logged(args, work / "tune.log", cwd=work, on_line=progress)
    tuned = work / "mert" / "moses.ini"
    if not tuned.exists():
        raise PhraseScorerError("mert-moses.pl finished without writing moses.ini", path=work / "tune.log")
    for line in tuned.read_text(encoding="utf-8").splitlines()[:6]:
        match = _DEV_BLEU.match(line)
        if match:
            result.dev_bleu = 100 * float(match.group(1))
    return result
