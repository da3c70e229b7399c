"""The data pipeline's config: each field declared once, in the group the training config embeds it from.

The field groups are the training config's sections (:mod:`vlforge.config.schema` subclasses them):
:class:`SourceFields` (``data:``), :class:`PixelFields` (``processor:``), :class:`VideoFields` (``video:``) and
:class:`PackingFields` (``packing:``). :class:`DataConfig`, the flat config of the pipeline itself, is those
groups together plus what a run decides (the dataset list, epochs, the batch size) and the pipeline's own
knobs. Defaults are the training config's (LMMS Engine's where LMMS Engine has the key): a data config YAML
(:func:`load_config`) and ``vlforge train`` read the same data the same way.

A dataset YAML is a list of entries ``{path, data_folder, data_type}`` (or a mapping with a
``datasets:`` list) plus optional ``weight`` (sampling ratio in the mixture), ``max_samples`` and the record
layout: ``layout`` (``auto``, ``messages``, ``sharegpt``, ``pairs``, ``prompt_completion``, ``alpaca``), ``columns``
and ``tags`` (record keys and role names, as LLaMA-Factory's ``dataset_info.json`` names them;
:mod:`vlforge.data.layouts`).
Relative ``path`` / ``data_folder`` resolve against the YAML's directory; an empty ``data_folder``
means the dataset file's own directory.

Example:
    >>> cfg = DataConfig(datasets=[{"path": "train.jsonl", "weight": 2}], packing=True, packing_length=4096)
    >>> cfg.datasets[0].weight, cfg.packing_strategy, cfg.fps
    (2.0, 'first_fit', 1.0)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from vlforge.errors import ConfigError, DataError
from vlforge.strict import StrictModel, error_line, field_error

DATA_TYPES = ("json", "jsonl", "parquet", "arrow")
DATA_SUFFIXES = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".arrow": "arrow"}
"""File suffixes a data file may have, and the ``data_type`` each one means (a JSON file's content may override
its suffix: :func:`infer_data_type`)."""
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".tar")
"""Suffixes of compressed files: never read (a data_type given for one would read its compressed bytes)."""
_SNIFF_LINE_BYTES = 1 << 26
DATASET_LIST_SUFFIXES = (".yaml", ".yml")


def unknown_suffix(path: str | Path, key: str = "data_type") -> str:
    """Why a data file's suffix does not say its format (a compressed file is named as such); ``key``: the config
    key that names the format."""
    suffix = PurePath(path).suffix.lower()
    if suffix in COMPRESSED_SUFFIXES:
        return f"{suffix} files are not read: decompress it first (a .jsonl.gz to .jsonl, ...)"
    return f"cannot tell the format from its suffix; set {key} to one of {', '.join(DATA_TYPES)}"


def infer_data_type(path: str | Path) -> str:
    """``data_type`` from the file extension, or a :class:`DataError` naming the file. A ``.json`` file holding
    JSON Lines is ``jsonl`` and a ``.jsonl`` file holding one JSON array is ``json``, by their first bytes (as
    Hugging Face ``datasets``' json loader reads both)."""
    kind = DATA_SUFFIXES.get(PurePath(path).suffix.lower())
    if kind is None:
        raise DataError(f"{path}: {unknown_suffix(path)}")
    return (_json_kind_by_content(Path(path)) or kind) if kind in ("json", "jsonl") else kind


def _json_kind_by_content(path: Path) -> str | None:
    """``json`` when the file starts with an array, ``jsonl`` when its first non-blank line is a whole JSON
    object followed by another line starting an object, or is the file's only line and not ``{"data": [...]}``;
    None when it cannot tell (or cannot read it)."""
    try:
        with open(path, "rb") as fh:
            lines = []
            while len(lines) < 2 and (line := fh.readline(_SNIFF_LINE_BYTES)):
                if text := line.removeprefix(b"\xef\xbb\xbf").strip():  # a BOM, as Windows editors write
                    lines.append(text)
    except OSError:
        return None
    if not lines:
        return None
    if lines[0].startswith(b"["):
        return "json"
    if not lines[0].startswith(b"{") or (len(lines) == 2 and not lines[1].startswith(b"{")):
        return None
    try:
        first = json.loads(lines[0])
    except (ValueError, UnicodeDecodeError):
        return None
    one_array = len(lines) == 1 and isinstance(first, dict) and isinstance(first.get("data"), list)
    return None if one_array else "jsonl"


LayoutName = Literal["auto", "messages", "sharegpt", "pairs", "prompt_completion", "alpaca"]
"""Record layouts a dataset entry may name (docs/data.md, "Record layouts")."""


TOOL_KEYS_UNREAD = ("LLaMA-Factory's tool-call key: vlforge trains no tool turns (leave it out; a record with tool "
                    "turns is a schema error)")
"""Why LLaMA-Factory's ``columns.tools`` / ``tags.observation_tag`` / ``tags.function_tag`` are refused."""
ALPACA_COLUMNS = ("prompt", "query", "response", "history")
"""``columns`` keys that only layout ``alpaca`` reads (LLaMA-Factory's names)."""


class RecordColumns(StrictModel):
    """Which keys of a record hold the turns, the media and a system prompt (LLaMA-Factory's ``columns``)."""

    messages: str | None = Field(default=None, min_length=1)
    """Key of the list of turns; null: the first of ``messages``, ``conversations``, ``conversation`` (layout
    ``pairs``: ``texts``) in the file's first chat record."""
    images: str | None = Field(default=None, min_length=1)
    """Key of the images that ``<image>`` placeholders take (a path, bytes, an ``{bytes, path}`` struct or a list);
    null: ``images``, else ``image``, in each record."""
    videos: str | None = Field(default=None, min_length=1)
    """Key of the videos that ``<video>`` placeholders take; null: ``videos``, else ``video``, in each record."""
    system: str | None = Field(default=None, min_length=1)
    """Key of a system prompt (a string) put before the turns when they have no system turn; null: ``system``
    where a record has one."""
    prompt: str | None = Field(default=None, min_length=1)
    """Layout ``alpaca``: key of the instruction (the user turn's first line); null: ``instruction``."""
    query: str | None = Field(default=None, min_length=1)
    """Layout ``alpaca``: key of the optional input appended to the instruction on a new line; null: ``input``."""
    response: str | None = Field(default=None, min_length=1)
    """Layout ``alpaca``: key of the reply; null: ``output``."""
    history: str | None = Field(default=None, min_length=1)
    """Layout ``alpaca``: key of earlier ``[instruction, reply]`` pairs put before the last exchange; null:
    ``history`` where a record has one."""

    @model_validator(mode="before")
    @classmethod
    def _tool_columns(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tools" in data:
            raise field_error("tools", TOOL_KEYS_UNREAD)
        return data

    def alpaca_keys(self) -> list[str]:
        """The alpaca-only keys this entry names."""
        return [key for key in ALPACA_COLUMNS if getattr(self, key) is not None]


class RoleTags(StrictModel):
    """The keys of a turn and the names of its roles (LLaMA-Factory's ``tags``)."""

    role_tag: str | None = Field(default=None, min_length=1)
    """Key of a turn's role; null: ``role`` (layout ``messages``) or ``from`` (``sharegpt``). Give it with
    ``content_tag``."""
    content_tag: str | None = Field(default=None, min_length=1)
    """Key of a turn's content; null: ``content`` (layout ``messages``) or ``value`` (``sharegpt``)."""
    user_tag: str | None = Field(default=None, min_length=1)
    """The one role name of user turns (layout ``pairs``: an exchange's user key); null accepts ``user`` and
    ``human`` (``pairs``: ``user``)."""
    assistant_tag: str | None = Field(default=None, min_length=1)
    """The one role name of assistant turns (layout ``pairs``: an exchange's reply key); null accepts
    ``assistant``, ``gpt`` and ``model`` (``pairs``: ``assistant``)."""
    system_tag: str | None = Field(default=None, min_length=1)
    """The one role name of system turns; null accepts ``system``."""

    @model_validator(mode="before")
    @classmethod
    def _tool_tags(cls, data: Any) -> Any:
        named = [key for key in ("observation_tag", "function_tag") if isinstance(data, dict) and key in data]
        if named:
            raise field_error(named[0], TOOL_KEYS_UNREAD)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> RoleTags:
        if (self.role_tag is None) != (self.content_tag is None):
            missing = "content_tag" if self.content_tag is None else "role_tag"
            raise field_error(missing, "give tags.role_tag and tags.content_tag together (the keys of a turn)")
        names = [(key, value) for key, value in (("user_tag", self.user_tag), ("assistant_tag", self.assistant_tag),
                                                 ("system_tag", self.system_tag)) if value is not None]
        for i, (key, value) in enumerate(names):
            for other, other_value in names[:i]:
                if value == other_value:
                    raise field_error(key, f"{key} and {other} are both {value!r}: a role name means one role")
        return self


class DatasetEntry(StrictModel):
    """One data file of the mixture."""

    path: str = Field(min_length=1)
    """Data file of chat records (see ``layout``): ``.json``, ``.jsonl``, ``.parquet`` or ``.arrow``; or a directory
    or glob pattern of such shards (``data/train-*.parquet``), which share weight and max_samples by their records."""
    data_folder: str = ""
    """Directory that relative image/video paths inside the samples resolve against ("" = the file's own)."""
    data_type: Literal["json", "jsonl", "parquet", "arrow"] | None = None
    """Format of ``path``; null means "from the file suffix"."""
    weight: float = Field(default=1.0, gt=0)
    """Sampling weight of this file in the mixture (relative to the other entries)."""
    max_samples: int | None = Field(default=None, ge=1)
    """Use at most this many samples of the file per epoch; null uses all."""
    layout: LayoutName = "auto"
    """How a record holds its turns: ``messages`` (``{role, content}`` turns, transformers' chat format),
    ``sharegpt`` (``{from, value}`` turns: LLaVA, ShareGPT4V, LLaVA-OneVision-Data), ``pairs`` (``{user,
    assistant}`` exchanges in ``texts``: The Cauldron), ``prompt_completion`` (TRL's ``prompt`` and ``completion``,
    lists of ``{role, content}`` turns or strings; only the completion is trained), ``alpaca`` (``instruction`` /
    ``input`` / ``output`` and an optional ``history``: LLaMA-Factory's default format) or ``auto`` (the one the
    file's first chat record uses)."""
    columns: RecordColumns = Field(default_factory=RecordColumns)
    """Record keys of the turns, images, videos and system prompt, where they are not the usual ones."""
    tags: RoleTags = Field(default_factory=RoleTags)
    """Turn keys and role names, where they are not the usual ones."""

    @model_validator(mode="after")
    def _pair_tags(self) -> DatasetEntry:
        if self.layout == "pairs":
            named = [key for key in ("role_tag", "content_tag", "system_tag") if getattr(self.tags, key) is not None]
            if named:
                raise field_error(f"tags.{named[0]}", "layout pairs: an exchange's keys are tags.user_tag and "
                                  "tags.assistant_tag; tags.role_tag, content_tag and system_tag name the keys of "
                                  "{role, content} turns")
        return self

    @model_validator(mode="before")
    @classmethod
    def _llama_factory_formatting(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("layout") == "openai":
            raise field_error("layout", "LLaMA-Factory's 'openai' formatting is layout messages here ({role, content} "
                                        "turns)")
        return data

    @model_validator(mode="after")
    def _prompt_completion_keys(self) -> DatasetEntry:
        if self.layout == "prompt_completion" and self.columns.messages is not None:
            raise field_error("columns.messages", "layout prompt_completion reads TRL's 'prompt' and 'completion' "
                              "keys (rename the columns in the data)")
        return self

    @model_validator(mode="after")
    def _alpaca_keys(self) -> DatasetEntry:
        named = self.columns.alpaca_keys()
        if named and self.layout not in ("alpaca", "auto"):
            raise field_error(f"columns.{named[0]}", f"layout {self.layout}: columns.{named[0]} names a key of "
                              "layout alpaca records (instruction / input / output / history)")
        if self.layout == "alpaca" or named:
            given = ["columns.messages"] if self.columns.messages is not None else []
            given += [f"tags.{key}" for key in RoleTags.model_fields if getattr(self.tags, key) is not None]
            if given:
                raise field_error(given[0], "layout alpaca has no list of turns: name its keys with columns.prompt, "
                                  "columns.query, columns.response and columns.history")
        return self

    @model_validator(mode="after")
    def _known_type(self) -> DatasetEntry:
        suffix = PurePath(self.path).suffix.lower()
        if suffix in COMPRESSED_SUFFIXES or (self.data_type is None and not shard_like(self.path)
                                             and suffix not in DATA_SUFFIXES):
            raise field_error("path" if suffix in COMPRESSED_SUFFIXES else "data_type",
                              f"{self.path!r}: {unknown_suffix(self.path)}")
        return self


class SourceFields(StrictModel):
    """How records are read: order, bad samples, media paths, labels (the training config's ``data:``)."""

    shuffle: bool = False
    """Shuffle the records: each file is read in blocks of ``shuffle_block`` lines/rows in an order permuted
    anew every epoch, through a buffer of ``shuffle_buffer`` records, seeded by ``data.seed``; the order is
    part of the resumable state (LMMS Engine's ``shuffle``, which permutes the whole dataset in memory)."""
    shuffle_buffer: int = Field(default=1000, ge=1)
    """Records held by the shuffle buffer (``shuffle: true``); each sample is drawn at random from them."""
    shuffle_block: int = Field(default=64, ge=1)
    """Consecutive lines/rows read together when shuffling (smaller: better mixed, more seeks)."""
    on_error: Literal["raise", "skip"] = "raise"
    """A sample that cannot be used stops training (``raise``) or is skipped, counted and reported (``skip``)."""
    allow_path_escape: bool = False
    """Allow relative media paths that leave their ``data_folder`` (rejected by default)."""
    seed: int | None = Field(default=None, ge=0)
    """Seed of the data order (the draws between mixture entries); null uses ``training.seed`` (0 outside a
    training run). LMMS Engine's ``data_seed``."""
    label_mode: Literal["assistant", "lmms"] = "assistant"
    """Which tokens are trained on: ``assistant`` replies and their ``<|im_end|>``, or ``lmms``: LMMS Engine
    0.1.4's template and masking (also its template's special tokens and newlines; Qwen2.5-VL, Qwen3-VL)."""


class PixelFields(StrictModel):
    """Image pixel limits (the training config's ``processor:``)."""

    min_pixels: int | None = Field(default=None, ge=1)
    """Smallest image area in pixels after resizing; null keeps the processor's own value."""
    max_pixels: int | None = Field(default=None, ge=1)
    """Largest image area in pixels after resizing; null keeps the processor's own value."""

    @model_validator(mode="after")
    def _pixel_range(self) -> PixelFields:
        if self.min_pixels is not None and self.max_pixels is not None and self.min_pixels > self.max_pixels:
            raise field_error("min_pixels", f"min_pixels ({self.min_pixels}) is above max_pixels ({self.max_pixels})")
        return self


class VideoFields(StrictModel):
    """How video frames are sampled and resized (the training config's ``video:``)."""

    video_sampling_strategy: Literal["fps", "frame_num"] = "fps"
    """Sample frames at ``fps`` frames per second, or a fixed ``frame_num`` frames per video."""
    video_max_pixels: int | None = Field(default=None, ge=1)
    """Largest frame area in pixels after resizing; null keeps the processor's own value."""
    video_min_pixels: int | None = Field(default=None, ge=1)
    """Smallest frame area in pixels after resizing; null keeps the processor's own value."""
    video_min_frames: int | None = Field(default=None, ge=1)
    """Fewest frames taken from one video; null keeps the processor's own value."""
    video_max_frames: int | None = Field(default=None, ge=1)
    """Most frames taken from one video; null keeps the processor's own value."""
    fps: float = Field(default=1.0, gt=0)
    """Frames per second sampled when ``video_sampling_strategy`` is ``fps``."""
    frame_num: int = Field(default=64, ge=1)
    """Frames per video when ``video_sampling_strategy`` is ``frame_num``."""

    @model_validator(mode="after")
    def _ranges(self) -> VideoFields:
        for low, high in (("video_min_pixels", "video_max_pixels"), ("video_min_frames", "video_max_frames")):
            low_value, high_value = getattr(self, low), getattr(self, high)
            if low_value is not None and high_value is not None and low_value > high_value:
                raise field_error(low, f"{low} ({low_value}) is above {high} ({high_value})")
        return self


class PackingFields(StrictModel):
    """Packing several samples into one row of ``packing_length`` tokens, and length filtering."""

    packing: bool = False
    """Pack samples into rows (attention never crosses sample boundaries)."""
    packing_length: int | None = Field(default=None, ge=1)
    """Tokens per packed row; also the ``filter_overlong`` limit unless ``max_length`` is set."""
    max_length: int | None = Field(default=None, ge=1)
    """Longest sample in tokens for ``filter_overlong`` (default: ``packing_length``)."""
    packing_strategy: Literal["first_fit", "best_fit"] = "first_fit"
    """How samples are assigned to rows."""
    filter_overlong: bool = False
    """Drop (and count) samples over the length limit instead of failing on them (never truncated)."""
    group_by_length: bool = False
    """Padded batches of similar length: windows of 64 samples (shuffled ones with ``data.shuffle``) sorted by
    length, then cut into batches. No effect with ``packing`` (a warning says so)."""

    @model_validator(mode="after")
    def _length_needed(self) -> PackingFields:
        if self.packing and self.packing_length is None:
            raise field_error("packing_length", "packing: true needs packing_length (tokens per packed row)")
        if self.filter_overlong and self.packing_length is None and self.max_length is None:
            raise field_error("max_length", "filter_overlong: true needs max_length or packing_length (the limit)")
        limits = (self.max_length, self.packing_length)
        if self.packing and None not in limits and limits[0] > limits[1]:
            raise field_error("max_length", f"max_length ({limits[0]}) exceeds packing_length ({limits[1]})")
        return self


FIELD_GROUPS: tuple[type[StrictModel], ...] = (SourceFields, PixelFields, VideoFields, PackingFields)
"""The groups :class:`DataConfig` is made of, each a section of the training config."""


class DataConfig(SourceFields, PixelFields, VideoFields, PackingFields):
    """Everything the data pipeline needs besides the tokenizer and model family (the groups' fields, flat)."""

    datasets: list[DatasetEntry] | str
    """Entries, or the path of a dataset YAML."""
    epochs: int | None = Field(default=1, gt=0)
    """Passes over the data; null repeats forever."""
    batch_size: int = Field(default=1, gt=0)
    """Samples per padded batch when not packing."""
    error_report: str | None = None
    """Write the skipped counts per reason (JSON) here at the end."""
    video_total_pixels: int | None = Field(default=None, gt=0)
    """A pixel budget over all frames of one video (qwen-vl-utils' rule)."""
    packing_open_bins: int = Field(default=16, gt=0)
    """Bins kept open while packing (the packer's buffer)."""
    pad_to_packing_length: bool = False
    """Pad packed rows to ``packing_length`` (static shapes)."""
    packed_collate: bool = True
    """Packed bins as one row (else a padded batch per bin)."""
    group_window: int = Field(default=64, gt=0)
    """Samples sorted together by ``group_by_length``."""

    @property
    def length_limit(self) -> int | None:
        """Longest sample accepted: packing_length when packing, else max_length."""
        return self.packing_length if self.packing else self.max_length

    @property
    def data_seed(self) -> int:
        """The seed of the data order (``seed``; 0 when unset)."""
        return 0 if self.seed is None else self.seed

    def vision_overrides(self) -> dict[str, Any]:
        """The vision settings this config sets (pixel and frame limits, sampling), for the family's defaults."""
        keys = (*PixelFields.model_fields, *VideoFields.model_fields, "video_total_pixels")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(frozen=True)
class ResolvedEntry:
    path: Path
    data_folder: Path
    data_type: str
    weight: float
    max_samples: int | None
    layout: str = "auto"
    columns: RecordColumns = field(default_factory=RecordColumns)
    tags: RoleTags = field(default_factory=RoleTags)
    shard_of: int | None = None
    """The index of the dataset entry (a directory or pattern) this file is a shard of; its ``weight`` and
    ``max_samples`` are then the whole entry's, shared among its shards by their records
    (:func:`vlforge.data.mixture.shares`). None: the entry is this one file."""


def load_config(data: dict[str, Any] | str | Path) -> DataConfig:
    """Validate a mapping or YAML file into :class:`DataConfig`; errors are one-line :class:`ConfigError`."""
    where = "data config"
    if isinstance(data, (str, Path)):
        where = str(data)
        data = _read_yaml(Path(data))
    try:
        return DataConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {error_line(exc, DataConfig)}") from None


def _read_yaml(path: Path) -> Any:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None


def read_dataset_yaml(path: str | Path) -> list[DatasetEntry]:
    """Entries of a dataset YAML (``- {path, data_folder, data_type, weight, max_samples, layout, columns, tags}``)."""
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
            raise ConfigError(f"{path}: datasets[{i}].{error_line(exc, DatasetEntry)}") from None
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
    return [resolved for i, e in enumerate(entries) for resolved in resolve_entry_files(e, base, i)]


def as_named(path: Path) -> Path:
    """``path`` made absolute without following links or folding ``..`` as text (the OS resolves a ``..`` after a
    linked folder where the link points, as it will when the file is opened)."""
    return path if path.is_absolute() else Path.cwd() / path


_GLOB = re.compile(r"[*?[]")
_SPLIT = re.compile(r"(?:^|[-_./])(train|test|validation|valid|val|dev)(?=[-_./]|$)")
"""A split named in a shard's path below its directory (``train-0000.parquet``, ``test/data-0.arrow``)."""
_METADATA_FILES = frozenset({"dataset_info.json", "state.json", "dataset_dict.json"})
"""Files of a ``save_to_disk`` directory that are not data."""
_MAX_WALK = 100_000
"""Entries a directory of shards may hold below it (an image folder named by mistake is refused, not walked)."""


def shard_like(path: str) -> bool:
    """Whether ``path`` may name shards rather than one file, as a config is validated (the files are checked when
    read): no suffix (or a folder's), an existing directory, or glob characters in its last part."""
    return not PurePath(path).suffix or Path(path).is_dir() or bool(_GLOB.search(PurePath(path).name))


def names_shards(path: Path, named: str | None = None) -> bool:
    """``path`` names several data files: an existing directory, or (not an existing file) a glob pattern. ``named``:
    the part the user wrote (glob characters in the folder above it, ``runs[v2]/``, are not a pattern)."""
    if path.is_file():
        return False
    return path.is_dir() or bool(_GLOB.search(named if named is not None else str(path)))


def _shard_root(base: Path, named: str) -> tuple[Path, str | None]:
    """The folder a directory or pattern of shards starts from, and the glob pattern below it (None: a directory,
    walked whole; glob characters in an existing directory's name are its name)."""
    parts = Path(named).parts
    if (base / named).is_dir():
        return base / named, None
    fixed = next((i for i, part in enumerate(parts) if _GLOB.search(part)), len(parts))
    return base / Path(*parts[:fixed]), str(Path(*parts[fixed:])) if fixed < len(parts) else None


def shard_files(base: Path, named: str, data_type: str | None = None) -> list[Path]:
    """The data files that ``named`` (a directory or glob pattern, relative to ``base``) names, sorted: data suffixes
    only (of ``data_type`` when given), hidden folders and ``save_to_disk`` metadata skipped, linked folders followed.
    A :class:`DataError` naming the path when there are none, when they mix types, or when they hold several splits
    (``train-*`` beside ``test-*``, or ``train/`` beside ``test/``)."""
    path = base / named
    suffixes = {suffix for suffix, kind in DATA_SUFFIXES.items() if data_type in (None, kind)}
    root, pattern = _shard_root(base, named)
    if pattern is not None:
        found = [f for f in root.glob(pattern) if f.is_file()]
        if not found:
            raise DataError(f"{path}: the pattern matches no file")
    else:
        found, seen, walked = [], set(), 0
        for folder, dirs, files in os.walk(root, followlinks=True):
            real = os.path.realpath(folder)
            if real in seen:  # a link back up the tree
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            walked += len(files) + len(dirs)
            if walked > _MAX_WALK:
                raise DataError(f"{path}: more than {_MAX_WALK:,} files below it; name the data files with a pattern "
                                f"({path}/**/*.parquet)")
            found += [Path(folder) / f for f in files]
    files = sorted(f for f in found if f.suffix.lower() in suffixes and f.name not in _METADATA_FILES)
    if not files:
        raise DataError(f"{path}: {'the pattern matches' if pattern is not None else 'a directory that holds'} no data "
                        f"file ({', '.join(sorted(suffixes))})")
    splits = sorted({m[1] for f in files if (m := _SPLIT.search(f.relative_to(root).as_posix().lower()))})
    if len(splits) > 1:
        pick = "train" if "train" in splits else splits[0]
        raise DataError(f"{path}: holds the splits {', '.join(splits)}: name one with a pattern, e.g. "
                        f"{root}/**/*{pick}*{files[0].suffix}")
    kinds = {DATA_SUFFIXES[f.suffix.lower()] for f in files}
    if len(kinds) > 1:
        raise DataError(f"{path}: mixes {', '.join(sorted(kinds))} files; name one kind (a pattern or data_type)")
    return files


def resolve_entry_files(entry: DatasetEntry, base: Path, index: int = 0) -> list[ResolvedEntry]:
    """``entry`` (the ``index``-th of its list) resolved (:func:`resolve_entry`); a directory or glob pattern is one
    entry per data file it names, each a shard of ``index`` holding the entry's ``weight``, ``max_samples``
    (shared by records when read) and ``data_folder`` (default: the directory, or the pattern's fixed part)."""
    if not names_shards(base / entry.path, entry.path):
        return [resolve_entry(entry, base)]
    files = [as_named(file) for file in shard_files(base, entry.path, entry.data_type)]
    folder = as_named(base / entry.data_folder if entry.data_folder else _shard_root(base, entry.path)[0])
    return [ResolvedEntry(file, folder, entry.data_type or infer_data_type(file), entry.weight, entry.max_samples,
                          entry.layout, entry.columns, entry.tags, shard_of=index) for file in files]


def resolve_entry(entry: DatasetEntry, base: Path) -> ResolvedEntry:
    """``entry`` with its path and data folder made absolute (relative to ``base``) and its data type decided."""
    path = as_named(base / entry.path)  # a hub-cache link keeps its name and folder
    folder = as_named(base / entry.data_folder) if entry.data_folder else path.parent
    kind = entry.data_type or infer_data_type(path)
    return ResolvedEntry(path, folder, kind, entry.weight, entry.max_samples, entry.layout, entry.columns, entry.tags)
