"""LMMS Engine configs -> vlforge's native layout, through ONE key table (also rendered in docs/train.md).

Two LMMS layouts are accepted unchanged:

* ``lmms``: top-level ``trainer_type``, ``dataset_config``, ``model_config``, ``trainer_args`` (what LMMS
  Engine's CLI reads today);
* ``lmms_list``: the guide's ``- type: trainer`` / ``config:`` list, with the trainer arguments flat next to
  ``dataset_config`` and ``model_config`` (LMMS Engine's current CLI silently ignores this form; we read it).

Example:
    >>> result = translate({"trainer_type": "fsdp2_trainer", "trainer_args": {"learning_rate": 1e-5}}, "x.yaml")
    >>> result.layout, result.native["training"]["learning_rate"], result.source_path(("training", "learning_rate"))
    ('lmms', 1e-05, ('trainer_args', 'learning_rate'))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vlforge.train.problems import PathT, Problem, render_path, suggest
from vlforge.train.schema import SECTION_FIELDS, section_models


@dataclass(frozen=True)
class KeyMap:
    """One LMMS Engine key (dotted, in the ``lmms`` layout) and the native key it becomes."""

    lmms: str
    native: str
    note: str = ""
    convert: Callable[[Any], Any] | None = None
    """Value translation; raises ValueError with a one-line reason for values we cannot honour."""


def _dataset_type(value: Any) -> bool:
    kinds = {"vision": False, "qwen3_vl_iterable": True}
    if value in kinds:
        return kinds[value]
    if value == "vision_audio":
        raise ValueError("audio datasets (dataset_type: vision_audio) are not supported by vlforge")
    raise ValueError(f"dataset_type {value!r} is not one of vision, qwen3_vl_iterable")


def _max_steps(value: Any) -> Any:
    return None if value == -1 else value  # -1 is the transformers "unset" value


def _resume(value: Any) -> Any:
    if value is True:
        return "auto"
    if value is False:
        return "none"
    return value


#: The mapping table: every LMMS Engine key vlforge reads, and where it goes. Order = docs order.
KEY_TABLE: tuple[KeyMap, ...] = (
    KeyMap("trainer_type", "trainer_type", "only `fsdp2_trainer`"),
    KeyMap("dataset_config.dataset_type", "data.streaming",
           "`vision` -> false, `qwen3_vl_iterable` -> true; `vision_audio` is an error", _dataset_type),
    KeyMap("dataset_config.dataset_format", "data.dataset_format"),
    KeyMap("dataset_config.datasets", "data.datasets", "entries may add `weight` and `max_samples`"),
    KeyMap("dataset_config.dataset_path", "data.dataset_path"),
    KeyMap("dataset_config.shuffle", "data.shuffle"),
    KeyMap("dataset_config.eval_dataset_path", "data.eval_dataset_path"),
    KeyMap("dataset_config.processor_config.processor_name", "processor.processor_name"),
    KeyMap("dataset_config.processor_config.processor_type", "processor.processor_type"),
    KeyMap("dataset_config.packing", "packing.packing"),
    KeyMap("dataset_config.packing_strategy", "packing.packing_strategy"),
    KeyMap("dataset_config.packing_length", "packing.packing_length"),
    KeyMap("dataset_config.filter_overlong", "packing.filter_overlong", "over-long samples are dropped and counted, never truncated"),
    KeyMap("dataset_config.max_length", "packing.max_length"),
    KeyMap("dataset_config.video_backend", "video.video_backend", "always decoded with PyAV (warning otherwise)"),
    KeyMap("dataset_config.video_sampling_strategy", "video.video_sampling_strategy"),
    KeyMap("dataset_config.video_max_pixels", "video.video_max_pixels"),
    KeyMap("dataset_config.video_max_frames", "video.video_max_frames"),
    KeyMap("dataset_config.fps", "video.fps"),
    KeyMap("dataset_config.frame_num", "video.frame_num"),
    KeyMap("model_config.load_from_pretrained_path", "model.load_from_pretrained_path"),
    KeyMap("model_config.attn_implementation", "model.attn_implementation",
           "`flash_attention_2` resolves to sdpa without flash-attn + GPU (warning)"),
    KeyMap("trainer_args.per_device_train_batch_size", "training.per_device_train_batch_size"),
    KeyMap("trainer_args.gradient_accumulation_steps", "training.gradient_accumulation_steps"),
    KeyMap("trainer_args.learning_rate", "training.learning_rate"),
    KeyMap("trainer_args.weight_decay", "training.weight_decay"),
    KeyMap("trainer_args.adam_beta1", "training.adam_beta1"),
    KeyMap("trainer_args.adam_beta2", "training.adam_beta2"),
    KeyMap("trainer_args.adam_epsilon", "training.adam_epsilon"),
    KeyMap("trainer_args.num_train_epochs", "training.num_train_epochs"),
    KeyMap("trainer_args.max_steps", "training.max_steps", "`-1` means unset", _max_steps),
    KeyMap("trainer_args.warmup_ratio", "training.warmup_ratio"),
    KeyMap("trainer_args.warmup_steps", "training.warmup_steps"),
    KeyMap("trainer_args.lr_scheduler_type", "training.lr_scheduler_type", "linear, cosine, constant, wsd"),
    KeyMap("trainer_args.max_grad_norm", "training.max_grad_norm"),
    KeyMap("trainer_args.seed", "training.seed"),
    KeyMap("trainer_args.bf16", "training.bf16"),
    KeyMap("trainer_args.fp16", "training.fp16"),
    KeyMap("trainer_args.eval_strategy", "training.eval_strategy", "`no` or `steps`"),
    KeyMap("trainer_args.eval_steps", "training.eval_steps"),
    KeyMap("trainer_args.gradient_checkpointing", "model.gradient_checkpointing"),
    KeyMap("trainer_args.freeze_modules", "model.freeze_modules"),
    KeyMap("trainer_args.group_by_length", "packing.group_by_length"),
    KeyMap("trainer_args.dataloader_num_workers", "dataloader_num_workers"),
    KeyMap("trainer_args.use_liger_kernel", "use_liger_kernel", "warning when liger-kernel is not installed"),
    KeyMap("trainer_args.use_rmpad", "use_rmpad"),
    KeyMap("trainer_args.sp_ulysses_degree", "sp_ulysses_degree", "Ulysses sequence parallelism (Qwen3-VL); see Sequence parallelism"),
    KeyMap("trainer_args.fsdp2", "fsdp.fsdp2"),
    KeyMap("trainer_args.fsdp_config.transformer_layer_cls_to_wrap", "fsdp.transformer_layer_cls_to_wrap"),
    KeyMap("trainer_args.fsdp_config.reshard_after_forward", "fsdp.reshard_after_forward"),
    KeyMap("trainer_args.logging_steps", "logging.logging_steps"),
    KeyMap("trainer_args.report_to", "logging.report_to", "warning when the sink is not installed"),
    KeyMap("trainer_args.run_name", "logging.run_name"),
    KeyMap("trainer_args.output_dir", "checkpointing.output_dir"),
    KeyMap("trainer_args.save_steps", "checkpointing.save_steps"),
    KeyMap("trainer_args.save_total_limit", "checkpointing.save_total_limit"),
    KeyMap("trainer_args.resume_from_checkpoint", "checkpointing.resume", "`true` -> `auto`", _resume),
)

BY_LMMS: dict[str, KeyMap] = {entry.lmms: entry for entry in KEY_TABLE}
BY_NATIVE: dict[str, KeyMap] = {entry.native: entry for entry in KEY_TABLE}
LMMS_SECTIONS = ("dataset_config", "model_config", "trainer_args")
#: Every LMMS mapping that holds further keys ("" is the top level).
GROUPS: tuple[str, ...] = ("", *sorted({entry.lmms.rsplit(".", 1)[0] for entry in KEY_TABLE if "." in entry.lmms}))

assert len(BY_LMMS) == len(KEY_TABLE) and len(BY_NATIVE) == len(KEY_TABLE), "the key table maps one to one"


def detect_layout(data: Any) -> str:
    """``lmms_list`` (the guide's list), ``lmms`` (LMMS Engine's mapping) or ``native``."""
    if isinstance(data, list):
        return "lmms_list"
    if isinstance(data, dict) and any(key in data for key in LMMS_SECTIONS):
        return "lmms"
    return "native"


def group_children(group: str) -> list[str]:
    """Keys valid directly inside an LMMS group: its leaves and its sub-groups."""
    prefix = f"{group}." if group else ""
    names = {entry.lmms[len(prefix):].split(".", 1)[0] for entry in KEY_TABLE if entry.lmms.startswith(prefix)}
    return sorted(names)


def lmms_name(native_path: str) -> str | None:
    """The LMMS key that becomes ``native_path``, if one does."""
    entry = BY_NATIVE.get(native_path)
    return entry.lmms if entry else None


@dataclass
class Translation:
    """A config turned into the native layout, remembering where each native key came from."""

    layout: str
    native: Any
    origin: str
    provenance: dict[PathT, PathT] = field(default_factory=dict)
    base: PathT = ()
    """Source path of the LMMS root (``(i, "config")`` in the list layout)."""
    problems: list[Problem] = field(default_factory=list)
    line_of: Callable[[PathT], int | None] = field(default=lambda path: None, repr=False)

    def source_path(self, native_path: PathT) -> PathT:
        """Where in the source file ``native_path`` is (or would be, when absent)."""
        if self.layout == "native":
            return tuple(native_path)
        native_path = tuple(native_path)
        for cut in range(len(native_path), 0, -1):
            if native_path[:cut] in self.provenance:
                return self.provenance[native_path[:cut]] + native_path[cut:]
        dotted = ".".join(str(part) for part in native_path)
        for entry in KEY_TABLE:  # absent key: point at where its LMMS key would go
            if entry.native == dotted or entry.native.startswith(dotted + "."):
                lmms = entry.lmms if entry.native == dotted else entry.lmms.rsplit(".", 1)[0]
                return self.lmms_source(lmms)
        return self.base

    def lmms_source(self, lmms: str) -> PathT:
        """Source path of an LMMS dotted key in this layout (trainer args sit flat in the list layout)."""
        parts = lmms.split(".") if lmms else []
        if self.layout == "lmms_list" and parts and parts[0] == "trainer_args":
            parts = parts[1:]
        return (*self.base, *parts)


def translate(data: Any, origin: str, line_of: Callable[[PathT], int | None] | None = None) -> Translation:
    """Turn ``data`` (any accepted layout) into the native layout; problems are collected, not raised.

    ``line_of(source_path)`` gives the file line of a key, for the problems' messages.
    """
    layout = detect_layout(data)
    result = Translation(layout, data if layout == "native" else {}, origin)
    if line_of is not None:
        result.line_of = line_of
    if layout == "native":
        return result
    if layout == "lmms_list":
        root = _unwrap_list(data, result)
        if root is None:
            return result
    else:
        root = data
    _walk_root(root, result)
    return result


def _unwrap_list(data: list[Any], result: Translation) -> dict[str, Any] | None:
    trainers = []
    for index, item in enumerate(data):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "trainer":
            trainers.append(index)
        else:
            result.problems.append(_problem(result, (index, "type"), f"unsupported list entry type {kind!r}; "
                                            "the guide's layout is one `- type: trainer` entry with `config:`"))
    if not trainers and not result.problems:
        result.problems.append(_problem(result, (), "empty config list; expected `- type: trainer`"))
    if len(trainers) > 1:
        result.problems.append(_problem(result, (trainers[1],), "more than one `type: trainer` entry"))
    if result.problems:
        return None
    index = trainers[0]
    item = data[index]
    for key in item:
        if key not in ("type", "config"):
            result.problems.append(_unknown(result, (index, key), ["type", "config"], ()))
    config = item.get("config")
    if not isinstance(config, dict):
        result.problems.append(_problem(result, (index, "config"), "`config:` must be a mapping of LMMS keys"))
        return None
    result.base = (index, "config")
    return None if result.problems else config


_NATIVE_SECTIONS = frozenset(SECTION_FIELDS)


def _walk_root(root: Any, result: Translation) -> None:
    if not isinstance(root, dict):
        result.problems.append(_problem(result, result.base, "expected a mapping of LMMS keys"))
        return
    flat_args = result.layout == "lmms_list"
    for key, value in root.items():
        where = (*result.base, key)
        if key in _NATIVE_SECTIONS and isinstance(value, dict):
            result.problems.append(_problem(result, where, "a native vlforge section in an LMMS Engine layout "
                                            "(dataset_config/model_config/trainer_args); use one layout"))
        elif key in LMMS_SECTIONS:
            _walk_group(key, value, where, result)
        elif key == "trainer_type":
            _set(result, BY_LMMS["trainer_type"], value, where)
        elif flat_args and f"trainer_args.{key}" in BY_LMMS:
            _set(result, BY_LMMS[f"trainer_args.{key}"], value, where)
        elif flat_args and f"trainer_args.{key}" in GROUPS:
            _walk_group(f"trainer_args.{key}", value, where, result)
        else:
            valid = [*group_children(""), *(group_children("trainer_args") if flat_args else ())]
            result.problems.append(_unknown(result, where, valid, ("", "trainer_args") if flat_args else ("",)))


def _walk_group(group: str, value: Any, where: PathT, result: Translation) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        result.problems.append(_problem(result, where, f"must be a mapping, got {type(value).__name__}"))
        return
    for key, item in value.items():
        full = f"{group}.{key}"
        if full in GROUPS:
            _walk_group(full, item, (*where, key), result)
        elif full in BY_LMMS:
            _set(result, BY_LMMS[full], item, (*where, key))
        else:
            result.problems.append(_unknown(result, (*where, key), group_children(group), (group,)))


def _set(result: Translation, entry: KeyMap, value: Any, where: PathT) -> None:
    if value is None:
        return  # LMMS dumps write null for "unset": the native default applies
    if entry.convert is not None:
        try:
            value = entry.convert(value)
        except ValueError as error:
            result.problems.append(_problem(result, where, str(error)))
            return
        if value is None:
            return
    native_path = tuple(entry.native.split("."))
    if native_path in result.provenance:
        first = render_path(result.provenance[native_path])
        result.problems.append(_problem(result, where, f"given twice (also at {first})"))
        return
    target = result.native
    for part in native_path[:-1]:
        target = target.setdefault(part, {})
    target[native_path[-1]] = value
    result.provenance[native_path] = where


def _problem(result: Translation, where: PathT, message: str) -> Problem:
    return Problem(result.origin, result.line_of(where), render_path(where), message)


def _unknown(result: Translation, where: PathT, valid: list[str], own_groups: tuple[str, ...]) -> Problem:
    key = str(where[-1])
    homes = [group for group in GROUPS if group not in own_groups and key in group_children(group)]
    if homes:
        home = render_path(result.lmms_source(homes[0])) or "the top level"
        return _problem(result, where, f"misplaced key; it belongs under {home}")
    close = suggest(key, valid)
    if close:
        return _problem(result, where, f"unknown key; did you mean {close!r}?")
    native_homes = [path for path, cls in section_models().items() if key in cls.model_fields]
    if native_homes:
        native = f"{native_homes[0]}.{key}" if native_homes[0] else key
        return _problem(result, where, f"unknown LMMS key; {native!r} exists only in vlforge's native layout")
    return _problem(result, where, "unknown key; valid here: " + ", ".join(valid))
