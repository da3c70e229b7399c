"""Reading a cache back: a map-style dataset by index or sample id, and batches; safetensors are memory-mapped.

Example:
    >>> cache = open_cache("/tmp/feats")  # doctest: +SKIP
    >>> row = cache["train:3"]; row["hidden_mean"].shape  # doctest: +SKIP
    torch.Size([1, 64])
    >>> for batch in cache.iter_batches(32): ...  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from vlforge.extract.manifest import CacheError, read_manifest
from vlforge.extract.shards import sha256_file

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64}


class FeatureCache(Sequence):
    """``cache[i]`` / ``cache["sample-id"]`` -> ``{"sample_id", "index", key: tensor}``; ``len(cache)`` rows.

    Rows are in the global order (skipped samples left out); ``index`` is a row's position in that
    order. safetensors shards are opened with ``safe_open`` (memory-mapped) on first use and read
    slice by slice; parquet shards are memory-mapped tables.
    """

    def __init__(self, root: str | Path, *, verify: bool = False) -> None:
        self.root = Path(root)
        manifest = read_manifest(self.root)
        if manifest is None:
            raise CacheError(f"{self.root}: no manifest.json; not a vlforge feature cache")
        if manifest.get("status") != "complete":
            raise CacheError(f"{self.root}: the cache is incomplete; run the same vlforge extract command to finish it")
        self.manifest = manifest
        self.features: dict[str, dict[str, Any]] = manifest["features"]
        self.format = manifest["options"]["format"]
        self.shards = manifest["shards"]
        self.ids: list[str] = []
        self._where: list[tuple[int, int]] = []
        for s, shard in enumerate(self.shards):
            if verify and sha256_file(self.root / "shards" / shard["file"]) != shard["sha256"]:
                raise CacheError(f"{self.root / 'shards' / shard['file']}: checksum does not match manifest.json")
            self.ids.extend(shard["sample_ids"])
            self._where.extend((s, r) for r in range(shard["rows"]))
        self._by_id = {sid: i for i, sid in enumerate(self.ids)}
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, key: int | str) -> dict[str, Any]:  # type: ignore[override]
        if isinstance(key, str):
            if key not in self._by_id:
                raise KeyError(f"sample id {key!r} is not in {self.root}")
            key = self._by_id[key]
        if not -len(self) <= key < len(self):
            raise IndexError(f"row {key} out of range for a cache of {len(self)} rows")
        shard, row = self._where[key]
        out = self._read(shard, row)
        out["sample_id"] = self.ids[key]
        return out

    def index_of(self, sample_id: str) -> int:
        return self._by_id[sample_id]

    def _handle(self, shard: int) -> Any:
        if shard not in self._open:
            path = self.root / "shards" / self.shards[shard]["file"]
            try:
                if self.format == "safetensors":
                    from safetensors import safe_open

                    self._open[shard] = safe_open(str(path), framework="pt")
                else:
                    import pyarrow.parquet as pq

                    self._open[shard] = pq.read_table(path, memory_map=True)
            except Exception as error:  # a shard damaged after the run (safetensors' and pyarrow's own errors)
                raise CacheError(f"{path}: cannot be read ({type(error).__name__}: {error}); open_cache(..., "
                                 "verify=True) checks every shard's sha256, and the same vlforge extract command "
                                 "recomputes a damaged one") from None
        return self._open[shard]

    def _read(self, shard: int, row: int) -> dict[str, Any]:
        handle = self._handle(shard)
        if self.format == "safetensors":
            out: dict[str, Any] = {"index": int(handle.get_slice("row_index")[row : row + 1][0])}
            for key, spec in self.features.items():
                if spec["ragged"]:
                    lo, hi = handle.get_slice(f"{key}.offsets")[row : row + 2].tolist()
                    out[key] = handle.get_slice(key)[lo:hi]
                else:
                    out[key] = handle.get_slice(key)[row : row + 1][0]
            return out
        out = {"index": handle.column("row_index")[row].as_py()}
        for key, spec in self.features.items():
            raw = handle.column(key)[row].as_py()
            shape = handle.column(f"{key}.shape")[row].as_py()
            dtype = _DTYPES[spec["dtype"]]
            out[key] = torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape) if raw else torch.zeros(shape,
                                                                                                        dtype=dtype)
        return out

    def iter_batches(self, batch_size: int) -> Iterator[dict[str, Any]]:
        """Batches of ``batch_size`` rows in order: fixed-shape keys stacked, ragged keys as lists."""
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        for start in range(0, len(self), batch_size):
            rows = [self[i] for i in range(start, min(start + batch_size, len(self)))]
            batch: dict[str, Any] = {"sample_ids": [r["sample_id"] for r in rows],
                                     "index": torch.tensor([r["index"] for r in rows])}
            for key, spec in self.features.items():
                values = [r[key] for r in rows]
                batch[key] = values if spec["ragged"] else torch.stack(values)
            yield batch

    def errors(self) -> list[dict[str, Any]]:
        """The skipped samples (``errors.jsonl``), in the global order."""
        path = self.root / "errors.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def open_cache(root: str | Path, *, verify: bool = False) -> FeatureCache:
    """Open a complete cache written by ``vlforge extract`` (``verify``: check every shard's sha256 first)."""
    return FeatureCache(root, verify=verify)
