"""The data pipeline as one resumable stream: mixture -> shuffle -> shard -> process -> filter -> pack/batch -> collate.

:class:`DataStream` is a plain iterator of collated batches whose ``state_dict()`` (taken between two
``next()`` calls) holds every source's read position, the mixture RNG, the records buffered in the
packer / length grouper, the skip ledger and packing stats: ``load_state_dict`` on a fresh stream
continues with exactly the batches the uninterrupted stream would have produced next (with ``shuffle``,
the block order of each file and the shuffle buffer's records and RNG are part of it). Buffered samples
are stored as their raw records and processed again on resume (processing is deterministic).

Records are dealt to shards by their global draw index (``index % num_shards == shard_id``), so
shards never overlap and together see every record once.

Example:
    >>> stream = DataStream(config, processor, base_dir="examples/data")  # doctest: +SKIP
    >>> batch = next(stream); state = stream.state_dict()  # doctest: +SKIP
    >>> resumed = DataStream(config, processor, base_dir="examples/data"); resumed.load_state_dict(state)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlforge.data.config import DataConfig, resolve_entries
from vlforge.data.errors import SampleError, SkipLedger
from vlforge.data.layouts import entry_formats
from vlforge.data.mixture import Mixture
from vlforge.data.packing import Binner, LengthGrouper, PackingStats, collate_packed, collate_padded
from vlforge.data.processor import ProcessedSample, QwenVLProcessor
from vlforge.data.schema import parse_conversation
from vlforge.data.shuffle import ShuffleBuffer
from vlforge.data.sources import RawRecord
from vlforge.errors import DataError

logger = logging.getLogger(__name__)


@dataclass
class Pending:
    """A processed sample waiting in a buffer, with the raw record needed to rebuild it."""

    ref: dict[str, Any]  # {"entry": int, "index": int, "location": str, "record": dict}
    sample: ProcessedSample


class _EmptyPassGuard:
    """Stops a stream that read one whole pass over its records without admitting a single sample.

    Without it an endless stream (``epochs=None``, i.e. training by ``max_steps``) whose every record is
    filtered or skipped would rewind and read forever; a finite one just ends. A stream restored mid-pass
    needs one full pass after the restore before it can tell.
    """

    def __init__(self, epoch: int, *, fresh: bool) -> None:
        self.start = epoch if fresh else epoch + 1
        self.drawn = self.admitted = 0

    def check(self, epoch: int, stream: DataStream) -> None:
        if self.admitted or epoch <= self.start or stream.config.epochs is not None:
            return  # a finite stream simply ends; its (empty) report says why
        sources = ", ".join(str(e.path) for e in stream.entries)
        where = f" (shard {stream.shard_id} of {stream.num_shards})" if stream.num_shards > 1 else ""
        skipped = ", ".join(f"{k}={v}" for k, v in sorted(stream.ledger.counts.items())) or "none"
        raise DataError(f"{sources}{where}: no usable sample in a full pass over the data: {self.drawn} record(s) "
                        f"read, skipped: {skipped}; check packing.max_length / packing_length, filter_overlong "
                        "and the records themselves")


class DataStream:
    """Iterator of collated batches for one shard (``shard_id`` of ``num_shards``)."""

    def __init__(self, config: DataConfig, processor: QwenVLProcessor, *, base_dir: str | Path = ".",
                 shard_id: int = 0, num_shards: int = 1) -> None:
        if not 0 <= shard_id < num_shards:
            raise DataError(f"shard_id {shard_id} not in [0, {num_shards})")
        self.config, self.processor = config, processor
        self.entries = resolve_entries(config, base_dir)
        self.formats = entry_formats(self.entries)
        """Each file's record layout (named by its entry, or detected from its first chat record)."""
        self.shard_id, self.num_shards = shard_id, num_shards
        self.mixture: Any = Mixture(self.entries, seed=config.data_seed, epochs=config.epochs,
                                    shuffle_block=config.shuffle_block if config.shuffle else None)
        if config.shuffle:
            self.mixture = ShuffleBuffer(self.mixture, size=config.shuffle_buffer, seed=config.data_seed)
        self.ledger = SkipLedger()
        self.stats = PackingStats()
        self.draws = 0
        self.done: set[int] = set()
        """Draw indices at or after ``draws`` that another run already used (set by a resharded resume)."""
        self.finished = False
        self.reported = False
        self.ready: deque[list[Pending]] = deque()
        self.group_epoch = self.mixture.epoch
        """The epoch of the samples in the grouper: at the next epoch's first draw it is flushed, so no packed row
        or length-group window holds samples of two epochs."""
        self._empty_pass = _EmptyPassGuard(self.mixture.epoch, fresh=True)
        if config.packing:
            self.grouper: Binner | LengthGrouper = Binner(config.packing_length, config.packing_strategy,
                                                          config.packing_open_bins)
        else:
            window = config.group_window if config.group_by_length else config.batch_size
            self.grouper = LengthGrouper(config.batch_size, window, sort=config.group_by_length)
        self.pad_token_id = processor.tokenizer.pad_token_id
        if self.pad_token_id is None:
            self.pad_token_id = processor.tokenizer.convert_tokens_to_ids("<|endoftext|>")

    # -- one record -------------------------------------------------------------------------------
    def _process(self, ref: dict[str, Any]) -> ProcessedSample:
        entry = self.entries[ref["entry"]]
        conv = parse_conversation(ref["record"], str(entry.path), ref["location"], self.formats[ref["entry"]])
        return self.processor.process(conv, entry.data_folder,
                                      allow_path_escape=self.config.allow_path_escape or None)

    def _admit(self, entry_index: int, raw: RawRecord) -> Pending | None:
        """Process a drawn record; a bad one raises or is counted (``on_error``); overlong is filtered."""
        ref = {"entry": entry_index, "index": self.draws - 1, "location": raw.location, "record": raw.record}
        self.ledger.seen += 1
        try:
            if raw.error is not None:
                raise raw.error
            sample = self._process(ref)
            limit = self.config.length_limit
            if limit is not None and len(sample) > limit:
                detail = f"{len(sample)} tokens > limit {limit}"
                if not self.config.filter_overlong:
                    raise DataError(f"{raw.source}:{raw.location}: {detail} (set filter_overlong to drop such samples)")
                self.ledger.record(SampleError("overlong", raw.source, raw.location, detail))
                return None
        except SampleError as err:
            if self.config.on_error == "raise":
                raise
            logger.debug("skipping %s", err)
            self.ledger.record(err)
            return None
        return Pending(ref, sample)

    # -- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> DataStream:
        return self

    def __next__(self) -> dict[str, Any]:
        while not self.ready:
            if self.finished:
                self._final_report()
                raise StopIteration
            drawn = self.mixture.next()
            self._empty_pass.check(self.mixture.epoch, self)
            if drawn is None:
                self.ready.extend(self.grouper.flush())
                self.finished = True
                continue
            if self.mixture.epoch != self.group_epoch:  # an epoch ends: its last rows go out on their own
                self.ready.extend(self.grouper.flush())
                self.group_epoch = self.mixture.epoch
            self.draws += 1
            if self.done and self.draws - 1 in self.done:
                self.done.discard(self.draws - 1)  # used before a resume on another number of shards
                continue
            if (self.draws - 1) % self.num_shards != self.shard_id:
                continue
            self._empty_pass.drawn += 1
            pending = self._admit(*drawn)
            if pending is not None:
                self._empty_pass.admitted += 1
                self.ready.extend(self.grouper.add(pending, len(pending.sample)))
        return self._collate(self.ready.popleft())

    def _collate(self, group: list[Pending]) -> dict[str, Any]:
        samples = [p.sample for p in group]
        lengths = [len(s) for s in samples]
        cfg = self.config
        if cfg.packing and cfg.packed_collate:
            pad_to = cfg.packing_length if cfg.pad_to_packing_length else None
            batch = collate_packed(samples, self.pad_token_id, pad_to=pad_to)
            computed, budget = batch["input_ids"].shape[1], cfg.packing_length
        else:
            batch = collate_padded(samples, self.pad_token_id)
            computed = batch["input_ids"].numel()
            budget = cfg.packing_length * len(samples) if cfg.packing else None
        self.stats.update(lengths, computed, budget)
        batch["sample_ids"] = [(p.ref["entry"], p.ref["location"]) for p in group]
        return batch

    def _final_report(self) -> None:
        if self.reported:
            return
        self.reported = True
        logger.info("data shard %d/%d: %d batches, %d samples, efficiency %.3f, budget fill %.3f", self.shard_id,
                    self.num_shards, self.stats.batches, self.stats.samples, self.stats.efficiency, self.stats.fill)
        if self.ledger.total:
            logger.warning("data shard %d/%d: skipped %d of %d sample(s): %s", self.shard_id, self.num_shards,
                           self.ledger.total, self.ledger.seen, self.ledger.top(len(self.ledger.counts)))
        if self.config.error_report:
            self.ledger.write_json(self.config.error_report, packing=self.stats.to_dict(),
                                   shard_id=self.shard_id, num_shards=self.num_shards)

    def report(self) -> dict[str, Any]:
        """Samples seen, skipped counts per reason with the first examples, and packing efficiency so far."""
        return {**self.ledger.to_dict(), "packing": self.stats.to_dict()}

    # -- resume -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Snapshot of everything needed to continue exactly (plain Python data; picklable)."""
        g = self.grouper
        if isinstance(g, Binner):
            buffer = {"bins": [[p.ref for p in b] for b in g.bins], "loads": list(g.loads)}
        else:
            buffer = {"items": [[p.ref, n] for p, n in g.items]}
        return copy.deepcopy({
            "version": 1, "shard_id": self.shard_id, "num_shards": self.num_shards,
            "mixture": self.mixture.state_dict(), "group_epoch": self.group_epoch, "draws": self.draws,
            "finished": self.finished,
            "done": sorted(self.done), "buffer": buffer, "ready": [[p.ref for p in group] for group in self.ready],
            "ledger": self.ledger.state_dict(), "stats": self.stats.to_dict(),
        })

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["shard_id"], state["num_shards"]) != (self.shard_id, self.num_shards):
            raise DataError(f"resume state is for shard {state['shard_id']}/{state['num_shards']}, "
                            f"this stream is {self.shard_id}/{self.num_shards}")
        self.mixture.load_state_dict(state["mixture"])
        self.draws, self.finished, self.reported = state["draws"], state["finished"], False
        self.group_epoch = int(state.get("group_epoch", self.mixture.epoch))  # states before epoch-bounded rows
        self.done = set(state.get("done", ()))
        rebuild = {}

        def pending(ref: dict[str, Any]) -> Pending:
            key = (ref["entry"], ref["index"])
            if key not in rebuild:
                rebuild[key] = Pending(copy.deepcopy(ref), self._process(ref))
            return rebuild[key]

        buffer = state["buffer"]
        if isinstance(self.grouper, Binner):
            self.grouper.bins = [[pending(r) for r in b] for b in buffer["bins"]]
            self.grouper.loads = list(buffer["loads"])
        else:
            self.grouper.items = [(pending(r), n) for r, n in buffer["items"]]
        self.ready = deque([[pending(r) for r in group] for group in state["ready"]])
        self.ledger.load_state_dict(state["ledger"])
        self.stats = PackingStats.from_dict(state["stats"])
        self._empty_pass = _EmptyPassGuard(self.mixture.epoch, fresh=False)

    def close(self) -> None:
        self.mixture.close()
