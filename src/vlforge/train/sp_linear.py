"""Ulysses sequence parallelism through Gated DeltaNet linear attention (Qwen3.5, Qwen3.5-MoE).

Each Gated DeltaNet head is independent (its own recurrent state, its own decay and beta) and the short causal conv
is per channel, so the layer splits by heads the way :func:`vlforge.train.sp.ulysses_attention` splits attention:

1. on its sequence shard, each rank runs the layer's input projections (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``,
   ``in_proj_a``) for all heads;
2. one all-to-all turns the conv channels of the rank's key-head group (its query, key and value channels) and its
   heads' ``b`` and ``a`` into the same heads over the *whole* sequence; ranks take consecutive key heads, and with
   them the value heads those key heads serve (``num_v_heads / num_k_heads`` each, as transformers groups them);
3. the conv (the layer's weights of those channels) and the gated delta rule run over the whole sequence with each
   sample's conv window and state starting fresh at its boundary (the samples of a packed row, each row of a padded
   batch, the padding up to the degree) - through the checked kernels of :mod:`vlforge.models.linear_attention` on
   CUDA, transformers' torch functions per sample elsewhere;
4. a second all-to-all gives each rank all heads of its shard back; the gated norm and ``out_proj`` run locally.

The degree must divide ``linear_num_key_heads`` (:func:`vlforge.config.parallel.check_sequence_parallel`).
"""

from __future__ import annotations

import logging
import types
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

from vlforge.models.blocks import any_compiled
from vlforge.models.linear_attention import (
    is_gated_deltanet,
    packed_causal_conv1d,
    packed_delta_rule,
    row_of_bounds,
)
from vlforge.train.sp import SequenceParallel, all_to_all

logger = logging.getLogger(__name__)


def head_channels(module: torch.nn.Module, degree: int, rank: int) -> torch.Tensor:
    """Indices of ``rank``'s conv channels (its query, key and value heads' channels) among the layer's
    ``2 * key_dim + value_dim``, in that order."""
    k_width, v_width = module.key_dim // degree, module.value_dim // degree
    return torch.cat([torch.arange(rank * k_width, (rank + 1) * k_width),
                      module.key_dim + torch.arange(rank * k_width, (rank + 1) * k_width),
                      2 * module.key_dim + torch.arange(rank * v_width, (rank + 1) * v_width)])


def _by_rank(x: torch.Tensor, degree: int) -> torch.Tensor:
    """(B, L, W) -> (B, L, degree, W / degree): consecutive channel groups, one per rank."""
    return x.reshape(*x.shape[:2], degree, -1)


def ulysses_forward(self: torch.nn.Module, hidden_states: torch.Tensor, cache: Any = None,
                    attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """The Gated DeltaNet forward of one sequence shard under Ulysses (see the module docstring)."""
    if kwargs.pop("cache_params", cache) is not None:
        raise ValueError("sequence parallelism is for training: run it with use_cache=False")
    group = self.vlforge_sp_group
    degree, rank = dist.get_world_size(group), dist.get_rank(group)
    rows, shard, _ = hidden_states.shape
    mixed = self.in_proj_qkv(hidden_states)
    query, key, value = torch.split(mixed, [self.key_dim, self.key_dim, self.value_dim], dim=-1)
    parts = [_by_rank(t, degree) for t in (query, key, value, self.in_proj_b(hidden_states),
                                           self.in_proj_a(hidden_states))]
    widths = [p.shape[-1] for p in parts]
    sent = torch.cat(parts, dim=-1).reshape(rows, shard, -1)
    whole = all_to_all(sent, 2, 1, group)  # (B, L, this rank's channels), L = shard * degree
    length = whole.shape[1]
    bounds = kwargs.get("vlforge_sp_bounds")
    if bounds is None or rows != 1:  # padded rows (the mask path): each row is one sample from its first token
        bounds = [(r * length, (r + 1) * length) for r in range(rows)]
    row = row_of_bounds(bounds)
    flat = whole.reshape(1, rows * length, -1)  # rows end to end: the packed machinery restarts each one
    q_part, k_part, v_part, b_part, a_part = torch.split(flat, widths, dim=-1)
    channels = head_channels(self, degree, rank).to(flat.device)
    conv_in = torch.cat([q_part, k_part, v_part], dim=-1).transpose(1, 2)
    mixed = packed_causal_conv1d(self, conv_in, row, channels).transpose(1, 2)
    query, key, value = torch.split(mixed, widths[:3], dim=-1)
    heads = slice(rank * self.num_v_heads // degree, (rank + 1) * self.num_v_heads // degree)
    query = query.reshape(1, rows * length, -1, self.head_k_dim)
    key = key.reshape(1, rows * length, -1, self.head_k_dim)
    value = value.reshape(1, rows * length, -1, self.head_v_dim)
    beta = b_part.sigmoid()
    g = -self.A_log[heads].float().exp() * F.softplus(a_part.float() + self.dt_bias[heads])
    core = packed_delta_rule(self, query, key, value, g, beta, row)  # (1, B * L, heads / degree, head_v_dim)
    core = all_to_all(core.reshape(rows, length, -1, self.head_v_dim), 1, 2, group)  # (B, L / degree, heads, d)
    z = self.in_proj_z(hidden_states).reshape(rows, shard, -1, self.head_v_dim)
    core = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
    return self.out_proj(core.reshape(rows, shard, -1))


def split_linear_attention(model: torch.nn.Module, state: SequenceParallel) -> int:
    """Give every Gated DeltaNet module of ``model`` :func:`ulysses_forward` over ``state``'s group (it replaces the
    packed-row forward: the whole sequence's sample bounds come with the SP keywords). Returns the count; raises
    when the model has none (only a family with linear attention asks)."""
    modules = [m for m in model.modules() if is_gated_deltanet(m)]
    if not modules:
        raise ValueError(f"{type(model).__name__} has no Gated DeltaNet layer to split by heads")
    compiled = any_compiled(model)
    for module in modules:
        if module.num_k_heads % state.degree or module.num_v_heads % module.num_k_heads:
            raise ValueError(f"sp_ulysses_degree {state.degree} cannot split {module.num_k_heads} key / "
                             f"{module.num_v_heads} value heads of the Gated DeltaNet layers")
        module.__dict__.setdefault("_vlforge_stock_forward", module.forward)
        module.vlforge_sp_group = state.group
        forward = types.MethodType(ulysses_forward, module)
        module.forward = torch.compiler.disable(forward) if compiled else forward  # its all-to-alls and bounds
    logger.info("sequence parallel: %d Gated DeltaNet layer(s) split by heads (%d key heads per rank)",
                len(modules), modules[0].num_k_heads // state.degree)
    return len(modules)

