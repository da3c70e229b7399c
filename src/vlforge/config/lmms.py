"""LMMS Engine configs -> vlforge's native layout, with LMMS Engine 0.1.4's whole schema and its semantics.

Two LMMS layouts are accepted unchanged:

* ``lmms``: top-level ``trainer_type``, ``dataset_config``, ``model_config``, ``trainer_args`` (what LMMS
  Engine's CLI reads today);
* ``lmms_list``: the guide's ``- type: trainer`` / ``config:`` list, with the trainer arguments flat next to
  ``dataset_config`` and ``model_config`` (LMMS Engine's current CLI silently ignores this form; we read it).

Every key of LMMS Engine's schema (``lmms_schema_0.1.4.json``, generated from the engine by
``scripts/lmms_schema.py``) is classified: **honoured** (``KEY_TABLE``: mapped onto a native key with the
meaning it has in LMMS Engine's fsdp2 trainer), **inert** (:data:`vlforge.config.lmms_keys.INERT`: accepted; a
value other than LMMS Engine's default gets one warning) or **refused** (:data:`vlforge.config.lmms_keys.REFUSED`:
a value other than the default is an error). A key that is none of these is an error ("did you mean").

Semantics kept from LMMS Engine:

* an honoured key the file leaves out takes **LMMS Engine's default** (``learning_rate`` 5e-5, 3 epochs,
  ``per_device_train_batch_size`` 8, ``filter_overlong`` true at ``packing_length`` 32000, ...), not vlforge's;
* precision: ``bf16: true`` loads the weights in bf16 and computes in bf16 (``fsdp.mixed_precision:
  pure_bf16``); ``bf16: false`` computes in float16 without loss scaling (``fsdp.param_dtype: float16``,
  fp32 master weights); ``reduce_dtype`` / ``output_dtype`` (default bfloat16) complete FSDP2's policy;
* ``lr_scheduler_type: wsd`` is LMMS Engine's (90% of the post-warm-up steps stable, then a cosine decay),
  ``constant`` warms up from 1% of the rate as LMMS Engine's does (without warm-up vlforge runs the set rate).

Example:
    >>> result = translate({"trainer_type": "fsdp2_trainer", "trainer_args": {"learning_rate": 1e-5}}, "x.yaml")
    >>> result.layout, result.native["training"]["learning_rate"], result.source_path(("training", "learning_rate"))
    ('lmms', 1e-05, ('trainer_args', 'learning_rate'))
    >>> result.native["training"]["per_device_train_batch_size"], result.native["fsdp"]["param_dtype"]
    (8, 'float16')
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vlforge.config.lmms_keys import (
    INERT,
    REFUSED,
    REFUSED_OK,
    UNDECLARED,
    is_default,
    lmms_fields,
    lmms_groups,
)
from vlforge.config.problems import PathT, Problem, render_path, suggest
from vlforge.config.schema import SECTION_FIELDS, section_models


@dataclass(frozen=True)
class KeyMap:
    """One honoured LMMS Engine key (dotted, in the ``lmms`` layout) and the native key it becomes."""

    lmms: str
    native: str
    """Native dotted key; ``""`` when the value is accepted and needs no native key (see ``note``)."""
    note: str = ""
    convert: Callable[[Any], Any] | None = None
    """Value translation; raises ValueError with a one-line reason for values we cannot honour, returns
    :class:`Expand` for several native keys or :class:`Ignore` for a value without effect."""


@dataclass(frozen=True)
class Expand:
    """A converted value that sets several native keys."""

    values: dict[str, Any]


@dataclass(frozen=True)
class Nearest:
    """A value vlforge has no exact counterpart for, honoured by its nearest one: set, with one warning."""

    value: Any
    reason: str


@dataclass(frozen=True)
class Ignore:
    """A value that has no effect in either engine: accepted with one warning."""

    reason: str


_STREAMING = {"vision": False, "vision_iterable": False, "qwen3_vl_iterable": True}


def _dataset_type(value: Any) -> bool:
    if value in _STREAMING:
        return _STREAMING[value]
    if value == "vision_audio":
        raise ValueError("audio datasets (dataset_type: vision_audio) are not supported by vlforge")
    raise ValueError(f"dataset_type {value!r} is not one of {', '.join(_STREAMING)} (vlforge trains "
                     "vision-language chats)")


def _processor_type(value: Any) -> Any:
    from vlforge.models.families import FAMILIES

    if value in FAMILIES:
        return value
    return Ignore(f"not a processor vlforge has ({', '.join(FAMILIES)}); the processing rules follow the "
                  "checkpoint's model_type")


def _trainer_type(value: Any) -> Any:
    if value == "hf_trainer":  # LMMS Engine's transformers.Trainer subclass: the same model, data and packing
        return Nearest("fsdp2_trainer", "vlforge trains it with its FSDP2 trainer: the same model, data, packing "
                       "and freezing, trainer_args.optim and lr_scheduler_type as vlforge honours them; the loss is "
                       "a token mean over the whole optimizer step (as hf_trainer's num_items_in_batch); "
                       "trainer_args.deepspeed is not used; checkpoints are vlforge's DCP checkpoints, not "
                       "transformers' (docs/train.md, LMMS Engine configs)")
    if value != "fsdp2_trainer":
        raise ValueError(f"{value!r} is not a trainer vlforge runs (fsdp2_trainer, or hf_trainer read as it)")
    return value


def _max_steps(value: Any) -> Any:
    return None if value == -1 else value  # -1 is the transformers "unset" value


def _resume(value: Any) -> Any:
    if value is True:
        return "auto"
    if value is False:
        return "none"
    return value


def _optim(value: Any) -> Any:
    if value in ("adamw_torch", "adamw_torch_fused"):
        return value
    return Ignore("LMMS Engine's fsdp2_trainer trains with torch.optim.AdamW whatever optim says, and so does "
                  "vlforge (adamw_torch_fused)")


_DTYPES = {"float32": "float32", "float": "float32", "fp32": "float32", "bfloat16": "bfloat16",
           "bf16": "bfloat16", "float16": "float16", "half": "float16", "fp16": "float16"}


def _dtype(value: Any) -> str:
    if value in _DTYPES:
        return _DTYPES[value]
    raise ValueError(f"{value!r} is not a floating dtype vlforge can use (float32, bfloat16, float16)")


def _pixels(value: Any) -> Expand:
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    names = {"image_min_pixels": "processor.min_pixels", "image_max_pixels": "processor.max_pixels",
             "video_min_pixels": "video.video_min_pixels", "video_max_pixels": "video.video_max_pixels"}
    other = sorted(set(value) - set(names))
    if other:
        raise ValueError(f"{', '.join(other)}: options of LMMS Engine's processors vlforge has no counterpart for "
                         "(image_/video_ min_pixels and max_pixels are honoured)")
    return Expand({names[key]: item for key, item in value.items() if item is not None})


def _packing_strategy(value: Any) -> Any:
    if value == "balanced":
        return Nearest("best_fit", "LMMS Engine's balanced packer places each sample best-fit into one of "
                       "num_buckets open rows and swaps samples to even out their lengths; vlforge packs best_fit "
                       "(the same samples, rows composed differently)")
    return value


def _dataset_extra(value: Any) -> Expand | Ignore:
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    other = sorted(set(value) - {"packing_kwargs"})
    if other:
        raise ValueError(f"{', '.join(other)}: options of LMMS Engine's datasets (the video decoder, "
                         "use_audio_in_video, ...) that vlforge has no counterpart for; remove them")
    if value.get("packing_kwargs"):
        return Ignore("packing_kwargs tune LMMS Engine's balanced packer (num_buckets: length buckets it balances "
                      "across ranks); vlforge fills each row from the samples it holds (packing.packing_strategy)")
    return Expand({})


def _fsdp2(value: Any) -> Expand:
    return Expand({})  # LMMS Engine's fsdp2_trainer shards with FSDP2 whatever the flag says: so does vlforge


def _later(value: Any) -> Expand:
    return Expand({})  # read by the precision pass (bf16 / fp16) once the whole file is walked


#: The honoured keys: every LMMS Engine key vlforge maps, and where it goes. Order = docs order.
KEY_TABLE: tuple[KeyMap, ...] = (
    KeyMap("trainer_type", "trainer_type", "`fsdp2_trainer`; `hf_trainer` runs on the same trainer with a warning "
           "naming what differs (loss normalisation, DeepSpeed, checkpoint format)", _trainer_type),
    KeyMap("dataset_config.dataset_type", "data.streaming",
           "`vision`, `vision_iterable` -> false (vlforge streams every dataset and counts its steps, so "
           "`max_steps` is optional); `qwen3_vl_iterable` -> true (needs `max_steps`, as in the guide); others "
           "are errors", _dataset_type),
    KeyMap("dataset_config.dataset_format", "data.dataset_format", "`csv`, `hf_dataset` are errors"),
    KeyMap("dataset_config.datasets", "data.datasets", "entries may add `weight`, `max_samples` and the record "
           "layout keys `layout`, `columns`, `tags`"),
    KeyMap("dataset_config.dataset_path", "data.dataset_path"),
    KeyMap("dataset_config.shuffle", "data.shuffle",
           "LMMS Engine permutes all records in memory with `data_seed`; vlforge streams them in per-epoch permuted "
           "blocks through a shuffle buffer (`data.shuffle_buffer`, `data.shuffle_block`)"),
    KeyMap("dataset_config.data_seed", "data.seed", "seed of the data order"),
    KeyMap("dataset_config.eval_dataset_path", "data.eval_dataset_path"),
    KeyMap("dataset_config.processor_config.processor_name", "processor.processor_name"),
    KeyMap("dataset_config.processor_config.processor_type", "processor.processor_type",
           "a name that is no vlforge family warns; the checkpoint's model_type decides", _processor_type),
    KeyMap("dataset_config.processor_config.extra_kwargs", "processor",
           "`image_min_pixels` / `image_max_pixels` -> `processor.min_pixels` / `max_pixels`, `video_min_pixels` / "
           "`video_max_pixels` -> `video.video_min_pixels` / `video_max_pixels`; other keys are errors", _pixels),
    KeyMap("dataset_config.extra_kwargs", "", "`packing_kwargs` has no effect (a warning); other keys are errors",
           _dataset_extra),
    KeyMap("dataset_config.packing", "packing.packing"),
    KeyMap("dataset_config.packing_strategy", "packing.packing_strategy",
           "`balanced` (LMMS Engine's bucket balancer) -> `best_fit`, with a warning", _packing_strategy),
    KeyMap("dataset_config.packing_length", "packing.packing_length"),
    KeyMap("dataset_config.filter_overlong", "packing.filter_overlong",
           "over-long samples are dropped and counted, never truncated"),
    KeyMap("dataset_config.max_length", "packing.max_length"),
    KeyMap("dataset_config.video_sampling_strategy", "video.video_sampling_strategy"),
    KeyMap("dataset_config.video_max_pixels", "video.video_max_pixels"),
    KeyMap("dataset_config.video_min_pixels", "video.video_min_pixels"),
    KeyMap("dataset_config.video_max_frames", "video.video_max_frames"),
    KeyMap("dataset_config.fps", "video.fps"),
    KeyMap("dataset_config.frame_num", "video.frame_num"),
    KeyMap("model_config.load_from_pretrained_path", "model.load_from_pretrained_path"),
    KeyMap("model_config.attn_implementation", "model.attn_implementation",
           "`flash_attention_2` resolves to sdpa without flash-attn + GPU (warning)"),
    KeyMap("model_config.overwrite_config", "model.overwrite_config",
           "set on `model.config` (and the model) after loading, as LMMS Engine does"),
    KeyMap("trainer_args.per_device_train_batch_size", "training.per_device_train_batch_size"),
    KeyMap("trainer_args.gradient_accumulation_steps", "training.gradient_accumulation_steps"),
    KeyMap("trainer_args.learning_rate", "training.learning_rate", "0 is allowed (with a warning)"),
    KeyMap("trainer_args.optim", "training.optim",
           "`adamw_torch_fused` (fused kernel) or `adamw_torch`; other names warn: LMMS Engine's fsdp2_trainer "
           "uses torch AdamW whatever `optim` says", _optim),
    KeyMap("trainer_args.weight_decay", "training.weight_decay"),
    KeyMap("trainer_args.adam_beta1", "training.adam_beta1"),
    KeyMap("trainer_args.adam_beta2", "training.adam_beta2"),
    KeyMap("trainer_args.adam_epsilon", "training.adam_epsilon"),
    KeyMap("trainer_args.num_train_epochs", "training.num_train_epochs"),
    KeyMap("trainer_args.max_steps", "training.max_steps", "`-1` means unset", _max_steps),
    KeyMap("trainer_args.warmup_ratio", "training.warmup_ratio"),
    KeyMap("trainer_args.warmup_steps", "training.warmup_steps"),
    KeyMap("trainer_args.lr_scheduler_type", "training.lr_scheduler_type",
           "linear, cosine, constant, wsd (LMMS Engine's fsdp2_trainer refuses linear; vlforge runs it)"),
    KeyMap("trainer_args.lr_scheduler_kwargs", "training.lr_scheduler_kwargs",
           "LMMS Engine's parameters and formulas: `min_lr_ratio`, `num_cycles`, `stable_ratio`, `start_factor`, "
           "`end_factor`"),
    KeyMap("trainer_args.max_grad_norm", "training.max_grad_norm"),
    KeyMap("trainer_args.seed", "training.seed"),
    KeyMap("trainer_args.data_seed", "data.seed", "same key as `dataset_config.data_seed`"),
    KeyMap("trainer_args.bf16", "training.bf16",
           "true: bf16 weights and compute (`fsdp.mixed_precision: pure_bf16`); false: float16 compute "
           "(`fsdp.param_dtype: float16`), as LMMS Engine's fsdp2_trainer", _later),
    KeyMap("trainer_args.fp16", "", "float16 compute, what `bf16: false` means anyway; with `bf16: true` an "
           "error", _later),
    KeyMap("trainer_args.reduce_dtype", "fsdp.reduce_dtype", "FSDP2's gradient reduction dtype", _dtype),
    KeyMap("trainer_args.output_dtype", "fsdp.output_dtype", "FSDP2's output dtype of every layer unit", _dtype),
    KeyMap("trainer_args.use_cpu", "training.use_cpu"),
    KeyMap("trainer_args.ddp_timeout", "training.ddp_timeout", "process-group timeout in seconds"),
    KeyMap("trainer_args.eval_strategy", "training.eval_strategy", "`no` or `steps`"),
    KeyMap("trainer_args.eval_steps", "training.eval_steps"),
    KeyMap("trainer_args.gradient_checkpointing", "model.gradient_checkpointing"),
    KeyMap("trainer_args.freeze_modules", "model.freeze_modules"),
    KeyMap("trainer_args.group_by_length", "packing.group_by_length"),
    KeyMap("trainer_args.dataloader_num_workers", "dataloader_num_workers"),
    KeyMap("trainer_args.dataloader_pin_memory", "dataloader_pin_memory"),
    KeyMap("trainer_args.use_liger_kernel", "use_liger_kernel",
           "on CUDA with liger-kernel: Liger's RMSNorm, SwiGLU, rope and fused linear cross-entropy where the family's "
           "modules compute the same maths, each replaced module logged, the rest named in one warning (docs/train.md, "
           "Speed levers); without CUDA or liger-kernel one warning and nothing replaced"),
    KeyMap("trainer_args.use_rmpad", "use_rmpad"),
    KeyMap("trainer_args.sp_ulysses_degree", "sp_ulysses_degree",
           "Ulysses sequence parallelism (every family, the MoE and linear-attention ones included); see Sequence "
           "parallelism"),
    KeyMap("trainer_args.fsdp2", "", "accepted either way: LMMS Engine's fsdp2_trainer always shards with FSDP2, "
           "and so does vlforge (`fsdp.fsdp2: true`)", _fsdp2),
    KeyMap("trainer_args.fsdp_config.transformer_layer_cls_to_wrap", "fsdp.transformer_layer_cls_to_wrap"),
    KeyMap("trainer_args.fsdp_config.reshard_after_forward", "fsdp.reshard_after_forward"),
    KeyMap("trainer_args.fsdp_config.hsdp_shard_size", "fsdp.hsdp_shard_size",
           "shard within groups of N ranks, replicate across groups"),
    KeyMap("trainer_args.logging_steps", "logging.logging_steps",
           "LMMS Engine's fsdp2_trainer logs every step; vlforge every `logging_steps`"),
    KeyMap("trainer_args.logging_first_step", "logging.logging_first_step"),
    KeyMap("trainer_args.report_to", "logging.report_to", "warning when the sink is not installed"),
    KeyMap("trainer_args.run_name", "logging.run_name"),
    KeyMap("trainer_args.output_dir", "checkpointing.output_dir"),
    KeyMap("trainer_args.save_strategy", "checkpointing.save_strategy",
           "`steps`, `epoch`, `no` (LMMS Engine's fsdp2_trainer saves every `save_steps` whatever it says)"),
    KeyMap("trainer_args.save_steps", "checkpointing.save_steps"),
    KeyMap("trainer_args.save_total_limit", "checkpointing.save_total_limit"),
    KeyMap("trainer_args.resume_from_checkpoint", "checkpointing.resume", "`true` -> `auto`", _resume),
)

BY_LMMS: dict[str, KeyMap] = {entry.lmms: entry for entry in KEY_TABLE}
BY_NATIVE: dict[str, KeyMap] = {}
for _entry in KEY_TABLE:
    BY_NATIVE.setdefault(_entry.native, _entry)
LMMS_SECTIONS = ("dataset_config", "model_config", "trainer_args")
#: Every LMMS mapping that holds further keys ("" is the top level).
GROUPS: tuple[str, ...] = lmms_groups()
#: Defaults LMMS Engine fills in after reading its dataclass (transformers' ``output_dir``).
_RUNTIME_DEFAULTS = {"trainer_args.output_dir": "trainer_output"}

assert len(BY_LMMS) == len(KEY_TABLE), "one entry per LMMS key"


def classification(key: str) -> str:
    """``honoured``, ``inert``, ``refused`` or ``group`` for a dotted LMMS key; ``unknown`` otherwise."""
    if key in GROUPS:
        return "group"
    if key in BY_LMMS:
        return "honoured"
    if key in INERT or lmms_fields().get(key, {}).get("dropped"):
        return "inert"
    if key in REFUSED:
        return "refused"
    return "unknown"


def inert_reason(key: str) -> str:
    """Why an inert key has no effect here."""
    if key in INERT:
        return INERT[key]
    from vlforge.config.lmms_keys import _DROPPED

    return _DROPPED


def detect_layout(data: Any) -> str:
    """``lmms_list`` (the guide's list), ``lmms`` (LMMS Engine's mapping) or ``native``."""
    if isinstance(data, list):
        return "lmms_list"
    if isinstance(data, dict) and any(key in data for key in LMMS_SECTIONS):
        return "lmms"
    return "native"


def group_children(group: str) -> list[str]:
    """Keys valid directly inside an LMMS group: every key of LMMS Engine's schema there."""
    prefix = f"{group}." if group else ""
    names = {key[len(prefix):].split(".", 1)[0] for key in lmms_fields() if key.startswith(prefix)}
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
    warnings: list[str] = field(default_factory=list)
    """Inert keys set to a non-default value, one sentence each (``key: value has no effect: why``)."""
    given: dict[str, Any] = field(default_factory=dict)
    """LMMS dotted key -> value as written, for every classified key of the file."""
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
            if entry.native and (entry.native == dotted or entry.native.startswith(dotted + ".")):
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
    if not result.problems:
        _finish(result)
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
    top = set(group_children(""))
    for key, value in root.items():
        where = (*result.base, key)
        if key in _NATIVE_SECTIONS and isinstance(value, dict):
            result.problems.append(_problem(result, where, "a native vlforge section in an LMMS Engine layout "
                                            "(dataset_config/model_config/trainer_args); use one layout"))
        elif key in LMMS_SECTIONS:
            _walk_group(key, value, where, result)
        elif key in top:
            _key(result, key, value, where)
        elif flat_args and f"trainer_args.{key}" in GROUPS:
            _walk_group(f"trainer_args.{key}", value, where, result)
        elif flat_args and f"trainer_args.{key}" in lmms_fields():
            _key(result, f"trainer_args.{key}", value, where)
        else:
            valid = [*top, *(group_children("trainer_args") if flat_args else ())]
            result.problems.append(_unknown(result, where, valid, ("", "trainer_args") if flat_args else ("",)))


def _walk_group(group: str, value: Any, where: PathT, result: Translation) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        result.problems.append(_problem(result, where, f"must be a mapping, got {type(value).__name__}"))
        return
    children = set(group_children(group))
    for key, item in value.items():
        name = key
        if group == "trainer_args.fsdp_config" and isinstance(key, str) and key.startswith("fsdp_") \
                and key[5:] in children:
            name = key[5:]  # transformers strips the prefix inside fsdp_config
        full = f"{group}.{name}"
        if full in GROUPS:
            _walk_group(full, item, (*where, key), result)
        elif name in children:
            _key(result, full, item, (*where, key))
        elif full in UNDECLARED:
            result.warnings.append(f"{render_path((*where, key))}: {_show(item)} has no effect: {UNDECLARED[full]}")
        else:
            result.problems.append(_unknown(result, (*where, key), sorted(children), (group,)))


def _key(result: Translation, key: str, value: Any, where: PathT) -> None:
    """One classified LMMS key as written in the file."""
    if key in result.given:
        result.problems.append(_problem(result, where, f"given twice (also as {key})"))
        return
    result.given[key] = value
    kind = classification(key)
    if kind == "honoured":
        _set(result, BY_LMMS[key], value, where)
    elif kind == "inert":
        if not is_default(key, value):
            result.warnings.append(f"{render_path(where)}: {_show(value)} has no effect: {inert_reason(key)}")
    elif kind == "refused" and not is_default(key, value) and value not in REFUSED_OK.get(key, ()):
        result.problems.append(_problem(result, where, f"{_show(value)} is refused: {REFUSED[key]}"))


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _set(result: Translation, entry: KeyMap, value: Any, where: PathT) -> None:
    if value is None:
        return  # LMMS dumps write null for "unset": LMMS Engine's default applies
    if entry.convert is not None:
        try:
            value = entry.convert(value)
        except ValueError as error:
            result.problems.append(_problem(result, where, str(error)))
            return
        if isinstance(value, Ignore):
            result.warnings.append(f"{render_path(where)}: {_show(result.given.get(entry.lmms))} has no effect: "
                                   f"{value.reason}")
            return
        if isinstance(value, Nearest):
            result.warnings.append(f"{render_path(where)}: {_show(result.given.get(entry.lmms))} is read as "
                                   f"{entry.native}: {_show(value.value)}: {value.reason}")
            value = value.value
        if value is None:
            return
    values = value.values if isinstance(value, Expand) else {entry.native: value}
    for native, item in values.items():
        _put(result, native, item, where)


def _put(result: Translation, native: str, value: Any, where: PathT) -> None:
    native_path = tuple(native.split("."))
    if native_path in result.provenance and _get(result.native, native_path) != value:
        first = render_path(result.provenance[native_path])
        result.problems.append(_problem(result, where, f"given twice (also at {first})"))
        return
    target = result.native
    for part in native_path[:-1]:
        target = target.setdefault(part, {})
    target[native_path[-1]] = value
    result.provenance[native_path] = where


def _get(data: dict[str, Any], path: PathT) -> Any:
    for part in path:
        data = data.get(part, {}) if isinstance(data, dict) else {}
    return data


def _finish(result: Translation) -> None:
    """LMMS Engine's defaults for honoured keys the file leaves out, then precision and schedule semantics."""
    fields = lmms_fields()
    for entry in KEY_TABLE:
        if entry.lmms in result.given or not entry.native or entry.convert is _later:
            continue
        record = fields[entry.lmms]
        default = _RUNTIME_DEFAULTS.get(entry.lmms, None if record.get("required") else record.get("default"))
        targets = [tuple(entry.native.split("."))]
        if default is None or any(target in result.provenance for target in targets):
            continue
        before = len(result.warnings)
        _set(result, entry, default, result.lmms_source(entry.lmms))
        del result.warnings[before:]  # a default never warns
    _precision(result)
    _schedule(result)
    _expert_parallel_wrap(result)
    training = result.native.get("training", {})
    if training.get("warmup_ratio") and training.get("warmup_steps"):  # LMMS Engine: the ratio wins when > 0
        where = result.provenance.pop(("training", "warmup_steps"))
        result.warnings.append(f"{render_path(where)}: {training.pop('warmup_steps')} has no effect: LMMS Engine "
                               "warms up for warmup_ratio of the steps when it is above 0, as vlforge does here")


def _expert_parallel_wrap(result: Translation) -> None:
    """With ``ep_degree`` > 1 LMMS Engine's expert-parallel path wraps fixed submodules of its MoE and Qwen3-VL
    models and never reads ``transformer_layer_cls_to_wrap`` (its own examples name a text-only class there)."""
    fsdp = result.native.get("fsdp", {})
    if (result.given.get("trainer_args.ep_degree") or 1) <= 1 or fsdp.get("transformer_layer_cls_to_wrap") is None:
        return
    where = result.provenance.pop(("fsdp", "transformer_layer_cls_to_wrap"))
    result.warnings.append(f"{render_path(where)}: {fsdp.pop('transformer_layer_cls_to_wrap')} has no effect: LMMS "
                           "Engine does not read it when ep_degree > 1 (its expert-parallel path wraps fixed "
                           "submodules); vlforge wraps the model's own layer classes (its _no_split_modules)")


def precision_values(bf16: bool) -> dict[str, Any]:
    """Native precision keys of LMMS Engine's fsdp2_trainer with ``bf16`` true or false.

    ``bf16: true``: the model is loaded in bf16 and FSDP2 computes in bf16 (no fp32 master weights);
    ``bf16: false``: FSDP2's ``param_dtype`` and the autocast are float16, without loss scaling (vlforge keeps
    fp32 master weights; LMMS Engine keeps the checkpoint's dtype).
    """
    if bf16:
        return {"training.bf16": True, "fsdp.mixed_precision": "pure_bf16", "fsdp.param_dtype": "bfloat16"}
    return {"training.bf16": False, "fsdp.mixed_precision": "fp32_master", "fsdp.param_dtype": "float16"}


def _precision(result: Translation) -> None:
    bf16 = result.given.get("trainer_args.bf16")
    fp16 = result.given.get("trainer_args.fp16")
    where_bf16 = result.lmms_source("trainer_args.bf16")
    if bf16 and fp16:
        result.problems.append(_problem(result, result.lmms_source("trainer_args.fp16"),
                                        "bf16 and fp16 are both true; choose one (LMMS Engine's TrainingArguments "
                                        "refuses both too)"))
        return
    values = precision_values(bool(bf16))
    where = result.lmms_source("trainer_args.fp16") if fp16 and "trainer_args.bf16" not in result.given else where_bf16
    for native, value in values.items():
        if tuple(native.split(".")) not in result.provenance:
            _put(result, native, value, where)


def _schedule(result: Translation) -> None:
    """LMMS Engine's own schedule parameters: ``constant`` warms up from 1%, ``wsd`` holds 90% then a cosine."""
    training = result.native.get("training", {})
    kind = training.get("lr_scheduler_type")
    kwargs = training.get("lr_scheduler_kwargs") or {}
    lmms = {"constant": {"start_factor": 0.01, "end_factor": 1.0},
            "wsd": {"stable_ratio": 0.9, "decay": "cosine", "min_lr_ratio": 0.0, "num_cycles": 0.5}}.get(kind)
    if lmms is not None and isinstance(kwargs, dict):
        training["lr_scheduler_kwargs"] = {**lmms, **kwargs}


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
