"""The global sample order and the work units: shard k is draws ``[k*S, (k+1)*S)`` of the data mixture.

The order is the data pipeline's own (``vlforge.data.Mixture`` over the sources, one epoch), so it does
not depend on the number of processes or workers. A shard is cut into chunks of ``batch_size`` draws;
each chunk is one forward. :class:`ChunkStream` (a torch ``IterableDataset``) reads the records and
processes the chunks of the shards it is given; DataLoader worker ``w`` takes every ``W``-th chunk.

Example:
    >>> from vlforge.data import DataConfig
    >>> cfg, base = data_config("examples/data/train.jsonl", on_error="skip")
    >>> entries = resolve_entries(cfg, base)
    >>> count_records(entries), sample_id_for({"id": 7}, "line 3", "train", "id")
    (10, '7')
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from vlforge.data import DataConfig, SampleError, parse_conversation, resolve_entries
from vlforge.data.config import ResolvedEntry
from vlforge.data.layouts import entry_formats
from vlforge.data.mixture import Mixture
from vlforge.data.packing import collate_padded
from vlforge.data.processor import QwenVLProcessor
from vlforge.extract.preflight import check_entries, data_config

logger = logging.getLogger(__name__)


def count_records(entries: list[ResolvedEntry]) -> int:
    """Number of draws of one epoch of the mixture (the length of the global order), from file metadata:
    row counts, a byte scan of JSONL lines, the JSON array length; no record is parsed."""
    from vlforge.data.estimate import record_counts

    return sum(record_counts(entries))


def source_stems(entries: list[ResolvedEntry]) -> list[str]:
    """A short, unique name per dataset file: its stem, or its path without suffix when stems collide."""
    stems = [e.path.stem for e in entries]
    if len(set(stems)) == len(stems):
        return stems
    return [str(e.path.with_suffix("")) for e in entries]


def sample_id_for(record: dict[str, Any] | None, location: str, stem: str, id_field: str) -> str:
    """``record[id_field]`` when it is a string or int, else ``STEM:N`` (N the line / row / item number)."""
    if record is not None and id_field:
        value = record.get(id_field)
        if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
            return str(value)
    return f"{stem}:{location.split()[-1]}"


def id_locations(entries: list[ResolvedEntry], seed: int, id_field: str, wanted: str, limit: int = 2) -> list[str]:
    """``FILE:line N`` (or row / item) of the first ``limit`` records whose sample id is ``wanted``, in the
    global order (a scan of the records, no media read: for the line of a duplicate id)."""
    mixture, stems, found = Mixture(entries, seed=seed, epochs=1), source_stems(entries), []
    try:
        while len(found) < limit and (drawn := mixture.next()) is not None:
            index, raw = drawn
            if sample_id_for(raw.record, raw.location, stems[index], id_field) == wanted:
                found.append(f"{entries[index].path}:{raw.location}")
    finally:
        mixture.close()
    return found


@dataclass
class Chunk:
    """One forward's worth of a shard, as a worker hands it to the model loop."""

    shard: int
    accounted: int  # draws of the global order this chunk covers (rows + errors)
    indices: list[int] = field(default_factory=list)  # global index of each valid sample
    sample_ids: list[str] = field(default_factory=list)
    items: list[tuple[int, int]] = field(default_factory=list)  # (images, videos) per valid sample
    lengths: list[int] = field(default_factory=list)  # tokens per valid sample
    errors: list[dict[str, Any]] = field(default_factory=list)
    batch: dict[str, Any] | None = None  # collate_padded of the valid samples


class ChunkStream(IterableDataset):
    """Reads the global order and yields processed :class:`Chunk` s of the shards in ``shards``."""

    def __init__(self, config: DataConfig, processor: QwenVLProcessor, entries: list[ResolvedEntry], *,
                 shards: list[int], shard_size: int, batch_size: int, id_field: str) -> None:
        super().__init__()
        self.config, self.processor, self.entries = config, processor, entries
        self.shards, self.shard_size, self.batch_size, self.id_field = set(shards), shard_size, batch_size, id_field
        self.stems = source_stems(entries)
        self.formats = entry_formats(entries)
        pad = processor.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")

    def __iter__(self) -> Iterator[Chunk]:
        info = get_worker_info()
        workers, me = (1, 0) if info is None else (info.num_workers, info.id)
        mixture = Mixture(self.entries, seed=self.config.data_seed, epochs=1)
        pending: list[tuple[int, int, Any]] = []
        current, counter = None, 0
        try:
            index = -1
            while (drawn := mixture.next()) is not None:
                index += 1
                shard = index // self.shard_size
                if shard not in self.shards:
                    continue
                key = (shard, (index - shard * self.shard_size) // self.batch_size)
                if key != current and pending:
                    if counter % workers == me:
                        yield self._process(current[0], pending)
                    counter += 1
                    pending = []
                current = key
                pending.append((index, *drawn))
            if pending and counter % workers == me:
                yield self._process(current[0], pending)
        finally:
            mixture.close()

    def _process(self, shard: int, pending: list[tuple[int, int, Any]]) -> Chunk:
        chunk = Chunk(shard=shard, accounted=len(pending))
        samples = []
        for index, entry_index, raw in pending:
            entry = self.entries[entry_index]
            sample_id = sample_id_for(raw.record, raw.location, self.stems[entry_index], self.id_field)
            try:
                if raw.error is not None:
                    raise raw.error
                conv = parse_conversation(raw.record, str(entry.path), raw.location, self.formats[entry_index])
                sample = self.processor.process(conv, entry.data_folder,
                                                allow_path_escape=self.config.allow_path_escape or None)
                limit = self.config.max_length
                if limit is not None and len(sample) > limit:
                    raise SampleError("overlong", raw.source, raw.location, f"{len(sample)} tokens > limit {limit}")
            except SampleError as err:  # returned as data: the model loop applies on_error
                chunk.errors.append({"sample_id": sample_id, "index": index, "source": err.source,
                                     "location": err.location, "reason": err.reason, "message": str(err)})
                continue
            samples.append(sample)
            chunk.indices.append(index)
            chunk.sample_ids.append(sample_id)
            chunk.lengths.append(len(sample))
            n_img = 0 if sample.image_grid_thw is None else int(sample.image_grid_thw.shape[0])
            n_vid = 0 if sample.video_grid_thw is None else int(sample.video_grid_thw.shape[0])
            chunk.items.append((n_img, n_vid))
        if samples:
            chunk.batch = collate_padded(samples, self.pad_token_id)
        return chunk


def shard_ranges(total: int, shard_size: int) -> list[tuple[int, int]]:
    """``[(first, count)]`` per shard of a global order of ``total`` samples."""
    return [(k, min(shard_size, total - k)) for k in range(0, total, shard_size)]


__all__ = ["Chunk", "ChunkStream", "check_entries", "count_records", "data_config", "id_locations", "resolve_entries",
           "sample_id_for", "shard_ranges", "source_stems"]
