"""Per-sample attention for packed rows without flash-attn: no dense mask across samples, on CPU and CUDA.

Registered with transformers as attention implementation ``vlforge_varlen`` (and a mask function that builds
no ``L x L`` mask). A packed row's sample boundaries arrive as transformers' own ``cu_seq_lens_q`` keyword
(the one its flash-attention path reads); each sample then attends causally to itself only, through
``torch.nn.attention.varlen.varlen_attn`` on CUDA where the installed torch has it (bf16/fp16; causal through
whichever keyword that torch's signature has), else one
``scaled_dot_product_attention`` call per sample. Without ``cu_seq_lens_q`` a row is one causal sequence; a
padding mask falls back to transformers' SDPA path. Memory grows with the sum of the samples' squared
lengths at most (SDPA's math kernel), never with the row's, and the dense-mask kernels are never used.

Example:
    >>> import torch
    >>> q = k = v = torch.randn(1, 2, 6, 4)
    >>> out, _ = varlen_attention(None, q, k, v, None, cu_seq_lens_q=torch.tensor([0, 2, 6]))
    >>> first = torch.nn.functional.scaled_dot_product_attention(q[:, :, :2], k[:, :, :2], v[:, :, :2], is_causal=True)
    >>> torch.allclose(out[:, :2].transpose(1, 2), first)
    True
"""

from __future__ import annotations

import inspect
import itertools
import logging
from typing import Any

import torch
from torch.nn import functional as F

logger = logging.getLogger(__name__)

ATTENTION_NAME = "vlforge_varlen"


_LAST: list[Any] = [None, None, None]
"""The last ``cu_seq_lens_q`` tensor, row length and its bounds: every layer of a forward gets the same tensor, so
its (host-syncing) read happens once per forward, not once per layer."""


def prime(cu_seqlens: torch.Tensor, host: torch.Tensor, length: int) -> None:
    """Tell the layers the bounds of ``cu_seqlens`` (a device tensor) from its ``host`` copy: the forward over a row
    of ``length`` tokens then reads no bounds back from the device (no host sync)."""
    _LAST[:] = [cu_seqlens, length, _split([int(x) for x in host.tolist()], length)]


def _split(cu: list[int], length: int) -> tuple[list[tuple[int, int]], bool]:
    out = [(a, b) for a, b in itertools.pairwise(cu) if b > a]
    tail = cu[-1] < length
    if tail:  # a pad tail (pad_to_packing_length): its tokens attend to themselves only, causally
        out.append((cu[-1], length))
    return out, tail


def _bounds(cu_seqlens: torch.Tensor, length: int) -> tuple[list[tuple[int, int]], bool]:
    """``([start, end) per sample, whether a pad tail beyond the last sample was added)``."""
    if _LAST[0] is cu_seqlens and _LAST[1] == length:
        return _LAST[2]
    found = _split([int(x) for x in cu_seqlens.tolist()], length)
    _LAST[:] = [cu_seqlens, length, found]
    return found


def _cuda_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                 scale: float | None) -> Any:
    """(L, H, D) packed varlen attention through torch's own kernel, or None where it cannot run."""
    if q.device.type != "cuda" or q.dtype not in (torch.bfloat16, torch.float16):
        return None
    options = _causal_options()
    if options is None:
        return None
    from torch.nn.attention.varlen import varlen_attn

    cu32 = cu.to(device=q.device, dtype=torch.int32)
    if "scale" in options:
        options = {**options, "scale": scale}
    return varlen_attn(q, k, v, cu32, cu32, longest, longest, **options)


_CAUSAL: list[Any] = []
"""Cached :func:`_causal_options` answer (a one-element list once computed)."""


def _causal_options() -> dict[str, Any] | None:
    """Keyword arguments that make this torch's ``varlen_attn`` causal, or None when it has no such kernel.

    torch spells it ``window_size=(-1, 0)`` (2.11 and later) or ``is_causal=True`` (earlier); a signature with
    neither is not used, since a non-causal call would silently let tokens see the future.
    """
    if not _CAUSAL:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            _CAUSAL.append(None)
            return None
        params = inspect.signature(varlen_attn).parameters
        if "window_size" in params:
            options: dict[str, Any] | None = {"window_size": (-1, 0)}
        elif "is_causal" in params:
            options = {"is_causal": True}
        else:
            options = None
        if options is not None and "scale" in params:
            options["scale"] = None
        _CAUSAL.append(options)
    return _CAUSAL[0]


def varlen_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """(B, H, L, D) q/k/v in, (B, L, H, D) out; see the module docstring."""
    cu = kwargs.get("cu_seq_lens_q")
    if attention_mask is not None or (cu is None and query.shape[0] != 1) or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    length = query.shape[2]
    if cu is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    bounds, padded_tail = _bounds(cu, length)
    if bounds == [(0, length)]:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    if not padded_tail:  # torch's kernel takes the boundaries as they are
        longest = max(b - a for a, b in bounds)
        fused = _cuda_varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu, longest,
                             scaling)
        if fused is not None:
            return fused[None], None
    pieces = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=True,
                                             scale=scaling) for a, b in bounds]
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous(), None


def _no_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """Build no dense mask; a real padding mask goes through transformers' SDPA mask builder."""
    if attention_mask is not None and not bool(attention_mask.all()):
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

        return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, attention_mask=attention_mask, **kwargs)
    return None


def register() -> str:
    """Register the attention and its mask builder with transformers (idempotent); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION_NAME, varlen_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    return ATTENTION_NAME


def use_for_text(model: torch.nn.Module) -> bool:
    """Switch the text decoder of ``model`` to :data:`ATTENTION_NAME` (the vision tower keeps its own); False when
    the model has no separate text config to switch."""
    register()
    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None and hasattr(config, "get_text_config") else None
    if text is None:
        return False
    text._attn_implementation = ATTENTION_NAME
    logger.info("packed rows: per-sample attention (%s: %s)", ATTENTION_NAME,
                "torch varlen kernel on CUDA bf16/fp16, else one SDPA call per sample")
    return True
