"""One distributed context for every job: one process, or torchrun's ``WORLD_SIZE`` processes over gloo / nccl.

``init_distributed()`` joins torchrun's process group (creating it when needed) and returns a
:class:`DistContext`: rank, world size, device, and the few collectives vlforge uses (barrier, sums,
min, object broadcast and gather). Objects travel over a gloo group, made once when the default
backend is nccl. Single-process runs create no process group at all. Nothing happens at import.

Example:
    >>> ctx = init_distributed()
    >>> ctx.world_size, ctx.rank, ctx.device.type
    (1, 0, 'cpu')
    >>> ctx.broadcast_object({"todo": [1, 2]}), ctx.all_gather_object(3)
    ({'todo': [1, 2]}, [3])
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

TIMEOUT = datetime.timedelta(minutes=30)


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
    _object_group: Any = field(default=None, repr=False)

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

    def object_group(self) -> Any:
        """The group objects travel in: None (the default group) under gloo, else a gloo group made once.

        A collective: every rank calls it the first time together (the object methods do).
        """
        if self._object_group is None and dist.get_backend() != "gloo":
            self._object_group = dist.new_group(backend="gloo")
        return self._object_group

    def broadcast_object(self, payload: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``payload`` on every rank (picklable objects; the value itself in one process)."""
        if not self.distributed:
            return payload
        box = [payload]
        dist.broadcast_object_list(box, src=src, group=self.object_group())
        return box[0]

    def all_gather_object(self, payload: Any) -> list[Any]:
        """Every rank's ``payload``, indexed by rank (``[payload]`` in one process)."""
        if not self.distributed:
            return [payload]
        boxes: list[Any] = [None] * self.world_size
        dist.all_gather_object(boxes, payload, group=self.object_group())
        return boxes

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._object_group = None


def init_distributed(*, backend: str | None = None, device: torch.device | None = None,
                     timeout: datetime.timedelta | None = None) -> DistContext:
    """Join torchrun's process group when ``WORLD_SIZE`` > 1 (creating it when none exists yet).

    ``device``: this process's device (default: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU;
    a CUDA device becomes the current one). ``backend`` of a group created here: default nccl for a
    CUDA device, gloo otherwise. An existing group (any backend) is joined as it is. ``timeout``: how long
    a collective of a group created here may wait (default 30 minutes).
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device is None:
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    cuda = device.type == "cuda"
    if cuda and device.index is not None:
        torch.cuda.set_device(device)
    owns = False
    if world > 1 and not dist.is_initialized():
        backend = backend or ("nccl" if cuda else "gloo")
        dist.init_process_group(backend=backend, timeout=timeout or TIMEOUT,
                                device_id=device if cuda and backend == "nccl" else None)
        owns = True
        logger.info("process group: %s, rank %d of %d", backend, rank, world)
    if dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
    return DistContext(rank, world, local_rank, device, owns)


__all__ = ["DistContext", "init_distributed"]
