"""One Moses process for a whole input: sentences in on stdin, n-best lists out on stdout.

``moses -f INI -n-best-list - N distinct`` writes each sentence's n-best list to standard output,
flushed sentence by sentence in input order whatever its thread count, and no 1-best
(``moses/IOWrapper.cpp``, ``moses/OutputCollector.h``). :class:`NBestStream` starts it once, so
Moses loads its tables once per run instead of once per chunk (several seconds for a real
system), feeds it the sentences from a thread of its own (the pipes are small: Moses must be able
to write while it reads), and hands out the lists sentence range by sentence range, each renumbered
from 0 and written to a file of the caller's. The process runs with an argument list, its
standard error appended to a log file, which a failure quotes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path
from typing import IO, Iterable, List, Optional, Tuple

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.paths import PathLike
from phrase_scorer.runtime.programs import cannot_start, last_lines

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 8


class NBestStream:
    """Moses decoding ``sentences`` (an iterable of source lines, read by a feeding thread) into
    n-best lists of ``size`` distinct hypotheses. :meth:`write_next` writes the lists of the next
    ``count`` sentences to a file; :meth:`close` stops the process."""

    def __init__(self, decoder: PathLike, ini: PathLike, sentences: Iterable[str], *, size: int, threads: int,
                 flags: str, log_path: PathLike) -> None:
        ini = Path(ini).resolve()
        self.log_path = Path(log_path)
        self.argv = [os.fspath(decoder), "-f", os.fspath(ini), "-threads", str(threads), *flags.split(),
                     "-n-best-list", "-", str(size), "distinct"]
        self._log = open(self.log_path, "a", encoding="utf-8")
        self._log.write(f"$ {' '.join(self.argv)}\n")
        self._log.flush()
        try:
            self.process = subprocess.Popen(self.argv, cwd=ini.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=self._log, text=True, encoding="utf-8", errors="replace")
        except OSError as exc:
            self._log.close()
            raise cannot_start(self.argv[0], exc) from None
        self.next_id = 0  # Moses' id of the next sentence to hand out
        self._pending: Optional[Tuple[int, str]] = None  # a line read ahead: (its sentence id, the rest of it)
        self._feed_error: List[BaseException] = []
        self._feeder = threading.Thread(target=self._feed, args=(sentences, self.process.stdin),
                                        name="phrase-scorer-moses-input", daemon=True)
        self._feeder.start()

    def _feed(self, sentences: Iterable[str], stdin: IO[str]) -> None:
        try:
            for sentence in sentences:
                stdin.write(sentence + "\n")
            stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass  # Moses stopped: write_next reports how
        except BaseException as exc:  # the source could not be read: raised by write_next
            self._feed_error.append(exc)
            self.process.kill()

    def _read(self) -> Optional[Tuple[int, str]]:
        """The next line of the lists as (sentence id, the line after the id), None at their end."""
        if self._pending is not None:
            line, self._pending = self._pending, None
            return line
        assert self.process.stdout is not None
        text = self.process.stdout.readline()
        if not text:
            return None
        head, separator, rest = text.partition(" ||| ")
        if not separator or not (head.strip().isascii() and head.strip().isdigit()):
            self._fail(f"Moses wrote a line that is not an n-best entry: {text[:80]!r}")
        return int(head), rest

    def write_next(self, count: int, path: PathLike) -> None:
        """Write the lists of the next ``count`` sentences to ``path``, their ids counted from 0
        (a sentence Moses found no translation for has no lines, as in Moses' own lists)."""
        stop = self.next_id + count
        with open(path, "w", encoding="utf-8") as out:
            while True:
                line = self._read()
                if line is None:
                    self._check_ended(stop)
                    break
                sentence, rest = line
                if sentence >= stop:
                    self._pending = line
                    break
                if sentence < self.next_id:
                    self._fail(f"Moses wrote sentence {sentence} after sentence {self.next_id}")
                out.write(f"{sentence - self.next_id} ||| {rest}")
        self.next_id = stop

    def _check_ended(self, stop: int) -> None:
        """At the end of Moses' output: fine once every sentence was fed and Moses exited with 0."""
        code = self.process.wait()
        if self._feed_error:
            raise self._feed_error[0]
        if code != 0:
            from phrase_scorer.runtime.supervisor import how_it_ended

            self._fail(f"Moses stopped with exit code {code}" if code > 0 else f"Moses {how_it_ended(code)}")

    def _fail(self, message: str) -> None:
        self.close()
        quoted = " | ".join(last_lines(self.log_path, LOG_TAIL_LINES))
        raise PhraseScorerError(f"{message}: {quoted}" if quoted else message, path=self.log_path,
                                hint="see the decoder's log; check the moses.ini and the decoder flags")

    def close(self) -> None:
        """Stop Moses (if it still runs) and wait for it and the feeding thread."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdout, self.process.stdin):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):  # ValueError: the feeding thread was closing it too, as Moses died
                pass
        self._feeder.join()
        self._log.close()
