"""The model of a training run: load, patch, guard, freeze, checkpointing, LoRA, Liger kernels, regional compilation
and FSDP2 sharding.

Master weights are fp32 unless ``fsdp.mixed_precision: pure_bf16``. With several processes and
``fsdp.fsdp2`` every layer class (``transformer_layer_cls_to_wrap``, else the model's
``_no_split_modules``) becomes its own ``fully_shard`` unit and the root holds the rest. The
mixed-precision policy computes in ``TrainConfig.param_dtype()`` (bf16 with ``training.bf16``, float16
with ``fsdp.param_dtype: float16``), reduces gradients in ``fsdp.reduce_dtype`` (default fp32, bf16 with
``pure_bf16``) and casts each unit's outputs to ``fsdp.output_dtype`` when set. With
``fsdp.hsdp_shard_size: N`` the mesh is ``(world / N, N)``: sharded within groups of N ranks, replicated
across them (HSDP). In one process there is no sharding; a compute dtype below the master weights' runs
under ``torch.autocast`` and ``output_dtype`` is a forward hook on the same units.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from vlforge.config.preflight import check_supported
from vlforge.config.schema import TrainConfig
from vlforge.dist import DistContext
from vlforge.errors import ConfigError
from vlforge.models.adapters import apply_lora, freeze
from vlforge.models.blocks import apply_checkpointing, compile_blocks
from vlforge.models.families import FAMILIES, supports
from vlforge.models.module_names import resolve_layer_classes

logger = logging.getLogger(__name__)


@dataclass
class TrainModel:
    """The prepared model and what the loop needs to know about it."""

    model: torch.nn.Module
    loaded: Any
    """The :class:`~vlforge.models.LoadedModel` (processor, tokenizer, path, family)."""
    sharded: bool
    compute_dtype: torch.dtype
    autocast: bool
    """Compute under ``torch.autocast`` in ``compute_dtype`` (one process, master weights in a wider dtype)."""

    def autocast_context(self, device: torch.device):
        if self.autocast:
            return torch.autocast(device.type, dtype=self.compute_dtype)
        return contextlib.nullcontext()


def layer_classes(model: torch.nn.Module, names: list[str] | None) -> set[type]:
    """Module classes to shard as units: ``names`` (resolved by :func:`resolve_layer_classes`) or the model's
    ``_no_split_modules``."""
    if names:
        return set(resolve_layer_classes(model, names).values())
    wanted = list(getattr(model, "_no_split_modules", None) or [])
    if not wanted:
        raise ConfigError(
            f"fsdp.transformer_layer_cls_to_wrap: {type(model).__name__} names no _no_split_modules; "
            "list its layer classes"
        )
    found = {type(m).__name__: type(m) for m in model.modules()}
    return {found[name] for name in wanted if name in found}


def prepare_model(cfg: TrainConfig, ctx: DistContext, *, keep_gathered: bool | None = None) -> TrainModel:
    """Load and prepare the model of ``cfg`` on this process's device (see the module docstring).

    ``keep_gathered``: the start-up memory plan's answer for ``fsdp.reshard_after_forward`` auto (rank 0's)."""
    import vlforge
    from vlforge.diagnosis.guard import guard
    from vlforge.models.load import load

    check_supported(cfg)
    bf16 = cfg.training.bf16
    pure = bf16 and cfg.fsdp.mixed_precision == "pure_bf16"
    master = torch.bfloat16 if pure else torch.float32
    compute = getattr(torch, cfg.param_dtype())
    loaded = load(cfg.model.load_from_pretrained_path, dtype=master, device="cpu",
                  attn_implementation=cfg.resolved_attn_implementation(), shared_processor=True)
    model = loaded.model
    if cfg.model.overwrite_config:
        overwrite_config(model, cfg.model.overwrite_config)
    if cfg.model.patch:
        report = vlforge.patch(model, precision=cfg.model.patch_precision)
        logger.info("patch: %s", report.summary())
    guard(model, cfg.param_dtype(), precision=cfg.model.patch_precision, tokens=cfg.model.token_audit)
    if cfg.model.freeze_modules:
        count = freeze(model, cfg.model.freeze_modules)
        total = sum(p.numel() for p in model.parameters())
        logger.info("froze %d of %d parameters under %s", count, total, ", ".join(cfg.model.freeze_modules))
        if count == total and cfg.model.lora is None:
            raise ConfigError(f"model.freeze_modules {cfg.model.freeze_modules}: every parameter of "
                              f"{type(model).__name__} is frozen; nothing would train")
    if cfg.fsdp.fsdp2 and cfg.fsdp.transformer_layer_cls_to_wrap and not ctx.distributed:
        layer_classes(model, cfg.fsdp.transformer_layer_cls_to_wrap)  # checked (and logged) before work starts
        logger.info("FSDP2: one process, no sharding (fsdp.transformer_layer_cls_to_wrap checked, not used)")
    apply_checkpointing(model, cfg.model.checkpointing(), loaded.family)  # none / selective / full (models.blocks)
    if cfg.packing.packing and cfg.resolved_attn_implementation() == "sdpa":
        from vlforge.models.varlen import use_for_text

        use_for_text(model)  # per-sample attention for packed rows, no dense L x L mask (flash-attn absent)
    if loaded.family in FAMILIES and FAMILIES[loaded.family].media.shared_placeholder:
        from vlforge.models.media_mask import separate_video_placeholders

        separate_video_placeholders(model)  # images and videos in one batch or packed row (GLM-4V)
    if cfg.packing.packing and supports(loaded.family, "linear_attention"):
        from vlforge.models.linear_attention import use_for_packed_rows

        use_for_packed_rows(model)  # each sample's Gated DeltaNet conv window and state restart at its boundary
    if cfg.model.lora is not None:
        model = apply_lora(model, cfg.model.lora)
        if cfg.model.freeze_modules:  # adapters inside frozen modules stay frozen too
            freeze(model.base_model.model, cfg.model.freeze_modules)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info("LoRA: %d trainable adapter parameters (r=%d)", trainable, cfg.model.lora.r)
    if cfg.use_liger_kernel:
        from vlforge.train.liger import apply_liger

        apply_liger(model, loaded.family, ctx.device)
    if cfg.model.compile:
        compile_blocks(model, loaded.family)  # after every forward change, before FSDP2 (torchtitan's order)
    model.train()
    sharded = ctx.distributed and cfg.fsdp.fsdp2
    if sharded:
        shard_model(model, cfg, ctx, keep_gathered)
    else:
        model.to(ctx.device)
        if cfg.fsdp.output_dtype:  # what FSDP2's policy does to each unit's outputs, without sharding
            cast_outputs(model, layer_classes(model, cfg.fsdp.transformer_layer_cls_to_wrap),
                         getattr(torch, cfg.fsdp.output_dtype))
    if compute != master:
        logger.info("precision: %s compute over %s master weights%s", cfg.param_dtype(), str(master)[6:],
                    " (float16 without loss scaling, as LMMS Engine's fsdp2 trainer)" if compute == torch.float16
                    else "")
    return TrainModel(model, loaded, sharded, compute, autocast=compute != master and not sharded)


def overwrite_config(model: torch.nn.Module, values: dict[str, Any]) -> None:
    """LMMS Engine's ``overwrite_config``: set each attribute on ``model.config``, and on the model where it has it."""
    for key, value in values.items():
        setattr(model.config, key, value)
        if getattr(model, key, None) is not None:
            setattr(model, key, value)
        logger.info("model.overwrite_config: %s = %r", key, value)


def cast_outputs(model: torch.nn.Module, classes: set[type], dtype: torch.dtype) -> int:
    """Cast the floating outputs of every ``classes`` module outside the vision tower, and of ``model``, to ``dtype``
    (FSDP2's ``output_dtype`` on the units ``shard_model`` would make); returns the hooks added."""
    from torch.distributed.utils import _apply_to_tensors

    def cast(module: torch.nn.Module, args: Any, output: Any) -> Any:
        return _apply_to_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, output)

    units = [m for name, m in model.named_modules() if isinstance(m, tuple(classes)) and not _in_vision_tower(name)]
    for module in [*units, model]:
        module.register_forward_hook(cast)
    return len(units) + 1


def kept_dtype_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Modules whose own trainable parameters are in another dtype than most of the model's: transformers keeps
    some in fp32 in a bf16 model (``_keep_in_fp32_modules_strict``: GLM-4.5V's routers). Each becomes its own FSDP2
    unit computing in its own dtype (one dtype per unit is FSDP2's rule); logged. A module holding both dtypes
    itself is a :class:`ConfigError`."""
    sizes: dict[torch.dtype, int] = {}
    for param in model.parameters():
        if param.requires_grad:
            sizes[param.dtype] = sizes.get(param.dtype, 0) + param.numel()
    if len(sizes) < 2:
        return []
    main = max(sizes, key=sizes.__getitem__)
    kept = []
    for name, module in model.named_modules():
        own = {p.dtype for p in module.parameters(recurse=False) if p.requires_grad}
        if own - {main}:
            if main in own or module is model or _in_vision_tower(name):  # a unit of its own would not help
                raise ConfigError(f"{name or type(module).__name__} holds trainable {sorted(map(str, own))} parameters "
                                  f"in a {str(main)[6:]} model where FSDP2 cannot give it a unit of its own (freeze "
                                  "it, or train with fp32 master weights)")
            kept.append(module)
    logger.info("FSDP2: %d module(s) kept in %s by the model (%s) shard as their own units", len(kept),
                ", ".join(sorted({str(p.dtype)[6:] for m in kept for p in m.parameters(recurse=False)})),
                ", ".join(sorted({type(m).__name__ for m in kept})))
    return kept


def precision_policy(cfg: TrainConfig) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` of ``cfg`` (param, reduce and output dtypes; see the module docstring)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    param = cfg.param_dtype()
    pure = cfg.training.bf16 and cfg.fsdp.mixed_precision == "pure_bf16"
    reduce = cfg.fsdp.reduce_dtype or ("bfloat16" if pure else "float32" if param != "float32" else None)
    output = cfg.fsdp.output_dtype
    return MixedPrecisionPolicy(param_dtype=None if param == "float32" else getattr(torch, param),
                                reduce_dtype=getattr(torch, reduce) if reduce else None,
                                output_dtype=getattr(torch, output) if output else None)


def fsdp_mesh(cfg: TrainConfig, ctx: DistContext) -> Any:
    """The device mesh of ``fully_shard``: all ranks, or ``(replicate, shard)`` groups with ``hsdp_shard_size``."""
    from torch.distributed.device_mesh import init_device_mesh

    size = cfg.fsdp.hsdp_shard_size
    if not size:
        return init_device_mesh(ctx.device.type, (ctx.world_size,))
    if ctx.world_size % size:
        raise ConfigError(f"fsdp.hsdp_shard_size: {size} does not divide the {ctx.world_size} process(es) of this "
                          "run")
    logger.info("HSDP: shard within groups of %d ranks, replicate across %d group(s)", size, ctx.world_size // size)
    return init_device_mesh(ctx.device.type, (ctx.world_size // size, size), mesh_dim_names=("replicate", "shard"))


#: Attribute names of the vision tower in the supported families.
VISION_TOWERS = ("visual", "vision_tower", "vision_model")


def _in_vision_tower(name: str) -> bool:
    return any(part in VISION_TOWERS for part in name.split("."))


def fill_missing_grads(model: torch.nn.Module) -> None:
    """Zero gradients for trainable parameters this step did not reach (as FSDP2's unused-param reduction does)."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


def resolve_reshard(cfg: TrainConfig, ctx: DistContext, keep_gathered: bool | None = None) -> bool:
    """``fsdp.reshard_after_forward``, or for null (auto): False when every rank is on one node and the start-up
    memory plan (rank 0's, ``keep_gathered``) found that the peak with every layer kept gathered fits, else True."""
    import os

    setting = cfg.fsdp.reshard_after_forward
    if setting is not None:
        return setting
    one_node = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size)) == ctx.world_size
    mine = bool(keep_gathered) if ctx.is_main else True  # rank 0 planned; the others follow it
    keep = bool(ctx.all_reduce_min(int(one_node and mine)))
    if keep:
        logger.info("fsdp.reshard_after_forward (auto): off: one node, and the memory plan with every layer gathered "
                    "fits")
    else:
        why = "several nodes" if not one_node else "no memory plan" if keep_gathered is None else "the plan needs it"
        logger.info("fsdp.reshard_after_forward (auto): on, except the last decoder layer (%s)", why)
    return not keep


def shard_model(model: torch.nn.Module, cfg: TrainConfig, ctx: DistContext, keep_gathered: bool | None = None) -> None:
    """``fully_shard`` each module kept in another dtype, each layer-class module, then the root (in place)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = fsdp_mesh(cfg, ctx)
    policy = precision_policy(cfg)
    classes = tuple(layer_classes(model, cfg.fsdp.transformer_layer_cls_to_wrap))
    units, in_tower = [], 0
    for name, module in model.named_modules():
        if isinstance(module, classes):
            if _in_vision_tower(name):
                in_tower += 1
            else:
                units.append(module)
    if in_tower:
        logger.info("FSDP2: the %d vision-tower layers stay in the root unit (the tower runs 0, 1 or 2 times per "
                    "forward depending on the batch, which per-layer units cannot follow across ranks)", in_tower)
    reshard = resolve_reshard(cfg, ctx, keep_gathered)
    kept = kept_dtype_modules(model)
    for module in kept:  # before their layer: FSDP2 needs one parameter dtype per unit
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=MixedPrecisionPolicy())
    if kept and cfg.model.compile:  # FSDP2's hooks are outside dynamo: each compiled layer breaks at such a unit
        logger.warning("model.compile: the compiled layers break their graph at the %d unit(s) kept in another dtype "
                       "(FSDP2's hooks run outside the compiled code)", len(kept))
    for index, module in enumerate(units):
        last = index == len(units) - 1 and cfg.fsdp.reshard_after_forward is None  # auto: its backward comes first
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard and not last, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    # A rank whose batch has no image leaves the tower's gradients None: reduce zeros so all ranks match.
    model.set_reduce_scatter_unused_params(True)
    if ctx.device.type != "cpu":
        model.to(ctx.device)
    logger.info("FSDP2: %d units of %s + root over %d ranks", len(units),
                ", ".join(sorted({type(m).__name__ for m in units})), ctx.world_size)
