"""Process group set-up for training: :mod:`vlforge.dist` (one context shared by train and extract).

The backend follows the device: nccl when CUDA is available, gloo otherwise. Single-process runs
create no process group at all.

Example:
    >>> ctx = init_distributed()
    >>> ctx.world_size, ctx.rank, ctx.device.type
    (1, 0, 'cpu')
"""

from __future__ import annotations

from vlforge.dist import DistContext, init_distributed

__all__ = ["DistContext", "init_distributed"]
