"""Helpers of the trainer tests: small configs over the bundled example data, torchrun launches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
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
    if nproc == 1:
        return [sys.executable, "-m", "vlforge.train", str(config), *overrides]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
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
