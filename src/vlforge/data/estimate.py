"""How many batches a shard's stream will yield, from file metadata and a small sample: no pass over the data.

Record counts come from metadata (parquet/arrow row counts, a byte scan of JSONL lines, the JSON array
length), capped by each entry's ``max_samples``. Sample lengths come from processing a fixed, seeded
sample of records (``sample`` of them, spread over every file), so start-up cost does not grow with the
dataset. The sample's lengths and skip counts are cached in a small JSON sidecar under
``lengths/`` of vlforge's cache (``$VLFORGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/vlforge``), keyed by a content fingerprint of every data
file (size plus sha256 of evenly spaced chunks) and the processing settings: a second start-up reads it.

Without packing the batch count follows from the record count (exact when nothing is skipped); with
packing the packer is simulated on lengths drawn from the sample.

Example:
    >>> est = estimate_batches(cfg, processor, base_dir=".", shards=[0], num_shards=1)  # doctest: +SKIP
    >>> est.batches, est.records, est.sampled  # doctest: +SKIP
    ([412], 3200, 256)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.data.config import DataConfig, ResolvedEntry, resolve_entries
from vlforge.data.errors import SampleError
from vlforge.data.identity import fingerprint
from vlforge.data.layouts import file_format
from vlforge.data.mixture import shares
from vlforge.data.packing import Binner
from vlforge.data.schema import parse_conversation
from vlforge.data.sources import open_source
from vlforge.errors import DataError
from vlforge.outputs import cache_root

logger = logging.getLogger(__name__)

SIDECAR_VERSION = 1
SIMULATED = 100_000
"""Packer simulation length; longer streams scale the simulated row count."""


@dataclass
class LengthProfile:
    """Token lengths of the admitted sample records and how many of the sample were skipped (per reason)."""

    lengths: list[int]
    sampled: int
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def admitted_fraction(self) -> float:
        return len(self.lengths) / self.sampled if self.sampled else 0.0


@dataclass
class BatchEstimate:
    """Estimated batches per requested shard, and what the estimate rests on."""

    batches: list[int]
    records: int
    """Records per epoch over every dataset entry (``max_samples`` applied)."""
    sampled: int
    admitted_fraction: float
    cached: bool
    sidecar: Path | None
    skipped: dict[str, int] = field(default_factory=dict)
    """Skips per reason in the sample."""


def record_counts(entries: list[ResolvedEntry], *, positions: bool = False) -> list[int]:
    """Records per epoch of each entry, from metadata (``max_samples`` applied); with ``positions`` the
    positions instead (JSONL lines, blank ones included)."""
    held, spans = [], []
    for entry in entries:
        source = open_source(entry.path, entry.data_type)
        try:
            held.append(source.records())
            spans.append(source.extent() if positions else held[-1])
        finally:
            source.close()
    limits = [limit for _, limit in shares(entries, held.__getitem__)]
    return [n if limit is None else min(n, limit) for n, limit in zip(spans, limits, strict=True)]


def cache_dir() -> Path:
    """Where the length sidecars live: ``lengths/`` of vlforge's cache (:func:`vlforge.outputs.cache_root`)."""
    return cache_root() / "lengths"


def _sidecar_key(config: DataConfig, processor: Any, entries: list[ResolvedEntry], sample: int) -> str:
    tok = processor.tokenizer
    parts = {
        "version": SIDECAR_VERSION, "sample": sample, "seed": config.data_seed, "limit": config.length_limit,
        "family": processor.family, "label_mode": processor.label_mode, "system": processor.default_system,
        "settings": repr(processor.settings), "tokenizer": [getattr(tok, "name_or_path", ""), len(tok)],
        "entries": [[fingerprint(e.path), str(e.data_folder), e.data_type, e.max_samples, e.layout,
                     e.columns.model_dump(), e.tags.model_dump()] for e in entries],
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _sample_positions(spans: list[int], sample: int, seed: int) -> list[tuple[int, int]]:
    """``(entry, position)`` pairs, ``sample`` of them spread evenly at random over every entry's positions."""
    total = sum(spans)
    rng = random.Random(f"{seed}:lengths")
    picks = sorted(rng.sample(range(total), min(sample, total)))
    out, base, entry = [], 0, 0
    for p in picks:
        while p >= base + spans[entry]:
            base += spans[entry]
            entry += 1
        out.append((entry, p - base))
    return out


def _records_at(entry: ResolvedEntry, positions: list[int]):
    """The raw records at ``positions`` (sorted; blank JSONL lines yield nothing), read by random access."""
    source = open_source(entry.path, entry.data_type)
    try:
        for position in positions:
            for _pos, record in source.read_range(position, position + 1):
                if record is not None:
                    yield record
    finally:
        source.close()


def sample_records(entries: list[ResolvedEntry], sample: int, seed: int):
    """``(entry, its record format, raw record)`` for a seeded sample of ``sample`` records spread over every entry
    (blank JSONL lines yield nothing), read by random access in file order."""
    by_entry: dict[int, list[int]] = {}
    for entry, k in _sample_positions(record_counts(entries, positions=True), sample, seed):
        by_entry.setdefault(entry, []).append(k)
    for i, ks in by_entry.items():
        fmt = file_format(entries[i])
        for raw in _records_at(entries[i], ks):
            yield entries[i], fmt, raw


def length_profile(config: DataConfig, processor: Any, entries: list[ResolvedEntry], sample: int) -> LengthProfile:
    """Process a seeded sample of records as the stream would and keep their token lengths."""
    lengths, skipped, seen = [], {}, 0
    for entry, fmt, raw in sample_records(entries, sample, config.data_seed):
        seen += 1
        try:
            if raw.error is not None:
                raise raw.error
            conv = parse_conversation(raw.record, str(entry.path), raw.location, fmt)
            n = len(processor.process(conv, entry.data_folder,
                                      allow_path_escape=config.allow_path_escape or None))
        except SampleError as err:
            skipped[err.reason] = skipped.get(err.reason, 0) + 1
            continue
        if config.length_limit is not None and n > config.length_limit:
            skipped["overlong"] = skipped.get("overlong", 0) + 1
            continue
        lengths.append(n)
    return LengthProfile(lengths, seen, skipped)


def cached_profile(config: DataConfig, processor: Any, entries: list[ResolvedEntry], sample: int) -> tuple[LengthProfile, bool, Path | None]:
    """:func:`length_profile`, read from / written to its sidecar (an unwritable cache only costs the reuse)."""
    path = cache_dir() / f"{_sidecar_key(config, processor, entries, sample)}.json"
    try:
        data = json.loads(path.read_text())
        return LengthProfile(list(data["lengths"]), int(data["sampled"]), dict(data["skipped"])), True, path
    except (OSError, ValueError, KeyError, TypeError):
        pass
    profile = length_profile(config, processor, entries, sample)
    try:
        from vlforge.outputs import atomic_write_json

        atomic_write_json(path, {"version": SIDECAR_VERSION, "lengths": profile.lengths,
                                 "sampled": profile.sampled, "skipped": profile.skipped,
                                 "files": [str(e.path) for e in entries]})
    except OSError as exc:
        logger.debug("length sidecar not written (%s): %s", path, exc)
        path = None
    return profile, False, path


def shard_draws(total: int, shard: int, num_shards: int) -> int:
    """Draws dealt to ``shard`` (``index % num_shards == shard``) out of ``total``."""
    return max(0, math.ceil((total - shard) / num_shards))


def simulate_rows(lengths: list[int], count: int, config: DataConfig, seed: int) -> int:
    """Packed rows for ``count`` samples with lengths drawn from ``lengths`` (scaled beyond :data:`SIMULATED`)."""
    if count <= 0 or not lengths:
        return 0
    rng = random.Random(f"{seed}:simulate")
    simulated = min(count, SIMULATED)
    binner: Binner[None] = Binner(config.packing_length, config.packing_strategy, config.packing_open_bins)
    rows = 0
    for _ in range(simulated):
        rows += len(binner.add(None, rng.choice(lengths)))
    rows += len(binner.flush())
    return rows if simulated == count else math.ceil(rows * count / simulated)


def padded_batches(samples: int, config: DataConfig) -> int:
    """Batches the length grouper cuts from ``samples`` samples (each full window of ``group_by_length`` is cut
    on its own, so a window that is not a multiple of the batch size leaves a short batch)."""
    size = config.batch_size
    window = max(config.group_window, size) if config.group_by_length else size
    full, rest = divmod(samples, window)
    return full * math.ceil(window / size) + math.ceil(rest / size)


def estimate_batches(config: DataConfig, processor: Any, *, base_dir: str | Path, shards: list[int],
                     num_shards: int, sample: int = 256) -> BatchEstimate:
    """Estimated batches of each shard in ``shards`` (of ``num_shards``) over ``config.epochs`` passes."""
    if config.epochs is None:
        raise DataError("estimate_batches needs a finite number of epochs")
    entries = resolve_entries(config, base_dir)
    counts = record_counts(entries)
    records = sum(counts)
    if records == 0:
        raise DataError(f"the datasets hold no records: {', '.join(str(e.path) for e in entries)}")
    profile, cached, sidecar = cached_profile(config, processor, entries, sample)
    batches = []
    for shard in shards:
        per_epoch: Counter[int] = Counter()  # rows and length windows never span two epochs: count each on its own
        for epoch in range(config.epochs):
            drawn = (shard_draws((epoch + 1) * records, shard, num_shards)
                     - shard_draws(epoch * records, shard, num_shards))
            per_epoch[round(drawn * profile.admitted_fraction)] += 1
        if config.packing:  # one packed row (bin) per batch
            batches.append(sum(times * simulate_rows(profile.lengths, admitted, config, config.data_seed + shard)
                               for admitted, times in per_epoch.items()))
        else:
            batches.append(sum(times * padded_batches(admitted, config) for admitted, times in per_epoch.items()))
    return BatchEstimate(batches, records, profile.sampled, profile.admitted_fraction, cached, sidecar,
                         profile.skipped)
