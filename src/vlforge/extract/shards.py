"""Shard files: rows of per-sample tensors written atomically, their checksum, and the per-shard receipt.

safetensors layout: a fixed-shape key ``K`` is one tensor (rows, ...); a ragged key (see
``features.RAGGED``) is all rows concatenated on dim 0 plus ``K.offsets`` (rows + 1, int64);
``row_index`` (rows,) holds each row's position in the global order; the header metadata ``vlforge`` holds
``{"format": 1, "sample_ids": [...]}`` as JSON. parquet layout: one row per sample with ``sample_id``, ``row_index`` and, per key,
the tensor's raw little-endian bytes (``K``) and its shape (``K.shape``); dtypes are in the manifest.

Every file is written to a temporary name in the same directory, fsynced, renamed into place, and the
directory fsynced, so a killed run leaves either the whole file or none.

Example:
    >>> import tempfile, torch, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> rows = [{"hidden_mean": torch.ones(1, 4)}, {"hidden_mean": torch.zeros(1, 4)}]
    >>> digest = write_shard(d / "s.safetensors", rows, ["a:1", "a:2"], [0, 1], "safetensors")
    >>> digest == sha256_file(d / "s.safetensors")
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from vlforge.extract.features import RAGGED

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a fsynced temporary file and a rename (then fsync the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; caches are shared like any other output
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem lets a directory be opened / fsynced
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write(path, (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode())


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def _safetensors_bytes(rows: list[dict[str, torch.Tensor]], sample_ids: list[str], indices: list[int]) -> bytes:
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {"row_index": torch.tensor(indices, dtype=torch.int64)}
    for key in rows[0] if rows else []:
        parts = [r[key] for r in rows]
        if key in RAGGED:
            offsets = torch.zeros(len(parts) + 1, dtype=torch.int64)
            offsets[1:] = torch.cumsum(torch.tensor([p.shape[0] for p in parts], dtype=torch.int64), 0)
            tensors[key] = torch.cat(parts).contiguous()
            tensors[f"{key}.offsets"] = offsets
        else:
            tensors[key] = torch.stack(parts).contiguous()
    # one metadata key: safetensors stores the metadata map in no fixed order, and the bytes must be stable
    return save(tensors, metadata={"vlforge": json.dumps({"format": 1, "sample_ids": sample_ids})})


def _raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _parquet_bytes(rows: list[dict[str, torch.Tensor]], sample_ids: list[str], indices: list[int]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, Any] = {"sample_id": pa.array(sample_ids, pa.string()),
                               "row_index": pa.array(indices, pa.int64())}
    for key in rows[0] if rows else []:
        columns[key] = pa.array([_raw_bytes(r[key]) for r in rows], pa.binary())
        columns[f"{key}.shape"] = pa.array([list(r[key].shape) for r in rows], pa.list_(pa.int64()))
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, compression="zstd")
    return sink.getvalue()


def write_shard(path: Path, rows: list[dict[str, torch.Tensor]], sample_ids: list[str], indices: list[int],
                fmt: str) -> str:
    """Write one shard atomically; return the sha256 of its bytes."""
    data = _safetensors_bytes(rows, sample_ids, indices) if fmt == "safetensors" else _parquet_bytes(
        rows, sample_ids, indices)
    atomic_write(path, data)
    return hashlib.sha256(data).hexdigest()


def shard_name(index: int, fmt: str) -> str:
    return f"shard-{index:05d}.{fmt}"


def receipt_path(root: Path, index: int) -> Path:
    return root / "shards" / f"shard-{index:05d}.json"


def read_receipt(root: Path, index: int) -> dict[str, Any] | None:
    path = receipt_path(root, index)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def shard_is_done(root: Path, index: int, fingerprint: str) -> bool:
    """A shard counts as finished when its receipt matches this run and its file's sha256 matches the receipt."""
    receipt = read_receipt(root, index)
    if receipt is None or receipt.get("fingerprint") != fingerprint:
        return False
    data = root / "shards" / receipt["file"]
    return data.is_file() and sha256_file(data) == receipt["sha256"]


def remove_stale(root: Path) -> int:
    """Delete temporary files left by a killed run; return how many."""
    shards = root / "shards"
    stale = list(shards.glob(".*.tmp")) if shards.is_dir() else []
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink()
    return len(stale)
