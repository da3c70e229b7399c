"""Two "nodes" on one machine: two torchrun launchers, one process each, joined by a c10d rendezvous on the
loopback interface (gloo on CPU; slow). What a user runs on two hosts, with 127.0.0.1 for the first host."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import torch
from trainkit import (
    REPO,
    descendants,
    exported_weights,
    free_port,
    kill_launch,
    logged,
    max_abs_diff,
    run_training,
    tiny_config,
    train_env,
    wait_for_file,
    write_config,
)

import warmstart

pytestmark = pytest.mark.slow

TIMEOUT = 300
"""Seconds any launch may take; every wait is bounded, so a hang fails the test instead of the suite."""


def node_command(config: Path, node_rank: int, port: int, rdzv_id: str, *overrides: str) -> list[str]:
    """Node ``node_rank`` of 2; node 0 hosts the rendezvous store (both match 127.0.0.1, so it is named)."""
    conf = f"is_host={int(node_rank == 0)},join_timeout={TIMEOUT // 2}"
    return [warmstart.python(), "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node_rank),
            "--nproc_per_node", "1", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
            "--rdzv_id", rdzv_id, "--rdzv_conf", conf, "--local_addr", "127.0.0.1", "--max_restarts", "0",
            "-m", "vlforge.train", str(config), *overrides]


def start_nodes(config: Path, logs: Path, *overrides: str) -> list[subprocess.Popen]:
    """Both nodes, each a torchrun with its own environment and log file."""
    port, rdzv_id = free_port(), uuid.uuid4().hex
    logs.mkdir(parents=True, exist_ok=True)
    nodes = []
    for node in (0, 1):
        env = {**train_env(), "GLOO_SOCKET_IFNAME": "lo"}
        with open(logs / f"node{node}.log", "wb") as log:
            nodes.append(subprocess.Popen(node_command(config, node, port, rdzv_id, *overrides), env=env, cwd=REPO,
                                          stdout=log, stderr=subprocess.STDOUT))
    return nodes


def wait_nodes(nodes: list[subprocess.Popen], logs: Path) -> list[int]:
    """Exit codes of both nodes; a node still running after TIMEOUT is killed (with its workers) and fails."""
    deadline = time.monotonic() + TIMEOUT
    try:
        return [node.wait(timeout=max(deadline - time.monotonic(), 0.1)) for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            kill_launch(node)
        pytest.fail(f"a node hung: {node_logs(logs)[-3000:]}")


def node_logs(logs: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')}" for path in sorted(logs.glob("*.log")))


def test_two_nodes_equal_one_process_and_survive_a_killed_node(tmp_path, tiny_checkpoint):
    model_path = tiny_checkpoint("qwen3_vl")
    cfg = tiny_config(tmp_path / "nodes", model_path, training={"max_steps": 2, "max_grad_norm": 1.0},
                      checkpointing={"save_steps": 1, "resume": "auto"},
                      model={"token_audit": False, "memory_plan": False})
    config = write_config(tmp_path / "run.yaml", cfg)

    # The single-node result: one process, 2 micro-batches a step (== 2 processes on one node: test_trainer_distributed).
    reference = tmp_path / "one"
    run_training(config, 1, f"checkpointing.output_dir={reference}", "training.gradient_accumulation_steps=2")

    # 1. Two nodes train to the end: the same losses, gradient norms and exported weights.
    out, logs = tmp_path / "nodes", tmp_path / "logs"
    codes = wait_nodes(start_nodes(config, logs), logs)
    assert codes == [0, 0], node_logs(logs)[-4000:]
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["world_size"] == 2
    assert len(logged(out, "loss")) == 2
    assert logged(out, "loss") == pytest.approx(logged(reference, "loss"), rel=1e-5)
    assert logged(out, "grad_norm") == pytest.approx(logged(reference, "grad_norm"), rel=1e-5)
    assert min(logged(out, "grad_norm")) > 1.0  # clipped by the norm over both nodes' shards
    final, final_ref = exported_weights(out / "final"), exported_weights(reference / "final")
    assert max_abs_diff(final_ref, exported_weights(model_path)) > 1e-4  # training moved the weights ...
    assert max_abs_diff(final, final_ref) < 1e-6  # ... as one process did

    # 2. Node 1 is killed (its torchrun and its worker) after checkpoint-1; node 0 must fail, not hang.
    killed, killed_logs = tmp_path / "killed", tmp_path / "killed-logs"
    override = f"checkpointing.output_dir={killed}"
    nodes = start_nodes(config, killed_logs, override)
    try:
        wait_for_file(killed / "checkpoint-1", nodes, TIMEOUT)
    except AssertionError:
        for node in nodes:
            kill_launch(node)
        raise AssertionError(node_logs(killed_logs)[-4000:]) from None
    workers = descendants(nodes[1].pid)
    assert workers, "node 1 has no worker to kill"
    kill_launch(nodes[1])  # the torchrun agent and its worker (which runs in a session of its own)
    codes = wait_nodes(nodes, killed_logs)
    assert codes[1] == -signal.SIGKILL and codes[0] != 0, node_logs(killed_logs)[-4000:]
    assert not (killed / "final").exists() and not (killed / "checkpoint-2").exists()  # really interrupted
    assert "trained" not in (killed_logs / "node1.log").read_text(errors="replace")  # its worker died too

    # Both nodes relaunched as they were (resume: auto): they continue from the newest complete checkpoint.
    resumed_logs = tmp_path / "resumed-logs"
    codes = wait_nodes(start_nodes(config, resumed_logs, override), resumed_logs)
    assert codes == [0, 0], node_logs(resumed_logs)[-4000:]
    assert f"resumed from {killed / 'checkpoint-1'}" in node_logs(resumed_logs)
    final_resumed = exported_weights(killed / "final")
    assert final_resumed.keys() == final.keys()
    assert all(torch.equal(final_resumed[k], final[k]) for k in final)  # bit-identical to the uninterrupted run
    assert logged(killed, "loss")[-1] == logged(out, "loss")[-1]
