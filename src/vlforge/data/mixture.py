"""Weighted interleaving of several sources with a resumable RNG and read positions.

Each draw picks a source that still has records with probability proportional to its ``weight``;
a source ends at end of file or after ``max_samples`` records. The shards of one entry (a directory or pattern)
share its weight and ``max_samples`` in proportion to their records (:func:`shares`), so they read as one file
would. When all have ended, the next epoch starts (sources rewound) until ``epochs`` passes are done (``None``:
forever). With ``shuffle_block`` each file is read in blocks of that many positions, permuted anew every epoch
(:class:`~vlforge.data.shuffle.ShuffledSource`).

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> for name in "ab":
    ...     _ = (d / f"{name}.jsonl").write_text("".join(json.dumps({"k": f"{name}{i}"}) + "\\n" for i in range(3)))
    >>> from vlforge.data.config import ResolvedEntry
    >>> mix = Mixture([ResolvedEntry(d / f"{n}.jsonl", d, "jsonl", 1.0, None) for n in "ab"], seed=0)
    >>> sorted(r.record["k"] for _, r in iter(mix.next, None))
    ['a0', 'a1', 'a2', 'b0', 'b1', 'b2']
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from vlforge.data.config import ResolvedEntry
from vlforge.data.sources import RawRecord, open_source
from vlforge.errors import DataError


def _split(total: int, counts: list[int]) -> list[int]:
    """``total`` (at most ``sum(counts)``) split in proportion to ``counts``, largest remainders first.

    >>> _split(20, [30, 4]), _split(5, [1, 1, 1]), _split(3, [0, 2, 2])
    ([18, 2], [2, 2, 1], [0, 2, 1])
    """
    whole = sum(counts)
    parts = [total * c // whole for c in counts]
    by_remainder = sorted(range(len(counts)), key=lambda i: (-(total * counts[i] % whole), i))
    for i in by_remainder[:total - sum(parts)]:
        parts[i] += 1
    return parts


def shares(entries: list[ResolvedEntry], records: Callable[[int], int]) -> list[tuple[float, int | None]]:
    """Per entry: its weight in the mixture and the most records it gives per epoch (None: all of them).

    A file of its own keeps its ``weight`` and ``max_samples``. The shards of one entry (``shard_of``) split the
    entry's ``max_samples`` in proportion to their records (``records(i)``, asked of shards only; largest remainders,
    never more than a shard holds) and its weight in proportion to what each gives, so the set reads as one file of
    all its records would: no small shard ends early, and ``max_samples`` is met whenever the set holds that many.
    """
    out: list[tuple[float, int | None]] = [(e.weight, e.max_samples) for e in entries]
    groups: dict[int, list[int]] = {}
    for i, entry in enumerate(entries):
        if entry.shard_of is not None:
            groups.setdefault(entry.shard_of, []).append(i)
    for members in groups.values():
        counts = [records(i) for i in members]
        whole, first = sum(counts), entries[members[0]]
        cap = first.max_samples
        limits = counts if cap is None or cap >= whole else _split(cap, counts)
        given = sum(limits)
        for i, limit in zip(members, limits, strict=True):
            weight = first.weight * limit / given if given else first.weight / len(members)
            out[i] = (weight, limit if cap is not None or limit == 0 else None)
    return out


class Mixture:
    """Draw records from several sources; ``state_dict()`` captures positions, counts and the RNG."""

    def __init__(self, entries: list[ResolvedEntry], *, seed: int = 0, epochs: int | None = 1,
                 shuffle_block: int | None = None) -> None:
        self.entries = entries
        self.sources: list[Any] = [open_source(e.path, e.data_type) for e in entries]
        if shuffle_block is not None:
            from vlforge.data.shuffle import ShuffledSource

            self.sources = [ShuffledSource(s, seed=seed, entry=i, block=shuffle_block)
                            for i, s in enumerate(self.sources)]
        self.weights, self.limits = zip(*shares(entries, self._size), strict=True) if entries else ((), ())
        self.epochs = epochs
        self.rng = random.Random(seed)
        self.epoch = 0
        self.taken = [0] * len(entries)
        self.ended = self._empty()

    def _size(self, i: int) -> int:
        """How much shard ``i`` holds, for :func:`shares`: its records, or for a JSON / JSON Lines shard without a
        ``max_samples`` to split its bytes (in proportion to its records, and read without scanning the file in every
        rank and worker)."""
        entry = self.entries[i]
        if entry.max_samples is None and entry.data_type in ("json", "jsonl"):
            return entry.path.stat().st_size
        return self.sources[i].records()

    def _empty(self) -> list[bool]:
        """Sources with nothing to give this epoch (a shard of no records): ended before the first draw."""
        return [limit == 0 for limit in self.limits]

    def _new_epoch(self) -> bool:
        if not any(self.taken):
            raise DataError(f"the datasets hold no records: {', '.join(str(e.path) for e in self.entries)}")
        self.epoch += 1
        if self.epochs is not None and self.epoch >= self.epochs:
            return False
        for source in self.sources:
            if hasattr(source, "start_epoch"):
                source.start_epoch(self.epoch)  # a new block order
            else:
                source.reset()
        self.taken = [0] * len(self.entries)
        self.ended = self._empty()
        return True

    def next(self) -> tuple[int, RawRecord] | None:
        """``(entry_index, record)`` or ``None`` when every epoch is done."""
        while True:
            live = [i for i, ended in enumerate(self.ended) if not ended]
            if not live:
                if not self._new_epoch():
                    return None
                continue
            i = live[0] if len(live) == 1 else self.rng.choices(live, weights=[self.weights[j] for j in live])[0]
            limit = self.limits[i]
            record = None if limit is not None and self.taken[i] >= limit else self.sources[i].next_record()
            if record is None:
                self.ended[i] = True
                continue
            self.taken[i] += 1
            return i, record

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss], "epoch": self.epoch, "taken": list(self.taken),
                "ended": list(self.ended), "sources": [s.state_dict() for s in self.sources]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "sources" not in state:
            raise DataError("the resume state was saved with data.shuffle true; resume with the same data.shuffle "
                            "(or start a new run)")
        if len(state["sources"]) != len(self.sources):
            raise DataError(f"resume state has {len(state['sources'])} sources, the config {len(self.sources)}")
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.epoch, self.taken, self.ended = state["epoch"], list(state["taken"]), list(state["ended"])
        for source, s in zip(self.sources, state["sources"], strict=True):
            source.load_state_dict(s)

    def close(self) -> None:
        for source in self.sources:
            source.close()
