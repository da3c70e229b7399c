"""LMMS Engine 0.1.4's whole config schema and why vlforge ignores or refuses the keys it does not map.

The schema is generated from the engine itself by ``scripts/lmms_schema.py`` (run with the peer venv's
python) into ``lmms_schema_0.1.4.json`` next to this file: every key of the top level,
``dataset_config`` (+ ``processor_config``), ``model_config`` and ``trainer_args`` (every
``TrainingArguments`` field LMMS Engine inherits from transformers 5.8.1, + ``fsdp_config`` and
``accelerator_config``), with its default. Each key is classified in :mod:`vlforge.config.lmms`:
**honoured** (``KEY_TABLE`` there), or here **inert** (accepted; a value other than LMMS Engine's default
gets one warning with the reason below) or **refused** (a value other than the default is an error, because
ignoring it would change what is trained).

Example:
    >>> fields = lmms_fields()
    >>> fields["trainer_args.ddp_timeout"]["default"], fields["dataset_config.shuffle"]["default"]
    (1800, True)
    >>> INERT["trainer_args.torch_compile"].split(";")[0]
    "transformers Trainer's option"
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("lmms_schema_0.1.4.json")
SCHEMA_SCRIPT = "scripts/lmms_schema.py"


@functools.cache
def load_schema() -> dict[str, Any]:
    """The committed schema record (``groups`` -> list of fields; see ``scripts/lmms_schema.py``)."""
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


@functools.cache
def lmms_fields() -> dict[str, dict[str, Any]]:
    """Every LMMS Engine key, dotted as in the ``lmms`` layout (``trainer_args.optim``), -> its field record."""
    out: dict[str, dict[str, Any]] = {}
    for group, fields in load_schema()["groups"].items():
        for record in fields:
            out[f"{group}.{record['name']}" if group else record["name"]] = record
    return out


@functools.cache
def lmms_groups() -> tuple[str, ...]:
    """Dotted LMMS mappings that hold further keys (``""`` is the top level)."""
    return tuple(load_schema()["groups"])


def lmms_defaults(key: str) -> list[Any]:
    """Values of ``key`` that count as LMMS Engine's default: the dataclass default and, where the shipped
    ``default_config.yaml`` writes another (a dump of one machine's run), that value too."""
    record = lmms_fields()[key]
    found = [] if record.get("required") else [record.get("default")]
    if "default_config_value" in record:
        found.append(record["default_config_value"])
    return found


def is_default(key: str, value: Any) -> bool:
    """``value`` is LMMS Engine's default for ``key`` (unset, empty and equal values count alike)."""
    return any(_same(value, default) for default in lmms_defaults(key))


def _same(value: Any, default: Any) -> bool:
    empty = (None, "", [], {})
    if value in empty and default in empty and not isinstance(value, bool) and not isinstance(default, bool):
        return True
    if (value is False and default == "no") or (value == "no" and default is False):
        return True  # YAML 1.1 reads an unquoted `no` as false
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default
    return value == default


# ---- why a key is inert (accepted; a non-default value warns) ------------------------------------------------

_HF = "transformers Trainer's option; LMMS Engine's fsdp2_trainer does not read it, nor does vlforge"
_EVAL = ("transformers Trainer's evaluation/prediction option; LMMS Engine's fsdp2_trainer runs no such loop "
         "(vlforge's eval loss is eval_strategy: steps + eval_steps on dataset_config.eval_dataset_path)")
_HUB = "pushes to the Hugging Face Hub from transformers' Trainer; neither engine's loop pushes (vlforge exports OUTPUT_DIR/final)"
_LOG = "log verbosity of transformers' Trainer; vlforge logs through Python's logging"
_DROPPED = ("not a TrainingArguments field of transformers 5.8.1: LMMS Engine 0.1.4 drops it with a warning "
            "('Filtering out unsupported TrainingArguments parameters')")
_PROFILER = "LMMS Engine's profiler output; vlforge has none in training (see vlforge profile)"
_EMA = ("LMMS Engine's EMA copy of the weights (saved beside each checkpoint); vlforge keeps none: "
        "checkpoints and the export hold the trained weights")
_FSDP1 = ("an option of transformers Trainer's FSDP plugin; LMMS Engine's fsdp2_trainer applies FSDP2 itself "
          "without it, as vlforge does")
_ACCEL = "an option of accelerate inside transformers' Trainer; LMMS Engine's fsdp2_trainer does not use accelerate's loop, nor does vlforge"
_DDP = "a DistributedDataParallel option; LMMS Engine's fsdp2_trainer and vlforge shard with FSDP2, no DDP"
_TRACKIO = "a trackio sink option; vlforge's sinks are wandb and tensorboard (logging.report_to)"

INERT: dict[str, str] = {
    "extra_kwargs": "TrainerConfig.extra_kwargs is not read by LMMS Engine 0.1.4",
    "dataset_config.filter_overlong_workers": "worker processes of LMMS Engine's length filter before training; "
                                              "vlforge filters while it streams",
    "dataset_config.video_backend": "vlforge decodes video with PyAV and applies qwen_vl_utils' frame sampling "
                                    "and resize rules itself, whatever the backend named",
    "model_config.monkey_patch_kwargs": "LMMS Engine's kernel patches (liger, rmpad, fused cross-entropy): the "
                                        "same maths; vlforge uses its own kernels",
    "trainer_args.optim_args": _HF,
    "trainer_args.optim_target_modules": _HF,
    "trainer_args.average_tokens_across_devices": "transformers Trainer's loss normalisation; LMMS Engine's "
                                                  "fsdp2_trainer averages per micro-batch and rank, vlforge always "
                                                  "over every label token of the step (docs/train.md, The loss)",
    "trainer_args.label_smoothing_factor": "transformers Trainer's loss option; LMMS Engine's fsdp2_trainer "
                                           "uses the model's plain cross-entropy, as vlforge does",
    "trainer_args.bf16_full_eval": _EVAL,
    "trainer_args.fp16_full_eval": _EVAL,
    "trainer_args.tf32": "transformers sets torch's TF32 flag from it; vlforge leaves torch's TF32 setting as it is",
    "trainer_args.gradient_checkpointing_kwargs": "LMMS Engine's fsdp2_trainer checkpoints non-reentrantly "
                                                  "whatever it says, as vlforge does",
    "trainer_args.torch_compile": _HF,
    "trainer_args.torch_compile_backend": _HF,
    "trainer_args.torch_compile_mode": _HF,
    "trainer_args.liger_kernel_config": "liger-kernel's options; vlforge applies liger's defaults "
                                        "(use_liger_kernel)",
    "trainer_args.use_cache": "the model's KV cache during training; both engines train without it",
    "trainer_args.neftune_noise_alpha": _HF,
    "trainer_args.torch_empty_cache_steps": "LMMS Engine empties the CUDA cache every N steps (memory only); "
                                            "vlforge does not",
    "trainer_args.auto_find_batch_size": _HF,
    "trainer_args.logging_strategy": "transformers Trainer's logging cadence; vlforge logs every "
                                     "logging_steps (and the first step with logging_first_step)",
    "trainer_args.log_on_each_node": _LOG,
    "trainer_args.logging_nan_inf_filter": _HF,
    "trainer_args.include_num_input_tokens_seen": "vlforge's metrics always carry label_tokens and tokens_per_s",
    "trainer_args.log_level": _LOG,
    "trainer_args.log_level_replica": _LOG,
    "trainer_args.disable_tqdm": "vlforge shows its progress bar on a terminal only",
    "trainer_args.project": "the wandb project of LMMS Engine's tracker; vlforge's wandb run takes it from "
                            "WANDB_PROJECT",
    "trainer_args.trackio_space_id": _TRACKIO,
    "trainer_args.trackio_bucket_id": _TRACKIO,
    "trainer_args.trackio_static_space_id": _TRACKIO,
    "trainer_args.eval_delay": _EVAL,
    "trainer_args.per_device_eval_batch_size": _EVAL,
    "trainer_args.prediction_loss_only": _EVAL,
    "trainer_args.eval_on_start": _EVAL,
    "trainer_args.eval_do_concat_batches": _EVAL,
    "trainer_args.eval_use_gather_object": _EVAL,
    "trainer_args.eval_accumulation_steps": _EVAL,
    "trainer_args.include_for_metrics": _EVAL,
    "trainer_args.batch_eval_metrics": _EVAL,
    "trainer_args.save_only_model": "transformers Trainer's checkpoint content; vlforge checkpoints always hold "
                                    "model, optimizer, scheduler, RNG and data state (needed to resume)",
    "trainer_args.save_on_each_node": "vlforge's ranks write one checkpoint into a shared output_dir",
    "trainer_args.enable_jit_checkpoint": _HF,
    "trainer_args.push_to_hub": _HUB,
    "trainer_args.hub_token": _HUB,
    "trainer_args.hub_private_repo": _HUB,
    "trainer_args.hub_model_id": _HUB,
    "trainer_args.hub_strategy": _HUB,
    "trainer_args.hub_always_push": _HUB,
    "trainer_args.hub_revision": _HUB,
    "trainer_args.load_best_model_at_end": _EVAL,
    "trainer_args.metric_for_best_model": _EVAL,
    "trainer_args.greater_is_better": _EVAL,
    "trainer_args.ignore_data_skip": "LMMS Engine's fsdp2_trainer always resumes the data where the checkpoint left "
                                     "it, and so does vlforge from an LMMS config; vlforge's own "
                                     "checkpointing.ignore_data_skip reads it from its start instead",
    "trainer_args.restore_callback_states_from_checkpoint": _HF,
    "trainer_args.full_determinism": _HF,
    "trainer_args.parallelism_config": _ACCEL,
    "trainer_args.dataloader_drop_last": "vlforge trains whole optimiser steps only: a last step the data cannot "
                                         "fill is not trained, whatever drop_last says",
    "trainer_args.dataloader_persistent_workers": "vlforge's DataLoader workers live for the whole run",
    "trainer_args.dataloader_prefetch_factor": "vlforge's DataLoader keeps torch's default prefetch",
    "trainer_args.remove_unused_columns": _HF,
    "trainer_args.label_names": _HF,
    "trainer_args.train_sampling_strategy": "transformers Trainer's sampler; LMMS Engine's fsdp2_trainer uses its "
                                            "own, vlforge its data stream (shuffle, data_seed)",
    "trainer_args.length_column_name": _HF,
    "trainer_args.ddp_find_unused_parameters": _DDP,
    "trainer_args.ddp_bucket_cap_mb": _DDP,
    "trainer_args.ddp_broadcast_buffers": _DDP,
    "trainer_args.ddp_static_graph": _DDP,
    "trainer_args.ddp_backend": "both engines choose the backend themselves: nccl on CUDA, gloo with use_cpu",
    "trainer_args.fsdp": _FSDP1,
    "trainer_args.deepspeed": "a DeepSpeed config for LMMS Engine's hf_trainer; its fsdp2_trainer (the one "
                              "trainer_type vlforge runs) does not use DeepSpeed",
    "trainer_args.debug": _HF,
    "trainer_args.skip_memory_metrics": _HF,
    "trainer_args.do_train": "a flag for transformers' example scripts; read by neither engine",
    "trainer_args.do_eval": "a flag for transformers' example scripts; read by neither engine",
    "trainer_args.do_predict": "a flag for transformers' example scripts; read by neither engine",
    "trainer_args.logging_dir": "transformers Trainer's TensorBoard directory; vlforge writes "
                                "OUTPUT_DIR/tensorboard (logging.report_to: tensorboard)",
    "trainer_args.local_rank": "set by the launcher; vlforge reads LOCAL_RANK from torchrun",
    "trainer_args.use_muon": "the Muon optimizer of LMMS Engine's hf_trainer; its fsdp2_trainer trains with "
                             "AdamW, as vlforge does",
    "trainer_args.print_batch_input_steps": "LMMS Engine logs a decoded batch every N steps; vlforge does not",
    "trainer_args.enable_profiler": _PROFILER,
    "trainer_args.profiler_config": _PROFILER,
    "trainer_args.enable_memory_snapshot": _PROFILER,
    "trainer_args.memory_snapshot_config": _PROFILER,
    "trainer_args.enable_cuda_event_profiler": _PROFILER,
    "trainer_args.cuda_event_profiler_config": _PROFILER,
    "trainer_args.ep_degree": "expert parallelism of LMMS Engine's MoE path (the same maths, other memory "
                              "layout); vlforge shards experts with FSDP2",
    "trainer_args.ema_enabled": _EMA,
    "trainer_args.ema_decay": _EMA,
    "trainer_args.ema_update_every": _EMA,
    "trainer_args.ema_start_step": _EMA,
    "trainer_args.ema_requires_grad_only": _EMA,
    "trainer_args.ema_param_filter": _EMA,
    "trainer_args.eval_config": "LMMS Engine's external eval server (submits each checkpoint); vlforge has none",
    "trainer_args.carbon_intensity": "LMMS Engine's CO2 estimate in its compute summary; vlforge reports none",
    "trainer_args.fsdp_config.min_num_params": _FSDP1,
    "trainer_args.fsdp_config.xla": _FSDP1,
    "trainer_args.fsdp_config.xla_fsdp_v2": _FSDP1,
    "trainer_args.fsdp_config.xla_fsdp_grad_ckpt": _FSDP1,
    "trainer_args.fsdp_config.backward_prefetch": _FSDP1,
    "trainer_args.fsdp_config.cpu_ram_efficient_loading": _FSDP1,
    "trainer_args.fsdp_config.forward_prefetch": _FSDP1,
    "trainer_args.fsdp_config.sync_module_states": _FSDP1,
    "trainer_args.fsdp_config.use_orig_params": _FSDP1,
    "trainer_args.fsdp_config.version": _FSDP1,
    "trainer_args.fsdp_config.xla_fsdp_settings": _FSDP1,
    **{f"trainer_args.accelerator_config.{name}": _ACCEL for name in (
        "split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler", "non_blocking",
        "gradient_accumulation_kwargs", "use_configured_state")},
}

# ---- why a key is refused (a value other than the default is an error) ---------------------------------------

REFUSED: dict[str, str] = {
    "config_yaml": "names a second config file that LMMS Engine merges over this one; vlforge reads one file: "
                   "give that file to vlforge instead",
    "dataset_config.object_storage": "LMMS Engine reads the data from an Azure/GCS bucket; vlforge reads local "
                                     "files only (copy the data, or mount the bucket and use its path)",
    "dataset_config.bucket_name": "LMMS Engine reads the data from this bucket; vlforge reads local files only",
    "model_config.extra_kwargs": "keyword arguments of LMMS Engine's from_pretrained (they can change the loaded "
                                 "model); vlforge has no counterpart",
    "model_config.load_from_config": "builds a model with random weights from a config; vlforge trains a "
                                     "checkpoint (load_from_pretrained_path: a directory, tiny preset or hub id)",
    "model_config.model_general_type": "picks another Auto class (a text-only model of a VL checkpoint); vlforge "
                                       "trains the image-text-to-text model of the checkpoint",
    "trainer_args.tp_degree": "tensor parallelism, which also divides the data-parallel size (and so the global "
                              "batch); vlforge has none",
    "trainer_args.ema_resume_from_ema": "LMMS Engine resumes from its EMA weights; vlforge keeps no EMA weights",
}

#: Keys LMMS Engine's own examples write that its config models do not declare: pydantic drops them silently there.
#: vlforge accepts them with a warning (any other undeclared key stays an error: it is usually a typo).
UNDECLARED: dict[str, str] = {
    "model_config.torch_dtype": "LMMS Engine 0.1.4's ModelConfig has no such field and drops it; the weights' "
                                "dtype follows trainer_args.bf16 there and here",
    "model_config.model_type": "LMMS Engine 0.1.4's ModelConfig has no such field and drops it; the checkpoint's "
                               "config.json names the model there and here",
}

#: Values of a refused key that are accepted besides LMMS Engine's default (they ask for what vlforge does).
REFUSED_OK: dict[str, tuple[Any, ...]] = {
    "model_config.model_general_type": ("image_text_to_text",),
    "dataset_config.object_storage": ("none",),
}
