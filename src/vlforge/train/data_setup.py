"""The training config's data sections -> the data pipeline's :class:`~vlforge.data.DataConfig` and streams.

Relative paths are relative to the working directory (``base_dir``), dataset-YAML entries relative to
their YAML. Length limit: ``packing.max_length``, else ``packing.packing_length`` when
``filter_overlong`` is on (the guide's Qwen3-VL config filters at ``packing_length`` with packing off).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vlforge.config.schema import TrainConfig
from vlforge.data.config import DataConfig

if TYPE_CHECKING:  # the pipeline itself (torch, PIL, PyAV) loads when a stream opens, not with the config
    from vlforge.data import DataStream, ResumableLoader

logger = logging.getLogger(__name__)


def processor_for(cfg: TrainConfig, loaded: Any, data_cfg: DataConfig):
    """The data pipeline's processor: the checkpoint's (or ``processor.processor_name``'s) tokenizer and images."""
    tokenizer, image_processor = loaded.tokenizer, getattr(loaded.processor, "image_processor", None)
    family = cfg.processor.processor_type or loaded.family
    if cfg.processor.processor_name:
        from vlforge.models import resolve

        source = resolve(cfg.processor.processor_name)
        if Path(source).resolve() != Path(loaded.path).resolve():  # the checkpoint's own: already loaded
            from vlforge.models.readers import read_processor

            hf = read_processor(source)
            tokenizer, image_processor = hf.tokenizer, getattr(hf, "image_processor", None)
    from vlforge.data import build_processor

    return build_processor(data_cfg, tokenizer, family, image_processor=image_processor)


def open_stream(data_cfg: DataConfig, processor: Any, *, rank: int, world_size: int,
                base_dir: str = ".") -> DataStream:
    """This rank's shard of the data (records dealt by draw index)."""
    from vlforge.data import DataStream

    return DataStream(data_cfg, processor, base_dir=base_dir, shard_id=rank, num_shards=world_size)


class RankData:
    """This rank's training batches: a :class:`DataStream`, or with ``workers`` > 0 DataLoader worker processes.

    ``worker_init``: the workers' ``worker_init_fn``. ``state_dict()`` is plain data holding every stream state of
    this rank (one per worker role);
    ``load_state_dict(states)`` takes the states of *all* ranks of the saving run, so a run saved
    with another number of processes or workers continues too (see
    :func:`vlforge.train.checkpoint.remap_data_state`).
    """

    def __init__(self, data_cfg: DataConfig, processor: Any, *, rank: int, world_size: int, workers: int = 0,
                 base_dir: str = ".", worker_init: Any = None) -> None:
        self.rank, self.world_size, self.workers = rank, world_size, workers
        self.stream: DataStream | None = None
        self.loader: ResumableLoader | None = None
        self._iterator = None
        if workers:
            from vlforge.data import ResumableLoader, StreamingDataset

            dataset = StreamingDataset(data_cfg, processor, base_dir=base_dir, rank=rank, world_size=world_size)
            self.loader = ResumableLoader(dataset, num_workers=workers,
                                          **({"worker_init_fn": worker_init} if worker_init else {}))
        else:
            self.stream = open_stream(data_cfg, processor, rank=rank, world_size=world_size, base_dir=base_dir)

    def __iter__(self) -> RankData:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.stream is not None:
            return next(self.stream)
        if self._iterator is None:
            self._iterator = iter(self.loader)
        return next(self._iterator)

    def state_dict(self) -> dict[str, Any]:
        if self.stream is not None:
            return {"workers": 0, "stream": self.stream.state_dict()}
        return {"workers": self.workers, "loader": self.loader.state_dict()}

    def shard_states(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        """The per-shard stream states inside one rank's saved state."""
        if state["workers"] == 0:
            return [state["stream"]]
        return list(state["loader"]["role_states"].values())

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        """Continue from the saved states of every rank of the saving run (index = its rank)."""
        from vlforge.train.checkpoint import remap_data_state

        same = len(states) == self.world_size and states[self.rank]["workers"] == self.workers
        if same and self.stream is not None:
            self.stream.load_state_dict(states[self.rank]["stream"])
            return
        if same:
            self.loader.load_state_dict(states[self.rank]["loader"])
            return
        shards = [shard for state in states for shard in self.shard_states(state)]
        if not shards:
            return  # the saving run had not produced a batch yet
        if self.stream is not None:
            self.stream.load_state_dict(remap_data_state(shards, self.rank, self.world_size))
            return
        total = self.world_size * self.workers
        self.loader.dataset.role_states = {
            role: remap_data_state(shards, self.rank * self.workers + role, total) for role in range(self.workers)}

    def report(self) -> dict[str, Any]:
        return self.stream.report() if self.stream is not None else self.loader.report()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
        self._iterator = None
