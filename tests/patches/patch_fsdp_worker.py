"""FSDP2 worker for ``test_patch_fsdp.py``: trains a tiny Qwen3-VL vision tower three ways on 2 gloo ranks.

Modes: ``stock`` (no patch), ``before`` (patched, then ``fully_shard``), ``after`` (``fully_shard``, then
patched). Rank 0 writes ``OUT_DIR/<mode>.pt`` with the global losses, the full final weights and how
often the GEMM forward and the stock ``F.conv3d`` ran.

Run (what the test does):
    .venv/bin/python -m torch.distributed.run --nproc_per_node=2 --master_addr=127.0.0.1 \
        --master_port=29531 tests/patches/patch_fsdp_worker.py /tmp/fsdp-out
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from patch_tiny_qwen import tiny_vision_config, vision_inputs
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

import vlforge
from vlforge.errors import PatchError
from vlforge.patches import is_patched, patch_embed

STEPS = 3
CALLS = {"gemm": 0, "conv3d": 0}


def _count_paths() -> None:
    gemm, conv3d = patch_embed.gemm_conv_forward, F.conv3d

    def counted_gemm(*args, **kwargs):
        CALLS["gemm"] += 1
        return gemm(*args, **kwargs)

    def counted_conv3d(*args, **kwargs):
        CALLS["conv3d"] += 1
        return conv3d(*args, **kwargs)

    patch_embed.gemm_conv_forward = counted_gemm
    F.conv3d = counted_conv3d  # what nn.Conv3d._conv_forward calls


def train(mode: str, mesh, rank: int) -> dict:
    CALLS.update(gemm=0, conv3d=0)
    torch.manual_seed(0)
    config = tiny_vision_config(depth=2)
    model = Qwen3VLVisionModel(config)
    if mode == "before":
        vlforge.patch(model)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if mode == "after":
        assert isinstance(model.patch_embed.proj.weight, DTensor)
        report = vlforge.patch(model)
        assert report.newly_patched == ["patch_embed.proj"], report.newly_patched
    assert is_patched(model.patch_embed.proj) == (mode != "stock")
    initial_proj = model.patch_embed.proj.weight.full_tensor().detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    losses = []
    for step in range(STEPS):
        inputs = vision_inputs(config, [[1, 4, 4], [1, 2, 4]], seed=100 * rank + step)
        loss = model(**inputs).last_hidden_state.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        global_loss = loss.detach().clone()
        dist.all_reduce(global_loss)
        losses.append(global_loss.item() / dist.get_world_size())
    weights = {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in model.named_parameters()
    }
    return {"losses": losses, "weights": weights, "initial_proj": initial_proj, "calls": dict(CALLS)}


def wrapped_conv_checks(mesh) -> dict:
    """A patched conv that is itself ``fully_shard``-ed stays patched, and unpatch refuses loudly."""
    conv = nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4))
    vlforge.patch(conv)
    fully_shard(conv, mesh=mesh)
    x = torch.randn(6, 3, 2, 4, 4)
    calls = CALLS["gemm"]
    out = conv(x)
    checks = {"class": type(conv).__name__, "patched": is_patched(conv), "gemm_ran": CALLS["gemm"] > calls}
    checks["shape"] = list(out.shape)
    try:
        vlforge.unpatch(conv)
    except PatchError as exc:
        checks["unpatch_error"] = str(exc)
    return checks


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    _count_paths()
    for mode in ("stock", "before", "after"):
        result = train(mode, mesh, rank)
        if rank == 0:
            torch.save(result, out_dir / f"{mode}.pt")
    checks = wrapped_conv_checks(mesh)
    if rank == 0:
        (out_dir / "wrapped.json").write_text(json.dumps(checks))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
