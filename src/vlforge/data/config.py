"""Typed data configuration (LMMS Engine key names) and the dataset YAML.

A dataset YAML is a list of entries ``{path, data_folder, data_type}`` (or a mapping with a
``datasets:`` list) plus optional ``weight`` (sampling ratio in the mixture) and ``max_samples``.
Relative ``path`` / ``data_folder`` resolve against the YAML's directory; an empty ``data_folder``
means the dataset file's own directory.

Example:
    >>> cfg = DataConfig(datasets=[{"path": "train.jsonl", "weight": 2}], packing=True, packing_length=4096)
    >>> cfg.datasets[0].weight, cfg.packing_strategy
    (2.0, 'first_fit')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from vlforge.data.sources import DATA_TYPES, infer_data_type
from vlforge.errors import ConfigError
from vlforge.strict import StrictModel

VIDEO_KEYS = ("video_sampling_strategy", "fps", "frame_num", "video_min_frames", "video_max_frames",
              "video_min_pixels", "video_max_pixels", "video_total_pixels", "min_pixels", "max_pixels")

LMMS_FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
"""Families whose LMMS Engine processor ``label_mode: lmms`` reproduces."""


class DatasetEntry(BaseModel):
    """One dataset file of the mixture (unknown keys keep their exact location in the error)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="dataset file (json, jsonl, parquet, arrow)")
    data_folder: str = Field("", description="root for relative media paths ('' = the file's directory)")
    data_type: Literal["json", "jsonl", "parquet", "arrow"] | None = Field(None, description="default: by extension")
    weight: float = Field(1.0, gt=0, description="relative sampling ratio in the mixture")
    max_samples: int | None = Field(None, gt=0, description="read at most this many records per epoch")


class DataConfig(StrictModel):
    """Everything the data pipeline needs besides the tokenizer and model family."""

    datasets: list[DatasetEntry] | str = Field(description="entries, or the path of a dataset YAML")
    on_error: Literal["raise", "skip"] = Field("raise", description="bad samples: stop, or skip and count")
    error_report: str | None = Field(None, description="write skipped counts per reason (JSON) here at the end")
    allow_path_escape: bool = Field(False, description="allow relative media paths that leave data_folder")
    seed: int = Field(0, description="mixture sampling seed")
    epochs: int | None = Field(1, gt=0, description="passes over the data; null = repeat forever")
    shuffle: bool = Field(False, description="read each file in per-epoch permuted blocks through a shuffle buffer")
    shuffle_buffer: int = Field(1000, gt=0, description="records held by the shuffle buffer")
    shuffle_block: int = Field(64, gt=0, description="consecutive lines/rows read together when shuffling")
    label_mode: Literal["assistant", "lmms"] = Field(
        "assistant", description="labels: assistant replies + <|im_end|>, or LMMS Engine 0.1.4's masking")
    # vision (None = the model family's default)
    video_sampling_strategy: Literal["fps", "frame_num"] | None = None
    fps: float | None = Field(None, gt=0)
    frame_num: int | None = Field(None, gt=0)
    video_min_frames: int | None = Field(None, gt=0)
    video_max_frames: int | None = Field(None, gt=0)
    video_min_pixels: int | None = Field(None, gt=0)
    video_max_pixels: int | None = Field(None, gt=0)
    video_total_pixels: int | None = Field(None, gt=0)
    min_pixels: int | None = Field(None, gt=0)
    max_pixels: int | None = Field(None, gt=0)
    # batching
    packing: bool = Field(False, description="pack samples into rows of packing_length")
    packing_length: int = Field(16384, gt=0, description="token budget of one packed row")
    packing_strategy: Literal["first_fit", "best_fit"] = "first_fit"
    packing_open_bins: int = Field(16, gt=0, description="bins kept open while packing (the packer buffer)")
    pad_to_packing_length: bool = Field(False, description="pad packed rows to packing_length (static shapes)")
    packed_collate: bool = Field(True, description="packed bins as one row (else a padded batch per bin)")
    filter_overlong: bool = Field(True, description="drop and count samples over the limit (else raise)")
    max_length: int | None = Field(None, gt=0, description="sample limit without packing (default: none)")
    batch_size: int = Field(1, gt=0, description="samples per padded batch when not packing")
    group_by_length: bool = Field(False, description="batch samples of similar length together")
    group_window: int = Field(64, gt=0, description="samples sorted together by group_by_length")


    @property
    def length_limit(self) -> int | None:
        """Longest sample accepted: packing_length when packing, else max_length."""
        return self.packing_length if self.packing else self.max_length

    def vision_overrides(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in VIDEO_KEYS if getattr(self, k) is not None}


@dataclass(frozen=True)
class ResolvedEntry:
    path: Path
    data_folder: Path
    data_type: str
    weight: float
    max_samples: int | None


def load_config(data: dict[str, Any] | str | Path) -> DataConfig:
    """Validate a mapping or YAML file into :class:`DataConfig`; errors are one-line :class:`ConfigError`."""
    where = "data config"
    if isinstance(data, (str, Path)):
        where = str(data)
        data = _read_yaml(Path(data))
    try:
        return DataConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ConfigError(f"{where}: {loc}: {first['msg']}") from None


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None


def read_dataset_yaml(path: str | Path) -> list[DatasetEntry]:
    """Entries of a dataset YAML (``- {path, data_folder, data_type, weight, max_samples}``)."""
    path = Path(path)
    data = _read_yaml(path)
    if isinstance(data, dict):
        data = data.get("datasets")
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path}: expected a non-empty list of datasets (or a 'datasets:' list)")
    entries = []
    for i, raw in enumerate(data):
        try:
            entries.append(DatasetEntry.model_validate(raw))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ConfigError(f"{path}: datasets[{i}].{loc}: {first['msg']}") from None
    return entries


def resolve_entries(config: DataConfig, base_dir: str | Path = ".") -> list[ResolvedEntry]:
    """Absolute dataset paths, data folders and types for every entry."""
    base = Path(base_dir)
    entries = config.datasets
    if isinstance(entries, str):
        yaml_path = base / entries
        entries, base = read_dataset_yaml(yaml_path), yaml_path.parent
    if not entries:
        raise ConfigError("datasets: no dataset entries")
    out = []
    for e in entries:
        path = (base / e.path).resolve()
        folder = (base / e.data_folder).resolve() if e.data_folder else path.parent
        kind = e.data_type or infer_data_type(path)
        if kind not in DATA_TYPES:  # pragma: no cover - guarded by the Literal
            raise ConfigError(f"{path}: unknown data_type {kind!r}")
        out.append(ResolvedEntry(path, folder, kind, e.weight, e.max_samples))
    return out
