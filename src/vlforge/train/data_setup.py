"""The training config's data sections -> the data pipeline's :class:`~vlforge.data.DataConfig` and streams.

Relative paths are relative to the working directory (``base_dir``), dataset-YAML entries relative to
their YAML. Length limit: ``packing.max_length``, else ``packing.packing_length`` when
``filter_overlong`` is on (the guide's Qwen3-VL config filters at ``packing_length`` with packing off).

Example:
    >>> from vlforge.train.schema import TrainConfig
    >>> cfg = TrainConfig(data={"dataset_path": "d.yaml"}, model={"load_from_pretrained_path": "tiny:qwen3_vl"},
    ...                   packing={"packing": True, "packing_length": 512}, training={"max_steps": 4, "seed": 3})
    >>> dc = data_config(cfg)
    >>> dc.datasets, dc.packing_length, dc.epochs, dc.seed
    ('d.yaml', 512, None, 3)
"""

from __future__ import annotations

import logging
import math
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from vlforge.data.config import DataConfig
from vlforge.train.schema import DATASET_LIST_SUFFIXES, TrainConfig

if TYPE_CHECKING:  # the pipeline itself (torch, PIL, PyAV) loads when a stream opens, not with the config
    from vlforge.data import DataStream, ResumableLoader

logger = logging.getLogger(__name__)


def _datasets(path: str, fmt: str | None) -> str | list[dict[str, Any]]:
    if fmt == "yaml" or (fmt is None and PurePath(path).suffix.lower() in DATASET_LIST_SUFFIXES):
        return path
    return [{"path": path, "data_type": fmt}]


def data_config(cfg: TrainConfig, *, eval_set: bool = False) -> DataConfig:
    """The pipeline config of the training (or, with ``eval_set``, the eval) data."""
    data, packing, video, proc = cfg.data, cfg.packing, cfg.video, cfg.processor
    if eval_set:
        datasets: Any = _datasets(data.eval_dataset_path, None)
        epochs: int | None = 1
    elif data.datasets is not None:
        datasets = [entry.model_dump() for entry in data.datasets]
        epochs = None if cfg.training.max_steps else math.ceil(cfg.training.num_train_epochs)
    else:
        datasets = _datasets(data.dataset_path, data.dataset_format)
        epochs = None if cfg.training.max_steps else math.ceil(cfg.training.num_train_epochs)
    limit = packing.max_length
    if limit is None and packing.filter_overlong:
        limit = packing.packing_length
    kwargs: dict[str, Any] = {
        "datasets": datasets, "on_error": data.on_error, "allow_path_escape": data.allow_path_escape,
        "label_mode": data.label_mode, "shuffle": data.shuffle and not eval_set,
        "shuffle_buffer": data.shuffle_buffer, "shuffle_block": data.shuffle_block,
        "seed": cfg.training.seed if data.seed is None else data.seed, "epochs": epochs, "packing": packing.packing,
        "packing_strategy": packing.packing_strategy, "filter_overlong": packing.filter_overlong,
        "max_length": limit, "batch_size": cfg.training.per_device_train_batch_size,
        "group_by_length": packing.group_by_length, "video_sampling_strategy": video.video_sampling_strategy,
        "fps": video.fps, "frame_num": video.frame_num,
    }
    if packing.packing_length is not None:
        kwargs["packing_length"] = packing.packing_length
    for key in ("video_min_frames", "video_max_frames", "video_min_pixels", "video_max_pixels"):
        if getattr(video, key) is not None:
            kwargs[key] = getattr(video, key)
    for key in ("min_pixels", "max_pixels"):
        if getattr(proc, key) is not None:
            kwargs[key] = getattr(proc, key)
    return DataConfig(**kwargs)


def processor_for(cfg: TrainConfig, loaded: Any, data_cfg: DataConfig):
    """The data pipeline's processor: the checkpoint's (or ``processor.processor_name``'s) tokenizer and images."""
    tokenizer, image_processor = loaded.tokenizer, getattr(loaded.processor, "image_processor", None)
    family = cfg.processor.processor_type or loaded.family
    if cfg.processor.processor_name:
        from transformers import AutoProcessor

        from vlforge.models import resolve

        hf = AutoProcessor.from_pretrained(resolve(cfg.processor.processor_name))
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

    ``state_dict()`` is plain data holding every stream state of this rank (one per worker role);
    ``load_state_dict(states)`` takes the states of *all* ranks of the saving run, so a run saved
    with another number of processes or workers continues too (see
    :func:`vlforge.train.checkpoint.remap_data_state`).
    """

    def __init__(self, data_cfg: DataConfig, processor: Any, *, rank: int, world_size: int, workers: int = 0,
                 base_dir: str = ".") -> None:
        self.rank, self.world_size, self.workers = rank, world_size, workers
        self.stream: DataStream | None = None
        self.loader: ResumableLoader | None = None
        self._iterator = None
        if workers:
            from vlforge.data import ResumableLoader, StreamingDataset

            dataset = StreamingDataset(data_cfg, processor, base_dir=base_dir, rank=rank, world_size=world_size)
            self.loader = ResumableLoader(dataset, num_workers=workers)
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
