"""The one rule of ``--resume``: an interrupted run goes on only with the settings it began with.

Training (its settings and its pair cache) and annotation each save what made their work; on
``--resume`` they hand the saved and the current settings to :func:`refuse_changed_settings`,
which names every difference in one message of one form.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

from phrase_scorer.errors import PhraseScorerError
from phrase_scorer.io.files import PathLike

_MISSING = "(none)"


def refuse_changed_settings(saved: Mapping[str, Any], current: Mapping[str, Any], *, path: Optional[PathLike] = None,
                            hint: str = "run again without --resume", label: Callable[[str], str] = str) -> None:
    """Raise a one-line :class:`PhraseScorerError` naming what changed, if anything did:

    ``cannot resume: NAME, ... changed since the interrupted run (NAME.KEY: SAVED -> NOW, ...)``,
    nested mappings compared key by key and named with dotted paths.
    """
    changes = list(_differences(saved, current, ""))
    if not changes:
        return
    names = list(dict.fromkeys(label(name.split(".")[0]) for name, _, _ in changes))
    details = ", ".join(f"{label(name)}: {_short(old)} -> {_short(new)}" for name, old, new in changes)
    raise PhraseScorerError(f"cannot resume: {', '.join(names)} changed since the interrupted run ({details})",
                            path=path, hint=hint)


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any], prefix: str):
    for key in [*saved, *(k for k in current if k not in saved)]:
        old, new = saved.get(key, _MISSING), current.get(key, _MISSING)
        if old == new:
            continue
        name = f"{prefix}{key}"
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            yield from _differences(old, new, name + ".")
        else:
            yield name, old, new


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
