"""The project's one error type, and the settings its messages name.

The library raises :class:`PhraseScorerError`; the command line turns it into a single line
``phrase-scorer: error: FILE line N: PROBLEM (HINT)`` and a non-zero exit status.

A message names a setting by its library name with :func:`setting` (``setting("valid_pairs")``),
and the reader sees the name they know: a Python caller the Python name (``valid_pairs``,
``resume=True``), the command line's user the flag of the verb that runs (``--valid-pairs``,
``--resume``), read from that verb's own options. A message that names another verb's flag (the
command to run next) says which: ``setting("decoder_flags", verb="rerank")``. The setting
travels as data, never as text: a message that names one is a :class:`Text`, made of
its literal pieces and its :class:`Setting` objects::

    hint=Text("run again without ", setting("resume"))

A :class:`Text` is a ``str`` whose characters are the library's spelling, so a Python caller, a
test and any code that reads, compares or searches the message use it as the plain string it is;
it also keeps its parts, and :meth:`Text.render` writes them with another spelling. The command
line does that in one place, where it shows an error or a logged message
(:mod:`phrase_scorer.cli.group`); nothing in the library chooses a spelling, and nothing global
changes while a command runs. An error pickles with its parts, so one raised in a worker process
renders where it is shown.

Why not f-strings: formatting a :class:`Setting` into an f-string (or concatenating it as a plain
``str``) keeps only its library spelling, since an f-string's result is plain text. Adding a
:class:`Text` to a ``str`` (``+``) keeps the parts; anything else that builds a message naming a
setting is made a :class:`Text` (the layout tests refuse a ``setting(...)`` inside an f-string).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union


@dataclass(frozen=True)
class Setting:
    """The setting ``name`` (its Python parameter or config field name), given ``value`` unless it
    is None (True/False: a switch on or off); ``short`` asks for the short spelling where there is
    one (``-m``); ``verb`` names the verb whose flag it is (``"moses-ini"``, ``"plot embeddings"``)
    when that is not the verb running. ``str()`` is the library's spelling: ``name`` or ``name=value``."""

    name: str
    value: object = None
    short: bool = False
    verb: Optional[str] = None

    def __str__(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


#: How a setting is written: the library's spelling is ``str`` (:meth:`Setting.__str__`).
Spelling = Callable[[Setting], str]

Part = Union[str, Setting]


def setting(name: str, value: object = None, *, short: bool = False, verb: Optional[str] = None) -> Setting:
    """The setting ``name`` given ``value`` (see :class:`Setting`); a value of another type than
    None, bool, int, float or str is kept as its text."""
    if not isinstance(value, (type(None), bool, int, float, str)):
        value = str(value)
    return Setting(name, value, short, verb)


class Text(str):
    """Text that may name settings: the ``str`` is the library's spelling, :attr:`parts` the
    literal pieces (``str``) and the :class:`Setting` objects it is made of."""

    parts: Tuple[Part, ...]

    def __new__(cls, *parts: Part) -> "Text":
        flat: list = []
        for part in parts:
            if isinstance(part, Text):
                flat.extend(part.parts)
            elif isinstance(part, (str, Setting)):
                flat.append(str(part) if isinstance(part, str) else part)
            else:
                raise TypeError(f"a Text is made of str and Setting, not {type(part).__name__}")
        self = super().__new__(cls, "".join(map(str, flat)))
        self.parts = tuple(flat)
        return self

    def render(self, spelling: Spelling = str) -> str:
        """The text with every setting written by ``spelling`` (the command line: its flags)."""
        return "".join(part if isinstance(part, str) else spelling(part) for part in self.parts)

    def __add__(self, other: object) -> "Text":
        if isinstance(other, (str, Setting)):
            return Text(self, other)
        return NotImplemented

    def __radd__(self, other: object) -> "Text":
        if isinstance(other, (str, Setting)):
            return Text(other, self)
        return NotImplemented

    def __reduce__(self):  # pickles (worker processes) and copies with its parts
        return Text, self.parts


def rendered(value: object, spelling: Spelling = str) -> str:
    """``value`` as text, its settings (if it names any) written by ``spelling``: a
    :class:`Text`, a :class:`Setting` or a :class:`PhraseScorerError`; anything else is ``str(value)``."""
    if isinstance(value, Setting):
        return spelling(value)
    if isinstance(value, (Text, PhraseScorerError)):
        return value.render(spelling)
    return str(value)


class PhraseScorerError(Exception):
    """A problem with the user's input or environment that the user can fix.

    ``path`` and ``line`` (1-based) locate the problem when it comes from a file; ``hint`` says
    what to do about it. ``message`` and ``hint`` are :class:`Text` (a ``str`` in the library's
    spelling); ``str(error)`` is the whole line in the library's spelling, :meth:`render` the same
    with another spelling of the settings it names.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Optional[os.PathLike | str] = None,
        line: Optional[int] = None,
        hint: Optional[str] = None,
    ) -> None:
        self.message = _text(message)
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.hint = None if hint is None else _text(hint)
        super().__init__(str(self))

    @property
    def text(self) -> Text:
        """The whole line: where, the message and the hint (in parentheses)."""
        where = ""
        if self.path is not None:
            where = "<stdin>" if self.path == "-" else shown_name(self.path)
            if self.line is not None:
                where += f" line {self.line}"
            where += ": "
        whole = Text(where, self.message)
        if self.hint:
            whole = Text(whole, " (", self.hint, ")")
        return whole

    def render(self, spelling: Spelling = str) -> str:
        return self.text.render(spelling)

    def __reduce__(self):  # keep path, line, hint and the settings named across processes (worker pools)
        return _rebuild, (self.message, self.path, self.line, self.hint)

    def __str__(self) -> str:
        return str.__str__(self.text)


def shown_name(name: str) -> str:
    """A file name as a message shows it: unchanged while every character prints, else quoted and
    escaped as Python's ``repr`` writes it (``'bad\\nname.txt'``), so that a newline, a carriage
    return or a terminal's escape sequence in a name neither splits the one-line error nor acts
    on the terminal."""
    return name if name.isprintable() else repr(name)


def one_line(message: str) -> str:
    """``message`` with every character that does not print (a newline, a tab, an escape) written
    as Python's ``repr`` writes it: what the command line shows is one line whatever the names in
    it hold."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def _text(value: object) -> Text:
    return Text(value if isinstance(value, (str, Setting)) else str(value))


def _rebuild(message, path, line, hint) -> PhraseScorerError:
    return PhraseScorerError(message, path=path, line=line, hint=hint)
