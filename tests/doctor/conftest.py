"""Doctor test helpers: small real modules with Qwen-shaped patch convolutions."""

from __future__ import annotations

import pytest
import torch
from torch import nn


class PatchEmbed3d(nn.Module):
    """A Qwen-VL-style vision patch embedding: rows of flattened windows -> Conv3d(stride == kernel)."""

    def __init__(self, in_channels: int = 3, hidden: int = 16, kernel: tuple[int, int, int] = (2, 4, 4)) -> None:
        super().__init__()
        self.kernel = kernel
        self.proj = nn.Conv3d(in_channels, hidden, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, self.proj.in_channels, *self.kernel)
        return self.proj(x).view(x.shape[0], -1)


class TinyVision(nn.Module):
    """Two patch embeddings of different shapes plus unrelated layers."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed3d()
        self.video_embed = PatchEmbed3d(hidden=8, kernel=(2, 2, 2))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)


@pytest.fixture
def tiny_vision() -> TinyVision:
    return TinyVision()


@pytest.fixture
def patch_model() -> PatchEmbed3d:
    return PatchEmbed3d()


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tiny_checkpoint):
    """The tiny Qwen3-VL checkpoint (real transformers classes, random weights), loaded with its processor."""
    from vlforge.models import load

    return load(tiny_checkpoint("qwen3_vl"))
