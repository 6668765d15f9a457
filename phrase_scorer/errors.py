"""The project's one error type.

The library raises :class:`PhraseScorerError`; the command line turns it into a single line
``phrase-scorer: error: FILE line N: PROBLEM (HINT)`` and a non-zero exit status.
"""

from __future__ import annotations

import os
from typing import Optional


class PhraseScorerError(Exception):
    """A problem with the user's input or environment that the user can fix.

    ``path`` and ``line`` (1-based) locate the problem when it comes from a file; ``hint`` says
    what to do about it.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Optional[os.PathLike | str] = None,
        line: Optional[int] = None,
        hint: Optional[str] = None,
    ) -> None:
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.hint = hint
        super().__init__(str(self))

    def __reduce__(self):  # keep path, line and hint across processes (worker pools)
        return _rebuild, (self.message, self.path, self.line, self.hint)

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = "<stdin>" if self.path == "-" else self.path
            if self.line is not None:
                where += f" line {self.line}"
            where += ": "
        text = where + self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


def _rebuild(message, path, line, hint) -> PhraseScorerError:
    return PhraseScorerError(message, path=path, line=line, hint=hint)
