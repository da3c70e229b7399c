"""A starter training config for a model and a dataset, sized by the memory plan for the stated GPUs.

The data is surveyed first (:mod:`vlforge.plan.survey`): its pixel and frame limits follow the largest sampled
image and video (the model's own limits cap them), and its packed rows hold the longest sampled record and eight
of the median one. The settings are then chosen by the plan's estimate, not by a table: starting from full
fine-tuning of every module without activation checkpointing, the plan's own cheaper-first changes
(:func:`vlforge.plan.report.candidates`: activation checkpointing, sequence parallelism, shorter rows - never
shorter than the longest sampled record -, a frozen vision tower, LoRA) are applied one at a time until the
estimate fits. Fitting means both what ``vlforge plan CONFIG --gpus N --gpu-memory G`` estimates (one image at
the pixel limit per row, half the tokens labels) and the estimate with this data's own median length, label and
visual shares. When nothing fits, the closest setting is kept and the report says so.

Example (CPU, seconds):
    >>> starter = make_starter("tiny:qwen3_vl", "examples/data/train.jsonl", gpus=1, gpu_memory=80 * 10**9)  # doctest: +SKIP
    >>> starter.fits, "packing_length" in starter.text  # doctest: +SKIP
    (True, True)
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import yaml

from vlforge.config.schema import TrainConfig
from vlforge.data.config import DATASET_LIST_SUFFIXES
from vlforge.memory.verdict import human
from vlforge.plan.survey import DataSurvey, pipeline_processor, survey_data

logger = logging.getLogger(__name__)

ROW_MULTIPLE = 1024
"""Packed row lengths are multiples of this many tokens."""
MEDIAN_PER_ROW = 8
"""A packed row holds at least this many records of the median length (and always the longest sampled one)."""
FULL_LR, LORA_LR = 1.0e-5, 1.0e-4
"""Starting learning rates: full fine-tuning, LoRA adapters."""


@dataclass
class Step:
    """One change the search applied, with the peaks per rank before it."""

    change: str
    why: str
    peak_before: int


@dataclass
class Starter:
    """The chosen config, its YAML text, the survey behind it and the plan's verdict."""

    config: TrainConfig
    text: str
    survey: DataSurvey
    fits: bool
    peak: int
    """Peak per rank as ``vlforge plan CONFIG --gpus --gpu-memory`` estimates it."""
    data_peak: int
    """Peak per rank with this data's median length, label and visual shares."""
    budget: int
    device_bytes: int
    device_note: str
    steps: list[Step] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)
    """When nothing fits: what ``vlforge plan`` suggests for the closest setting (more GPUs, ...)."""
    steps_per_epoch: int = 0
    plan_command: str = ""
    data_plan_command: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"fits": self.fits, "peak_bytes_per_rank": self.peak, "data_peak_bytes_per_rank": self.data_peak,
                "budget_bytes": self.budget, "device_bytes": self.device_bytes, "device": self.device_note,
                "changes": [{"change": s.change, "why": s.why, "peak_bytes_before": s.peak_before} for s in self.steps],
                "suggestions": self.suggestions, "steps_per_epoch": self.steps_per_epoch,
                "plan_command": self.plan_command, "data_plan_command": self.data_plan_command,
                "survey": self.survey.to_dict(), "config": self.config.model_dump(mode="json")}


def _round_up(value: int, multiple: int) -> int:
    return max(multiple, math.ceil(value / multiple) * multiple)


def _data_section(data: str, data_folder: str | None) -> dict[str, Any]:
    if PurePath(data).suffix.lower() in DATASET_LIST_SUFFIXES:
        return {"dataset_path": data, "dataset_format": "yaml"}
    if data_folder is not None:  # an entry: the data file and the folder its media paths are relative to
        return {"datasets": [{"path": data, "data_folder": data_folder}]}
    return {"dataset_path": data}


def base_config(model: str, data: str, output_dir: str, data_folder: str | None = None) -> dict[str, Any]:
    """The starting point of the search, before the data is seen: full fine-tuning in bf16, packed rows."""
    return {
        "data": _data_section(data, data_folder),
        "packing": {"packing": True, "packing_length": 4096, "filter_overlong": True},
        "model": {"load_from_pretrained_path": model, "gradient_checkpointing": False, "freeze_modules": []},
        "training": {"bf16": True, "learning_rate": FULL_LR, "lr_scheduler_type": "cosine", "warmup_ratio": 0.03,
                     "num_train_epochs": 1, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
                     "seed": 0},
        "checkpointing": {"output_dir": output_dir, "save_total_limit": 2, "resume": "auto"},
    }


def sized_to_data(values: dict[str, Any], survey: DataSurvey, model_config: Any) -> dict[str, Any]:
    """Pixel, frame and row limits from the survey (a copy of ``values``)."""
    out = {key: dict(section) if isinstance(section, dict) else section for key, section in values.items()}
    if survey.with_images:
        out["processor"] = {"max_pixels": survey.largest_image[0] * survey.largest_image[1]}
    if survey.with_videos:
        out["video"] = {"video_max_pixels": survey.largest_frame[0] * survey.largest_frame[1],
                        "video_max_frames": max(2, survey.most_frames)}
    if not survey.with_images and not survey.with_videos and hasattr(model_config, "vision_config"):
        out["model"]["freeze_modules"] = ["visual"]  # text only: the tower never runs
    out["packing"]["packing_length"] = _round_up(max(survey.longest, MEDIAN_PER_ROW * survey.median), ROW_MULTIPLE)
    return out


def _estimates(cfg: TrainConfig, model_config: Any, world: int, survey: DataSurvey) -> tuple[int, int]:
    """(what ``vlforge plan`` estimates, the estimate with this data's lengths and shares)."""
    import torch

    from vlforge.memory.estimate import estimate_memory

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plain = estimate_memory(cfg, model_config, world=world, device=device).peak_bytes
    visual = survey.visual_share if (survey.with_images or survey.with_videos) else None
    data = estimate_memory(cfg, model_config, world=world, device=device, sample_length=max(1, survey.median),
                           label_share=survey.label_share, visual_share=visual).peak_bytes
    return plain, data


def search(cfg: TrainConfig, model_config: Any, *, world: int, budget: int, survey: DataSurvey
           ) -> tuple[TrainConfig, list[Step], tuple[int, int]]:
    """Apply the plan's cheapest changes one at a time until both estimates fit ``budget`` (or nothing helps)."""
    from vlforge.plan.report import candidates

    peaks = _estimates(cfg, model_config, world, survey)
    steps: list[Step] = []
    while max(peaks) > budget:
        lowering = None
        for change, changed, why in candidates(cfg, model_config, world):
            if changed.packing.packing and (changed.packing.packing_length or 0) < survey.longest:
                continue  # rows shorter than a sampled record would drop it
            if changed.model.lora is not None and importlib.util.find_spec("peft") is None:
                continue  # vlforge train refuses LoRA without peft
            found = _estimates(changed, model_config, world, survey)
            if max(found) <= budget:
                lowering = (change, changed, why, found)
                break
            if lowering is None and max(found) < max(peaks):
                lowering = (change, changed, why, found)
        if lowering is None:
            break
        change, changed, why, found = lowering
        logger.info("init: %s (%s): %s -> %s per rank", change, why, human(max(peaks)), human(max(found)))
        steps.append(Step(change, why, max(peaks)))
        cfg, peaks = changed, found
        if changed.model.lora is not None:
            cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"learning_rate": LORA_LR})})
    return cfg, steps, peaks


def steps_per_epoch(cfg: TrainConfig, survey: DataSurvey, world: int) -> int:
    """Optimiser steps of one epoch: the packer run on lengths drawn from the sample (as ``vlforge train``
    counts them), over the ranks and the accumulation."""
    from vlforge.config.data import data_config
    from vlforge.data.estimate import simulate_rows

    data_cfg = data_config(cfg)
    admitted = round(survey.records * survey.usable / max(1, survey.sampled))
    rows = simulate_rows(survey.lengths, admitted, data_cfg, data_cfg.data_seed)
    per_step = world * cfg.training.per_device_train_batch_size * cfg.training.gradient_accumulation_steps
    return max(1, math.ceil(rows / per_step))


def make_starter(model: str, data: str, *, gpus: int = 1, nodes: int = 1, gpu_memory: int | None = None,
                 gpu_memory_text: str | None = None, output_dir: str | None = None, sample: int = 64,
                 config_name: str = "CONFIG", data_folder: str | None = None) -> Starter:
    """Survey ``data`` (its media paths relative to ``data_folder``, default its own directory), size the config for
    ``model`` on ``gpus`` x ``nodes`` GPUs and render it."""
    from vlforge.models.load import load_model_config
    from vlforge.plan.report import device_budget, make_plan

    world = gpus * nodes
    output_dir = output_dir or output_dir_for(None, data)
    values = base_config(model, data, output_dir, data_folder)
    model_config = load_model_config(model)
    first = TrainConfig.model_validate(values)
    survey = survey_data(first, sample=sample, processor=pipeline_processor(first))
    sized = TrainConfig.model_validate(sized_to_data(values, survey, model_config))
    chosen, steps, (_plain, data_peak) = search(sized, model_config, world=world,
                                                survey=survey, budget=device_budget(gpu_memory)[2])
    final = make_plan(chosen, gpus=gpus, nodes=nodes, gpu_memory=gpu_memory, model_config=model_config)
    per_epoch = steps_per_epoch(chosen, survey, world)
    chosen = chosen.model_copy(update={
        "logging": chosen.logging.model_copy(update={"logging_steps": max(1, min(10, per_epoch // 10))}),
        "checkpointing": chosen.checkpointing.model_copy(update={"save_steps": max(1, math.ceil(per_epoch / 4))})})
    fits = final.fits and data_peak <= final.budget_bytes
    hardware = f"--gpus {gpus}" + (f" --nodes {nodes}" if nodes > 1 else "") + \
        (f" --gpu-memory {gpu_memory_text}" if gpu_memory_text else "")
    visual = f" --visual-share {survey.visual_share:.2f}" if survey.with_images or survey.with_videos else ""
    starter = Starter(
        config=chosen, text="", survey=survey, fits=fits, peak=final.estimate.peak_bytes, data_peak=data_peak,
        budget=final.budget_bytes, device_bytes=final.device_bytes, device_note=final.device_note, steps=steps,
        suggestions=[s.change for s in final.suggestions if s.fits] if not fits else [],
        steps_per_epoch=per_epoch, plan_command=f"vlforge plan {config_name} {hardware}",
        data_plan_command=f"vlforge plan {config_name} {hardware} --seq-len {max(1, survey.median)} "
                          f"--label-share {survey.label_share:.2f}{visual}")
    starter.text = render(starter, model=model, data=data, hardware=hardware, config_name=config_name)
    return starter


# --------------------------------------------------------------------------- the YAML, commented


def _scalar(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()


def _line(key: str, value: Any, comment: str = "", width: int = 34) -> str:
    text = f"  {key}: {_scalar(value)}"
    return f"{text.ljust(width - 1)} # {comment}" if comment else text


def unusable_line(survey: DataSurvey) -> str:
    """What the sampled records that cannot be used mean for the run (``data.on_error: raise`` stops at the first)."""
    return (f"{survey.sampled - survey.usable} of the {survey.sampled} sampled records cannot be used (first: "
            f"{survey.first_problem}); with data.on_error: raise the run stops at the first such record: fix them, "
            "or set data.on_error: skip (data.max_skip_fraction bounds the share)")


def _fps_comment(survey: DataSurvey) -> str:
    """Why ``video.fps`` is there: it samples video files; a video given as frames keeps its own rate."""
    if not survey.frame_lists:
        return "frames sampled per second"
    if survey.frame_lists == survey.videos:
        return "unused by the sampled videos: lists of frames, each read whole at its own sample_fps"
    return "frames sampled per second of a video file; a list of frames keeps its own sample_fps"


def _hw(hw: tuple[int, int]) -> str:
    return f"{hw[1]}x{hw[0]}"


def render(starter: Starter, *, model: str, data: str, hardware: str, config_name: str) -> str:
    """The config as commented YAML: why each chosen value is what it is, and the commands that come next."""
    cfg, survey = starter.config, starter.survey
    changes = {s.change for s in starter.steps}
    peak_line = (f"`vlforge plan` estimates {human(starter.peak)} peak per rank "
                 f"({human(starter.data_peak)} with this data's lengths and shares); "
                 f"{'fits' if starter.fits else 'does NOT fit'} in {human(starter.budget)} usable of "
                 f"{human(starter.device_bytes)} ({starter.device_note})")
    media = []
    if survey.with_images:
        media.append(f"images in {survey.with_images} (up to {survey.most_images} per record, the largest "
                     f"{_hw(survey.largest_image)} after resizing)")
    if survey.with_videos:
        lists = f"; {survey.frame_lists} of the {survey.videos} are lists of frames" if survey.frame_lists else ""
        media.append(f"videos in {survey.with_videos} (up to {survey.most_frames} frames of "
                     f"{_hw(survey.largest_frame)}{lists})")
    skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(survey.skipped.items()))
    head = [
        f"# Starter config written by: vlforge init --model {shlex.quote(model)} --data {shlex.quote(data)}"
        + (f" --data-folder {shlex.quote(cfg.data.datasets[0].data_folder)}" if cfg.data.datasets else "")
        + f" {hardware}",
        f"# Check it:  vlforge validate {config_name}",
        f"#            {starter.plan_command}",
        f"#            {starter.data_plan_command}   # this data's lengths and shares",
        f"# Train it:  vlforge train {config_name}      "
        f"(N GPUs: torchrun --nproc_per_node N -m vlforge.train {config_name})",
        "# Every key is described in docs/train.md; relative paths are relative to the directory you run from.",
        "#",
        f"# The data: {survey.sampled} of {survey.records:,} records sampled, {survey.usable} usable"
        + (f" (skipped: {skipped})" if skipped else "") + f"; {min(survey.lengths)} to {survey.longest} tokens, "
        f"median {survey.median}; {survey.label_share:.0%} of the tokens are labels, {survey.visual_share:.0%} "
        "visual.",
        "# Media: " + ("; ".join(media) if media else "no images or videos in the sample (text only)") + ".",
        f"# Memory: {peak_line}.",
    ]
    if survey.skipped:
        head.append(f"# WARNING: {unusable_line(survey)}.")
    if starter.steps:
        head.append("# Chosen by the plan, in this order: " + "; ".join(s.change for s in starter.steps) + ".")
    if not starter.fits:
        head.append("# NOTHING vlforge can change fits; this is the closest setting"
                    + (f". `vlforge plan` suggests: {'; '.join(starter.suggestions)}" if starter.suggestions else "")
                    + ".")
    body = ["", "data:"]
    data_section = cfg.data
    if data_section.dataset_format:
        body.append(_line("dataset_path", data_section.dataset_path, "a dataset YAML: its files hold the records"))
        body.append(_line("dataset_format", data_section.dataset_format))
    elif data_section.datasets:
        entry = data_section.datasets[0]
        body += ["  datasets:", _line("  - path", entry.path, "chat records (docs/data.md)"),
                 _line("    data_folder", entry.data_folder, "relative media paths in the records start here")]
    else:
        body.append(_line("dataset_path", data_section.dataset_path, "chat records (docs/data.md)"))
    body.append(_line("on_error", data_section.on_error, "a bad record stops the run naming its line; "
                                                         "`skip` counts and skips it"))
    if survey.with_images:
        body += ["", "processor:",
                 _line("max_pixels", cfg.processor.max_pixels,
                       f"the largest sampled image ({_hw(survey.largest_image)}); larger ones are scaled down")]
    if survey.with_videos:
        body += ["", "video:",
                 _line("video_max_pixels", cfg.video.video_max_pixels,
                       f"the largest sampled frame ({_hw(survey.largest_frame)})"),
                 _line("video_max_frames", cfg.video.video_max_frames, "frames of the longest sampled video"
                       + ("; a longer list of frames is thinned evenly to it" if survey.frame_lists else "")),
                 _line("fps", cfg.video.fps, _fps_comment(survey))]
    packing = cfg.packing
    row_why = (f"holds the longest sampled record ({survey.longest}) and {MEDIAN_PER_ROW} of the median"
               if not any(c.startswith("packing.") for c in changes) else "shortened by the plan to fit")
    body += ["", "packing:",
             _line("packing", True, "several records per row; attention never crosses them"),
             _line("packing_length", packing.packing_length, row_why),
             _line("filter_overlong", True, "longer records are skipped and counted, never cut")]
    model_section = cfg.model
    checkpointing_why = ("chosen by the plan: recompute activations in the backward"
                         if any(c.startswith(("model.activation_checkpointing", "model.gradient_checkpointing"))
                                for c in changes) else "not needed to fit")
    freeze_why = ("chosen by the plan" if any(c.startswith("model.freeze_modules") for c in changes)
                  else "text only: the vision tower never runs" if model_section.freeze_modules else "train every module")
    body += ["", "model:",
             _line("load_from_pretrained_path", model_section.load_from_pretrained_path),
             _line("activation_checkpointing", model_section.checkpointing(), checkpointing_why),
             _line("freeze_modules", model_section.freeze_modules, freeze_why)]
    if model_section.lora is not None:
        body.append("  lora:                           # chosen by the plan: adapters instead of full weights")
        for key in ("r", "alpha", "target_modules"):
            body.append("  " + _line(key, getattr(model_section.lora, key)))
    training = cfg.training
    body += ["", "training:",
             _line("bf16", training.bf16, "bf16 compute, fp32 master weights"),
             _line("learning_rate", training.learning_rate,
                   "a common start for LoRA" if model_section.lora else "a common start for full fine-tuning"),
             _line("lr_scheduler_type", training.lr_scheduler_type),
             _line("warmup_ratio", training.warmup_ratio),
             _line("num_train_epochs", training.num_train_epochs, f"about {starter.steps_per_epoch} step(s) per epoch; more for a small dataset"),
             _line("per_device_train_batch_size", training.per_device_train_batch_size, "packed rows per micro-step"),
             _line("gradient_accumulation_steps", training.gradient_accumulation_steps,
                   "raise for larger steps (memory unchanged)"),
             _line("seed", training.seed)]
    if training.optimizer_state_dtype != "float32":
        body.append(_line("optimizer_state_dtype", training.optimizer_state_dtype,
                          "chosen by the plan: AdamW's moments in bf16"))
    if cfg.sp_ulysses_degree > 1:
        body += ["", _line("sp_ulysses_degree", cfg.sp_ulysses_degree, "chosen by the plan").lstrip()]
    body += ["", "logging:", _line("logging_steps", cfg.logging.logging_steps),
             "", "checkpointing:",
             _line("output_dir", cfg.checkpointing.output_dir, "checkpoints, metrics.jsonl and final/ (the export)"),
             _line("save_steps", cfg.checkpointing.save_steps),
             _line("save_total_limit", cfg.checkpointing.save_total_limit),
             _line("resume", cfg.checkpointing.resume, "continue from the latest checkpoint in output_dir")]
    return "\n".join(head + body) + "\n"


def output_dir_for(out: Path | None, data: str) -> str:
    """``output/<name>``: the config's name, else the data file's or directory's (a pattern's glob characters
    left out: ``data/train-*.parquet`` -> ``output/train``)."""
    name = out.stem if out else re.sub(r"[*?[\]]", "", PurePath(data).stem).strip("-_.")
    return f"output/{name or 'run'}"
