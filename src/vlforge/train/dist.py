"""Process group set-up for training: one process, or torchrun's ``WORLD_SIZE`` processes over gloo / nccl.

The backend follows the device: nccl when CUDA is available, gloo otherwise. Single-process runs
create no process group at all.

Example:
    >>> ctx = init_distributed()
    >>> ctx.world_size, ctx.rank, ctx.device.type
    (1, 0, 'cpu')
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


@dataclass
class DistContext:
    """Where this process sits in the job."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool
    """True when :func:`init_distributed` created the process group (and :meth:`close` destroys it)."""
    sp_degree: int = 1
    """Sequence-parallel degree: groups of ``sp_degree`` consecutive ranks read the same data."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        """This process's data shard (its data-parallel rank)."""
        return self.rank // self.sp_degree

    @property
    def data_world(self) -> int:
        """Number of data shards (the data-parallel size)."""
        return self.world_size // self.sp_degree

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over ranks (a no-op in one process); returns ``tensor``."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_min(self, value: int) -> int:
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
        return int(tensor.item())

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def init_distributed() -> DistContext:
    """Join torchrun's process group when ``WORLD_SIZE`` > 1 (gloo on CPU, nccl with CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if cuda else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30),
                                device_id=device if cuda else None)
        owns = True
        logger.info("process group: %s, rank %d of %d", backend, rank, world)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank, world, local_rank, device, owns)
