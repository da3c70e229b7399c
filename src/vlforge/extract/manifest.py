"""``manifest.json``: what a cache holds and what made it; refusing to mix caches; the final merge.

The fingerprint is the sha256 of the canonical JSON of ``model`` (config + weight hashes, not the id or
path), ``data`` (dataset files' sha256, weights, seed, count) and the cache options. A run whose
fingerprint differs from the one in an existing ``manifest.json`` stops with one line unless
``--overwrite``. The manifest has no timestamps, so a resumed run writes the same bytes as an
uninterrupted one.

Example:
    >>> header = {"model": {"config_sha256": "ab"}, "data": {}, "options": {"batch_size": 8}}
    >>> len(fingerprint(header))
    64
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import struct
from pathlib import Path
from typing import Any

from vlforge.errors import ConfigError, VlforgeError
from vlforge.extract.shards import (
    read_receipt,
    remove_cache_files,
    sha256_file,
)
from vlforge.models.refs import dtype_name
from vlforge.outputs import atomic_write_bytes, atomic_write_json

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"


class CacheError(VlforgeError):
    """A feature cache that cannot be written to, resumed or read as asked."""


def hash_model(path: Path, mode: str) -> dict[str, Any]:
    """sha256 of ``config.json`` and of the weights: ``full`` hashes every ``*.safetensors`` file's bytes,
    ``header`` hashes each file's safetensors header (names, dtypes, shapes, offsets) and size."""
    config = path / "config.json"
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        if mode == "full" or file.suffix != ".safetensors":
            digest.update(bytes.fromhex(sha256_file(file)))
        else:
            with open(file, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                digest.update(fh.read(size))
            digest.update(str(file.stat().st_size).encode())
    return {"config_sha256": sha256_file(config) if config.is_file() else None,
            "weights_sha256": digest.hexdigest(), "weights_hash": mode, "weight_files": [f.name for f in files]}


class DuplicateIdError(CacheError):
    """Two rows of the cache have one sample id (``sample_id``); the run names where they are."""

    def __init__(self, sample_id: str, message: str) -> None:
        super().__init__(message)
        self.sample_id = sample_id


def fingerprint(header: dict[str, Any]) -> str:
    """sha256 of the parts of the header that decide the cache's contents."""
    model = {k: v for k, v in header["model"].items() if k not in ("id", "path")}
    key = {"model": model, "data": header["data"], "options": header["options"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def read_manifest(root: Path) -> dict[str, Any] | None:
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CacheError(f"{path}: not valid JSON ({exc}); pass --overwrite to start the cache again") from None


def _difference(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The first part of the cache's key that differs, down to one value (``data.entries[1].sha256 was ...``); for
    the model, the two model ids beside it."""
    for section in ("model", "options", "data"):
        a, b = old.get(section, {}), new.get(section, {})
        ignored = ("id", "path") if section == "model" else ()
        found = _first_difference(section, {k: v for k, v in a.items() if k not in ignored},
                                  {k: v for k, v in b.items() if k not in ignored})
        if found is not None:
            if section == "model":
                found += f"; the cache's model is {a.get('id')!r}, this run's {b.get('id')!r}"
            return found
    return "fingerprint differs"


def _first_difference(where: str, a: Any, b: Any) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        return next((found for key in sorted(set(a) | set(b))
                     if (found := _first_difference(f"{where}.{key}", a.get(key), b.get(key))) is not None), None)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and any(
            isinstance(item, (dict, list)) for item in a):
        return next((found for i, (x, y) in enumerate(zip(a, b, strict=True))
                     if (found := _first_difference(f"{where}[{i}]", x, y)) is not None), None)
    if a == b:
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) != len(b) and any(isinstance(x, dict) for x in a + b):
        return f"{where} has {len(b)} entries, the cache's {len(a)}"
    return f"{where} was {_short(a)}, now {_short(b)}"


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def as_cached(root: Path, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the dtype spelled as the cache in ``root`` spells the same dtype: caches made before dtypes
    were canonical keep the alias they were given (``bf16``), which is part of their fingerprint."""
    existing = read_manifest(root) if root.is_dir() else None
    cached = (existing or {}).get("options", {}).get("dtype")
    if isinstance(cached, str) and cached != options.get("dtype"):
        with contextlib.suppress(ConfigError):
            if dtype_name(cached) == options.get("dtype"):
                return {**options, "dtype": cached}
    return options


def check_options(root: Path, options: dict[str, Any]) -> None:
    """Before the model loads: a cache in ``root`` made with other options (``--batch-size``, ``--features``, ...)
    is refused at once, as :func:`prepare` would refuse it after loading the model."""
    existing = read_manifest(root) if root.is_dir() else None
    if existing is None or "options" not in existing:
        return
    found = _first_difference("options", existing["options"], json.loads(json.dumps(as_cached(root, options))))
    if found is not None:
        raise CacheError(f"{root} holds a cache of other options ({found}); use --overwrite to replace it or choose "
                         "another --out")


def check_target(root: Path) -> None:
    """Before any work: ``root`` is new, empty, or a vlforge cache (it has a readable manifest)."""
    if root.is_dir() and read_manifest(root) is None and any(root.iterdir()):
        raise CacheError(f"--out {root}: exists, is not empty and has no {MANIFEST}; choose a new or empty "
                         "directory")


def prepare(root: Path, header: dict[str, Any], *, overwrite: bool) -> bool:
    """Check ``root`` against ``header`` (clearing it with ``overwrite``); write the in-progress manifest.

    Returns True when an existing compatible cache is being resumed.
    """
    check_target(root)
    existing = read_manifest(root) if root.exists() else None
    resumed = False
    if existing is not None:
        if existing.get("fingerprint") == header["fingerprint"]:
            resumed = True
        elif not overwrite:
            raise CacheError(f"{root} holds a cache of another model or options ({_difference(existing, header)}); "
                             "use --overwrite to replace it or choose another --out")
        else:
            logger.info("--overwrite: removing the cache of %s (%s); files vlforge did not write stay", root,
                        _difference(existing, header))
            remove_cache_files(root, (MANIFEST, ERRORS))
    (root / "shards").mkdir(parents=True, exist_ok=True)
    if not resumed or existing.get("status") != "complete":
        atomic_write_json(root / MANIFEST, {**header, "status": "incomplete", "shards": []})
    return resumed


def finalize(root: Path, header: dict[str, Any], num_shards: int) -> dict[str, Any]:
    """Merge the shard receipts into ``manifest.json`` and ``errors.jsonl`` (call once every shard is done)."""
    shards, errors, skipped, missing = [], [], {}, []
    seen: dict[str, int] = {}
    for k in range(num_shards):
        receipt = read_receipt(root, k)
        if receipt is None or receipt.get("fingerprint") != header["fingerprint"]:
            missing.append(k)
            continue
        for sid in receipt["sample_ids"]:
            if sid in seen:
                raise DuplicateIdError(sid, f"duplicate sample id {sid!r} in shards {seen[sid]} and {k}; ids come "
                                            f"from the {header['options']['id_field']!r} field: make them unique or "
                                            "pass --id-field ''")
            seen[sid] = k
        for err in receipt["errors"]:
            skipped[err["reason"]] = skipped.get(err["reason"], 0) + 1
        errors.extend(receipt["errors"])
        shards.append({key: receipt[key] for key in ("index", "file", "rows", "sha256", "sample_ids", "first",
                                                      "count", "skipped")})
    if missing:
        raise CacheError(f"{root}: shards {missing[:10]} are not finished; run the same command again to complete them")
    atomic_write_bytes(root / ERRORS, "".join(json.dumps(e, sort_keys=True) + "\n" for e in errors).encode())
    manifest = {**header, "status": "complete", "shards": shards, "num_rows": sum(s["rows"] for s in shards),
                "num_skipped": len(errors), "skipped": dict(sorted(skipped.items()))}
    atomic_write_json(root / MANIFEST, manifest)
    return manifest
