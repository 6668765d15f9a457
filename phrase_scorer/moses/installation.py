"""Finding a Moses installation and running its programs.

A Moses installation is a folder with ``bin/`` (the decoder, and mert's ``extractor``, ``mert``,
``kbmira``, ``pro`` and ``evaluator``) and ``scripts/`` (``training/mert-moses.pl``), given by
``--moses-home`` or the ``MOSES_HOME`` environment variable. Programs are started with argument
lists (never through a shell), their output goes to a log file, and a failure is reported with
the end of that log.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.inputs import text_lines
from phrase_scorer.io.paths import PathLike

log = logging.getLogger(__name__)

MERT_PROGRAMS = ("extractor", "mert", "kbmira", "pro", "evaluator")


@dataclass(frozen=True)
class MosesInstallation:
    home: Path

    @classmethod
    def find(cls, home: Optional[PathLike] = None) -> "MosesInstallation":
        value = home or os.environ.get("MOSES_HOME")
        if not value:
            raise PhraseScorerError(
                "no Moses installation given",
                hint=Text("pass ", setting("moses_home", "DIR"),
                          " or set MOSES_HOME to a folder with bin/moses and scripts/"),
            )
        installation = cls(Path(value).resolve())
        if not installation.home.is_dir():
            raise PhraseScorerError("Moses home is not a folder", path=value,
                                    hint=Text("check ", setting("moses_home"), " / MOSES_HOME"))
        return installation

    @classmethod
    def given(cls, moses: "MosesGiven") -> "MosesInstallation":
        """``moses`` itself when it is an installation, else the one found in the folder it names
        (:meth:`find`; None: ``MOSES_HOME``)."""
        return moses if isinstance(moses, MosesInstallation) else cls.find(moses)

    @property
    def bin(self) -> Path:
        return self.home / "bin"

    def program(self, name: str) -> Path:
        return require_program(self.bin / name, f"Moses program {name}",
                               Text("build Moses with its bjam, or point ", setting("moses_home"), " elsewhere"))

    def decoder(self, name: str = "moses") -> Path:
        return self.program(name)

    def script(self, relative: str) -> Path:
        path = self.home / "scripts" / relative
        if not path.is_file():
            raise PhraseScorerError(f"Moses script {relative} is missing", path=path,
                                    hint="MOSES_HOME/scripts must be Moses' scripts/ folder")
        return path

    def check_mert(self, mertdir: Optional[PathLike] = None) -> Path:
        """mert-moses.pl dies unless all of mert's programs are in its ``--mertdir`` (by default
        ``bin/``); say so first. Returns that folder."""
        folder = Path(mertdir).resolve() if mertdir else self.bin
        for name in MERT_PROGRAMS:
            require_program(folder / name, f"mert program {name}",
                            Text("build Moses' mert programs, or point ", setting("mertdir"), " or ",
                                 setting("moses_home"), " elsewhere"))
        return folder


#: Moses as a function of the library takes it: an installation, or the folder of one (its
#: ``--moses-home``), found once the function needs it; None: the ``MOSES_HOME`` environment variable's.
MosesGiven = Union[MosesInstallation, PathLike, None]


def require_program(path: Path, what: str, hint: str) -> Path:
    """``path`` if it is an executable file, else an error saying ``what`` is missing."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise PhraseScorerError(f"{what} is missing", path=path, hint=hint)
    return path


_BLEU_AT = re.compile(r"^\((\d+)\) BEST at \d+: .* => ([-\d.]+) at")
_RUN_START = re.compile(r"^run (\d+) start at")


def parse_mert_progress(line: str) -> Optional[Dict[str, float]]:
    """mert-moses.pl's own progress lines: an iteration starting, or its dev BLEU."""
    match = _BLEU_AT.match(line)
    if match:
        return {"iteration": int(match.group(1)), "bleu": float(match.group(2))}
    match = _RUN_START.match(line)
    if match:
        return {"iteration": int(match.group(1))}
    return None


def read_lines(path: PathLike) -> List[str]:
    """Lines of a plain or gzip text file, without their line ends (:func:`~phrase_scorer.io.inputs.text_lines`:
    only ``\\n`` ends a line, as Moses reads it, and a ``\\r`` before it is dropped)."""
    return [text for _, text in text_lines(path)]


def write_lines(path: PathLike, lines: Sequence[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
