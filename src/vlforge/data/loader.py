"""torch ``IterableDataset`` over :class:`DataStream`, sharded by rank and DataLoader worker, with exact resume.

Shard ``rank * num_workers + role`` of ``world_size * num_workers`` runs in each worker. Every batch
carries its worker's stream state; :class:`ResumableLoader` keeps the latest state per role and the
number of batches consumed. On resume, worker ``w`` takes role ``(w + consumed) % num_workers`` so the
DataLoader's round-robin continues with the same worker order as the uninterrupted run.

Example:
    >>> loader = ResumableLoader(StreamingDataset(cfg, proc, rank=0, world_size=1), num_workers=2)  # doctest: +SKIP
    >>> batch = next(iter(loader)); state = loader.state_dict()  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vlforge.data.config import DataConfig
from vlforge.data.errors import SkipLedger
from vlforge.data.processor import QwenVLProcessor
from vlforge.data.stream import DataStream
from vlforge.errors import DataError

STATE_KEY = "_stream_state"


class StreamingDataset(IterableDataset):
    """Yields collated batches (use ``DataLoader(..., batch_size=None)``); see the module docstring."""

    def __init__(self, config: DataConfig, processor: QwenVLProcessor, *, base_dir: str | Path = ".",
                 rank: int = 0, world_size: int = 1) -> None:
        super().__init__()
        self.config, self.processor, self.base_dir = config, processor, base_dir
        self.rank, self.world_size = rank, world_size
        self.role_states: dict[int, dict[str, Any]] = {}
        self.rotation = 0

    def stream_for(self, role: int, num_workers: int) -> DataStream:
        """The stream of one worker role, positioned at its saved state if any."""
        stream = DataStream(self.config, self.processor, base_dir=self.base_dir,
                            shard_id=self.rank * num_workers + role, num_shards=self.world_size * num_workers)
        if role in self.role_states:
            stream.load_state_dict(self.role_states[role])
        return stream

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        num_workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        role = (worker + self.rotation) % num_workers
        stream = self.stream_for(role, num_workers)
        try:
            for batch in stream:
                batch[STATE_KEY] = {"role": role, "state": stream.state_dict(), "report": stream.report()}
                yield batch
        finally:
            stream.close()


class ResumableLoader:
    """A DataLoader over :class:`StreamingDataset` that can save and restore its exact position."""

    def __init__(self, dataset: StreamingDataset, *, num_workers: int = 0, **loader_kwargs: Any) -> None:
        self.dataset, self.num_workers = dataset, num_workers
        self.loader_kwargs = loader_kwargs
        self.consumed = 0
        self.reports: dict[int, dict[str, Any]] = {}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        loader = DataLoader(self.dataset, batch_size=None, num_workers=self.num_workers,
                            persistent_workers=False, **self.loader_kwargs)
        for batch in loader:
            info = batch.pop(STATE_KEY)
            self.dataset.role_states[info["role"]] = info["state"]
            self.reports[info["role"]] = info["report"]
            self.consumed += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "num_workers": self.num_workers, "rank": self.dataset.rank,
                "world_size": self.dataset.world_size, "role_states": dict(self.dataset.role_states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = (max(self.num_workers, 1), self.dataset.rank, self.dataset.world_size)
        saved = (max(state["num_workers"], 1), state["rank"], state["world_size"])
        if mine != saved:
            raise DataError(f"loader state was saved with (workers, rank, world_size)={saved}, now {mine}")
        self.consumed = state["consumed"]
        self.dataset.role_states = {int(k): v for k, v in state["role_states"].items()}
        self.dataset.rotation = self.consumed % max(self.num_workers, 1)

    def report(self) -> dict[str, Any]:
        """Samples seen, skipped counts per reason (with examples) and packing stats summed over this rank's workers."""
        ledger = SkipLedger.merged([SkipLedger.from_dict(rep) for _, rep in sorted(self.reports.items())])
        totals = {"batches": 0, "samples": 0, "real_tokens": 0, "computed_tokens": 0, "budget_tokens": 0}
        for rep in self.reports.values():
            for key in totals:
                totals[key] += rep["packing"][key]
        real = totals["real_tokens"]
        eff = real / totals["computed_tokens"] if totals["computed_tokens"] else 0.0
        fill = real / totals["budget_tokens"] if totals["budget_tokens"] else 0.0
        return {**ledger.to_dict(), "packing": {**totals, "efficiency": eff, "fill": fill}}
