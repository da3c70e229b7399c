"""Output paths: checked before any work, written atomically, and never removing what vlforge did not write.

Every directory vlforge builds as a whole (a checkpoint, an export, a tiny model, a fixed checkpoint) is
staged in a hidden sibling, sealed with a ledger ``.vlforge-written.json`` that lists each file it
wrote, fsynced, and renamed into place. Files vlforge writes into a directory it does not own (a run's
``metrics.jsonl``, a plot, a trace, a rewritten template) are recorded, with their size and mtime, in
the ledger of the directory that holds them. Removing or replacing an output removes only what a ledger
records: a file a user planted inside survives, and a path with no record is never overwritten. The one
exception is an unfinished staging directory (``.tmp-NAME``, ledger marked ``partial``), which is
vlforge's alone and is cleared when the next attempt starts.

The ``check_*`` functions run before a model or dataset is loaded, so a bad output path costs the user
one line and exit 2, not a finished run.

Example:
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "notes.txt").write_text("mine")
    4
    >>> with staged_dir(root / "out", writer="example") as stage:
    ...     _ = (stage / "weights.bin").write_bytes(b"0" * 8)
    >>> sorted(p.name for p in (root / "out").iterdir())
    ['.vlforge-written.json', 'weights.bin']
    >>> _ = (root / "out" / "user.txt").write_text("planted")
    >>> [p.name for p in remove_owned(root / "out")]   # the planted file is kept, with a warning
    ['user.txt']
    >>> check_output_file(root / "notes.txt", flag="--plot")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vlforge.errors.OutputError: --plot .../notes.txt: exists and was not written by vlforge; ...
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vlforge.errors import OutputError

logger = logging.getLogger(__name__)

LEDGER = ".vlforge-written.json"
STAGING_PREFIX = ".tmp-"


# --- atomic files -----------------------------------------------------------------------------------
def fsync_dir(directory: Path) -> None:
    """Make a rename or new entry in ``directory`` durable (silently skipped where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def cache_root() -> Path:
    """Root of everything vlforge caches (tiny and real-size presets, built tokenizers, data length sidecars):
    ``$VLFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/vlforge``, else ``~/.cache/vlforge``."""
    root = os.environ.get("VLFORGE_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vlforge"


@contextlib.contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive advisory file lock, for cache entries several processes may build at once (no-op where
    ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, writer: str | None = None) -> Path:
    """Write ``data`` to ``path`` through a fsynced temporary sibling and a rename, then fsync the directory.

    With ``writer`` the file is recorded in its directory's ledger (so a later run may replace it).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs are shared like any other file
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    if writer is not None:
        record(path, writer=writer)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str, *, writer: str | None = None) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"), writer=writer)


def atomic_write_json(path: str | os.PathLike[str], payload: Any, *, writer: str | None = None) -> Path:
    """:func:`atomic_write_bytes` for an indented, key-sorted JSON document."""
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n", writer=writer)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_failure(error: BaseException, *, no_room_only: bool = False) -> str | None:
    """The OS error behind a failed write as one line (``[Errno 28] No space left on device``), or None when
    ``error`` is not one. Looks through exception chains (torch's serializer reports a short write as a
    ``RuntimeError`` whose context is the ``OSError``), ``torch.distributed.checkpoint``'s per-rank failures and
    safetensors' I/O errors. ``no_room_only`` (an error from anywhere, not from a write): only the errors that
    mean there is no room to write (a full disk or quota, a file-size limit, a read-only filesystem)."""
    seen: set[int] = set()
    found_short = None
    pending: list[BaseException] = [error]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and (not no_room_only or current.errno in NO_ROOM):
            return f"[Errno {current.errno}] {current.strerror}" if current.errno else str(current)
        if type(current).__name__ == "SafetensorError" and "I/O error" in str(current):
            return str(current).strip().splitlines()[0]
        if isinstance(current, RuntimeError) and any(mark in str(current) for mark in _SHORT_WRITE):
            short = str(current).strip().splitlines()[0]  # the OSError stayed behind in another process
        else:
            short = None
        failures = getattr(current, "failures", None)  # torch.distributed.checkpoint's CheckpointException
        if isinstance(failures, dict):
            pending += [item[0] if isinstance(item, tuple) else item for item in failures.values()]
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
        found_short = found_short or short
    return f"a short write ({found_short})" if found_short else None


NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
"""OS errors that mean a write found no room."""
_SHORT_WRITE = ("unexpected pos", "failed writing file")
"""What torch's serializer says when a write came up short (a full disk, a file-size limit)."""


def write_room(path: str | os.PathLike[str]) -> str:
    """What limits writes at ``path``, in a few words: the free space of its device and this process's file-size
    limit (``ulimit -f``) when there is one; for messages about a short write."""
    parts = []
    with contextlib.suppress(OSError):
        parts.append(f"{_size(shutil.disk_usage(_nearest_existing(Path(path))).free)} free there")
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if soft != resource.RLIM_INFINITY:
            parts.append(f"file-size limit {_size(soft)} (ulimit -f)")
    return ", ".join(parts) or "no limit known"


# --- ledgers --------------------------------------------------------------------------------------------
def read_ledger(directory: Path) -> dict[str, Any] | None:
    """The ledger of ``directory``, or None when it has none (or an unreadable one)."""
    path = directory / LEDGER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("entries"), dict) else None


def _write_ledger(directory: Path, ledger: dict[str, Any]) -> None:
    atomic_write_json(directory / LEDGER, ledger)


def _stat(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def record(path: str | os.PathLike[str], *, writer: str, growing: bool = False) -> None:
    """Record the file ``path`` in the ledger of the directory that holds it (a directory vlforge built
    as a whole carries its own ledger instead, see :func:`seal`).

    ``growing`` marks a file vlforge appends to (a metrics log): only its name is checked later.
    """
    path = Path(path)
    ledger = read_ledger(path.parent) or {"vlforge": 1, "entries": {}}
    entry: dict[str, Any] = {"kind": "file", "writer": writer, "time": round(time.time(), 3)}
    if not growing:
        entry.update(_stat(path))
    ledger["entries"][path.name] = entry
    _write_ledger(path.parent, ledger)


def _forget(path: Path) -> None:
    ledger = read_ledger(path.parent)
    if ledger is not None and ledger["entries"].pop(path.name, None) is not None:
        _write_ledger(path.parent, ledger)


def _file_entry(path: Path) -> dict[str, Any] | None:
    """The ledger entry that records the file ``path``, or None."""
    for ancestor in path.parents:
        ledger = read_ledger(ancestor)
        if ledger is None:
            continue
        entry = ledger["entries"].get(path.relative_to(ancestor).as_posix())
        if entry is not None and entry.get("kind") == "file":
            return entry
        if ancestor == path.parent or not ledger.get("sealed"):
            return None
    return None


def owned(path: str | os.PathLike[str]) -> bool:
    """True when vlforge wrote ``path``: a sealed directory, or a file recorded unchanged in a ledger above it."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        ledger = read_ledger(path)
        return ledger is not None
    if not path.is_file():
        return False
    entry = _file_entry(path)
    return entry is not None and all(entry.get(k) in (None, v) for k, v in _stat(path).items())


def foreign_files(directory: Path) -> list[Path]:
    """Files (and symlinks) under a sealed ``directory`` that its ledger (or a subdirectory's own) does not record."""
    ledger = read_ledger(directory) or {"entries": {}}
    if ledger.get("partial"):
        return []
    known = set(ledger["entries"])
    found = []
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        nested = [d for d in dirs if not (base / d).is_symlink() and read_ledger(base / d) is not None]
        for name in nested:  # files written into a directory the caller made: recorded in its own ledger
            found += foreign_files(base / name)
        dirs[:] = [d for d in dirs if d not in nested]
        for name in files + [d for d in dirs if (base / d).is_symlink()]:
            rel = (base / name).relative_to(directory).as_posix()
            if rel != LEDGER and rel not in known:
                found.append(base / name)
    return sorted(found)


def remove_owned(path: str | os.PathLike[str]) -> list[Path]:
    """Remove what vlforge wrote at ``path``; returns the paths kept because vlforge did not write them.

    A file must be recorded unchanged in a ledger; a directory must carry its own ledger (only the
    files it lists are deleted, then directories left empty). Anything else raises :class:`OutputError`.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return []
    if not owned(path):
        raise OutputError(f"{path}: was not written by vlforge; refusing to remove it")
    if not path.is_dir():
        path.unlink()
        _forget(path)
        return []
    ledger = read_ledger(path) or {"entries": {}}
    if ledger.get("partial"):
        shutil.rmtree(path)  # an unfinished staging directory: vlforge's alone (see the module docstring)
        return []
    kept = foreign_files(path)
    for rel in ledger["entries"]:
        target = path / rel
        if target.is_file() and not target.is_symlink():
            target.unlink()
    (path / LEDGER).unlink(missing_ok=True)
    for root, _dirs, _files in sorted(os.walk(path, topdown=False), key=lambda w: -len(w[0])):
        with contextlib.suppress(OSError):
            Path(root).rmdir()  # only succeeds when empty: a user's file keeps its directory
    if path.exists():
        logger.warning("kept %s: it holds %d file(s) vlforge did not write (first: %s)", path, len(kept),
                       kept[0] if kept else "an empty directory")
    else:
        _forget(path)
    return kept


# --- staged directories ---------------------------------------------------------------------------------
def staging_path(target: Path) -> Path:
    return target.parent / f"{STAGING_PREFIX}{target.name}"


def make_staging(target: str | os.PathLike[str], *, writer: str, unique: bool = False) -> Path:
    """Create an empty staging sibling of ``target`` with a ``partial`` ledger.

    The default name ``.tmp-NAME`` is the same for every rank of a job (collective writers such as
    checkpoints); an unfinished one left by a killed run is cleared. ``unique`` adds a random suffix
    for writers that may run side by side, and clears the unfinished ones of dead processes.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if unique:
        _clear_dead_stagings(target)
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{target.name}.", dir=target.parent))
        os.chmod(stage, 0o777 & ~_umask())  # mkdtemp makes it private; outputs are not
    else:
        stage = staging_path(target)
        if stage.exists() or stage.is_symlink():
            if not is_partial(stage):
                raise OutputError(f"{stage}: exists and was not made by vlforge; remove it or choose another "
                                  "output path")
            logger.info("removing %s, left unfinished by an earlier run", stage)
            shutil.rmtree(stage)
        stage.mkdir()
    _write_ledger(stage, {"vlforge": 1, "partial": True, "writer": writer, "pid": os.getpid(),
                          "host": _host(), "entries": {}})
    return stage


def is_partial(path: Path) -> bool:
    """A staging directory left unfinished: its ledger says partial, or it is empty (a run killed between making
    it and writing its ledger; removing an empty directory loses nothing)."""
    if not path.is_dir() or path.is_symlink():
        return False
    ledger = read_ledger(path)
    return bool(ledger and ledger.get("partial")) or not any(path.iterdir())


def _host() -> str:
    import socket

    return socket.gethostname()


def _clear_dead_stagings(target: Path) -> None:
    for stage in target.parent.glob(f"{STAGING_PREFIX}{target.name}.*"):
        ledger = read_ledger(stage) if is_partial(stage) else None
        if ledger is None or ledger.get("host") != _host() or _alive(int(ledger.get("pid", 0))):
            continue
        logger.info("removing %s, left unfinished by an earlier run", stage)
        shutil.rmtree(stage, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def seal(directory: Path, *, writer: str) -> None:
    """Record every file under ``directory`` in its ledger (fsyncing each) and mark it complete."""
    entries: dict[str, Any] = {}
    for root, _dirs, files in os.walk(directory):
        base = Path(root)
        for name in files:
            file = base / name
            rel = file.relative_to(directory).as_posix()
            if rel == LEDGER:
                continue
            with contextlib.suppress(OSError), open(file, "rb") as handle:
                os.fsync(handle.fileno())
            entries[rel] = {"kind": "file", **_stat(file)}
        fsync_dir(base)
    _write_ledger(directory, {"vlforge": 1, "sealed": True, "writer": writer, "time": round(time.time(), 3),
                              "entries": entries})


def publish(stage: Path, target: str | os.PathLike[str], *, writer: str) -> Path:
    """Seal ``stage`` and rename it to ``target``, replacing a previous vlforge output there."""
    target = Path(target)
    seal(stage, writer=writer)
    if target.exists() or target.is_symlink():
        if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
            target.rmdir()
        else:
            kept = remove_owned(target)
            if kept:
                raise OutputError(f"{target}: holds {kept[0]}, which vlforge did not write; "
                                  "move it away or choose another output path")
    os.rename(stage, target)
    fsync_dir(target.parent)
    return target


@contextlib.contextmanager
def staged_dir(target: str | os.PathLike[str], *, writer: str) -> Iterator[Path]:
    """Build a directory in a staging sibling, then :func:`publish` it as ``target`` (removed on error)."""
    target = Path(target)
    stage = make_staging(target, writer=writer, unique=True)
    try:
        yield stage
        publish(stage, target, writer=writer)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


# --- checks before work -----------------------------------------------------------------------------------
def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path(path.anchor or ".")


def _check_writable_place(path: Path, flag: str, required_bytes: int | None, shown: Path | None = None) -> None:
    """``path`` (absent, or a directory) can be created or written into; enough free space when known.

    Errors name ``shown`` (the output the user gave) when it differs from ``path`` (its directory).
    """
    anchor = _nearest_existing(path)
    path = shown or path
    if not anchor.is_dir():
        raise OutputError(f"{flag} {path}: {anchor} is a file, not a directory")
    try:
        probe = tempfile.mkdtemp(prefix=".vlforge-probe-", dir=anchor)
        os.rmdir(probe)
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot write in {anchor} ({exc.strerror or exc})") from None
    if required_bytes:
        free = shutil.disk_usage(anchor).free
        if free < required_bytes:
            raise OutputError(f"{flag} {path}: needs about {_size(required_bytes)}, {anchor} has "
                              f"{_size(free)} free")


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def check_output_dir(path: str | os.PathLike[str], *, flag: str, mode: str = "into",
                     required_bytes: int | None = None) -> Path:
    """Check an output directory before any work; returns it as an absolute path.

    ``mode``: ``"new"`` (absent or empty), ``"replace"`` (absent, empty, or a vlforge output holding
    nothing else: it will be replaced) or ``"into"`` (any directory: files are added to it).
    """
    if mode not in ("new", "replace", "into"):
        raise ValueError(f"mode {mode!r}")
    path = Path(path).expanduser().absolute()
    if (path.exists() or path.is_symlink()) and not path.is_dir():
        raise OutputError(f"{flag} {path}: exists and is not a directory")
    _check_writable_place(path, flag, required_bytes)
    if mode != "into" and path.is_dir() and any(path.iterdir()):
        if mode == "new":
            raise OutputError(f"{flag} {path}: exists and is not empty; choose a new or empty directory")
        if not owned(path):
            raise OutputError(f"{flag} {path}: is not empty and was not written by vlforge (no {LEDGER}); "
                              "choose a new or empty directory")
        kept = foreign_files(path)
        if kept:
            raise OutputError(f"{flag} {path}: holds {kept[0].relative_to(path)}, which vlforge did not write; "
                              "move it away or choose another directory")
    return path


def check_output_file(path: str | os.PathLike[str], *, flag: str, required_bytes: int | None = None) -> Path:
    """Check an output file before any work: absent, or a file vlforge wrote there (it is replaced)."""
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        raise OutputError(f"{flag} {path}: is a directory; give a file path")
    if path.exists() and not owned(path):
        how = ("was changed since vlforge wrote it" if path.is_file() and _file_entry(path) is not None
               else "was not written by vlforge")
        raise OutputError(f"{flag} {path}: exists and {how}; refusing to overwrite it (remove it or choose another path)")
    _check_writable_place(path.parent, flag, required_bytes, shown=path)
    return path
