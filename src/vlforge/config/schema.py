"""The native training-config schema: typed sections, field docs, and checks at construction.

Every section forbids unknown keys. The data sections are the data pipeline's own field groups
(:mod:`vlforge.data.config`), extended by what only a run has (its files, the processor choice, the decoder
name). Checks that involve two fields raise a ``vlforge_field`` error whose ``field`` names the key at fault
(relative to the section), so the loader can point at the exact key.

Example:
    >>> from vlforge.config.schema import TrainConfig
    >>> cfg = TrainConfig(data={"datasets": [{"path": "a.jsonl"}]}, model={"load_from_pretrained_path": "tiny:qwen3_vl"})
    >>> cfg.training.lr_scheduler_type, cfg.fsdp.mixed_precision
    ('linear', 'fp32_master')
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import PurePath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, field_validator, model_validator

from vlforge.data.config import (
    COMPRESSED_SUFFIXES,
    DATA_SUFFIXES,
    DATASET_LIST_SUFFIXES,
    DatasetEntry,
    PackingFields,
    PixelFields,
    SourceFields,
    VideoFields,
    shard_like,
    unknown_suffix,
)
from vlforge.errors import did_you_mean
from vlforge.strict import StrictModel, field_error, model_in_annotation

logger = logging.getLogger(__name__)


class DataSection(SourceFields):
    """Where the training samples come from and what to do with bad ones (the pipeline's source fields, plus the
    files of the run)."""

    datasets: list[DatasetEntry] | None = None
    """Inline list of data files (LMMS ``dataset_format: yaml`` with ``datasets:``)."""
    dataset_path: str | None = None
    """A dataset YAML listing ``datasets:`` entries, or a single data file; alternative to ``datasets``."""
    dataset_format: Literal["json", "jsonl", "yaml", "parquet", "arrow"] | None = None
    """Format of ``dataset_path`` (``yaml`` for a dataset list); null means "from the suffix"."""
    streaming: bool = False
    """Read the data as a stream (iterable dataset, length unknown): ``training.max_steps`` is required."""
    max_skip_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    """Largest share of the samples seen that may be skipped (``on_error: skip``, ``filter_overlong``); above
    it training stops with an error naming the top reasons (0: none may be, 1: never stop)."""
    eval_dataset_path: str | None = None
    """Dataset YAML or data file for the eval loss (used when ``training.eval_strategy`` is ``steps``)."""

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        if self.datasets is None and self.dataset_path is None:
            raise field_error("datasets", "no training data: give data.datasets (a list) or data.dataset_path")
        if self.datasets is not None and self.dataset_path is not None:
            raise field_error("dataset_path", "give data.datasets or data.dataset_path, not both")
        if self.datasets is not None and not self.datasets:
            raise field_error("datasets", "the dataset list is empty")
        if self.datasets is not None and self.dataset_format not in (None, "yaml"):
            raise field_error(
                "dataset_format",
                f"dataset_format {self.dataset_format!r} does not fit an inline datasets list (use yaml or omit it)",
            )
        if self.dataset_path is not None and self.dataset_format is not None:
            suffix = PurePath(self.dataset_path).suffix.lower()
            listing = self.dataset_format == "yaml"
            if (listing and suffix in DATA_SUFFIXES) or (not listing and suffix in DATASET_LIST_SUFFIXES):
                what = "a dataset YAML listing data files" if listing else f"a {self.dataset_format} data file"
                right = DATA_SUFFIXES.get(suffix, "yaml")
                raise field_error(
                    "dataset_format",
                    f"dataset_format {self.dataset_format!r} reads {self.dataset_path!r} as {what}, but its suffix "
                    f"says {right}: set data.dataset_format={right} (or null: from the suffix)",
                )
        if self.dataset_path is not None:
            suffix = PurePath(self.dataset_path).suffix.lower()
            if suffix in COMPRESSED_SUFFIXES or (self.dataset_format is None and suffix not in DATA_SUFFIXES
                                                 and suffix not in DATASET_LIST_SUFFIXES
                                                 and not shard_like(self.dataset_path)):
                raise field_error("dataset_path" if suffix in COMPRESSED_SUFFIXES else "dataset_format",
                                  f"{self.dataset_path!r}: {unknown_suffix(self.dataset_path, 'dataset_format')}")
        return self


class ProcessorSection(PixelFields):
    """The Hugging Face processor that turns chat samples into token ids and pixels."""

    processor_name: str | None = None
    """Processor directory or preset; null uses ``model.load_from_pretrained_path``."""
    processor_type: str | None = None
    """Model family the processing rules follow (a ``model_type`` vlforge has a record of: ``vlforge tiny --list``);
    null takes it from the checkpoint's ``model_type``."""

    @field_validator("processor_type")
    @classmethod
    def _known_family(cls, value: str | None) -> str | None:
        from vlforge.models.families import FAMILIES

        if value is not None and value not in FAMILIES:
            raise ValueError(f"unknown model family {value!r}{did_you_mean(value, FAMILIES)} "
                             f"(known: {', '.join(FAMILIES)})")
        return value


class VideoSection(VideoFields):
    """How video frames are sampled and resized (decoded with PyAV)."""

    video_backend: Literal["pyav", "qwen_vl_utils", "decord", "torchvision"] = "pyav"
    """Decoder; vlforge always decodes with PyAV, other names are accepted for LMMS configs (with a warning)."""


class LoraConfig(StrictModel):
    """Low-rank adapters (through peft) instead of full fine-tuning."""

    r: int = Field(default=16, ge=1)
    """Rank of the adapters."""
    alpha: float = Field(default=32.0, gt=0)
    """Scaling numerator: the update is multiplied by ``alpha / r``."""
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    """Module names (or suffixes) that get adapters, as peft matches them; one matching nothing resolves like
    ``model.freeze_modules``."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the adapter input."""


class ModelConfig(StrictModel):
    """The checkpoint to train and how it is loaded."""

    load_from_pretrained_path: str = Field(min_length=1)
    """Checkpoint directory, tiny preset (``tiny:qwen3_vl``) or hub id."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    """Attention kernel of the decoder; flash_attention_2 needs flash-attn and a GPU."""
    freeze_modules: list[str] = Field(default_factory=list)
    """Modules whose parameters are not trained: a dotted path, a unique path suffix (``visual`` is
    ``model.visual``) or an alias such as ``vision_tower`` (docs/train.md, "Module names")."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory (LMMS Engine's key): true means
    ``activation_checkpointing: full`` (another ``activation_checkpointing`` beside it is an error); false leaves
    the choice to ``activation_checkpointing``."""
    activation_checkpointing: Literal["none", "selective", "full"] | None = None
    """What the decoder layers and vision blocks keep for the backward: ``none`` (everything, fastest),
    ``selective`` (only the outputs of their matrix multiplies and attention kernels; norms, activations, rope
    and casts are recomputed: little extra compute, less memory), ``full`` (only each block's input; the whole
    block runs again in the backward, about a third more compute). null: from ``gradient_checkpointing``."""
    compile: bool = False
    """Compile each decoder layer and vision block with ``torch.compile`` (regional compilation; the first steps
    take longer, the compile time is logged)."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of all weights; null trains all (unfrozen) weights."""
    patch: bool = True
    """Apply ``vlforge.patch`` (patch-embedding convolutions as one GEMM) after loading."""
    patch_precision: Literal["native", "fp32"] = "native"
    """Precision of the patched GEMM: the input's own dtype, or fp32 then cast back."""
    overwrite_config: dict[str, Any] | None = None
    """Model config attributes set after loading (LMMS Engine's ``overwrite_config``): each key is set on
    ``model.config`` and, where the model has that attribute too, on the model; exported with the model."""
    token_audit: bool = True
    """Audit the chat template's special tokens for untrained rows at start-up (a few seconds; see
    docs/tokens.md); ``vlforge train --no-token-audit`` sets it to false."""
    memory_plan: bool = True
    """Log the memory plan's estimate of the peak per rank at start-up, a warning when it exceeds the free
    memory (``vlforge plan``; about a second)."""

    @field_validator("freeze_modules", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value

    @model_validator(mode="after")
    def _one_checkpointing(self) -> ModelConfig:
        mode = self.activation_checkpointing
        if mode is None:
            return self
        if self.gradient_checkpointing and mode != "full":
            raise field_error("activation_checkpointing", f"activation_checkpointing: {mode} contradicts "
                              "gradient_checkpointing: true (which means full); set one of them")
        self.gradient_checkpointing = mode == "full"  # one meaning whichever key was written (exact round trip)
        return self

    def checkpointing(self) -> str:
        """The activation checkpointing mode: ``activation_checkpointing``, else from ``gradient_checkpointing``."""
        return self.activation_checkpointing or ("full" if self.gradient_checkpointing else "none")


class TrainingConfig(StrictModel):
    """Batch sizes, optimiser, schedule, precision and evaluation cadence."""

    per_device_train_batch_size: int = Field(default=1, ge=1)
    """Samples (or packed rows) per process per micro-step."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    """Micro-steps per optimiser step; the loss is the mean over all label tokens of the whole step."""
    learning_rate: float = Field(default=1e-5, ge=0)
    """Peak learning rate of AdamW; 0 is allowed (the weights then stay as loaded; a warning says so)."""
    optim: Literal["adamw_torch_fused", "adamw_torch"] = "adamw_torch_fused"
    """AdamW implementation: ``adamw_torch_fused`` (the fused kernel where the device has one, else foreach,
    with a log line) or ``adamw_torch`` (``torch.optim.AdamW`` with foreach)."""
    optimizer_state_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype AdamW keeps its two moment estimates in. ``bfloat16`` halves the optimiser state (each update is
    computed in float32 from the stored moments, then they are stored rounded; the weights keep their dtype):
    with fp32 master weights 12 instead of 16 bytes per trainable parameter, what lets Qwen3-VL-8B train on one
    141 GB GPU (``vlforge plan`` counts it)."""
    weight_decay: float = Field(default=0.0, ge=0)
    """AdamW decoupled weight decay."""
    adam_beta1: float = Field(default=0.9, ge=0, lt=1)
    """AdamW beta1."""
    adam_beta2: float = Field(default=0.999, ge=0, lt=1)
    """AdamW beta2."""
    adam_epsilon: float = Field(default=1e-8, gt=0)
    """AdamW epsilon."""
    num_train_epochs: float = Field(default=1.0, gt=0)
    """Passes over the data; ignored when ``max_steps`` is set."""
    max_steps: int | None = Field(default=None, ge=1)
    """Total optimiser steps; required for streaming data; overrides ``num_train_epochs``."""
    warmup_ratio: float = Field(default=0.0, ge=0, lt=1)
    """Fraction of the total steps with linear warm-up, in [0, 1)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Warm-up steps (alternative to ``warmup_ratio``)."""
    lr_scheduler_type: Literal["linear", "cosine", "constant", "wsd"] = "linear"
    """Schedule after warm-up: linear or cosine decay to 0, constant, or warmup-stable-decay."""
    lr_decay_ratio: float = Field(default=0.1, gt=0, le=1)
    """For ``wsd``: fraction of the total steps spent in the final decay (unless ``lr_scheduler_kwargs``
    gives ``stable_ratio``)."""
    lr_scheduler_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Schedule parameters (LMMS Engine's): ``cosine``: ``min_lr_ratio``, ``num_cycles``; ``wsd``: those and
    ``stable_ratio`` (share of the post-warm-up steps held, then a cosine decay) and ``decay`` (``linear`` or
    ``cosine``); ``constant``: ``start_factor``, ``end_factor`` (the warm-up ramps between them)."""
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    """Clip the global gradient norm to this value; null disables clipping."""
    seed: int = Field(default=42, ge=0)
    """Seed of model initialisation extras, data order and dropout."""
    bf16: bool = False
    """Compute in bfloat16 (see ``fsdp.mixed_precision`` for the master weights)."""
    fp16: bool = False
    """Compute in float16 with loss scaling (bf16 is preferred)."""
    eval_strategy: Literal["no", "steps"] = "no"
    """``steps``: compute the eval loss every ``eval_steps`` on ``data.eval_dataset_path``."""
    eval_steps: int | None = Field(default=None, ge=1)
    """Optimiser steps between eval-loss computations."""
    use_cpu: bool = False
    """Train on the CPU (gloo between processes) even where CUDA is available."""
    ddp_timeout: int = Field(default=1800, ge=1)
    """Seconds a collective may wait before the process group gives up (``init_process_group(timeout=)``)."""
    max_nonfinite_steps: int = Field(default=3, ge=1)
    """Optimiser steps in a row whose loss or gradient norm is NaN or infinite (none of them is applied) after
    which the run stops with exit 3, naming the step and its samples; 1 stops at the first."""
    loss_spike_factor: float | None = Field(default=None, gt=1)
    """A step whose loss exceeds this factor times the mean loss of the last ``loss_spike_window`` applied steps
    is a loss spike, logged with its samples; null: no spike check."""
    loss_spike_window: int = Field(default=50, ge=1)
    """Applied steps whose mean loss is the spike reference; no step is judged before that many were applied."""
    loss_spike_action: Literal["log", "skip"] = "log"
    """``log``: a warning per spike; ``skip``: the spike is also not applied (counted towards
    ``max_nonfinite_steps`` like a non-finite step; one more small all-reduce per step with several processes)."""
    stop_signals: list[Literal["SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP"]] = Field(
        default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    """Signals that stop the run at an optimiser-step boundary: every rank finishes the step, a checkpoint is
    saved and the run exits 4 ([] keeps each signal's default action)."""
    stop_grace_period: float = Field(default=25.0, gt=0)
    """Seconds from the first stop signal until the process exits at once (128 + the signal's number, 143 for
    SIGTERM) if its checkpoint is not written yet; so does a second stop signal (2 s or more after the first)."""
    rank_timeout: float = Field(default=300.0, gt=0)
    """Seconds without a heartbeat from another process of the run (a stopped or lost host) after which the others
    stop with exit 5, naming it; a process that exits or fails is named within seconds."""

    @field_validator("eval_strategy", mode="before")
    @classmethod
    def _yaml_no(cls, value: Any) -> Any:
        return "no" if value is False else value  # YAML 1.1 reads an unquoted `no` as false

    @field_validator("lr_scheduler_kwargs", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("stop_signals", mode="before")
    @classmethod
    def _signal_list(cls, value: Any) -> Any:
        return [] if value is None else [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> TrainingConfig:
        if self.bf16 and self.fp16:
            raise field_error("fp16", "bf16 and fp16 are both true; choose one (bf16 is preferred)")
        if self.warmup_ratio and self.warmup_steps:
            raise field_error("warmup_steps", "give warmup_ratio or warmup_steps, not both")
        if self.eval_strategy == "steps" and self.eval_steps is None:
            raise field_error("eval_steps", "eval_strategy: steps needs eval_steps")
        _check_schedule_kwargs(self.lr_scheduler_type, self.lr_scheduler_kwargs)
        return self


class FsdpConfig(StrictModel):
    """Sharding with FSDP2 (``fully_shard``) and the mixed-precision policy."""

    fsdp2: bool = True
    """Shard parameters, gradients and optimiser state with FSDP2; false keeps a full replica per process."""
    transformer_layer_cls_to_wrap: list[str] | None = None
    """Layer classes sharded as units, checked against the model (a name without transformers 5's ``Text`` part
    is accepted); null uses the model's own ``_no_split_modules``."""
    reshard_after_forward: bool | None = None
    """Free gathered parameters after the forward (less memory, one more all-gather in backward). null or auto: the
    last decoder layer never reshards (its backward comes first), the others do, unless every rank is on one node and
    the start-up memory plan (``model.memory_plan``) with every layer kept gathered fits 85% of the free memory
    (then none reshards). One process shards nothing, so there is nothing to reshard."""
    mixed_precision: Literal["fp32_master", "pure_bf16"] = "fp32_master"
    """With bf16: fp32 master weights and fp32 gradient reduction, or everything in bf16 (less memory)."""

    @field_validator("reshard_after_forward", mode="before")
    @classmethod
    def _auto_is_null(cls, value: Any) -> Any:
        return None if isinstance(value, str) and value.strip().lower() == "auto" else value
    param_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Compute dtype of the parameters (FSDP2's ``param_dtype``; in one process an autocast to it); null:
    bfloat16 with ``training.bf16``, else float32. ``float16`` runs without loss scaling, as LMMS Engine's
    fsdp2 trainer does with ``bf16: false``."""
    reduce_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Dtype gradients are reduced in across ranks (FSDP2's ``reduce_dtype``; the all-reduce of
    ``fsdp2: false``); null: float32, or bfloat16 with ``pure_bf16``."""
    output_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """Dtype the floating outputs of every layer unit and of the model are cast to (FSDP2's ``output_dtype``;
    the same units get a cast in one process); null: no cast."""
    hsdp_shard_size: int = Field(default=0, ge=0)
    """HSDP: shard within groups of this many consecutive ranks and replicate across the groups; 0 shards
    over all ranks (1, pure replication, is refused as in LMMS Engine)."""

    @field_validator("transformer_layer_cls_to_wrap", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("transformer_layer_cls_to_wrap")
    @classmethod
    def _not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("an empty list wraps nothing; use null for the model's own layer classes")
        return value

    @field_validator("hsdp_shard_size")
    @classmethod
    def _not_one(cls, value: int) -> int:
        if value == 1:
            raise ValueError("hsdp_shard_size: 1 would replicate every parameter (pure DDP), which LMMS Engine "
                             "refuses too; use 0 to shard over all ranks or > 1 for HSDP")
        return value


class LoggingConfig(StrictModel):
    """Metrics cadence and sinks (a JSONL file in ``output_dir`` is always written)."""

    logging_steps: int = Field(default=10, ge=1)
    """Optimiser steps between metric logs (the only host syncs for logging)."""
    logging_first_step: bool = False
    """Also log the first optimiser step on its own (then every ``logging_steps``)."""
    report_to: list[Literal["wandb", "tensorboard"]] = Field(default_factory=list)
    """Extra sinks: ``wandb``, ``tensorboard`` (``none`` or [] for none, ``all`` for both)."""
    run_name: str | None = None
    """Run name shown by the sinks; null uses the output directory name."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _normalise(cls, value: Any) -> Any:
        if value is None or value == "none":
            return []
        if value == "all":
            return ["tensorboard", "wandb"]
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return [item for item in value if item != "none"]
        return value


class CheckpointingConfig(StrictModel):
    """Where checkpoints go, how often, how many are kept, and resuming."""

    output_dir: str = Field(default="output", min_length=1)
    """Directory of checkpoints, metrics and the final Hugging Face export."""
    save_strategy: Literal["steps", "epoch", "no"] = "steps"
    """When checkpoints are written: every ``save_steps``, at the end of every epoch, or (``no``) only at the
    end of the run (the checkpoint the export is made from)."""
    save_steps: int = Field(default=500, ge=1)
    """Optimiser steps between checkpoints (``save_strategy: steps``)."""
    save_total_limit: int | None = Field(default=None, ge=1)
    """Keep at most this many checkpoints (oldest deleted first); null keeps all."""
    resume: str = Field(default="auto", min_length=1)
    """``auto`` (latest checkpoint in output_dir, if any), ``none``, or a checkpoint directory."""
    ignore_data_skip: bool = False
    """On resume, read the data from its start instead of where the checkpoint left it (transformers' name): the
    weights, optimiser, schedule and step still resume. Needed when the data files changed since the checkpoint
    (a resume on other files is refused otherwise)."""


class TrainConfig(StrictModel):
    """A whole training run. YAML is its serialised form (see ``vlforge validate``)."""

    trainer_type: Literal["fsdp2_trainer"] = "fsdp2_trainer"
    """The training engine (one: FSDP2); kept so LMMS Engine configs name it."""
    data: DataSection
    """Training (and eval) data."""
    processor: ProcessorSection = Field(default_factory=ProcessorSection)
    """Processor choice and image pixel limits."""
    packing: PackingFields = Field(default_factory=PackingFields)
    """Packing and length filtering."""
    video: VideoSection = Field(default_factory=VideoSection)
    """Video frame sampling."""
    model: ModelConfig
    """Checkpoint and how it is loaded."""
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    """Optimisation hyper-parameters."""
    fsdp: FsdpConfig = Field(default_factory=FsdpConfig)
    """Sharding and mixed precision."""
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Metrics cadence and sinks."""
    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoints and resume."""
    sp_ulysses_degree: int = Field(default=1, ge=1)
    """Ulysses sequence-parallel degree (every family): ranks that split one sequence; divides processes and heads
    (Qwen3.5: also its linear-attention key heads)."""
    use_liger_kernel: bool = False
    """Apply Liger's Triton kernels (liger-kernel, CUDA) to the family's RMSNorms, SwiGLU MLPs and rope where they
    compute the same maths, and its fused linear cross-entropy over the label rows; every replaced module is logged,
    what cannot be replaced is named in one warning (docs/train.md, "Speed levers"). Without liger-kernel or a CUDA
    GPU: one warning, nothing replaced."""
    use_rmpad: bool = False
    """Remove padding; in vlforge this is ``packing.packing`` (varlen packed rows): a different value logs a
    warning."""
    dataloader_num_workers: int = Field(default=0, ge=0)
    """DataLoader worker processes per training process."""
    dataloader_pin_memory: bool = True
    """Copy each batch into pinned (page-locked) host memory before the non-blocking copy to a CUDA device, so the
    copy does not wait for the kernels queued before it (transformers' and LMMS Engine's default too; no effect on
    the CPU)."""

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        """A section written with nothing under it (``training:``) means "all defaults"."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if not (value is None and key in SECTION_FIELDS)}
        return data

    @model_validator(mode="after")
    def _across_sections(self) -> TrainConfig:
        if self.data.streaming and self.training.max_steps is None:
            raise field_error(
                "training.max_steps", "streaming data has no known length: set training.max_steps"
            )
        if self.training.eval_strategy == "steps" and self.data.eval_dataset_path is None:
            raise field_error("data.eval_dataset_path", "eval_strategy: steps needs data.eval_dataset_path")
        if self.fsdp.mixed_precision == "pure_bf16" and not self.training.bf16:
            raise field_error("fsdp.mixed_precision", "mixed_precision: pure_bf16 needs training.bf16: true")
        if self.training.bf16 and self.fsdp.param_dtype not in (None, "bfloat16"):
            raise field_error("fsdp.param_dtype", f"param_dtype: {self.fsdp.param_dtype} contradicts "
                              "training.bf16: true (bfloat16 compute)")
        if self.fsdp.hsdp_shard_size and self.sp_ulysses_degree > 1:
            raise field_error("fsdp.hsdp_shard_size", "HSDP (hsdp_shard_size) with sequence parallelism "
                              "(sp_ulysses_degree > 1) is not supported")
        return self

    def param_dtype(self) -> str:
        """The compute dtype of the parameters: ``fsdp.param_dtype``, else from ``training.bf16``."""
        return self.fsdp.param_dtype or ("bfloat16" if self.training.bf16 else "float32")

    def to_yaml(self) -> str:
        """The resolved config as native-layout YAML; ``load_config`` of it gives an equal config."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)  # non-ASCII escaped: exact round trip

    def resolved_attn_implementation(self) -> str:
        """The attention kernel to load with here: ``flash_attention_2`` becomes ``sdpa`` when unusable."""
        if self.model.attn_implementation == "flash_attention_2" and not _flash_attention_usable():
            return "sdpa"
        return self.model.attn_implementation

    def inert_warnings(self) -> list[str]:
        """Settings that are accepted but have no effect on this machine, one sentence each."""
        return _inert_warnings(self)


#: Top-level fields that are sections (``data``, ``model``, ``training``, ...).
SECTION_FIELDS = frozenset(
    name for name, info in TrainConfig.model_fields.items() if isinstance(info.annotation, type)
    and issubclass(info.annotation, BaseModel)
)


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _inert_warnings(cfg: TrainConfig) -> list[str]:
    notes: list[str] = []
    if cfg.use_liger_kernel and not _importable("liger_kernel"):
        notes.append("use_liger_kernel: true has no effect: liger-kernel is not installed here")
    elif cfg.use_liger_kernel and (cfg.training.use_cpu or not _cuda_available()):
        notes.append("use_liger_kernel: true has no effect: no CUDA GPU here (Liger's kernels are Triton kernels for "
                     "CUDA devices)")
    if cfg.video.video_backend != "pyav":
        notes.append(
            f"video.video_backend: {cfg.video.video_backend!r} has no effect: vlforge decodes video with PyAV "
            "(same frame sampling and resize rules)"
        )
    if cfg.model.attn_implementation == "flash_attention_2" and not _flash_attention_usable():
        notes.append(
            "model.attn_implementation: 'flash_attention_2' has no effect: flash-attn or a CUDA GPU is missing "
            "here; sdpa is used instead"
        )
    for sink, module in (("wandb", "wandb"), ("tensorboard", "tensorboard")):
        if sink in cfg.logging.report_to and not _importable(module):
            notes.append(f"logging.report_to: {sink!r} has no effect: {module} is not installed here")
    if cfg.packing.group_by_length and cfg.packing.packing:
        notes.append("packing.group_by_length: true has no effect with packing; the packer fills each row from the "
                     "samples it holds (packing_strategy), group_by_length groups padded batches only")
    for key in ("shuffle_buffer", "shuffle_block"):
        if key in cfg.data.model_fields_set and not cfg.data.shuffle:
            notes.append(f"data.{key} has no effect: data.shuffle is false")
    if "use_rmpad" in cfg.model_fields_set and cfg.use_rmpad != cfg.packing.packing:
        notes.append(f"use_rmpad: {str(cfg.use_rmpad).lower()} has no effect: vlforge removes padding exactly "
                     f"when packing.packing is true (here {str(cfg.packing.packing).lower()})")
    packing = cfg.packing
    if packing.packing_length is not None and not packing.packing and (
        not packing.filter_overlong or packing.max_length is not None
    ):
        notes.append("packing.packing_length has no effect: packing is off and it is not the filter_overlong limit")
    if not cfg.fsdp.fsdp2 and (cfg.fsdp.transformer_layer_cls_to_wrap is not None
                               or cfg.fsdp.reshard_after_forward is not None):
        notes.append("fsdp.transformer_layer_cls_to_wrap / reshard_after_forward have no effect: fsdp.fsdp2 is false")
    if cfg.training.eval_strategy == "no" and cfg.training.eval_steps is not None:
        notes.append("training.eval_steps has no effect: training.eval_strategy is 'no'")
    if cfg.fsdp.mixed_precision == "pure_bf16" and cfg.training.fp16:
        notes.append("fsdp.mixed_precision: 'pure_bf16' has no effect with fp16")
    if cfg.training.learning_rate == 0:
        notes.append("training.learning_rate: 0 trains nothing: every update is zero and the weights stay as loaded")
    if cfg.training.use_cpu and cfg.dataloader_pin_memory and "dataloader_pin_memory" in cfg.model_fields_set:
        notes.append("dataloader_pin_memory: true has no effect: training.use_cpu is true (pinning serves copies "
                     "to a CUDA device)")
    return notes


#: Parameters each schedule takes in ``training.lr_scheduler_kwargs`` (LMMS Engine's names), and their checks.
SCHEDULE_KWARGS: dict[str, dict[str, str]] = {
    "linear": {},
    "cosine": {"min_lr_ratio": "ratio", "num_cycles": "positive"},
    "wsd": {"min_lr_ratio": "ratio", "num_cycles": "positive", "stable_ratio": "ratio", "decay": "shape"},
    "constant": {"start_factor": "ratio", "end_factor": "ratio"},
}


def _check_schedule_kwargs(kind: str, kwargs: dict[str, Any]) -> None:
    allowed = SCHEDULE_KWARGS[kind]
    for key, value in kwargs.items():
        if key not in allowed:
            names = ", ".join(allowed) or "none"
            raise field_error(f"lr_scheduler_kwargs.{key}",
                              f"not a parameter of the {kind} schedule (it takes: {names})")
        check = allowed[key]
        if check == "shape":
            if value not in ("linear", "cosine"):
                raise field_error(f"lr_scheduler_kwargs.{key}", f"decay must be linear or cosine (got {value!r})")
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise field_error(f"lr_scheduler_kwargs.{key}", f"must be a number (got {value!r})")
        if check == "ratio" and not 0 <= value <= 1:
            raise field_error(f"lr_scheduler_kwargs.{key}", f"must be in [0, 1] (got {value!r})")
        if check == "positive" and value <= 0:
            raise field_error(f"lr_scheduler_kwargs.{key}", f"must be greater than 0 (got {value!r})")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:  # checks before work run without torch: no CUDA to speak of
        return False
    return torch.cuda.is_available()


def _flash_attention_usable() -> bool:
    if not _importable("flash_attn"):
        return False
    import torch

    return torch.cuda.is_available()


#: Every section model reachable from TrainConfig, by dotted path ("" is the top level).
def section_models() -> dict[str, type[BaseModel]]:
    """Dotted section path -> model class, e.g. ``{"": TrainConfig, "training": TrainingConfig, ...}``."""
    found: dict[str, type[BaseModel]] = {}

    def visit(prefix: str, cls: type[BaseModel]) -> None:
        found[prefix] = cls
        for name, info in cls.model_fields.items():
            sub = model_in_annotation(info.annotation)
            if sub is not None:
                visit(f"{prefix}.{name}" if prefix else name, sub)

    visit("", TrainConfig)
    return found
