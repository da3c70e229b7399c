"""Paths and snippets shared by the config tests: the guide YAMLs and the bad-config corpus."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SEEDS = Path("/work/shared/seeds")
GUIDE_NAMES = ("lmms_guide_qwen2_5_vl.yaml", "lmms_guide_qwen3_vl.yaml")
BAD_CONFIGS = sorted((HERE / "bad_configs").glob("*.yaml"))

#: The smallest valid native config.
MINIMAL = "data: {dataset_path: examples/data/dataset.yaml}\nmodel: {load_from_pretrained_path: tiny:qwen3_vl}\n"


def guide_path(name: str) -> Path:
    """The published guide YAML: from the seeds directory if present, else our verbatim copy."""
    seed = SEEDS / name
    return seed if seed.is_file() else HERE / "guide_configs" / name
