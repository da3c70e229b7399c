"""Real-size presets: published dimensions on the meta device, accepted wherever a model ref is, refused cleanly."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import warmstart
from vlforge.errors import ConfigError, ModelLoadError
from vlforge.models import preset_config
from vlforge.models.presets import REAL_PRESETS, param_count
from vlforge.models.refs import check_model_ref, model_family

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(REAL_PRESETS))
def test_each_preset_has_its_published_parameter_count_on_meta(name):
    """The count on the meta device matches the checkpoint's published total (and the size in its name)."""
    spec = REAL_PRESETS[name]
    count = param_count(f"real:{name}")
    if spec.published_params is not None:  # Qwen3.5: no source gave the multimodal total, the name's size must do
        assert count == pytest.approx(spec.published_params, rel=0.01), (name, count)
    nominal = float(re.search(r"_(\d+)b(?:_|$)", name)[1]) * 1e9
    assert 0.9 * nominal <= count <= 1.3 * nominal, (name, count)


def test_preset_config_returns_tiny_and_real_configs():
    real = preset_config("real:qwen3_vl_8b")
    assert (real.model_type, real.text_config.hidden_size, real.vision_config.depth) == ("qwen3_vl", 4096, 27)
    assert real.tie_word_embeddings is False
    tiny = preset_config("tiny:qwen2_5_vl")
    assert (tiny.model_type, tiny.text_config.hidden_size) == ("qwen2_5_vl", 64)


def test_refs_accept_real_presets_and_reject_unknown_ones_listing_the_known():
    check_model_ref("real:qwen3_vl_2b@3")
    assert model_family("real:qwen2_5_vl_7b") == "qwen2_5_vl"
    with pytest.raises(ConfigError) as error:
        check_model_ref("real:qwen3_vl_9b")
    message = str(error.value)
    assert "\n" not in message and all(f"real:{name}" in message for name in REAL_PRESETS)


def test_load_refuses_weights_that_do_not_fit(monkeypatch, tmp_path):
    monkeypatch.setenv("VLFORGE_CACHE_DIR", str(tmp_path))
    import importlib

    load_module = importlib.import_module("vlforge.models.load")

    monkeypatch.setattr(load_module, "available_bytes", lambda device: 2**30)
    with pytest.raises(ModelLoadError, match=r"real:qwen3_vl_8b: the fp32 weights need about 3\d\.\d GiB"):
        load_module.load("real:qwen3_vl_8b", processor=False)


def test_plan_cli_takes_a_real_preset(tmp_path):
    env = {"VLFORGE_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [warmstart.python(), "-m", "vlforge.cli", "plan", "examples/qwen3_vl_tiny.yaml",
         "model.load_from_pretrained_path=real:qwen3_vl_8b", "--gpus", "8", "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=300, env=env,
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1 = does not fit: still a plan
    report = json.loads(proc.stdout)
    assert report["peak_bytes_per_rank"] > 8.7e9 * 2 / 8  # at least its bf16/fp32 parameter shard
    bad = subprocess.run(
        [warmstart.python(), "-m", "vlforge.cli", "plan", "examples/qwen3_vl_tiny.yaml",
         "model.load_from_pretrained_path=real:nope", "--json"],
        capture_output=True, text=True, cwd=REPO, timeout=300, env=env,
    )
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode == 2 and len(errors) == 1 and "real:qwen3_vl_2b" in errors[0], bad.stderr
