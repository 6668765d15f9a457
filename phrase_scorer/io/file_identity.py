"""The one identity of an input file (:func:`file_identity`): its size, then the SHA-256 of its
bytes, a recorded hash reused only for the untouched file (device, inode, size, modification and
change time)."""

from __future__ import annotations

import hashlib
import os
from stat import S_ISREG
from typing import Any, Mapping, Optional, Tuple

from phrase_scorer.io.paths import PathLike


IDENTITY_STAT = ("device", "inode", "size", "mtime_ns", "ctime_ns")  # what must all match to reuse a hash


def file_identity(path: PathLike) -> dict:
    """The one identity of an input file: ``{"path", "size", "mtime_ns", "sha256", "device",
    "inode", "ctime_ns"}``.

    Two identities are the same input when they hold the same bytes (:func:`identity_change`): the
    size decides first; when the sizes match, the SHA-256 of the bytes decides. The path is there
    to be read by people, never compared. The SHA-256 is ``None`` until it is needed: a record
    that is written (a resume record, a signature, a cache's description) holds it
    (:func:`hash_identities`), and a file takes its hash from the record instead of being read
    again only when it is still the same file with nothing done to it since: its device, inode,
    size, modification time and change time all as recorded (the change time moves with every
    write, and with ``touch -r``, ``cp -p`` or ``rsync -t`` restoring a modification time). A
    pipe or a device, which reading would consume, is known by its path, size and time alone."""
    info = os.stat(path)
    identity = {"path": os.path.abspath(path), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    if not S_ISREG(info.st_mode):
        return identity
    return {**identity, "sha256": None, "device": info.st_dev, "inode": info.st_ino, "ctime_ns": info.st_ctime_ns}


def is_file_identity(value: Any) -> bool:
    """Whether ``value`` is a :func:`file_identity` as recorded: a mapping with its size and
    SHA-256 (records of experiment steps before the identity had times hold no more)."""
    return isinstance(value, Mapping) and {"size", "sha256"} <= value.keys()


def identity_sha256(identity: dict) -> str:
    """The SHA-256 of the file ``identity`` describes, read (once) if it is not known yet."""
    if identity.get("sha256") is None:
        identity["sha256"] = file_sha256(identity["path"])
    return identity["sha256"]


def untouched(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether ``current`` is the very file ``saved`` recorded with nothing done to it since
    (:data:`IDENTITY_STAT` all equal; a record without them never is)."""
    return all(saved.get(key) is not None and saved.get(key) == current.get(key) for key in IDENTITY_STAT)


def identity_change(saved: Mapping[str, Any], current: dict) -> Optional[Tuple[str, Any, Any]]:
    """None when the file ``current`` identifies holds the bytes ``saved`` recorded; else what
    differs, as ``(key, saved value, current value)``: its ``size``, or its ``sha256`` (same size,
    other bytes). The file is hashed unless it is :func:`untouched` since the record, when
    ``current`` takes the recorded hash."""
    if saved.get("size") != current.get("size"):
        return "size", saved.get("size"), current.get("size")
    if current.get("sha256") is None and saved.get("sha256") is not None and untouched(saved, current):
        current["sha256"] = saved.get("sha256")
        return None
    digest = identity_sha256(current)
    return None if digest == saved.get("sha256") else ("sha256", saved.get("sha256"), digest)


def hash_identities(value: Any) -> Any:
    """Fill in the SHA-256 of every :func:`file_identity` inside ``value`` (nested mappings and
    lists) that lacks one, before ``value`` is written as a record; returns ``value``."""
    if is_file_identity(value) and isinstance(value, dict):
        identity_sha256(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            hash_identities(item)
    elif isinstance(value, list):
        for item in value:
            hash_identities(item)
    return value


def file_sha256(path: PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
