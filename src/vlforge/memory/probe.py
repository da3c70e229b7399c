"""Activation memory measured without memory: model pieces run on the ``meta`` device, attention on the host.

:func:`saved_bytes` runs a callable under ``torch.autograd.graph.saved_tensors_hooks`` and adds up the
bytes autograd keeps for the backward (parameters excluded, views counted once). Run on ``meta`` tensors
it costs no memory and no compute, so one text decoder layer or one vision block of a real-size model is
measured in milliseconds from its config alone.

Attention is the exception: which SDPA kernel runs (and whether it keeps the ``L x L`` scores) depends on
the device, dtype and mask, and ``meta`` always takes the math path. The probes therefore swap the
model's attention for a stand-in that saves nothing (:data:`STANDIN`) and :func:`attention_cost` measures
transformers' own SDPA function on the real device with small shapes, split into a part linear in the
sequence and a part quadratic in it, scaled to the model's heads and length.

Example:
    >>> import torch
    >>> cost = attention_cost(torch.device("cpu"), torch.float32, causal=True, masked=False)
    >>> cost.layer_bytes(heads=8, head_dim=64, length=1024) > 0
    True
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

import torch

from vlforge.models.linear_attention import reference_mixers

STANDIN = "vlforge_plan_standin"
"""Attention implementation name of the probes' stand-in (keeps nothing for the backward)."""


def saved_bytes(fn: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """``(bytes autograd saves while running fn(*args, **kwargs), its result)``."""
    seen: dict[int, tuple[torch.Tensor, int]] = {}  # the tensor is held so that its id is not reused

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not isinstance(base, torch.nn.Parameter) and not isinstance(t, torch.nn.Parameter):
            size = base.numel() * base.element_size()
            seen[id(base)] = (base, max(seen.get(id(base), (None, 0))[1], size))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    return sum(size for _, size in seen.values()), out


class AttentionCalls:
    """How often the stand-in attention ran inside :func:`counting_attention` (0: the layer has no softmax
    attention, e.g. a Gated DeltaNet layer)."""

    count = 0


_COUNTERS: list[AttentionCalls] = []


@contextlib.contextmanager
def counting_attention() -> Any:
    """Count the stand-in attention's calls within the block."""
    calls = AttentionCalls()
    _COUNTERS.append(calls)
    try:
        yield calls
    finally:
        _COUNTERS.remove(calls)


def _standin(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             attention_mask: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    for calls in _COUNTERS:
        calls.count += 1
    batch, _heads, length, _dim = query.shape
    heads = query.shape[1]
    out = query.new_empty(batch, length, heads, value.shape[-1])
    return out.requires_grad_(query.requires_grad), None


class _GroupedMatmulStandin(torch.autograd.Function):
    """A grouped expert matmul on meta tensors: the output's shape, and the input kept for the backward as the
    real kernel keeps it (torch's meta kernel of ``grouped_mm`` takes bfloat16 only)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x.new_empty(x.shape[0], weight.shape[-1])

    @staticmethod
    def backward(ctx, grad):  # never run: the probes only count what the forward keeps
        x, weight = ctx.saved_tensors
        return grad.new_empty(x.shape), grad.new_empty(weight.shape)


@contextlib.contextmanager
def meta_experts() -> Any:
    """Within the block, transformers' grouped expert matmul (MoE layers) runs on meta tensors of any dtype."""
    try:
        from transformers.integrations import moe
    except ImportError:  # a transformers without its MoE integration: nothing to bridge
        yield
        return
    original = getattr(moe, "_grouped_mm", None)
    if original is None:
        yield
        return

    def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
        if x.is_meta and weight.dtype != torch.bfloat16:
            return _GroupedMatmulStandin.apply(x.to(weight.dtype), weight)
        return original(x, weight, offs)

    moe._grouped_mm = grouped_mm
    try:
        yield
    finally:
        moe._grouped_mm = original


@contextlib.contextmanager
def meta_autocast() -> Any:
    """Within the block, ``torch.autocast(device_type="meta", ...)`` is the CPU's (torch has no autocast for meta
    tensors): peft's LoRA on MoE expert parameters builds its delta weight under one, which the probe must run."""
    original = torch.autocast

    class Autocast(original):  # type: ignore[misc, valid-type]
        def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
            super().__init__("cpu" if device_type == "meta" else device_type, *args, **kwargs)

    torch.autocast = Autocast
    try:
        yield
    finally:
        torch.autocast = original


def register_standin() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(STANDIN, _standin)


@dataclass(frozen=True)
class AttentionCost:
    """Bytes SDPA keeps: per head ``linear`` per (token x head_dim), ``per_token`` per token and ``quadratic``
    per token pair (the math kernel's scores); per call ``pair`` per token pair (a mask converted inside the
    call); ``shared`` per token pair once per forward (a mask built once and kept by every layer)."""

    linear: float
    per_token: float
    quadratic: float
    pair: float
    shared: float

    def layer_bytes(self, *, heads: int, head_dim: int, length: int, segments: int = 1) -> int:
        """One layer: ``heads`` query heads over ``length`` tokens attending within ``segments`` equal pieces."""
        pairs = length * length / max(segments, 1)
        return int(heads * (self.linear * length * head_dim + self.per_token * length + self.quadratic * pairs)
                   + self.pair * length * length)

    def shared_bytes(self, length: int) -> int:
        """Kept once per forward whatever the number of layers (the mask)."""
        return int(self.shared * length * length)


@functools.lru_cache(maxsize=32)
def attention_cost(device: torch.device, dtype: torch.dtype, *, causal: bool, masked: bool) -> AttentionCost:
    """Measure transformers' SDPA attention on ``device`` (what the training run will call) at small shapes.

    ``masked``: a boolean block-causal mask is passed (packed rows, padded batches), else ``is_causal``
    (one unpadded sequence) or nothing (vision blocks, ``causal=False``).
    """
    import numpy as np
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    class Stub(torch.nn.Module):
        is_causal = causal
        num_key_value_groups = 1

    def run(length: int, head_dim: int, heads: int, calls: int = 1) -> int:
        mask = None
        if masked:
            idx = torch.arange(length, device=device)
            half = idx >= length // 2
            mask = ((half[:, None] == half[None, :]) & (idx[None, :] <= idx[:, None]))[None, None]

        def layers() -> None:
            for _ in range(calls):
                q, k, v = (torch.zeros(1, heads, length, head_dim, device=device, dtype=dtype, requires_grad=True)
                           for _ in range(3))  # values do not matter, and zeros leave the RNG untouched
                sdpa_attention_forward(Stub(), q, k, v, mask, dropout=0.0, scaling=None,
                                       is_causal=causal if not masked else None)
        return saved_bytes(layers)[0]

    shapes = [(64, 16, 2), (128, 16, 2), (64, 32, 2), (64, 16, 4), (128, 16, 4), (96, 32, 4)]
    rows = [[h * n * d, h * n, h * n * n, n * n] for n, d, h in shapes]
    measured = [run(*shape) for shape in shapes]
    coef = np.linalg.lstsq(np.asarray(rows, float), np.asarray(measured, float), rcond=None)[0]
    linear, per_token, quadratic, square = (max(float(c), 0.0) for c in coef)
    # the head-independent square term: converted in each call (kept per layer) or once (kept once)?
    n, d, h = shapes[0]
    second = run(n, d, h, calls=2) - measured[0]
    per_call = h * (linear * n * d + per_token * n + quadratic * n * n)
    pair = min(max((second - per_call) / (n * n), 0.0), square)
    return AttentionCost(linear, per_token, quadratic, pair, square - pair)


# -- the model's pieces on meta -------------------------------------------------------------------------
def meta_model(config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The model of ``config`` on the ``meta`` device in ``dtype``, its attention swapped for the stand-in."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    register_standin()
    cls = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    with torch.device("meta"):
        model = cls.from_config(config, dtype=dtype, attn_implementation=STANDIN)
    return model


def find_stack(model: torch.nn.Module, kind: str) -> tuple[torch.nn.Module, torch.nn.ModuleList] | None:
    """``(owner, layers)``: the text decoder (``kind="text"``: holds ``layers`` and ``rotary_emb``) or the vision
    tower (``kind="vision"``: holds ``blocks``), or None when the model has none."""
    attr = "layers" if kind == "text" else "blocks"
    for _name, module in model.named_modules():
        stack = getattr(module, attr, None)
        if isinstance(stack, torch.nn.ModuleList) and len(stack) and (kind == "vision" or hasattr(module, "rotary_emb")):
            return module, stack
    return None


def _meta(*shape: int, dtype: torch.dtype, grad: bool = False) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def layer_kinds(layers: torch.nn.ModuleList) -> list[tuple[int, int]]:
    """``(index of the first, count)`` per kind of layer in a stack: layers whose module classes differ (a dense
    layer before MoE ones, GLM-4.5V; linear beside full attention, Qwen3.5) keep different activations."""
    kinds: dict[tuple[str, ...], list[int]] = {}
    for index, layer in enumerate(layers):
        kinds.setdefault(tuple(type(m).__name__ for m in layer.modules()), []).append(index)
    return [(indexes[0], len(indexes)) for indexes in kinds.values()]


def _text_layer_call(model: torch.nn.Module, length: int, dtype: torch.dtype, input_grad: bool,
                     index: int = 0) -> tuple[Any, tuple, dict]:
    owner, layers = find_stack(model, "text")
    hidden = _meta(1, length, owner.config.hidden_size, dtype=dtype, grad=input_grad)
    positions = torch.zeros(3, 1, length, dtype=torch.long, device="meta")
    try:
        cos, sin = owner.rotary_emb(hidden, positions)
    except (RuntimeError, ValueError, IndexError):
        cos, sin = owner.rotary_emb(hidden, positions[0])
    return layers[index], (hidden,), {"attention_mask": None, "position_ids": positions,
                                  "position_embeddings": (cos.detach(), sin.detach())}


def text_layer_bytes(model: torch.nn.Module, length: int, dtype: torch.dtype, *, input_grad: bool = True,
                     measure: Any = None, index: int = 0) -> int:
    """Bytes text decoder layer ``index`` keeps for the backward over ``length`` tokens (attention excluded).

    ``measure``: the counter (default :func:`saved_bytes`; :func:`selective_bytes` for selective checkpointing).
    """
    layer, args, kwargs = _text_layer_call(model, length, dtype, input_grad, index)
    # linear attention in torch (its kernels must never see meta tensors); MoE experts' matmul in any dtype
    with reference_mixers(model), meta_experts(), meta_autocast():
        return (measure or saved_bytes)(layer, *args, **kwargs)[0]


def vision_block_bytes(model: torch.nn.Module, patches: int, dtype: torch.dtype, *, measure: Any = None) -> int:
    """Bytes one vision block keeps for the backward over ``patches`` patches of one image (attention excluded)."""
    measure = measure or saved_bytes
    owner, blocks = find_stack(model, "vision")
    cfg = owner.config
    width = getattr(cfg, "embed_dim", None) or cfg.hidden_size  # Qwen2-VL: embed_dim is the tower width
    heads = cfg.num_heads
    hidden = _meta(patches, width, dtype=dtype, grad=True)
    rotary = _meta(patches, width // heads, dtype=dtype)
    cu = torch.tensor([0, patches], dtype=torch.int32)
    block = blocks[0]
    try:
        return measure(block, hidden, cu_seqlens=cu, position_embeddings=(rotary, rotary))[0]
    except TypeError:  # older signatures take rotary_pos_emb
        return measure(block, hidden, cu_seqlens=cu, rotary_pos_emb=_meta(patches, width // heads // 2,
                                                                           dtype=torch.float32))[0]


def selective_bytes(fn: Any, *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """``(bytes selective checkpointing keeps while running fn(*args, **kwargs), its result)``: the outputs of the
    ops :func:`vlforge.models.blocks.selective_policy` saves (the block's input is counted by the caller)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from vlforge.models.blocks import SAVED_OPS

    class Kept(TorchDispatchMode):
        total = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in SAVED_OPS:
                Kept.total += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            return out

    with Kept():
        out = fn(*args, **kwargs)
    return Kept.total, out


def loss_bytes(model: torch.nn.Module, labels: int, dtype: torch.dtype) -> int:
    """Bytes kept by the final norm, ``lm_head`` at ``labels`` positions and the fp32 cross-entropy."""
    owner, _layers = find_stack(model, "text")
    head = model.get_output_embeddings()
    hidden = _meta(1, labels, owner.config.hidden_size, dtype=dtype, grad=True)

    def tail(x: torch.Tensor) -> torch.Tensor:
        logits = head(owner.norm(x) if hasattr(owner, "norm") else x)
        target = torch.zeros(labels, dtype=torch.long, device="meta")
        return torch.nn.functional.cross_entropy(logits.reshape(labels, -1).float(), target, reduction="sum")

    return saved_bytes(tail, hidden)[0]
