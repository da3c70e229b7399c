"""The data files a checkpoint was saved reading, so that a run resumes only on the same data.

A file is identified by its size and the sha256 of its first and last 64 KiB (cheap for any size): the same bytes
under another path (a dataset moved or copied to another machine) are the same data; a file appended to, cut,
replaced, added or removed is not - a JSON Lines stream resumes at a byte offset, a parquet one at a row.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "d.jsonl"
    >>> _ = path.write_text('{"a": 1}\\n')
    >>> saved = [file_identity(path)]
    >>> _ = path.write_text('{"a": 1}\\n{"a": 2}\\n')
    >>> first_change(saved, [file_identity(path)])  # doctest: +ELLIPSIS
    '.../d.jsonl changed (9 bytes then, 18 now)'
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EDGE_BYTES = 1 << 16
"""Bytes hashed at each end of a file."""


def file_identity(path: Path) -> dict[str, Any]:
    """``{"path", "size", "sha256"}``: the digest covers the size and the file's first and last ``EDGE_BYTES``."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as handle:
        digest.update(handle.read(EDGE_BYTES))
        if size > EDGE_BYTES:
            handle.seek(max(EDGE_BYTES, size - EDGE_BYTES))
            digest.update(handle.read(EDGE_BYTES))
    return {"path": str(path), "size": size, "sha256": digest.hexdigest()}


def data_files(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The identity of every data file, in the order the run reads its entries."""
    return [file_identity(Path(path)) for path in paths]


def first_change(saved: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    """What differs between the files a checkpoint was saved reading and the files now, in words (the first
    difference), or None when they are the same (paths aside)."""
    if len(saved) != len(now):
        then_paths = {f["path"] for f in saved}
        now_paths = {f["path"] for f in now}
        added = [f["path"] for f in now if f["path"] not in then_paths]
        removed = [f["path"] for f in saved if f["path"] not in now_paths]
        named = (f"; added {_some(added)}" if added else "") + (f"; removed {_some(removed)}" if removed else "")
        return f"{len(saved)} data file(s) then, {len(now)} now{named}"
    for before, after in zip(saved, now, strict=True):
        if (before["size"], before["sha256"]) == (after["size"], after["sha256"]):
            continue
        if before["size"] != after["size"]:
            return f"{after['path']} changed ({before['size']:,} bytes then, {after['size']:,} now)"
        return f"{after['path']} changed (the same size, other bytes)"
    return None


def _some(paths: list[str], shown: int = 2) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more
