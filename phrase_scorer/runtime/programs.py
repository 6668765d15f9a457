"""Running an external program (Moses' decoder, mert-moses.pl, mert, a binariser): an argument
list, never a shell string; its output appended to a log file; a failure as one line that quotes
the end of the log and names the whole log."""

from __future__ import annotations

import logging
import os
import subprocess
from collections import deque
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import PathLike

log = logging.getLogger(__name__)


def last_lines(path: PathLike, lines: int = 5) -> List[str]:
    """The last ``lines`` non-blank lines of a log (none if it cannot be read)."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return [line.strip() for line in deque((l for l in f if l.strip()), maxlen=lines)]
    except OSError:
        return []


def run_logged(
    args: Sequence[PathLike],
    log_path: PathLike,
    *,
    cwd: Optional[PathLike] = None,
    stdin: Optional[IO] = None,
    stdout: Optional[IO] = None,
    on_line: Optional[Callable[[str], None]] = None,
    env: Optional[Dict[str, str]] = None,
) -> None:
    """Run ``args`` (a list, no shell), appending its output to ``log_path``.

    With ``stdout`` given, the program's standard output goes there and only stderr to the log.
    ``on_line`` sees each logged line as it comes (for progress). A non-zero exit raises a
    PhraseScorerError that quotes the end of the log.
    """
    argv = [os.fspath(a) for a in args]
    log.debug("running %s", " ".join(argv))
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {' '.join(argv)}\n")
        log_file.flush()
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdin=stdin, stdout=stdout if stdout is not None else subprocess.PIPE,
                stderr=subprocess.STDOUT if stdout is None else subprocess.PIPE, text=True, errors="replace", env=env,
            )
        except OSError as exc:
            raise PhraseScorerError(f"cannot start {argv[0]}: {exc.strerror}", path=argv[0]) from None
        stream = proc.stdout if stdout is None else proc.stderr
        try:
            for line in stream:
                log_file.write(line)
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if code != 0:
        raise PhraseScorerError(
            f"{Path(argv[0]).name} failed with exit status {code}: "
            + (" / ".join(last_lines(log_path)) or "no output"),
            path=log_path, hint=f"its whole log is {log_path}; the command: {' '.join(argv)}",
        )
