"""The router's load-balancing loss of a mixture-of-experts model under Ulysses sequence parallelism.

transformers' ``load_balancing_loss_func`` reduces every layer's router logits to three sums over the batch's
tokens (padding excluded by the attention mask): the top-k assignments per expert, the routing probability per
expert, and the token count; the loss is ``num_experts * sum(assignments / count * probability / count)``. It is
not a sum over tokens, so the loss of a sequence shard is not a share of the loss of the sequence. Here each rank
computes the three sums over the real tokens of its shard and the sums are added over the sp group (the
probabilities through an exchange whose backward hands each rank the gradient of its own share), so every rank of a
group holds the loss of the whole sequence and the group's gradients add up to one process's.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class _GroupSum(torch.autograd.Function):
    """Sum over the group; the backward passes the gradient through to this rank's share (every rank computes the
    same function of the sum, so the shares' gradients add up over the group to the whole's)."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def balance_sums(router_logits: tuple[torch.Tensor, ...], keep: torch.Tensor, num_experts: int,
                 top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top-k assignments per expert, routing probability per expert, tokens) over the tokens where ``keep``
    (flattened like the logits' rows) is True, summed over the layers, as transformers counts them."""
    device = router_logits[0].device
    weight = keep.reshape(-1).to(device=device, dtype=torch.float32)
    assigned = torch.zeros(num_experts, dtype=torch.float32, device=device)
    probability = torch.zeros(num_experts, dtype=torch.float32, device=device)
    for logits in router_logits:
        routing = torch.softmax(logits.to(device), dim=-1)
        _, chosen = torch.topk(routing, top_k, dim=-1)
        assigned = assigned.scatter_add(0, chosen.reshape(-1), weight.repeat_interleave(top_k))
        probability = probability + (routing.float() * weight[:, None]).sum(dim=0)
    return assigned, probability, weight.sum() * len(router_logits)


def group_balance_loss(router_logits: tuple[torch.Tensor, ...], keep: torch.Tensor, text_config: Any,
                       group: Any) -> torch.Tensor:
    """The load-balancing loss of the whole sequence from this rank's shard (``keep``: its real tokens)."""
    num_experts = router_logits[0].shape[-1]  # one logit per routed expert, whatever the config calls their count
    assigned, probability, tokens = balance_sums(router_logits, keep, num_experts, text_config.num_experts_per_tok)
    counts = torch.cat([assigned, tokens.reshape(1)])
    dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=group)
    assigned, tokens = counts[:-1], counts[-1]
    probability = _GroupSum.apply(probability, group)
    return torch.sum(assigned / tokens * probability / tokens) * num_experts
