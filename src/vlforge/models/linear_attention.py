"""Packed rows through Gated DeltaNet linear attention (Qwen3.5): each sample's conv window and recurrent state
start fresh at its boundary.

transformers' ``Qwen3_5GatedDeltaNet`` runs its short causal depthwise conv and its gated delta rule over the whole
row: in a packed row every sample's state flows into the next (with restarting position ids it silently leaks;
given ``cu_seq_lens_q`` it refuses without flash-linear-attention, and even with it the conv is never told where a
sample starts). :func:`use_for_packed_rows` gives every Gated DeltaNet module of a model a forward that keeps the
stock projections, gates, gated norm and output projection and splits only the two sequence mixers at the sample
boundaries (the ``cu_seq_lens_q`` keyword vlforge passes for a packed row, as :mod:`vlforge.models.varlen` reads):

- with CUDA tensors and both optional kernels installed (``causal-conv1d``, ``flash-linear-attention``): one
  ``causal_conv1d_fn(..., seq_idx=)`` and one ``chunk_gated_delta_rule(..., cu_seqlens=)`` call per layer, the
  kernels' own packed-sequence arguments;
- anywhere else (CPU, or a kernel missing): transformers' own torch functions once per sample, each with a zero
  conv context and a zero initial state, which is exactly the computation of separate forwards.

Without boundaries (an unpacked batch, generation with a cache) the stock forward runs. The change is on the module
instances only (their class, other models and the checkpoint are untouched); :class:`LinearAttentionPatch.restore`
undoes it.

Example (CPU, seconds):
    >>> from vlforge.models import load                                        # doctest: +SKIP
    >>> patch = use_for_packed_rows(load("tiny:qwen3_5").model)                # doctest: +SKIP
    >>> patch.count                                                            # doctest: +SKIP
    1
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import logging
import sys
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

BOUNDARY_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
"""The packed-row keywords the decoder layer forwards; the stock functions never see them."""


def is_gated_deltanet(module: torch.nn.Module) -> bool:
    """A Gated DeltaNet token mixer of transformers (Qwen3.5, Qwen3.5-MoE): the class name says so."""
    return type(module).__name__.endswith("GatedDeltaNet")


def sample_bounds(cu_seqlens: torch.Tensor, length: int) -> list[tuple[int, int]]:
    """``[start, end)`` of each non-empty sample of a row of ``length`` tokens; a pad tail past the last boundary
    is one more sample (as :mod:`vlforge.models.varlen` treats it)."""
    cu = [int(x) for x in cu_seqlens.reshape(-1).tolist()]
    if not cu or cu[0] != 0:
        cu = [0, *cu]
    if cu[-1] > length:
        raise ValueError(f"the packed row's boundaries end at {cu[-1]} but it has {length} tokens")
    bounds = [(a, b) for a, b in itertools.pairwise(cu) if b > a]
    if cu[-1] < length:
        bounds.append((cu[-1], length))
    return bounds


@dataclass
class _Row:
    """The sample boundaries of the packed row being run, read from its boundary tensor once per forward: every
    Gated DeltaNet layer gets the same tensor object, so the host sync (and the kernels' index tensors) happen once,
    not once per layer."""

    source: Any  # a weak reference to the boundary tensor these were read from
    length: int
    bounds: list[tuple[int, int]]
    index: dict[Any, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def kernel_index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``seq_idx`` (1, T) int32 for causal-conv1d and ``cu_seqlens`` int64 for fla, on ``device``."""
        if device not in self.index:
            lengths = torch.tensor([b - a for a, b in self.bounds])
            seq_idx = torch.repeat_interleave(torch.arange(len(self.bounds), dtype=torch.int32), lengths)
            cu = torch.tensor([0, *(b for _, b in self.bounds)], dtype=torch.long)
            self.index[device] = (seq_idx.reshape(1, -1).contiguous().to(device), cu.to(device))
        return self.index[device]


_LAST_ROW: list[_Row] = []


def _row_of(kwargs: dict[str, Any], length: int) -> _Row | None:
    cu = kwargs.get("cu_seq_lens_q")
    source = cu if cu is not None else kwargs.get("seq_idx")  # or a per-token sample index (DataCollatorWithFlattening)
    if source is None:
        return None
    if _LAST_ROW and _LAST_ROW[0].source() is source and _LAST_ROW[0].length == length:
        return _LAST_ROW[0]
    if cu is None:
        idx = source.reshape(-1)
        starts = (torch.nonzero(idx[1:] != idx[:-1]).reshape(-1) + 1).tolist()
        cu = torch.tensor([0, *starts, idx.numel()])
    row = _Row(weakref.ref(source), length, sample_bounds(cu, length))
    _LAST_ROW[:] = [row]
    return row


@dataclass(frozen=True)
class Kernels:
    """The optional CUDA kernels with packed-sequence arguments (None where not installed)."""

    causal_conv1d_fn: Any = None
    chunk_gated_delta_rule: Any = None

    @property
    def usable(self) -> bool:
        return self.causal_conv1d_fn is not None and self.chunk_gated_delta_rule is not None


_FOUND: list[Kernels] = []


def kernels() -> Kernels:
    """``causal_conv1d.causal_conv1d_fn`` and fla's ``chunk_gated_delta_rule`` where they import (looked up once)."""
    if not _FOUND:
        conv = rule = None
        if importlib.util.find_spec("causal_conv1d") is not None:
            try:
                conv = importlib.import_module("causal_conv1d").causal_conv1d_fn
            except Exception as error:  # a build for another torch/CUDA: absent, and said once
                logger.warning("causal-conv1d does not import here (%s); Gated DeltaNet uses the torch path", error)
        if importlib.util.find_spec("fla") is not None:
            try:
                rule = importlib.import_module("fla.ops.gated_delta_rule").chunk_gated_delta_rule
            except Exception as error:
                logger.warning("flash-linear-attention does not import here (%s); Gated DeltaNet uses the torch "
                               "path", error)
        _FOUND.append(Kernels(conv, rule))
    return _FOUND[0]


def _kernel_path(x: torch.Tensor) -> bool:
    return x.is_cuda and kernels().usable


def packed_causal_conv1d(module: torch.nn.Module, x: torch.Tensor, row: _Row) -> torch.Tensor:
    """The layer's depthwise causal conv over ``x`` (1, C, T), with a zero left context at every sample start."""
    weight, bias = module.conv1d.weight.squeeze(1), module.conv1d.bias
    if _kernel_path(x):
        seq_idx, _ = row.kernel_index(x.device)
        if x.stride(1) != 1:  # causal-conv1d takes seq_idx for a channel-last layout only
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
        return kernels().causal_conv1d_fn(x, weight, bias, seq_idx=seq_idx, activation=module.activation)
    conv = vars(sys.modules[type(module).__module__])["causal_conv1d_fn"]  # transformers' own (torch fallback)
    return torch.cat([conv(x[:, :, a:b], weight, bias, activation=module.activation) for a, b in row.bounds], dim=2)


def packed_delta_rule(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor, row: _Row) -> torch.Tensor:
    """The chunked gated delta rule over (1, T, H, D) inputs with a zero state at every sample start."""
    if _kernel_path(query):
        _, cu = row.kernel_index(query.device)
        out, _ = kernels().chunk_gated_delta_rule(query, key, value, g=g, beta=beta, initial_state=None,
                                                  output_final_state=False, use_qk_l2norm_in_kernel=True,
                                                  cu_seqlens=cu)
        return out
    rule = vars(sys.modules[type(module).__module__])["torch_chunk_gated_delta_rule"]
    pieces = [rule(query[:, a:b], key[:, a:b], value[:, a:b], g=g[:, a:b], beta=beta[:, a:b], initial_state=None,
                   output_final_state=False, use_qk_l2norm_in_kernel=True)[0] for a, b in row.bounds]
    return torch.cat(pieces, dim=1)


def packed_forward(self: torch.nn.Module, hidden_states: torch.Tensor, cache: Any = None,
                   attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """The Gated DeltaNet forward with sample boundaries (see the module docstring)."""
    cache = kwargs.pop("cache_params", cache)  # the stock forward's older name
    row = _row_of(kwargs, hidden_states.shape[1])
    rest = {k: v for k, v in kwargs.items() if k not in BOUNDARY_KEYS}
    if row is None:
        return self._vlforge_stock_forward(hidden_states, cache=cache, attention_mask=attention_mask, **rest)
    if cache is not None:
        raise ValueError("a packed row (cu_seq_lens_q) is for training: run it with use_cache=False")
    if hidden_states.shape[0] != 1:
        raise ValueError(f"a packed batch is one row, got {hidden_states.shape[0]}")
    stock = vars(sys.modules[type(self).__module__])
    hidden_states = stock["apply_mask_to_padding_states"](hidden_states, attention_mask)  # as the stock layer
    return mix(self, hidden_states, row)


def mix(self: torch.nn.Module, hidden_states: torch.Tensor, row: _Row) -> torch.Tensor:
    """Projections, the per-sample conv and delta rule, the gated norm and the output projection of one row."""
    batch, length, _ = hidden_states.shape
    mixed = packed_causal_conv1d(self, self.in_proj_qkv(hidden_states).transpose(1, 2), row).transpose(1, 2)
    z = self.in_proj_z(hidden_states).reshape(batch, length, -1, self.head_v_dim)
    b, a = self.in_proj_b(hidden_states), self.in_proj_a(hidden_states)
    query, key, value = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    query = query.reshape(batch, length, -1, self.head_k_dim)
    key = key.reshape(batch, length, -1, self.head_k_dim)
    value = value.reshape(batch, length, -1, self.head_v_dim)
    beta = b.sigmoid()
    g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
    core = packed_delta_rule(self, query, key, value, g, beta, row)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(batch, length, -1))


@dataclass
class LinearAttentionPatch:
    """The Gated DeltaNet modules given :func:`packed_forward`; :meth:`restore` gives them back their own."""

    modules: list[torch.nn.Module] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.modules)

    def restore(self) -> int:
        for module in self.modules:
            module.__dict__.pop("forward", None)
            module.__dict__.pop("_vlforge_stock_forward", None)
        count, self.modules = len(self.modules), []
        return count


def use_for_packed_rows(model: torch.nn.Module) -> LinearAttentionPatch:
    """Give every Gated DeltaNet module of ``model`` the boundary-aware forward (idempotent; logged). Raises when
    the model has none: only a family with linear attention asks for it."""
    patch = LinearAttentionPatch([m for m in model.modules() if is_gated_deltanet(m)])
    if not patch.modules:
        raise ValueError(f"{type(model).__name__} has no Gated DeltaNet layer to make packed-row aware")
    for module in patch.modules:
        if "_vlforge_stock_forward" not in module.__dict__:
            module._vlforge_stock_forward = module.forward
            module.forward = types.MethodType(packed_forward, module)
    path = "causal-conv1d + flash-linear-attention kernels on CUDA" if kernels().usable else "torch, per sample"
    logger.info("packed rows: %d Gated DeltaNet layer(s) restart their conv and state at each sample (%s)",
                patch.count, path)
    return patch
