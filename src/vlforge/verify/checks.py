"""Numerical comparisons used by ``vlforge verify``: differences, cosines, KL, top-k, reference errors.

Example:
    >>> import torch
    >>> from vlforge.verify.checks import abs_diff, cosine, logits_agreement
    >>> a = torch.tensor([1.0, 2.0, 3.0])
    >>> abs_diff(a, a + 1e-3)["max"] < 2e-3, round(cosine(a, 2 * a), 6)
    (True, 1.0)
    >>> logits = torch.randn(1, 4, 10)
    >>> logits_agreement(logits, logits)["top1"]
    1.0
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def abs_diff(a: torch.Tensor, b: torch.Tensor) -> dict[str, float]:
    """Max and mean absolute difference, computed in fp64."""
    diff = (a.detach().double() - b.detach().double()).abs()
    return {"max": float(diff.max()), "mean": float(diff.mean())}


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine similarity of the flattened tensors, computed in fp64 (1.0 for two zero tensors)."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    norms = a.norm() * b.norm()
    if norms == 0:
        return 1.0 if torch.equal(a, b) else 0.0
    return float((a @ b) / norms)


def reference_error(value: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """Max abs error and relative RMS error (``||value - ref|| / ||ref||``) against a reference."""
    value, reference = value.detach(), reference.detach()
    diff = value.double() - reference.double()
    scale = reference.double().norm()
    return {"max_abs": float(diff.abs().max()),
            "relative_rms": float(diff.norm() / scale) if scale > 0 else float(diff.norm())}


def logits_agreement(stock: torch.Tensor, patched: torch.Tensor, *, k: int = 5) -> dict[str, Any]:
    """KL(stock || patched) per position (mean and max), top-1 agreement, top-k set agreement.

    Both ``(batch, seq, vocab)``; every position counts. Top-k agreement is the fraction of positions
    whose ``k`` highest logits are the same set of tokens.
    """
    stock = stock.float().flatten(0, -2)
    patched = patched.float().flatten(0, -2)
    log_p = F.log_softmax(stock, dim=-1)
    log_q = F.log_softmax(patched, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0)
    top1 = (stock.argmax(-1) == patched.argmax(-1)).double().mean()
    k = min(k, stock.shape[-1])
    top_s = stock.topk(k, dim=-1).indices.sort(-1).values
    top_p = patched.topk(k, dim=-1).indices.sort(-1).values
    topk = (top_s == top_p).all(-1).double().mean()
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1": float(top1), "topk": float(topk),
            "k": k, "positions": int(stock.shape[0])}


def split_pooled(features: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Mean over each sample's rows (``sizes`` rows per sample, in order)."""
    if sum(sizes) != features.shape[0]:
        raise ValueError(f"{features.shape[0]} feature rows do not split into samples of {sizes}")
    return [chunk.double().mean(0) for chunk in torch.split(features, sizes)]
