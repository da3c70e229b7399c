"""Per-sample attention for packed rows without flash-attn: no dense mask across samples, on CPU and CUDA.

Registered with transformers as attention implementation ``vlforge_varlen`` (and a mask function that builds
no ``L x L`` mask). A packed row's sample boundaries arrive as transformers' own ``cu_seq_lens_q`` keyword
(the one its flash-attention path reads); each sample then attends causally to itself only, through
``torch.nn.attention.varlen.varlen_attn`` on CUDA where the installed torch has it (bf16/fp16; causal through
whichever keyword that torch's signature has), else one
``scaled_dot_product_attention`` call per sample. Without ``cu_seq_lens_q`` a row is one causal sequence; a
padding mask falls back to transformers' SDPA path. Memory grows with the sum of the samples' squared
lengths at most (SDPA's math kernel), never with the row's, and the dense-mask kernels are never used.

Under ``torch.compile`` the packed call is one opaque op, ``torch.ops.vlforge.packed_attention`` (its sample
bounds are host-side Python, which dynamo would otherwise break the graph on or specialise per row): a compiled
decoder layer stays one graph, and a checkpointed one can be compiled around its checkpoint. Its backward runs
the same attention again under autograd (one more attention forward per layer: under 1% of a layer's training
FLOPs for 1k-token samples, about 4% for 8k-token ones at width 4096); eager training never goes through the op.

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

from vlforge.models.opaque import (
    autocast_inputs,
    grad_shapes,
    grads_or_none,
    recomputed_grads,
    same_tensor,
    version,
)

logger = logging.getLogger(__name__)

ATTENTION_NAME = "vlforge_varlen"

VISION_ATTENTION_NAME = "vlforge_varlen_flash_layout"
"""The same attention for a vision tower (bidirectional, per image). transformers hands a vision block its images'
bounds (``cu_seq_lens_q``) only when the implementation's name contains "flash" (otherwise its SDPA path splits the
images on the host, a graph break under compile); this name takes them in flash-attention's layout."""


_RECENT: list[tuple[torch.Tensor, int | None, int, tuple[list[tuple[int, int]], bool]]] = []
"""The last few ``(cu_seqlens tensor, its version, row length, bounds)``: every layer of a forward gets the same
tensor (the text row's, and under compile the vision tower's: Qwen2.5-VL's two, window and full), so its
(host-syncing) read happens once per forward, not per layer."""
_KEPT = 4


def _remember(cu_seqlens: torch.Tensor, length: int, bounds: tuple[list[tuple[int, int]], bool]) -> None:
    _RECENT[:] = [(cu_seqlens, version(cu_seqlens), length, bounds), *_RECENT[:_KEPT - 1]]


def prime(cu_seqlens: torch.Tensor, host: torch.Tensor, length: int) -> None:
    """Tell the layers the bounds of ``cu_seqlens`` (a device tensor) from its ``host`` copy: the forward over a row
    of ``length`` tokens then reads no bounds back from the device (no host sync)."""
    _remember(cu_seqlens, length, _split([int(x) for x in host.tolist()], length))


def _split(cu: list[int], length: int) -> tuple[list[tuple[int, int]], bool]:
    out = [(a, b) for a, b in itertools.pairwise(cu) if b > a]
    tail = cu[-1] < length
    if tail:  # a pad tail (pad_to_packing_length): its tokens attend to themselves only
        out.append((cu[-1], length))
    return out, tail


def _bounds(cu_seqlens: torch.Tensor, length: int) -> tuple[list[tuple[int, int]], bool]:
    """``([start, end) per sample, whether a pad tail beyond the last sample was added)``."""
    for tensor, known_version, known_length, bounds in _RECENT:
        if known_length == length and same_tensor(tensor, known_version, cu_seqlens):
            return bounds
    found = _split([int(x) for x in cu_seqlens.tolist()], length)
    _remember(cu_seqlens, length, found)
    return found


def _cuda_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, longest: int,
                 scale: float | None, causal: bool) -> Any:
    """(L, H, D) packed varlen attention through torch's own kernel, or None where it cannot run."""
    if q.device.type != "cuda" or q.dtype not in (torch.bfloat16, torch.float16):
        return None
    options = _kernel_options(causal)
    if options is None:
        return None
    from torch.nn.attention.varlen import varlen_attn

    cu32 = cu.to(device=q.device, dtype=torch.int32)
    if "scale" in options:
        options = {**options, "scale": scale}
    return varlen_attn(q, k, v, cu32, cu32, longest, longest, **options)


_OPTIONS: list[Any] = []
"""Cached :func:`_kernel_options` answers (causal, bidirectional) once computed."""


def _kernel_options(causal: bool) -> dict[str, Any] | None:
    """Keyword arguments that make this torch's ``varlen_attn`` causal (or leave it bidirectional), or None when
    it has no such kernel.

    torch spells causal ``window_size=(-1, 0)`` (2.11 and later) or ``is_causal=True`` (earlier); a signature with
    neither is not used for causal attention, since a non-causal call would silently let tokens see the future.
    Both spell bidirectional as their default.
    """
    if not _OPTIONS:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            _OPTIONS.extend([None, None])
            return None
        params = inspect.signature(varlen_attn).parameters
        if "window_size" in params:
            options: dict[str, Any] | None = {"window_size": (-1, 0)}
        elif "is_causal" in params:
            options = {"is_causal": True}
        else:
            options = None
        scale = {"scale": None} if "scale" in params else {}
        _OPTIONS.extend([None if options is None else {**options, **scale}, scale])
    return _OPTIONS[0 if causal else 1]


def varlen_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """(B, H, L, D) q/k/v in, (B, L, H, D) out; see the module docstring. Causal unless the caller says
    ``is_causal=False`` or its module is not causal (the vision towers: each image attends to itself whole)."""
    cu = kwargs.get("cu_seq_lens_q")
    if attention_mask is not None or (cu is None and query.shape[0] != 1) or dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != heads:
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    if cu is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    if torch.compiler.is_compiling():
        query, key, value = autocast_inputs(query, key, value)  # as SDPA under autocast takes them
        return packed_attention(query, key, value, cu, scaling, causal), None
    return _attend(query, key, value, cu, scaling, causal), None


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu: torch.Tensor,
            scaling: float | None, causal: bool = True) -> torch.Tensor:
    """Attention of each sample of a packed row to itself only: (1, H, L, D) q/k/v (as many kv heads as query
    heads) in, (1, L, H, D) out."""
    length = query.shape[2]
    bounds, padded_tail = _bounds(cu, length)
    if bounds == [(0, length)]:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling)
        return out.transpose(1, 2).contiguous()
    if not padded_tail:  # torch's kernel takes the boundaries as they are
        longest = max(b - a for a, b in bounds)
        fused = _cuda_varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu, longest,
                             scaling, causal)
        if fused is not None:
            return fused[None]
    pieces = [F.scaled_dot_product_attention(query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], is_causal=causal,
                                             scale=scaling) for a, b in bounds]
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous()


@torch.library.custom_op("vlforge::packed_attention", mutates_args=())
def packed_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     scale: float | None, causal: bool) -> torch.Tensor:
    """:func:`_attend` as one op for ``torch.compile`` (the module docstring says why)."""
    return _attend(query, key, value, cu_seqlens, scale, causal).contiguous()


@packed_attention.register_fake
def _packed_attention_shape(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                            scale: float | None, causal: bool) -> torch.Tensor:
    return query.new_empty(query.shape[0], query.shape[2], query.shape[1], query.shape[3])


@torch.library.custom_op("vlforge::packed_attention_backward", mutates_args=())
def _packed_attention_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               cu_seqlens: torch.Tensor, scale: float | None, causal: bool,
                               needed: list[bool]) -> list[torch.Tensor]:
    """Gradients of :func:`packed_attention`: the forward again under autograd, then its backward."""
    return recomputed_grads(lambda q, k, v: _attend(q, k, v, cu_seqlens, scale, causal), [query, key, value], grad,
                            needed)


@_packed_attention_backward.register_fake
def _packed_attention_backward_shape(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                     cu_seqlens: torch.Tensor, scale: float | None, causal: bool,
                                     needed: list[bool]) -> list[torch.Tensor]:
    return grad_shapes([query, key, value], needed)


def _keep_inputs(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    query, key, value, cu_seqlens, scale, causal = inputs
    ctx.save_for_backward(query, key, value, cu_seqlens)
    ctx.scale, ctx.causal = scale, causal


def _packed_grads(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    query, key, value, cu_seqlens = ctx.saved_tensors
    needed = list(ctx.needs_input_grad[:3])
    grads = _packed_attention_backward(grad.contiguous(), query, key, value, cu_seqlens, ctx.scale, ctx.causal,
                                       needed)
    return *grads_or_none(grads, needed), None, None, None


packed_attention.register_autograd(_packed_grads, setup_context=_keep_inputs)


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

    for name in (ATTENTION_NAME, VISION_ATTENTION_NAME):
        AttentionInterface.register(name, varlen_attention)
        AttentionMaskInterface.register(name, _no_mask)
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


def use_for_vision(model: torch.nn.Module) -> bool:
    """Switch the vision tower of ``model`` from SDPA to :data:`VISION_ATTENTION_NAME` (the same per-image
    attention as one op: what ``model.compile`` needs to compile a vision block whole); False when the tower uses
    another implementation (flash-attn's takes the bounds itself) or the model has none."""
    config = getattr(model, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is None or vision._attn_implementation != "sdpa":
        return False
    register()
    vision._attn_implementation = VISION_ATTENTION_NAME
    logger.info("vision tower: per-image attention as one op (%s)", VISION_ATTENTION_NAME)
    return True
