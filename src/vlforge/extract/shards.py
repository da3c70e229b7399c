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
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from vlforge.extract.options import RAGGED
from vlforge.outputs import atomic_write_bytes


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(block):
            digest.update(chunk)
    return digest.hexdigest()


def _safetensors_bytes(rows: list[dict[str, torch.Tensor]], sample_ids: list[str], indices: list[int]) -> bytes:
    import torch
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
    import torch

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
    atomic_write_bytes(path, data)
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


def shard_problem(root: Path, index: int, fingerprint: str) -> str | None:
    """Why shard ``index`` must be (re)computed, or None when its receipt matches this run and its file's
    sha256 matches the receipt. A missing receipt gives ``"not written"``."""
    receipt = read_receipt(root, index)
    if receipt is None:
        return "not written" if not receipt_path(root, index).exists() else "its receipt is unreadable"
    if receipt.get("fingerprint") != fingerprint:
        return "it belongs to another run"
    data = root / "shards" / receipt["file"]
    if not data.is_file():
        return f"{receipt['file']} is missing"
    if sha256_file(data) != receipt["sha256"]:
        return f"{receipt['file']} is damaged (sha256 differs from its receipt)"
    return None


def shard_is_done(root: Path, index: int, fingerprint: str) -> bool:
    return shard_problem(root, index, fingerprint) is None


def remove_stale(root: Path) -> int:
    """Delete temporary files a killed run left (only the names :func:`vlforge.outputs.atomic_write_bytes` makes); return how many."""
    shards = root / "shards"
    stale = list(shards.glob(".shard-*.tmp")) if shards.is_dir() else []
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink()
    return len(stale)


def remove_cache_files(root: Path, names: tuple[str, ...]) -> None:
    """Delete what a cache's receipts and ``names`` account for (``--overwrite``); other files stay."""
    shards = root / "shards"
    for receipt in sorted(shards.glob("shard-*.json")) if shards.is_dir() else []:
        try:
            data_file = json.loads(receipt.read_text()).get("file")
        except (OSError, ValueError):
            continue  # not a receipt vlforge can read: leave it
        if isinstance(data_file, str) and Path(data_file).name == data_file:
            (shards / data_file).unlink(missing_ok=True)
        receipt.unlink()
    remove_stale(root)
    for name in names:
        (root / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        shards.rmdir()  # only when nothing else is in it
