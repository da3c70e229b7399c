"""`vlforge plan`: will this training config fit, and the cheapest changes that make it fit.

Each suggestion is one change of the config, estimated again with :func:`~vlforge.memory.estimate.estimate_memory`;
they are listed fitting ones first, each group in order of cost to the run (what it costs in speed or in
what is trained): accumulation instead of a larger batch, selective activation checkpointing, bfloat16 optimizer
states, full activation checkpointing, sequence parallelism, shorter rows, a frozen vision tower, LoRA, more GPUs.
When no single change fits, the changes are also applied together in that order until the estimate fits.

The report also estimates the three activation checkpointing modes with the rest of the config as it is and names
the fastest that fits (``none``, then ``selective``, then ``full``): a run that fits without checkpointing is told
so, as a run that needs it.

Example:
    >>> report = make_plan(load_config("examples/qwen3_vl_tiny.yaml"), gpus=8, gpu_memory=80 * 10**9)  # doctest: +SKIP
    >>> report.fits, [s.change for s in report.suggestions][:1]  # doctest: +SKIP
    (True, ['model.activation_checkpointing: selective'])
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from vlforge.config.parallel import check_sequence_parallel, sequence_parallel_heads
from vlforge.memory.estimate import MemoryEstimate, estimate_memory
from vlforge.memory.verdict import human
from vlforge.models.blocks import CHECKPOINTING
from vlforge.models.families import supports
from vlforge.models.load import load_model_config

logger = logging.getLogger(__name__)

DEFAULT_GPU_MEMORY = 80 * 10**9
"""An H100 / A100 80 GB, when neither ``--gpu-memory`` nor a CUDA device says otherwise."""
MARGIN = 0.9
"""Share of the device memory a plan may use (the rest: CUDA context, allocator fragmentation)."""


@dataclass
class Suggestion:
    change: str
    """The config change(s), as ``key: value``."""
    peak_bytes: int
    fits: bool
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.change, "peak_bytes_per_rank": self.peak_bytes, "fits": self.fits, "why": self.why}


@dataclass
class PlanReport:
    estimate: MemoryEstimate
    budget_bytes: int
    device_bytes: int
    device_note: str
    suggestions: list[Suggestion] = field(default_factory=list)
    checkpointing: dict[str, int] = field(default_factory=dict)
    """Peak per rank of each activation checkpointing mode, the rest of the config as it is."""
    current_checkpointing: str = "none"

    @property
    def recommended_checkpointing(self) -> str | None:
        """The fastest mode that fits (None when none does)."""
        return next((mode for mode, peak in self.checkpointing.items() if peak <= self.budget_bytes), None)

    def checkpointing_line(self) -> str:
        current = self.current_checkpointing
        peaks = ", ".join(f"{mode} {human(peak)}" for mode, peak in self.checkpointing.items())
        best = self.recommended_checkpointing
        if best is None:
            advice = "none of them fits with the rest of the config as it is"
        elif best == current:
            advice = f"the fastest that fits is {best}, as configured"
        else:
            advice = f"the fastest that fits is {best}: set model.activation_checkpointing: {best} (now {current})"
        return f"activation checkpointing: {peaks}; {advice}"

    @property
    def fits(self) -> bool:
        return self.estimate.peak_bytes <= self.budget_bytes

    def verdict(self) -> str:
        """One line: the peak per rank against the usable device memory, and the largest parts."""
        est = self.estimate
        top = sorted(((v, k) for k, v in est.parts.items() if v), reverse=True)[:3]
        parts = ", ".join(f"{k.replace('_', ' ')} {human(v)}" for v, k in top)
        word = "fits" if self.fits else "does NOT fit"
        return (f"plan: {human(est.peak_bytes)} peak per rank on {est.world} rank(s) ({parts}); {word} in "
                f"{human(self.budget_bytes)} usable of {human(self.device_bytes)} ({self.device_note})")

    def to_dict(self) -> dict[str, Any]:
        return {**self.estimate.to_dict(), "fits": self.fits, "budget_bytes": self.budget_bytes,
                "device_bytes": self.device_bytes, "device": self.device_note,
                "checkpointing_peaks": dict(self.checkpointing),
                "recommended_checkpointing": self.recommended_checkpointing,
                "suggestions": [s.to_dict() for s in self.suggestions]}


def _update(cfg: Any, section: str | None, **values: Any) -> Any:
    if section is None:
        return cfg.model_copy(update=values)
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=values)})


def candidates(cfg: Any, model_config: Any, world: int) -> list[tuple[str, Any, str]]:
    """``(change, changed config, why)`` for every cheap change that applies to ``cfg``, cheapest first."""
    out = []
    batch, accum = cfg.training.per_device_train_batch_size, cfg.training.gradient_accumulation_steps
    if batch > 1:
        changed = _update(_update(cfg, "training", per_device_train_batch_size=1), "training",
                          gradient_accumulation_steps=accum * batch)
        out.append((f"training.per_device_train_batch_size: 1, gradient_accumulation_steps: {accum * batch}", changed,
                    "the same samples per step, one at a time"))
    mode = cfg.model.checkpointing()
    if mode == "none":
        out.append(("model.activation_checkpointing: selective", with_checkpointing(cfg, "selective"),
                    "keeps only the matmul and attention outputs of each layer (little extra compute)"))
    if cfg.training.optimizer_state_dtype == "float32" and cfg.fsdp.mixed_precision != "pure_bf16":
        out.append(("training.optimizer_state_dtype: bfloat16",
                    _update(cfg, "training", optimizer_state_dtype="bfloat16"),
                    "AdamW's moments stored in bfloat16 (half the optimizer state; each update still in float32)"))
    if mode != "full":
        out.append(("model.activation_checkpointing: full", with_checkpointing(cfg, "full"),
                    "keeps one layer's activations instead of all (about a third more compute)"))
    family = getattr(model_config, "model_type", "")
    heads = [n for n in sequence_parallel_heads(model_config).values() if n is not None]
    for degree in (2, 4, 8):
        if degree > cfg.sp_ulysses_degree and supports(family, "sequence_parallel") and world % degree == 0 \
                and all(n % degree == 0 for n in heads):
            out.append((f"sp_ulysses_degree: {degree}", _update(cfg, None, sp_ulysses_degree=degree),
                        f"each rank holds 1/{degree} of the sequence in the text layers"))
            break
    if cfg.packing.packing and cfg.packing.packing_length and cfg.packing.packing_length >= 2048:
        half = cfg.packing.packing_length // 2
        out.append((f"packing.packing_length: {half}", _update(cfg, "packing", packing_length=half,
                                                                max_length=min(cfg.packing.max_length or half, half)),
                    "shorter packed rows (longer samples are filtered or refused)"))
    if hasattr(model_config, "vision_config") and "visual" not in cfg.model.freeze_modules:
        out.append(("model.freeze_modules: [visual]", _update(cfg, "model",
                                                               freeze_modules=[*cfg.model.freeze_modules, "visual"]),
                    "the vision tower keeps no gradients, optimizer state or activations"))
    if cfg.model.lora is None:
        from vlforge.config.schema import LoraConfig
        from vlforge.models.families import FAMILIES, Family

        record = FAMILIES.get(getattr(model_config, "model_type", ""))
        targets = list(record.lora_targets if record else Family.lora_targets)
        lora = LoraConfig(r=16, alpha=32, target_modules=targets)
        out.append((f"model.lora: {{r: 16, alpha: 32, target_modules: [{', '.join(targets)}]}}",
                    _update(cfg, "model", lora=lora), "trains adapters only: no full gradients or optimizer state"))
    return out


def device_budget(gpu_memory: int | None) -> tuple[int, str, int]:
    """``(device bytes, where that figure comes from, the bytes a plan may use)``: ``gpu_memory``, else this
    machine's CUDA device, else :data:`DEFAULT_GPU_MEMORY`."""
    import torch

    if gpu_memory is not None:
        device_bytes, note = gpu_memory, "--gpu-memory"
    elif torch.cuda.is_available():
        device_bytes, note = torch.cuda.get_device_properties(0).total_memory, torch.cuda.get_device_name(0)
    else:
        device_bytes, note = DEFAULT_GPU_MEMORY, "assumed 80 GB GPU; set --gpu-memory"
    return device_bytes, note, int(device_bytes * MARGIN)


def with_checkpointing(cfg: Any, mode: str) -> Any:
    """``cfg`` with activation checkpointing ``mode`` (both keys, as the schema resolves them)."""
    return _update(cfg, "model", activation_checkpointing=mode, gradient_checkpointing=mode == "full")


def make_plan(cfg: Any, *, gpus: int = 1, nodes: int = 1, gpu_memory: int | None = None,
              model_config: Any = None, sample_length: int | None = None, label_share: float = 0.5,
              visual_share: float | None = None) -> PlanReport:
    """The estimate, whether it fits and the suggestions for ``cfg`` on ``gpus`` x ``nodes`` ranks."""
    import torch

    world = gpus * nodes
    if model_config is None:
        model_config = load_model_config(cfg.model.load_from_pretrained_path)
    check_sequence_parallel(cfg.sp_ulysses_degree, family=getattr(model_config, "model_type", ""), world=world,
                            processes="GPU(s) of the plan (--gpus x --nodes)", **sequence_parallel_heads(model_config))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device_bytes, note, budget = device_budget(gpu_memory)
    kwargs = {"world": world, "device": device, "sample_length": sample_length, "label_share": label_share,
              "visual_share": visual_share}
    estimate = estimate_memory(cfg, model_config, **kwargs)
    report = PlanReport(estimate, budget, device_bytes, note)
    current = report.current_checkpointing = cfg.model.checkpointing()
    report.checkpointing = {mode: estimate.peak_bytes if mode == current else
                            estimate_memory(with_checkpointing(cfg, mode), model_config, **kwargs).peak_bytes
                            for mode in CHECKPOINTING}
    report.suggestions = suggest(cfg, model_config, budget, world, kwargs, estimate.peak_bytes)
    return report


def suggest(cfg: Any, model_config: Any, budget: int, world: int, kwargs: dict[str, Any],
            current: int) -> list[Suggestion]:
    """Each applicable change estimated on its own (lower peaks only), fitting ones first; then cumulative ones."""
    found = []
    options = candidates(cfg, model_config, world)
    for change, changed, why in options:
        peak = estimate_memory(changed, model_config, **kwargs).peak_bytes
        if peak < current:
            found.append(Suggestion(change, peak, peak <= budget, why))
    found.sort(key=lambda s: not s.fits)  # stable: cheapest first within each group
    if current > budget and not any(s.fits for s in found):
        combined, names, lowest = cfg, [], current
        for change, _changed, _why in options:
            step = [c for c in candidates(combined, model_config, world) if c[0] == change]
            if not step:
                continue
            peak = estimate_memory(step[0][1], model_config, **kwargs).peak_bytes
            if peak >= lowest:  # nothing on top of the changes so far (full after selective, ...): left out
                continue
            key = change.partition(":")[0]  # a later value of the same key replaces the earlier one
            combined, lowest = step[0][1], peak
            names = [*(name for name in names if name.partition(":")[0] != key), change]
            if peak <= budget:
                found.insert(0, Suggestion(" + ".join(names), peak, True, "these changes together"))
                break
        more = world
        while more < 1024 and not any(s.fits for s in found):
            more *= 2
            peak = estimate_memory(cfg, model_config, **{**kwargs, "world": more}).peak_bytes
            if peak <= budget:
                found.append(Suggestion(f"{more} GPUs (FSDP2 shards parameters, gradients and optimizer state)",
                                        peak, True, "more ranks share the model state"))
    return found


def render(report: PlanReport) -> list[str]:
    """Plain text lines: the verdict, the parts, the suggestions."""
    est = report.estimate
    lines = [report.verdict(), ""]
    load = est.workload
    lines.append(f"per rank: {load.tokens} tokens per micro-batch, {load.micro_batches} micro-batch(es) per step, "
                 f"{est.parameters:,} parameters ({est.trainable:,} trainable), FSDP2 shards over {est.shard}, "
                 f"SP degree {est.sp}")
    width = max(len(k) for k in est.parts)
    for key, value in est.parts.items():
        lines.append(f"  {key.replace('_', ' '):<{width}}  {human(value):>10}")
    lines.append(f"  {'peak':<{width}}  {human(est.peak_bytes):>10}")
    if report.checkpointing:
        lines.append(report.checkpointing_line())
    for note in est.notes + load.notes:
        lines.append(f"note: {note}")
    if report.suggestions and not report.fits:
        lines += ["", "changes that lower the peak (fitting first, cheapest first):"]
        for s in report.suggestions:
            mark = "fits" if s.fits else "still over"
            lines.append(f"  {s.change}: {human(s.peak_bytes)} ({mark}; {s.why})")
    return lines
