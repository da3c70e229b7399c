"""The data files a checkpoint was saved reading, so that a run resumes only on the same data.

A file is identified by its size and the sha256 of its first and last 16 KiB (cheap for any size): the same bytes
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
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EDGE_BYTES = 1 << 14
"""Bytes hashed at each end of a file (every rank reads them from every data file at a resume)."""


def fingerprint(path: Path, chunks: int = 8, chunk_size: int = 1 << 16) -> str:
    """Content fingerprint: size and sha256 of ``chunks`` evenly spaced pieces (whole file when small)."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        if size <= chunks * chunk_size:
            digest.update(fh.read())
        else:
            for k in range(chunks):
                fh.seek((size - chunk_size) * k // (chunks - 1))
                digest.update(fh.read(chunk_size))
    return digest.hexdigest()


def file_identity(path: Path) -> dict[str, Any]:
    """``{"path", "size", "sha256"}``: the digest covers the size and the file's first and last ``EDGE_BYTES``."""
    return {"path": str(path), "size": path.stat().st_size, "sha256": fingerprint(path, 2, EDGE_BYTES)}


def data_files(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The identity of every data file, in the order the run reads its entries."""
    return [file_identity(Path(path)) for path in paths]


def recorded(value: Any) -> list[dict[str, Any]] | None:
    """The file identities a checkpoint holds, or None when it holds none in this form (saved before they were)."""
    keys = {"path", "size", "sha256"}
    if isinstance(value, list) and all(isinstance(item, dict) and keys <= item.keys() for item in value):
        return value
    return None


def first_change(saved: list[dict[str, Any]], now: list[dict[str, Any]]) -> str | None:
    """What differs between the files a checkpoint was saved reading and the files now, in words (the first
    difference), or None when they are the same, in the same order (paths aside: the same bytes moved)."""
    def key(file: dict[str, Any]) -> tuple[int, str]:
        return file["size"], file["sha256"]

    if [key(f) for f in saved] == [key(f) for f in now]:
        return None
    if sorted(map(key, saved)) == sorted(map(key, now)):
        moved = next(i for i, (a, b) in enumerate(zip(saved, now, strict=True)) if key(a) != key(b))
        then = next(i for i, f in enumerate(saved) if key(f) == key(now[moved]))
        if saved[then]["path"] == now[moved]["path"]:  # entries reordered
            return f"the same files in another order ({now[moved]['path']} was data file {then + 1}, now {moved + 1})"
        return f"the same files in another order ({now[moved]['path']} now holds what {saved[then]['path']} held)"
    if len(saved) != len(now):
        then_keys, now_keys = Counter(map(key, saved)), Counter(map(key, now))
        extra = [f for f in now if _take(then_keys, key(f))]
        removed = [f["path"] for f in saved if _take(now_keys, key(f))]
        copies = [f["path"] for f in extra if key(f) in map(key, saved)]
        added = [f["path"] for f in extra if key(f) not in map(key, saved)]
        named = (f"; new or changed: {_some(added)}" if added else "") + \
                (f"; listed again: {_some(copies)}" if copies else "") + \
                (f"; gone or changed: {_some(removed)}" if removed else "")
        return f"{len(saved)} data file(s) then, {len(now)} now{named}"
    index, (before, after) = next((i, pair) for i, pair in enumerate(zip(saved, now, strict=True))
                                  if key(pair[0]) != key(pair[1]))
    what = (f"{before['size']:,} bytes then, {after['size']:,} now" if before["size"] != after["size"]
            else "the same size, other bytes")
    if before["path"] == after["path"]:
        return f"{after['path']} changed ({what})"
    return f"data file {index + 1} was {before['path']}, now {after['path']} ({what})"


def _take(counts: Counter, key: tuple[int, str]) -> bool:
    """True when ``key`` is not (any more) in ``counts``; else one of it is used up."""
    if counts[key] > 0:
        counts[key] -= 1
        return False
    return True


def _some(paths: list[str], shown: int = 2) -> str:
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return ", ".join(paths[:shown]) + more
