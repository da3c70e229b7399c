"""Peak memory per rank of a training config, from the config and the model's config (no weights loaded).

The parts, per rank (``shard`` = the ranks FSDP2 shards over; 1 in one process):

* **parameters**: every parameter in the master dtype (fp32, or bf16 with ``pure_bf16``) / ``shard``;
* **gathered / cast weights**: under FSDP2 the root unit's parameters (embeddings, vision tower, ``lm_head``)
  stay gathered in the compute dtype and two decoder layers are gathered at a time (every layer with
  ``fsdp.reshard_after_forward: false``); in one process with
  bf16 autocast over fp32 weights, the bf16 copy of every weight matrix is kept for the backward;
* **gradients** (master dtype) and **optimizer** (AdamW: two states, in the master dtype or in
  ``training.optimizer_state_dtype``) of the trainable parameters / ``shard``; with bfloat16 states the optimiser
  step also holds float32 copies of the moments of one chunk of parameters (:mod:`vlforge.train.optim`);
* **activations**: what autograd keeps for the backward, measured per text decoder layer, per vision
  block and for the loss by running those modules on the ``meta`` device at the real sizes
  (:mod:`vlforge.memory.probe`), attention measured on this machine's SDPA kernel; with ``full`` activation
  checkpointing only each layer's input plus one layer's activations, with ``selective`` each layer's input and
  the outputs of its matrix multiplies and attention kernels (:mod:`vlforge.models.blocks`) plus one layer's
  activations;
* **temporary**: the two logit-sized gradients of the cross-entropy's backward (fp32) and FSDP2's gradient
  reduce buffers.

Peak = parameters + gathered + optimizer + (gradients + activations when gradients accumulate over
micro-batches, else the larger of activations + the first gradients and all gradients, plus a tied embedding's
second, table-sized gradient at the end of the backward) + temporary; or, when larger, the optimiser step's
parameters + gradients + optimizer + its float32 temporaries.

Example:
    >>> from vlforge.config.load import load_config
    >>> est = estimate_memory(load_config("examples/qwen3_vl_tiny.yaml"), world=1)  # doctest: +SKIP
    >>> est.peak_bytes > est.parts["parameters"]  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from vlforge.memory.probe import (
    attention_cost,
    counting_attention,
    find_stack,
    layer_kinds,
    loss_bytes,
    meta_model,
    selective_bytes,
    text_layer_bytes,
    vision_block_bytes,
)

logger = logging.getLogger(__name__)

DEFAULT_LENGTH = 4096
"""Tokens per sample when the config bounds neither (no packing, no max_length)."""
OPTIMIZER_CHUNK_ELEMENTS = 1 << 26
"""Parameters the low-precision-state AdamW (:class:`vlforge.train.optim.AdamWLowPrecisionStates`) updates at once:
its float32 temporaries are about 3 x 4 bytes x this (or x the largest tensor, when larger)."""


@dataclass
class Workload:
    """What one forward of one rank processes (derived from the config; see :func:`workload`)."""

    tokens: int
    """Tokens of one micro-batch (packed row, or batch x longest sample)."""
    rows: int
    segments: int
    """Samples the attention of a row is split into (1 for a single sequence)."""
    labels: int
    vision_patches: int
    micro_batches: int
    masked: bool
    """A boolean attention mask is passed (packed rows, padded batches)."""
    notes: list[str] = field(default_factory=list)


@dataclass
class MemoryEstimate:
    """Bytes per rank by part, the peak, and the facts behind them."""

    parts: dict[str, int]
    peak_bytes: int
    workload: Workload
    parameters: int
    trainable: int
    world: int
    shard: int
    sp: int
    notes: list[str] = field(default_factory=list)
    gathered_extra: int = 0
    """Bytes the peak grows by when no FSDP2 unit reshards after the forward (every layer stays gathered)."""

    def to_dict(self) -> dict[str, Any]:
        return {"peak_bytes_per_rank": self.peak_bytes, "parts": dict(self.parts), "parameters": self.parameters,
                "trainable_parameters": self.trainable, "world": self.world, "fsdp_shard": self.shard,
                "sp_degree": self.sp, "tokens_per_micro_batch": self.workload.tokens,
                "vision_patches_per_micro_batch": self.workload.vision_patches,
                "micro_batches_per_step": self.workload.micro_batches, "notes": self.notes + self.workload.notes}


def _vision_settings(cfg: Any, model_config: Any) -> tuple[int, int, int, int]:
    """``(patch_size, merge_size, temporal_patch_size, max image patches)``."""
    vision = model_config.vision_config
    patch = getattr(vision, "patch_size", 14)
    merge = getattr(vision, "spatial_merge_size", 2)
    temporal = getattr(vision, "temporal_patch_size", 2)
    max_pixels = cfg.processor.max_pixels or 16384 * 28 * 28
    return patch, merge, temporal, max(1, max_pixels // (patch * patch))


def workload(cfg: Any, model_config: Any, *, sample_length: int | None = None, label_share: float = 0.5,
             visual_share: float | None = None) -> Workload:
    """Tokens, labels and vision patches of one micro-batch of one rank (before sequence parallelism)."""
    notes: list[str] = []
    packing = cfg.packing
    batch = cfg.training.per_device_train_batch_size
    if packing.packing:
        tokens, rows, segments = packing.packing_length, 1, max(1, packing.packing_length // (sample_length or 1024))
        micro = cfg.training.gradient_accumulation_steps * batch
        masked = False  # packed rows: per-sample attention (vlforge.models.varlen or flash-attn), no mask
    else:
        length = sample_length or packing.max_length or (packing.packing_length if packing.filter_overlong else None)
        if length is None:
            length = DEFAULT_LENGTH
            notes.append(f"samples assumed {DEFAULT_LENGTH} tokens long (set packing.max_length, or --seq-len)")
        tokens, rows, segments = batch * length, batch, 1
        micro = cfg.training.gradient_accumulation_steps
        masked = batch > 1
    labels = max(1, int(tokens * label_share))
    patches = 0
    if hasattr(model_config, "vision_config"):
        patch, merge, temporal, image = _vision_settings(cfg, model_config)
        video = 0
        if cfg.video.video_max_pixels:
            frames = cfg.video.video_max_frames or 768
            video = max(1, frames // temporal) * cfg.video.video_max_pixels // (patch * patch)
        if visual_share is not None:
            patches = int(tokens * visual_share) * merge * merge
        else:
            patches = min(max(image, video), tokens * merge * merge) * rows
            notes.append("vision: one image (or video) at the configured pixel limits per sample "
                         "(--visual-share sets the share of visual tokens instead)")
    return Workload(tokens, rows, segments, labels, patches, micro, masked, notes)


def _count(params: Any) -> int:
    return sum(p.numel() for p in params)


@contextlib.contextmanager
def _quiet() -> Any:
    """Module-name resolution logs and library deprecation warnings are noise when probing variants."""
    loggers = [logging.getLogger(name) for name in ("vlforge.train", "vlforge.models")]  # module-name resolution
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for each, level in zip(loggers, levels, strict=True):
            each.setLevel(level)


_BUILT: list[tuple[Any, tuple[Any, ...], torch.nn.Module]] = []
"""The last meta models built (model config, what else shaped them, the model): estimating one config twice (with
other workload assumptions) builds it once. Estimates only read them."""


def _trainable_model(cfg: Any, model_config: Any, dtype: torch.dtype) -> torch.nn.Module:
    lora = cfg.model.lora.model_dump_json() if cfg.model.lora is not None else None
    key = (dtype, tuple(cfg.model.freeze_modules), lora)
    for config, shaped, model in _BUILT:
        if config is model_config and shaped == key:
            return model
    with _quiet():
        model = _build_trainable(cfg, model_config, dtype)
    _BUILT.insert(0, (model_config, key, model))
    del _BUILT[4:]
    return model


def _build_trainable(cfg: Any, model_config: Any, dtype: torch.dtype) -> torch.nn.Module:
    model = meta_model(model_config, dtype)
    if cfg.model.freeze_modules:
        from vlforge.models.adapters import freeze

        freeze(model, cfg.model.freeze_modules)
    if cfg.model.lora is not None:
        from vlforge.models.adapters import apply_lora

        model = apply_lora(model, cfg.model.lora)
    return model


def _root_and_units(model: torch.nn.Module) -> tuple[int, int, int]:
    """``(parameters outside the text decoder layers, parameters of the largest layer, of all layers)``."""
    _owner, layers = find_stack(model, "text")
    per_layer = [_count(layer.parameters()) for layer in layers]
    return _count(model.parameters()) - sum(per_layer), max(per_layer), sum(per_layer)


def _matrix_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.dim() >= 2)


def estimate_memory(cfg: Any, model_config: Any, *, world: int = 1, device: torch.device | str = "cpu",
                    sample_length: int | None = None, label_share: float = 0.5,
                    visual_share: float | None = None) -> MemoryEstimate:
    """Peak bytes per rank of one training step of ``cfg`` on ``world`` ranks (see the module docstring)."""
    device = torch.device(device)
    compute = getattr(torch, cfg.param_dtype())
    pure = cfg.training.bf16 and cfg.fsdp.mixed_precision == "pure_bf16"
    master = torch.bfloat16 if pure else torch.float32
    mb, cb = master.itemsize, compute.itemsize
    sp = max(1, cfg.sp_ulysses_degree)
    sharded = cfg.fsdp.fsdp2 and world > 1
    shard = (cfg.fsdp.hsdp_shard_size or world) if sharded else 1
    load = workload(cfg, model_config, sample_length=sample_length, label_share=label_share,
                    visual_share=visual_share)
    model = _trainable_model(cfg, model_config, compute)
    total = _count(model.parameters())
    trainable = _count(p for p in model.parameters() if p.requires_grad)
    root, unit, units = _root_and_units(model)
    parts: dict[str, int] = {"parameters": total * mb // shard}
    if sharded:  # two layers at a time, or every layer when nothing reshards after the forward
        kept = units if getattr(cfg.fsdp, "reshard_after_forward", None) is False else 2 * unit
        parts["gathered_weights"] = (root + kept) * cb
    elif compute != master:
        parts["cast_weights"] = _matrix_params(model) * cb  # autocast's bf16 copies, kept for the backward
    parts["gradients"] = trainable * mb // shard
    state = getattr(torch, getattr(cfg.training, "optimizer_state_dtype", "float32"))
    state_bytes = mb if state == torch.float32 else state.itemsize
    parts["optimizer"] = 2 * trainable * state_bytes // shard
    parts["activations"] = _text_activations(cfg, model, load, compute, device, sp)
    parts["vision_activations"] = _vision_activations(cfg, model, load, compute, device)
    head = model.get_output_embeddings()
    head_grad = (head.weight.numel() * mb // shard) if head is not None and head.weight.requires_grad else 0
    vocab = model_config.get_text_config().vocab_size
    labels_here = math.ceil(load.labels / sp)
    # the cross-entropy's backward holds the gradient of its log-softmax output and of the logits at once (fp32)
    parts["temporary"] = 2 * labels_here * vocab * 4 + (2 * unit * 4 if sharded else 0)
    # a tied embedding gets its gradient twice: the embedding's backward builds a dense table-sized gradient before
    # adding it to the lm_head's, at the end of the backward when all other gradients exist
    embed = model.get_input_embeddings()
    tied = head is not None and embed is not None and head.weight is embed.weight and embed.weight.requires_grad
    tied_extra = embed.weight.numel() * (4 if sharded else mb) if tied else 0
    acts = parts["activations"] + parts["vision_activations"]
    static = parts["parameters"] + parts.get("gathered_weights", 0) + parts.get("cast_weights", 0) + parts["optimizer"]
    if load.micro_batches > 1:
        moving = parts["gradients"] + max(acts, tied_extra)
    else:
        moving = max(acts + head_grad, parts["gradients"] + tied_extra)
    peak = static + moving + parts["temporary"]
    if state_bytes < mb:  # the optimiser step: float32 moments and denominators of one chunk at a time
        largest = max((p.numel() for p in model.parameters() if p.requires_grad), default=0) // shard
        step_temp = 3 * 4 * max(min(OPTIMIZER_CHUNK_ELEMENTS, trainable // shard), largest)
        peak = max(peak, parts["parameters"] + parts["gradients"] + parts["optimizer"] + step_temp)
    extra = (units - 2 * unit) * cb if sharded and getattr(cfg.fsdp, "reshard_after_forward", None) is not False else 0
    return MemoryEstimate(parts, int(peak), load, total, trainable, world, shard, sp, gathered_extra=max(0, extra))


def _text_activations(cfg: Any, model: torch.nn.Module, load: Workload, dtype: torch.dtype,
                      device: torch.device, sp: int) -> int:
    owner, layers = find_stack(model, "text")
    tc = owner.config
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    length = load.tokens // load.rows
    local = math.ceil(length / sp)
    # under SP every rank attends over the whole row with heads / sp heads, per sample (no mask)
    masked = load.masked and sp == 1 and cfg.resolved_attn_implementation() == "sdpa"
    cost = attention_cost(device, dtype, causal=True, masked=masked)
    attn = cost.layer_bytes(heads=math.ceil(heads / sp), head_dim=head_dim, length=length,
                            segments=load.segments) * load.rows
    kinds = layer_kinds(layers)  # each kind of layer probed once, counted as often as the stack holds it
    sizes, attending = {}, 0
    for first, count in kinds:
        with counting_attention() as calls:
            sizes[first] = text_layer_bytes(model, local, dtype, index=first) * load.rows
        attending += count if calls.count else 0  # a linear-attention layer (Qwen3.5) runs no SDPA
    layer = max(sizes.values())  # the one layer a checkpointed stack recomputes at a time
    trains = any(p.requires_grad for p in layers.parameters())
    mode = cfg.model.checkpointing() if trains else "none"
    inputs = load.rows * local * tc.hidden_size * dtype.itemsize  # what a checkpointed layer keeps of its input
    if mode == "full":
        kept = len(layers) * inputs + layer + (attn if attending else 0)
    elif mode == "selective":  # matmul outputs + the attention kernel's output and log-sum-exp, per layer
        matmuls = sum(count * text_layer_bytes(model, local, dtype, measure=selective_bytes, index=first)
                      for first, count in kinds) * load.rows
        attn_out = load.rows * math.ceil(heads / sp) * length * (head_dim * dtype.itemsize + 4)
        kept = matmuls + len(layers) * inputs + attending * attn_out + layer + (attn if attending else 0)
    else:
        kept = sum(count * sizes[first] for first, count in kinds) + attending * attn
    shared = cost.shared_bytes(length) * load.rows
    return int(kept + shared + loss_bytes(model, math.ceil(load.labels / sp), dtype))


def _vision_activations(cfg: Any, model: torch.nn.Module, load: Workload, dtype: torch.dtype,
                        device: torch.device) -> int:
    found = find_stack(model, "vision")
    if found is None or load.vision_patches == 0:
        return 0
    owner, blocks = found
    if not any(p.requires_grad for p in owner.parameters()):
        return 0  # a frozen tower keeps nothing for the backward
    vc = owner.config
    width = getattr(vc, "embed_dim", None) or vc.hidden_size
    heads = vc.num_heads
    patches = load.vision_patches
    cost = attention_cost(device, dtype, causal=False, masked=False)
    attn = cost.layer_bytes(heads=heads, head_dim=width // heads, length=patches)
    block = vision_block_bytes(model, patches, dtype)
    mode = cfg.model.checkpointing()
    if mode == "full":
        kept = len(blocks) * patches * width * dtype.itemsize + block + attn
    elif mode == "selective":
        matmuls = vision_block_bytes(model, patches, dtype, measure=selective_bytes)
        attn_out = patches * (width * dtype.itemsize + heads * 4)
        kept = len(blocks) * (patches * width * dtype.itemsize + matmuls + attn_out) + block + attn
    else:
        kept = len(blocks) * (block + attn)
    patch_input = patches * getattr(vc, "in_channels", 3) * getattr(vc, "temporal_patch_size", 2) * \
        getattr(vc, "patch_size", 14) ** 2 * 4
    return int(kept + patch_input)
