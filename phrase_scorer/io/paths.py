"""What the commands call a path: a ``str`` or ``os.PathLike`` (``PathLike``), ``-`` for
standard input or output (``STDIO``), and the names derived from one (a ``.gz`` name, the
``.part`` an output is written under before it is renamed into place)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union


PathLike = Union[str, os.PathLike]
STDIO = "-"


def is_gzip_name(path: PathLike) -> bool:
    return os.fspath(path).endswith(".gz")


def part_path(path: PathLike) -> Path:
    """The temporary file an output is written to before it is renamed into place."""
    path = Path(path)
    return path.with_name(path.name + ".part")
