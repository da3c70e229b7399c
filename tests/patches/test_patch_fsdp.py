"""FSDP2 (``fully_shard``) on 2 gloo ranks trains the same with the patch applied before or after sharding."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import torch

import warmstart

WORKER = Path(__file__).with_name("patch_fsdp_worker.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("fsdp")
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(WORKER.parent), os.environ.get("PYTHONPATH")])),
    }
    command = [
        warmstart.python(), "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(WORKER), str(out),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = {mode: torch.load(out / f"{mode}.pt", weights_only=True) for mode in ("stock", "before", "after")}
    runs["wrapped"] = json.loads((out / "wrapped.json").read_text())
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["before", "after"])
def test_fsdp2_patched_training_equals_stock(fsdp_runs: dict[str, dict], mode: str) -> None:
    stock, patched = fsdp_runs["stock"], fsdp_runs[mode]
    assert stock["calls"]["conv3d"] > 0 and stock["calls"]["gemm"] == 0
    assert patched["calls"]["gemm"] > 0, "the patched conv never ran the GEMM forward"
    assert patched["calls"]["conv3d"] == 0, "the patched conv fell back to F.conv3d"
    assert len(patched["losses"]) == len(stock["losses"]) == 3
    assert stock["losses"][-1] != stock["losses"][0]  # the optimiser really moved the weights
    torch.testing.assert_close(
        torch.tensor(patched["losses"]), torch.tensor(stock["losses"]), rtol=1e-5, atol=1e-6
    )
    assert list(patched["weights"]) == list(stock["weights"])
    for run in (stock, patched):  # the patch conv's own weight trained (its gradient flowed through)
        assert (run["weights"]["patch_embed.proj.weight"] - run["initial_proj"]).abs().max() > 1e-4
    for name, value in stock["weights"].items():
        torch.testing.assert_close(patched["weights"][name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_fully_sharded_patched_conv_still_runs_gemm_and_unpatch_refuses(fsdp_runs: dict[str, dict]) -> None:
    wrapped = fsdp_runs["wrapped"]
    assert wrapped["class"] == "FSDPGemmConv3d"
    assert wrapped["patched"] and wrapped["gemm_ran"] and wrapped["shape"] == [6, 8, 1, 1, 1]
    assert "cannot unpatch" in wrapped["unpatch_error"] and "unpatch before wrapping" in wrapped["unpatch_error"]
