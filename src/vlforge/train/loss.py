"""Token-sum loss of one micro-batch: logits only where a label exists, never across packed samples.

The loss of an optimiser step is ``sum of token cross-entropies / label tokens of the whole step``
(all accumulation micro-batches of all ranks), so each micro-batch contributes
``token_loss_sum(model, batch) / global_label_count``. :func:`label_count` counts the tokens that
are predicted (a label at position ``t + 1`` is predicted from position ``t``; the first token of a
packed sample is never predicted from the previous sample).

Packed rows (``cu_seqlens`` present) are run with ``use_cache=False`` and no ``attention_mask``:
transformers 5.23 then reads row 0 of the ``(4, 1, L)`` position ids (restarting at 0 per sample)
to build a block-diagonal causal mask, so attention never crosses samples (tested against separate
forwards, loss and gradients).

Example:
    >>> import torch
    >>> batch = {"labels": torch.tensor([[-100, 5, 6, -100]])}
    >>> int(label_count(batch))
    2
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

IGNORE_INDEX = -100

#: Batch keys the model's forward takes; everything else (labels, cu_seqlens, sample_ids, ...) stays out.
MODEL_KEYS = (
    "input_ids", "attention_mask", "position_ids", "mm_token_type_ids", "pixel_values", "image_grid_thw",
    "pixel_values_videos", "video_grid_thw", "second_per_grid_ts",
)


def target_mask(batch: dict[str, Any]) -> torch.Tensor:
    """Boolean (B, L-1): position ``t`` predicts a label (``labels[:, t + 1]``) of the same sample."""
    labels = batch["labels"]
    mask = labels[:, 1:] != IGNORE_INDEX
    cu = batch.get("cu_seqlens")
    if cu is not None:  # a sample's first token is never a target of the previous sample's last one
        starts = cu[1:-1].long()
        starts = starts[(starts > 0) & (starts < labels.shape[1])]
        mask[:, starts - 1] = False
    return mask


def label_count(batch: dict[str, Any]) -> torch.Tensor:
    """Number of predicted label tokens of ``batch`` (int64 tensor on the batch's device)."""
    return target_mask(batch).sum()


def model_inputs(batch: dict[str, Any], device: torch.device | str, float_dtype: torch.dtype | None = None) -> dict:
    """The forward's keyword arguments from a collated batch, moved to ``device``."""
    inputs: dict[str, Any] = {}
    for key in MODEL_KEYS:
        value = batch.get(key)
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            value = value.to(device, non_blocking=True)
            if float_dtype is not None and value.is_floating_point() and key.startswith("pixel_values"):
                value = value.to(float_dtype)
        inputs[key] = value
    return inputs


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` without a host sync: on CUDA through pinned memory with a non-blocking copy (a
    copy from pageable memory, or a blocking one, waits for every kernel queued before it)."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return (tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True)


def packed_kwargs(batch: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """A packed row's sample boundaries as transformers' own attention keywords (``cu_seq_lens_q`` ...), read by
    :mod:`vlforge.models.varlen` and flash-attention; other kernels ignore them. The row's bounds are read on the
    host and handed to :func:`vlforge.models.varlen.prime`, so no layer reads them back from the device."""
    from vlforge.models.varlen import prime

    host = batch["cu_seqlens"].to(torch.int32)
    longest = int(batch.get("max_seqlen") or int((host[1:] - host[:-1]).max()))
    cu = to_device(host, device)
    prime(cu, host, int(batch["input_ids"].shape[1]))
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def router_aux_coef(model: torch.nn.Module) -> float:
    """``router_aux_loss_coef`` of a mixture-of-experts model whose config turns the router loss on
    (``output_router_logits``, as transformers and LMMS Engine decide), else 0.0. The top-level config is read
    first (where ``model.overwrite_config`` sets keys), then the text config (where checkpoints keep them)."""
    config = getattr(model, "config", None)
    if config is None:
        return 0.0
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def setting(name: str) -> Any:
        top = getattr(config, name, None)
        return top if top is not None else getattr(text, name, None)

    if not setting("output_router_logits") or expert_count(text) is None:
        return 0.0
    return float(setting("router_aux_loss_coef") or 0.0)


def expert_count(text_config: Any) -> int | None:
    """The routed experts per MoE layer of a text config (Qwen's ``num_experts``, GLM's ``n_routed_experts`` read
    as transformers' ``num_local_experts``); None for a dense model."""
    for name in ("num_experts", "num_local_experts"):
        value = getattr(text_config, name, None)
        if value is not None:
            return int(value)
    return None


def _takes_mask() -> bool:
    """Whether transformers' models take a boolean ``logits_to_keep`` mask (``slice_logits_to_keep``, 5.21+)."""
    from transformers import modeling_utils

    return hasattr(modeling_utils, "slice_logits_to_keep")


def masked_logits(model: torch.nn.Module, inputs: dict[str, Any], keep: torch.Tensor,
                  **kwargs: Any) -> tuple[Any, torch.Tensor]:
    """The model's output and its logits ``(keep.sum(), vocab)`` at the True positions of the boolean ``keep``
    ``(batch, length)``, in row-major order; only those hidden states go through ``lm_head``. transformers
    before 5.21 takes positions only: there the columns any row keeps are projected, then the mask selects. An
    integer ``keep`` holds the positions of a one-row batch (what :func:`forward_loss` passes: boolean indexing on a
    GPU reads the count back to the host)."""
    if keep.dtype != torch.bool or _takes_mask():  # positions of a one-row batch (no host sync), or a mask it takes
        out = model(**inputs, logits_to_keep=keep, **kwargs)
        return out, out.logits.reshape(-1, out.logits.shape[-1])
    columns = keep.any(0).nonzero().squeeze(1)
    out = model(**inputs, logits_to_keep=columns, **kwargs)
    return out, out.logits[keep[:, columns]]


@dataclass
class LossTerms:
    """What one micro-batch's forward gives the objective."""

    token_sum: torch.Tensor
    """Sum (fp32) of the cross-entropy of every predicted label token."""
    router_aux: torch.Tensor | None = None
    """transformers' load-balancing loss of the forward's router logits (MoE with the router loss on), else None."""


def token_loss_sum(model: torch.nn.Module, batch: dict[str, Any], device: torch.device | str,
                   float_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Sum (fp32) of the cross-entropy of every predicted label token of ``batch`` (see :func:`forward_loss`)."""
    return forward_loss(model, batch, device, float_dtype).token_sum


def forward_loss(model: torch.nn.Module, batch: dict[str, Any], device: torch.device | str,
                 float_dtype: torch.dtype | None = None, *, router_aux: bool = False) -> LossTerms:
    """One forward of ``batch``: the token cross-entropy sum and, with ``router_aux``, the router loss.

    Only the hidden states at predicting positions go through ``lm_head`` (``logits_to_keep`` as a
    boolean mask), so the (tokens x vocabulary) logits of unlabelled positions are never built. The router loss
    is the model's own (``output_router_logits=True``: transformers' ``load_balancing_loss_func`` over every
    layer's router logits, the padding of an unpacked batch excluded by its attention mask, every token of a
    packed row counted, as transformers and LMMS Engine count them).
    """
    mask = target_mask(batch)
    full = torch.zeros_like(batch["labels"], dtype=torch.bool)
    full[:, :-1] = mask
    targets = to_device(batch["labels"][:, 1:][mask], device)
    # one row (packed rows, batch size 1): its label positions, found on the host; else the boolean mask
    keep = to_device(full[0].nonzero().squeeze(1), device) if full.shape[0] == 1 else full.to(device)
    inputs = model_inputs(batch, device, float_dtype)
    if "cu_seqlens" in batch:
        if batch["input_ids"].shape[0] != 1:
            raise ValueError("a packed batch must be one row")
        inputs.pop("attention_mask", None)
        inputs.update(packed_kwargs(batch, device))
    extra = {"output_router_logits": True} if router_aux else {}
    head = fused_loss_head(model) if _takes_mask() or keep.dtype != torch.bool else None
    if head is not None:  # use_liger_kernel: the head returns the token-sum of its fused linear cross-entropy
        head._vlforge_targets = targets
        try:
            out = model(**inputs, logits_to_keep=keep, use_cache=False, **extra)
        finally:
            head._vlforge_targets = None
        token_sum = out.logits
    else:
        out, logits = masked_logits(model, inputs, keep, use_cache=False, **extra)
        token_sum = F.cross_entropy(logits.float(), targets, reduction="sum")
    aux = getattr(out, "aux_loss", None) if router_aux else None
    if router_aux and aux is None:
        raise ValueError(f"{type(model).__name__} returned no aux_loss with output_router_logits=True")
    return LossTerms(token_sum, None if aux is None else aux.float())


def fused_loss_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The output head that computes the loss itself from targets (Liger's fused linear cross-entropy, put there by
    :func:`vlforge.train.liger.apply_liger`), else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head if head is not None and hasattr(head, "_vlforge_targets") else None
