"""Helpers of the trainer tests: small configs over the bundled example data, torchrun launches."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
DATASET = REPO / "examples" / "data" / "dataset.yaml"


def tiny_config(output_dir: Path, model_path: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A native config dict: the example data, short rows, a few fp32 steps, no export side effects."""
    cfg: dict[str, Any] = {
        "data": {"dataset_path": str(DATASET)},
        "processor": {"max_pixels": 12544},
        "packing": {"packing": False},
        "video": {"video_max_frames": 4, "video_max_pixels": 3136},
        "model": {"load_from_pretrained_path": str(model_path)},
        "training": {"max_steps": 2, "learning_rate": 1e-3, "adam_epsilon": 1e-3, "seed": 0,
                     "lr_scheduler_type": "constant", "max_grad_norm": None},
        "logging": {"logging_steps": 1},
        "checkpointing": {"output_dir": str(output_dir), "save_steps": 100, "resume": "none"},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_command(config: Path, nproc: int, *overrides: str) -> list[str]:
    """``torchrun`` (or plain ``python -m``) command line of a training run."""
    import warmstart  # tests/ (not on the path of a torchrun worker running test_trainer_sp.py)

    python = warmstart.python()
    if nproc == 1:
        return [python, "-m", "vlforge.train", str(config), *overrides]
    return [python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
            str(free_port()), "-m", "vlforge.train", str(config), *overrides]


def train_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def run_training(config: Path, nproc: int = 1, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(train_command(config, nproc, *overrides), env=train_env(), capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _not_json(token: str) -> None:
    raise AssertionError(f"metrics.jsonl holds {token}, which strict JSON readers (jq, JavaScript) refuse")


def logged(output_dir: Path, key: str) -> list[float]:
    """Every value of ``key`` in the run's ``metrics.jsonl``, in order; every line must be strict JSON."""
    records = [json.loads(line, parse_constant=_not_json) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [record[key] for record in records if key in record]


def wait_for_file(path: Path, procs: list[subprocess.Popen], timeout: float = 600) -> None:
    """Poll until ``path`` exists; fail if a process of ``procs`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        ended = [proc.args for proc in procs if proc.poll() is not None]
        assert not ended, f"ended before {path} was written: {ended}"
        assert time.monotonic() < deadline, f"no {path} after {timeout} s"
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process under ``pid``, warm-started runs included (:func:`warmstart.descendants`)."""
    import warmstart

    return warmstart.descendants(pid)


def kill_launch(proc: subprocess.Popen) -> None:
    """SIGKILL a launch and every process under it, as a crashed host would end them. torchrun starts each
    worker in a session of its own, so killing torchrun (or its process group) alone leaves the workers running."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def exported_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        weights.update(load_file(file))
    assert weights, f"no safetensors in {directory}"
    return weights


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def token_mean_grads(trainer: Any, batches: list[dict]) -> tuple[float, dict[str, torch.Tensor]]:
    """The token-mean loss of ``batches`` through ``trainer.accumulate`` and a copy of every gradient it left."""
    trainer.model.zero_grad(set_to_none=True)
    count, loss_sum = trainer.accumulate(batches)
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return float(loss_sum / count), grads
