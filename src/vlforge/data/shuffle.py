"""Shuffled reading without loading the data: permuted blocks per epoch, then a bounded shuffle buffer.

Two seeded stages, both part of the stream's resumable state:

* :class:`ShuffledSource` reads a file in blocks of ``block`` consecutive positions (lines, rows, array
  items) in an order permuted anew every epoch (parquet: its row groups permuted, then the blocks inside
  each); the permutation is a function of (seed, dataset entry, epoch), so the state is three integers.
* :class:`ShuffleBuffer` keeps ``size`` drawn records and hands out a random one each time, refilling
  from the mixture: records of different blocks, files and epochs interleave.

Every shard runs the same two stages with the same seed and deals the shuffled records by index, so shards
still never overlap and a resume on another number of processes continues the same global order.

Example:
    >>> import json, tempfile, pathlib
    >>> from vlforge.data.config import ResolvedEntry
    >>> from vlforge.data.mixture import Mixture
    >>> d = pathlib.Path(tempfile.mkdtemp()); f = d / "a.jsonl"
    >>> _ = f.write_text("".join(json.dumps({"i": i}) + "\\n" for i in range(10)))
    >>> mix = Mixture([ResolvedEntry(f, d, "jsonl", 1.0, None)], seed=0, shuffle_block=2)
    >>> stream = ShuffleBuffer(mix, size=4, seed=0)
    >>> order = [r.record["i"] for _, r in iter(stream.next, None)]
    >>> sorted(order) == list(range(10)), order != list(range(10))
    (True, True)
"""

from __future__ import annotations

import random
from typing import Any

from vlforge.data.errors import SampleError
from vlforge.data.sources import RawRecord, Source
from vlforge.errors import DataError


def _rng(*parts: object) -> random.Random:
    return random.Random(":".join(str(p) for p in parts))  # str seeds hash with sha512: stable across runs


class ShuffledSource:
    """A :class:`~vlforge.data.sources.Source` read block by block in a per-epoch permuted order."""

    def __init__(self, source: Source, *, seed: int, entry: int, block: int) -> None:
        self.source, self.seed, self.entry, self.block = source, seed, entry, block
        self.name = source.name
        self.epoch, self.cursor, self.position = 0, 0, None
        self._order: list[tuple[int, int]] | None = None
        self._reader = None

    def order(self) -> list[tuple[int, int]]:
        """The ``[start, stop)`` blocks of this epoch, in reading order."""
        if self._order is None:
            rng = _rng(self.seed, self.entry, self.epoch, "blocks")
            groups = [list(group) for group in self.source.block_groups(self.block)]
            rng.shuffle(groups)
            for group in groups:
                rng.shuffle(group)
            self._order = [block for group in groups for block in group]
        return self._order

    def next_record(self) -> RawRecord | None:
        order = self.order()
        while self.cursor < len(order):
            if self._reader is None:
                start, stop = order[self.cursor]
                self._reader = self.source.read_range(start if self.position is None else self.position, stop)
            for position, record in self._reader:
                self.position = position + 1
                if record is not None:
                    return record
            self.cursor, self.position, self._reader = self.cursor + 1, None, None
        return None

    def start_epoch(self, epoch: int) -> None:
        self.close()
        self.epoch, self.cursor, self.position, self._order = epoch, 0, None, None

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "block": self.cursor, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start_epoch(int(state["epoch"]))
        self.cursor, self.position = int(state["block"]), state["position"]

    def records(self) -> int:
        return self.source.records()

    def close(self) -> None:
        self._reader = None
        self.source.close()


def _record_state(entry: int, record: RawRecord) -> list[Any]:
    err = record.error
    error = None if err is None else [err.reason, err.source, err.location, err.detail]
    return [entry, record.source, record.location, record.record, error]


def _record_from(state: list[Any]) -> tuple[int, RawRecord]:
    entry, source, location, value, error = state
    return int(entry), RawRecord(source, location, value, None if error is None else SampleError(*error))


class ShuffleBuffer:
    """Wraps a :class:`~vlforge.data.mixture.Mixture`: ``next()`` returns a random one of ``size`` buffered draws.

    The buffer never mixes epochs: at an epoch boundary it drains before taking the next epoch's first
    record, so every epoch is one permutation of its records (a dataset smaller than the buffer is
    shuffled whole, each epoch anew).
    """

    def __init__(self, inner: Any, *, size: int, seed: int) -> None:
        self.inner, self.size = inner, size
        self.rng = _rng(seed, "buffer")
        self.items: list[tuple[int, RawRecord]] = []
        self.carry: tuple[int, RawRecord] | None = None
        """The next epoch's first record, held until this epoch's records are served."""
        self.fill_epoch = inner.epoch
        self.exhausted = False

    @property
    def epoch(self) -> int:
        """The epoch of the records being served."""
        return self.fill_epoch

    def next(self) -> tuple[int, RawRecord] | None:
        if not self.items and self.carry is not None:
            self.items, self.carry, self.fill_epoch = [self.carry], None, self.inner.epoch
        while self.carry is None and not self.exhausted and len(self.items) < self.size:
            drawn = self.inner.next()
            if drawn is None:
                self.exhausted = True
            elif self.inner.epoch != self.fill_epoch:
                if self.items:
                    self.carry = drawn
                else:
                    self.items, self.fill_epoch = [drawn], self.inner.epoch
            else:
                self.items.append(drawn)
        if not self.items:
            return None
        i = self.rng.randrange(len(self.items))
        self.items[i], self.items[-1] = self.items[-1], self.items[i]
        return self.items.pop()

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"inner": self.inner.state_dict(), "rng": [version, list(internal), gauss],
                "items": [_record_state(entry, record) for entry, record in self.items],
                "carry": None if self.carry is None else _record_state(*self.carry),
                "fill_epoch": self.fill_epoch, "exhausted": self.exhausted}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "inner" not in state:
            raise DataError("the resume state was saved with data.shuffle false; resume with the same data.shuffle "
                            "(or start a new run)")
        self.inner.load_state_dict(state["inner"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.items = [_record_from(item) for item in state["items"]]
        self.carry = None if state["carry"] is None else _record_from(state["carry"])
        self.fill_epoch, self.exhausted = int(state["fill_epoch"]), bool(state["exhausted"])

    def close(self) -> None:
        self.inner.close()
