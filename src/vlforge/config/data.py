"""The training config's data sections as the data pipeline's :class:`~vlforge.data.DataConfig`.

The sections *are* the pipeline's field groups (:data:`vlforge.data.config.FIELD_GROUPS`), so each group's
fields pass over as they are; only what a run decides is derived here: the dataset list (an inline list, a
dataset YAML or one data file; the eval set), the epochs (endless when ``training.max_steps`` bounds the run),
the batch size, the data seed (``data.seed``, else ``training.seed``) and the length limit
(``packing.max_length``, else ``packing.packing_length`` when ``filter_overlong`` is on: the guide's Qwen3-VL
config filters at ``packing_length`` with packing off). Relative paths are relative to the working directory
(``base_dir``), dataset-YAML entries relative to their YAML.

Example:
    >>> from vlforge.config.schema import TrainConfig
    >>> cfg = TrainConfig(data={"dataset_path": "d.yaml"}, model={"load_from_pretrained_path": "tiny:qwen3_vl"},
    ...                   packing={"packing": True, "packing_length": 512}, training={"max_steps": 4, "seed": 3})
    >>> dc = data_config(cfg)
    >>> dc.datasets, dc.packing_length, dc.epochs, dc.seed
    ('d.yaml', 512, None, 3)
"""

from __future__ import annotations

import math
from pathlib import PurePath
from typing import Any

from vlforge.config.schema import TrainConfig
from vlforge.data.config import DATASET_LIST_SUFFIXES, FIELD_GROUPS, DataConfig

#: The training config's section that holds each of the pipeline's field groups.
SECTION_OF_GROUP = {group: section for section, info in TrainConfig.model_fields.items() for group in FIELD_GROUPS
                    if isinstance(info.annotation, type) and issubclass(info.annotation, group)}


def _datasets(path: str, fmt: str | None) -> str | list[dict[str, Any]]:
    if fmt == "yaml" or (fmt is None and PurePath(path).suffix.lower() in DATASET_LIST_SUFFIXES):
        return path
    return [{"path": path, "data_type": fmt}]


def data_config(cfg: TrainConfig, *, eval_set: bool = False) -> DataConfig:
    """The pipeline config of the training (or, with ``eval_set``, the eval) data."""
    values: dict[str, Any] = {}
    for group, section in SECTION_OF_GROUP.items():
        values.update(getattr(cfg, section).model_dump(include=set(group.model_fields)))
    data, packing, training = cfg.data, cfg.packing, cfg.training
    if eval_set:
        datasets: Any = _datasets(data.eval_dataset_path, None)
        epochs: int | None = 1
    else:
        datasets = ([entry.model_dump() for entry in data.datasets] if data.datasets is not None
                    else _datasets(data.dataset_path, data.dataset_format))
        epochs = None if training.max_steps else math.ceil(training.num_train_epochs)
    limit = packing.max_length
    if limit is None and packing.filter_overlong:
        limit = packing.packing_length
    values.update(datasets=datasets, epochs=epochs, batch_size=training.per_device_train_batch_size,
                  seed=training.seed if data.seed is None else data.seed, max_length=limit,
                  shuffle=data.shuffle and not eval_set)
    return DataConfig(**values)
