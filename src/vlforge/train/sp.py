"""Ulysses sequence parallelism (``sp_ulysses_degree``) for every family (MoE and Qwen3.5 linear attention included).

The ``W`` processes form a ``(dp, sp)`` device mesh, ``dp = W / sp``; the ``sp`` ranks of a group are
consecutive (rank ``d * sp + s``) and read the same batches (the data is sharded by the dp rank only).
FSDP2 shards the parameters over all ``W`` ranks (both mesh dimensions), so nothing changes there.

One forward of a group:

1. every rank embeds the *whole* sequence (the 3-D rotary positions come with the batch: the data
   pipeline runs the family's ``get_rope_index``, with ``second_per_grid_ts`` for Qwen2.5-VL
   videos); the vision tower runs once per group: each rank encodes its share of the
   images/videos (:func:`assign_images`) and the merged features (and Qwen3-VL's deepstack
   features) are all-gathered (gradients summed back to the owner);
2. a forward pre-hook on the text model pads the sequence to a multiple of ``sp`` and gives each
   rank a *copy* of its contiguous shard of ``inputs_embeds`` and position ids (so the
   whole-sequence tensors are freed before the first layer, not kept alive by a view until the
   backward), and the deepstack visual features of the visual tokens inside that shard;
3. every text attention layer calls :func:`ulysses_attention`: an all-to-all turns the sequence
   shard of q, k and v into a head shard of the whole sequence, causal SDPA runs per sample (one
   row, grouped k/v heads used as they are) or under a block-causal mask (padded rows), never
   across samples or pads, and a second all-to-all turns the result back (Qwen3.5's Gated DeltaNet layers split
   by heads the same way: :mod:`vlforge.train.sp_linear`);
4. each rank projects only its shard's label positions through ``lm_head``; the loss is the sum of
   those token losses, and dividing by the label count summed over all ranks (every rank counts
   only its shard: :func:`shard_label_count`) gives the same loss and gradients as one process; a MoE router's
   load-balancing loss is a whole-sequence statistic, its sums are added over the group
   (:mod:`vlforge.train.sp_router`).

Example (the single-process bits; the collectives need ``torchrun``):
    >>> import torch
    >>> shard_bounds(10, 2, 1)  # 10 tokens padded to 10, rank 1 of 2
    (5, 10)
    >>> segment_ids(torch.tensor([0, 3, 5]), None, 6).tolist()
    [[0, 0, 0, 1, 1, -6]]
"""

from __future__ import annotations

import itertools
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

from vlforge.errors import ConfigError
from vlforge.models.blocks import any_compiled
from vlforge.models.module_names import vision_tower
from vlforge.train.loss import LossTerms, masked_logits, model_inputs, target_mask
from vlforge.train.sp_router import group_balance_loss

logger = logging.getLogger(__name__)

#: Name under which :func:`ulysses_attention` is registered with transformers' attention interface.
ATTENTION_NAME = "vlforge_ulysses"


@dataclass
class SequenceParallel:
    """This process's place in the ``(dp, sp)`` mesh and the per-forward routing state."""

    degree: int
    rank: int
    """Rank inside the sp group."""
    group: Any
    mesh: Any = None
    pending: dict[str, Any] = field(default_factory=dict)
    """Set by :func:`sp_token_loss_sum` for the text-model pre-hook of the forward being run."""


def shard_bounds(length: int, degree: int, rank: int) -> tuple[int, int]:
    """``[start, end)`` of ``rank``'s shard after padding ``length`` to a multiple of ``degree``."""
    size = -(-length // degree)
    return rank * size, (rank + 1) * size


def segment_ids(cu_seqlens: torch.Tensor | None, attention_mask: torch.Tensor | None, padded: int,
                rows: int = 1) -> torch.Tensor:
    """(rows, padded) attention segments: tokens attend only within their segment (causally).

    Packed samples (``cu_seqlens``) get 0, 1, ...; pads (``attention_mask`` 0, or the padding up to
    ``padded``) get a distinct negative id each, so they attend only to themselves.
    """
    if cu_seqlens is not None:
        cu = cu_seqlens.long().cpu()
        length = int(cu[-1])
        seg = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])[None].expand(rows, -1)
    else:
        length = int(attention_mask.shape[1]) if attention_mask is not None else padded
        seg = torch.zeros(rows, length, dtype=torch.long)
    seg = seg.clone()
    own = -torch.arange(1, padded + 1)[None].expand(rows, -1)
    if attention_mask is not None:
        keep = attention_mask.cpu().bool()
        seg = torch.where(keep, seg, own[:, :length])
    out = own.clone()
    out[:, :length] = seg
    return out


def block_causal_mask(segments: torch.Tensor) -> torch.Tensor:
    """(rows, 1, L, L) boolean SDPA mask: causal and within one segment."""
    length = segments.shape[1]
    idx = torch.arange(length, device=segments.device)
    causal = idx[None, :] <= idx[:, None]
    same = segments[:, :, None] == segments[:, None, :]
    return (same & causal)[:, None]


# -- collectives ----------------------------------------------------------------------------------
def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    world = dist.get_world_size(group)
    inputs = [chunk.contiguous() for chunk in x.chunk(world, dim=scatter_dim)]
    outputs = [torch.empty_like(inputs[0]) for _ in range(world)]
    dist.all_to_all(outputs, inputs, group=group)
    return torch.cat(outputs, dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """All-to-all whose backward is the reverse exchange."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Split ``x`` along ``scatter_dim`` over the group, concatenate what arrives along ``gather_dim``."""
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherRows(torch.autograd.Function):
    """Concatenate every rank's rows (``sizes[r]`` rows from rank r); backward sums the gradients over the group
    and returns this rank's rows."""

    @staticmethod
    def forward(ctx, local, sizes, rank, group):
        ctx.sizes, ctx.rank, ctx.group = sizes, rank, group
        most = max(sizes)
        padded = torch.cat([local, local.new_zeros(most - local.shape[0], *local.shape[1:])]) if most else local
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        start = sum(ctx.sizes[:ctx.rank])
        return grad[start:start + ctx.sizes[ctx.rank]], None, None, None


def assign_images(patches: list[int], degree: int) -> list[int]:
    """Owner rank of each image/video (largest first onto the least-loaded rank; same answer on every rank).

    Example:
        >>> assign_images([4, 16, 4, 4], 2)
        [1, 0, 1, 1]
    """
    load = [0] * degree
    owners = [0] * len(patches)
    for index in sorted(range(len(patches)), key=lambda i: (-patches[i], i)):
        owner = min(range(degree), key=lambda r: (load[r], r))
        owners[index] = owner
        load[owner] += patches[index]
    return owners


def _split_tower(state: SequenceParallel, tower: torch.nn.Module, width: int) -> None:
    """Make the vision tower of an sp group run each image on one rank and gather the features on all.

    ``width``: the merged features' width (the text model's hidden size). Qwen3-VL's deepstack
    features travel in the same exchange, concatenated after the merged ones.
    """
    original = tower.forward
    merge = tower.spatial_merge_size ** 2
    deepstack = len(getattr(tower, "deepstack_visual_indexes", None) or ())

    def forward(hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs: Any):
        if not state.pending:
            return original(hidden_states, grid_thw=grid_thw, **kwargs)
        patches = grid_thw.prod(-1).tolist()
        owners = assign_images(patches, state.degree)
        starts = [0, *torch.tensor(patches).cumsum(0).tolist()]
        mine = [i for i, owner in enumerate(owners) if owner == state.rank]
        if mine:
            pixels = torch.cat([hidden_states[starts[i]:starts[i + 1]] for i in mine])
            out = original(pixels, grid_thw=grid_thw[mine], **kwargs)
            local = torch.cat([out.pooler_output, *out.deepstack_features], dim=-1) if deepstack else out.pooler_output
        else:  # a leaf that needs a gradient, so this rank joins the backward exchange too
            local = torch.zeros(0, width * (1 + deepstack), device=hidden_states.device, dtype=tower.dtype,
                                requires_grad=True)
        rows = [n // merge for n in patches]
        sizes = [sum(rows[i] for i, owner in enumerate(owners) if owner == r) for r in range(state.degree)]
        gathered = _GatherRows.apply(local, sizes, state.rank, state.group)
        # rows arrive grouped by rank (each rank's images in index order): put them back in image order
        order = [i for r in range(state.degree) for i, owner in enumerate(owners) if owner == r]
        offsets, at = {}, 0
        for i in order:
            offsets[i] = at
            at += rows[i]
        index = torch.cat([torch.arange(offsets[i], offsets[i] + rows[i]) for i in range(len(rows))])
        features = gathered.index_select(0, index.to(gathered.device))
        if not deepstack:
            from transformers.modeling_outputs import BaseModelOutputWithPooling

            return BaseModelOutputWithPooling(pooler_output=features)
        output_class = vars(sys.modules[type(tower).__module__])["BaseModelOutputWithDeepstackFeatures"]
        parts = features.split(width, dim=-1)
        return output_class(pooler_output=parts[0], deepstack_features=list(parts[1:]))

    tower.forward = forward


# -- attention ------------------------------------------------------------------------------------
def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention over the whole sequence from sequence shards: (B, H, L/sp, D) in, (B, L/sp, H, D) out.

    The whole padded sequence's layout comes in through the decoder's keyword arguments: for one row,
    ``vlforge_sp_bounds`` (``[start, end)`` of every sample and of the pad tail: causal SDPA per
    sample, no L x L mask), else ``vlforge_sp_mask`` (the (B, 1, L, L) block-causal mask). The model's
    own ``attention_mask`` (built for the shard) is ignored.
    """
    group = module.vlforge_sp_group
    degree = dist.get_world_size(group)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads % degree:  # fewer (or indivisible) k/v heads: give every q head its own copy
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    q = all_to_all(query, 1, 2, group)
    k = all_to_all(key, 1, 2, group)
    v = all_to_all(value, 1, 2, group)
    bounds = kwargs.get("vlforge_sp_bounds")
    grouped = q.shape[1] != k.shape[1]
    if bounds is not None:  # no mask: SDPA reads the grouped k/v heads itself (as transformers' sdpa does)
        gqa = {"enable_gqa": True} if grouped else {}
        out = torch.cat([F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True,
                                                        dropout_p=dropout, scale=scaling, **gqa)
                         for a, b in bounds], dim=2)
    else:
        if grouped:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        mask = kwargs["vlforge_sp_mask"].to(q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling)
    out = all_to_all(out, 2, 1, group)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Register :func:`ulysses_attention` as transformers attention ``vlforge_ulysses`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, ulysses_attention)


# -- set-up ---------------------------------------------------------------------------------------
def text_model(model: torch.nn.Module) -> torch.nn.Module:
    """The text decoder (the module holding ``layers`` and ``rotary_emb``) inside ``model``."""
    for _, module in model.named_modules():
        if type(module).__name__.endswith("TextModel") and hasattr(module, "layers"):
            return module
    raise ConfigError(f"sp_ulysses_degree: no text decoder found in {type(model).__name__}")


def setup_sequence_parallel(model: torch.nn.Module, degree: int, ctx: Any) -> SequenceParallel:
    """Build the mesh, switch the text attention to Ulysses and install the input router (the layout was checked
    by :func:`vlforge.config.parallel.check_sequence_parallel` at start-up)."""
    from torch.distributed.device_mesh import init_device_mesh

    text = text_model(model)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size // degree, degree), mesh_dim_names=("dp", "sp"))
    state = SequenceParallel(degree, mesh.get_local_rank("sp"), mesh.get_group("sp"), mesh)
    register_attention()
    if any_compiled(text):  # its sample bounds are host-side Python: keep dynamo out
        from transformers import AttentionInterface

        AttentionInterface.register(ATTENTION_NAME, torch.compiler.disable(ulysses_attention))
        logger.warning("model.compile with sequence parallelism: the Ulysses attention (and Gated DeltaNet) "
                       "forwards run eager between the compiled parts, and a checkpointed decoder layer is not "
                       "compiled at all")
    text.config._attn_implementation = ATTENTION_NAME
    for module in text.modules():
        if hasattr(module, "q_proj") and hasattr(module, "o_proj"):
            module.vlforge_sp_group = state.group
    text.register_forward_pre_hook(lambda mod, args, kwargs: _route(state, args, kwargs), with_kwargs=True)
    path = vision_tower(model)
    if path is not None:
        _split_tower(state, model.get_submodule(path), text.config.hidden_size)
    logger.info("sequence parallel: degree %d, mesh dp=%d x sp=%d (sp rank %d)", degree,
                ctx.world_size // degree, degree, state.rank)
    return state


# -- input routing --------------------------------------------------------------------------------
def _pad_last(x: torch.Tensor, dim: int, padded: int) -> torch.Tensor:
    extra = padded - x.shape[dim]
    if extra == 0:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


def _route(state: SequenceParallel, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Text-model pre-hook: keep this rank's shard of the whole-sequence inputs."""
    if not state.pending:
        raise RuntimeError("sequence-parallel text model called outside sp_token_loss_sum")
    if args:
        raise RuntimeError("sequence-parallel text model expects keyword arguments")
    embeds = kwargs["inputs_embeds"]
    length = embeds.shape[1]
    padded = state.pending["padded"]
    start, end = shard_bounds(length, state.degree, state.rank)
    kwargs = dict(kwargs)
    # copies, not views: a view would keep the whole sequence's storage alive until the backward
    kwargs["inputs_embeds"] = _pad_last(embeds, 1, padded)[:, start:end].clone()
    positions = kwargs.get("position_ids")
    if positions is not None:
        kwargs["position_ids"] = _pad_last(positions, positions.ndim - 1, padded)[..., start:end].clone()
    kwargs["attention_mask"] = None
    visual = kwargs.get("visual_pos_masks")
    if visual is not None:
        visual = _pad_last(visual, 1, padded)
        inside = torch.zeros_like(visual)
        inside[:, start:end] = True
        keep = inside[visual]  # which visual tokens (in row-major order) fall into this shard
        kwargs["deepstack_visual_embeds"] = [feat[keep.to(feat.device)] for feat in kwargs["deepstack_visual_embeds"]]
        kwargs["visual_pos_masks"] = visual[:, start:end]
    kwargs["vlforge_sp_mask"] = state.pending["mask"]
    kwargs["vlforge_sp_bounds"] = state.pending["bounds"]
    return args, kwargs


# -- loss -----------------------------------------------------------------------------------------
def _local_targets(batch: dict[str, Any], state: SequenceParallel) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(local keep mask (B, L/sp), local targets, padded length)."""

    labels = batch["labels"]
    rows, length = labels.shape
    padded = shard_bounds(length, state.degree, 0)[1] * state.degree
    keep = torch.zeros(rows, padded, dtype=torch.bool)
    keep[:, :length - 1] = target_mask(batch)
    targets = torch.zeros(rows, padded, dtype=labels.dtype)
    targets[:, :length - 1] = labels[:, 1:]
    start, end = shard_bounds(length, state.degree, state.rank)
    local = keep[:, start:end]
    return local, targets[:, start:end][local], padded


def shard_label_count(batch: dict[str, Any], state: SequenceParallel) -> torch.Tensor:
    """Predicted label tokens of ``batch`` inside this rank's sequence shard."""
    return _local_targets(batch, state)[0].sum()


def sp_token_loss_sum(model: torch.nn.Module, batch: dict[str, Any], device: torch.device | str,
                      float_dtype: torch.dtype | None, state: SequenceParallel, *,
                      router_aux: bool = False) -> LossTerms:
    """Sum (fp32) of the cross-entropy of the predicted label tokens in this rank's shard and, with ``router_aux``,
    the router's load-balancing loss of the whole sequence (:mod:`vlforge.train.sp_router`)."""
    local, targets, padded = _local_targets(batch, state)
    inputs = model_inputs(batch, device, float_dtype)
    rows = batch["input_ids"].shape[0]
    length = batch["input_ids"].shape[1]
    pad_tail = [(length, padded)] if padded > length else []
    attention = batch.get("attention_mask")
    mask, bounds = None, None
    if "cu_seqlens" in batch:
        if rows != 1:
            raise ValueError("a packed batch must be one row")
        inputs.pop("attention_mask", None)
        cu = batch["cu_seqlens"].long().tolist()
        bounds = [*((a, b) for a, b in itertools.pairwise(cu) if b > a), *pad_tail]
    elif rows == 1 and (attention is None or bool(attention.all())):
        bounds = [(0, length), *pad_tail]
    else:  # padded rows: one (B, 1, L, L) mask
        mask = block_causal_mask(segment_ids(None, attention, padded, rows).to(device))
    extra = {}
    if router_aux:  # the model's own aux_loss would count this shard only (and mismatch the whole row's mask)
        inputs.pop("attention_mask", None)
        extra["output_router_logits"] = True
    state.pending = {"padded": padded, "mask": mask, "bounds": bounds}
    try:
        out, logits = masked_logits(model, inputs, local.to(device), use_cache=False, **extra)
    finally:
        state.pending = {}
    token_sum = F.cross_entropy(logits.float(), targets.to(device), reduction="sum")
    if not router_aux:
        return LossTerms(token_sum)
    # the tokens the router loss counts: every token of a packed row, the unpadded ones otherwise (as transformers)
    real = torch.ones(rows, length, dtype=torch.bool) if "cu_seqlens" in batch or attention is None \
        else attention.cpu().bool()
    start, end = shard_bounds(length, state.degree, state.rank)
    keep = _pad_last(real, 1, padded)[:, start:end]
    text = model.config.get_text_config()
    return LossTerms(token_sum, group_balance_loss(out.router_logits, keep, text, state.group).float())
