"""The project's one error type.

The library raises :class:`PhraseScorerError`; the command line turns it into a single line
``phrase-scorer: error: FILE line N: PROBLEM (HINT)`` and a non-zero exit status.

A message names a setting by its library name with :func:`setting` (``setting("valid_pairs")``):
a marker in the text that :func:`render` turns into the name the reader knows. A Python caller
reads the Python name (``valid_pairs``); the command line installs a renderer (:func:`renderer`)
that writes the flag (``--valid-pairs``). The marker is plain text, so it survives f-strings,
concatenation and pickling (an error raised in a worker process is rendered where it is shown).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from typing import Callable, Iterator, Optional

_MARK = "\x1e"  # a control character no message holds; json.dumps escapes it inside the marker
_MARKER = re.compile(_MARK + "([^" + _MARK + "]*)" + _MARK)

#: How a setting is written: (name, value or None, short) -> text. Python names by default.
Renderer = Callable[[str, object, bool], str]


def python_name(name: str, value: object, short: bool) -> str:
    return name if value is None else f"{name}={value}"


_renderer: Renderer = python_name


def setting(name: str, value: object = None, *, short: bool = False) -> str:
    """A marker naming the setting ``name`` (its Python parameter or config field name), given
    ``value`` if not None (True/False: a switch on or off); ``short`` asks for the short spelling
    where there is one (``-m``)."""
    if not isinstance(value, (type(None), bool, int, float, str)):
        value = str(value)
    return _MARK + json.dumps([name, value, short]) + _MARK


def render(text: str) -> str:
    """``text`` with every :func:`setting` marker written by the installed renderer."""
    if _MARK not in text:
        return text

    def one(match: re.Match) -> str:
        try:
            name, value, short = json.loads(match.group(1))
        except ValueError:  # not a marker: never shown raw
            return match.group(1)
        return _renderer(name, value, short)

    return _MARKER.sub(one, text).replace(_MARK, "")


@contextlib.contextmanager
def renderer(how: Renderer) -> Iterator[None]:
    """Write settings with ``how`` inside the block (the command line: as its flags)."""
    global _renderer
    before, _renderer = _renderer, how
    try:
        yield
    finally:
        _renderer = before


class PhraseScorerError(Exception):
    """A problem with the user's input or environment that the user can fix.

    ``path`` and ``line`` (1-based) locate the problem when it comes from a file; ``hint`` says
    what to do about it. ``message`` and ``hint`` read rendered (:func:`render`); ``raw_message``
    and ``raw_hint`` keep the :func:`setting` markers, for the process that shows the error.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Optional[os.PathLike | str] = None,
        line: Optional[int] = None,
        hint: Optional[str] = None,
    ) -> None:
        self.raw_message = message
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.raw_hint = hint
        super().__init__(str(self))

    @property
    def message(self) -> str:
        return render(self.raw_message)

    @property
    def hint(self) -> Optional[str]:
        return None if self.raw_hint is None else render(self.raw_hint)

    def __reduce__(self):  # keep path, line, hint and the settings' markers across processes (worker pools)
        return _rebuild, (self.raw_message, self.path, self.line, self.raw_hint)

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = "<stdin>" if self.path == "-" else self.path
            if self.line is not None:
                where += f" line {self.line}"
            where += ": "
        text = where + self.raw_message
        if self.raw_hint:
            text += f" ({self.raw_hint})"
        return render(text)


def _rebuild(message, path, line, hint) -> PhraseScorerError:
    return PhraseScorerError(message, path=path, line=line, hint=hint)
