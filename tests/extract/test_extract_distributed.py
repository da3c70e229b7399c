"""Scale-out under torchrun (2 CPU processes, gloo): same cache as one process, and finishing another run's cache."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import pytest
from extractkit import cache_files

import warmstart
from vlforge.extract import open_cache, run_extract

FEATURES = ["vision_pooled", "hidden_mean", "hidden_last"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, ckpt, data, out) -> subprocess.CompletedProcess:
    cmd = [warmstart.python(), "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", "-m", "vlforge.extract", "--model", str(ckpt), "--data", str(data),
           "--out", str(out), "--batch-size", "2", "--shard-size", "3", "--features", ",".join(FEATURES),
           "--layers", "1,-1", "--no-progress", "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_processes_equal_one_and_complete_a_partial_cache(tmp_path, qwen3_ckpt, image_dataset):
    single = tmp_path / "single"
    run_extract(model=str(qwen3_ckpt), data=str(image_dataset), out=single, batch_size=2, shard_size=3,
                features=FEATURES, layers=[1, -1])

    double = tmp_path / "double"
    result = _torchrun(2, qwen3_ckpt, image_dataset, double)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(doc) for doc in result.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    assert sorted(r["rank"] for r in reports) == [0, 1]
    assert sum(r["shards_written"] for r in reports) == 6 and all(r["shards_written"] == 3 for r in reports)
    assert cache_files(double) == cache_files(single)

    # a cache left half done by a 1-process run (shards 1, 2, 4 missing) is finished by 2 processes
    partial = tmp_path / "partial"
    shutil.copytree(single, partial)
    for k in (1, 2, 4):
        (partial / "shards" / f"shard-{k:05d}.safetensors").unlink()
        (partial / "shards" / f"shard-{k:05d}.json").unlink()
    result = _torchrun(2, qwen3_ckpt, image_dataset, partial)
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(doc) for doc in result.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    assert sorted(r["shards_written"] for r in reports) == [1, 2]
    assert all(r["shards_reused"] == 3 for r in reports)
    assert cache_files(partial) == cache_files(single)
    assert len(open_cache(partial, verify=True)) == 17
