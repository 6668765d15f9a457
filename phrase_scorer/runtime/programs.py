"""Running an external program (Moses' decoder, mert-moses.pl, mert, a binariser): an argument
list, never a shell string; its output appended to a log file; a failure as one line that quotes
the end of the log and names the whole log.

The log is never written through a link: it is created when missing, and an existing one is
appended to only when it is a regular file of its own (no symbolic link, no other name), so a
link planted at a log's fixed name (``OUT.log``) never reaches the file it points at."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import subprocess
from collections import deque
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence

from phrase_scorer.errors import PhraseScorerError, Text, setting
from phrase_scorer.io.os_errors import describe_os_error, out_of_resources
from phrase_scorer.io.paths import PathLike

log = logging.getLogger(__name__)


def last_lines(path: PathLike, lines: int = 5) -> List[str]:
    """The last ``lines`` non-blank lines of a log (none if it cannot be read)."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return [line.strip() for line in deque((l for l in f if l.strip()), maxlen=lines)]
    except OSError:
        return []


def open_log(path: PathLike) -> IO[str]:
    """``path`` opened for appending (see the module docstring): created when missing, never
    followed through a symbolic link, refused when it is not a regular file of its own."""
    flags = (os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
             | getattr(os, "O_NONBLOCK", 0))  # a FIFO is refused, not waited on
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PhraseScorerError("the log is a symbolic link: refusing to write through it", path=path,
                                    hint="move the link away, or choose another output") from None
        raise describe_os_error(exc, path) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        problem = "is not a regular file" if not stat.S_ISREG(info.st_mode) else "has another name (a hard link)"
        raise PhraseScorerError(f"the log {problem}: refusing to write to it", path=path,
                                hint="move it away, or choose another output")
    return os.fdopen(fd, "a", encoding="utf-8")


def cannot_start(program: str, exc: OSError) -> PhraseScorerError:
    """Why ``program`` could not be started: no such program, or no open file, memory or process
    left for it (named with the limit, :func:`~phrase_scorer.io.os_errors.out_of_resources`)."""
    shortage = out_of_resources(exc)
    if shortage is not None:
        return PhraseScorerError(Text(f"cannot start {program}: ", shortage.message), hint=shortage.hint)
    return PhraseScorerError(f"cannot start {program}: {exc.strerror}", path=program)


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
    with open_log(log_path) as log_file:
        log_file.write(f"$ {' '.join(argv)}\n")
        log_file.flush()
        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, stdin=stdin, stdout=stdout if stdout is not None else subprocess.PIPE,
                stderr=subprocess.STDOUT if stdout is None else subprocess.PIPE, text=True, errors="replace", env=env,
            )
        except OSError as exc:
            raise cannot_start(argv[0], exc) from None
        stream = proc.stdout if stdout is None else proc.stderr
        assert stream is not None  # piped above
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
    if code != 0:  # a signal's death (the out-of-memory killer's SIGKILL) named as the workers' is
        from phrase_scorer.runtime.supervisor import how_it_ended

        how = f"failed with exit status {code}" if code > 0 else how_it_ended(code)
        raise PhraseScorerError(
            f"{Path(argv[0]).name} {how}: " + (" / ".join(last_lines(log_path)) or "no output"),
            path=log_path, hint=f"its whole log is {log_path}; the command: {' '.join(argv)}",
        )


WORKDIR_MARK = ".phrase-scorer-{verb}"  # in a working folder: which verb made it


def fresh_directory(path: Path, verb: str = "tune") -> Path:
    """Create the working folder ``path`` of an external program, empty. An old one is removed
    only if a previous run of ``verb`` made it (its mark file); a link there, or a folder of
    anyone else's, is refused."""
    if path.is_symlink():
        raise PhraseScorerError("the working folder is a symbolic link", path=path,
                                hint=Text("choose another ", setting("working_dir"), " or remove the link"))
    if path.exists():
        mark = path / WORKDIR_MARK.format(verb=verb)
        if not (mark.is_file() and not mark.is_symlink()):
            raise PhraseScorerError(f"working directory exists and was not made by phrase-scorer {verb}", path=path,
                                    hint=Text("choose another ", setting("working_dir"), " or remove it"))
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / WORKDIR_MARK.format(verb=verb)).write_text(f"made by phrase-scorer {verb}; removed by the next run with "
                                                       "this working dir\n")
    return path
