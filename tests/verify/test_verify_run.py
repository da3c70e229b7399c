"""``vlforge verify``: passes on every tiny family, fails (exit 3, naming the check) on a corrupted fast path."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import vlforge.patches.patch_embed as patch_embed
from vlforge.cli import app
from vlforge.models.inputs import make_spec
from vlforge.patches import is_patchable, patched_modules
from vlforge.verify import VerifyOptions, VerifyReport, run_verify

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe"]
PUBLISHED = ["patch_layer.fp32_max_abs_diff", "patch_layer.bf16_cosine", "vision_tower.pooled_cosine"]


@pytest.mark.parametrize("family", FAMILIES)
def test_verify_passes_on_every_tiny_family(loaded_bf16, family):
    loaded = loaded_bf16(family)
    report = run_verify(VerifyOptions(model="unused", synthetic="2x32x32", generate_tokens=2, tower_reference=False),
                        loaded=loaded)
    assert report.passed, [c.describe() for c in report.checks]
    assert [c.name for c in report.checks] == PUBLISHED
    convs = sorted(name for name, m in loaded.model.named_modules() if is_patchable(m))
    assert sorted(layer.name for layer in report.layers) == convs
    for layer in report.layers:
        assert 0 <= layer.fp32_max_abs_diff < 1e-5 and layer.fp32_mean_abs_diff <= layer.fp32_max_abs_diff
        assert layer.bf16_cosine > 0.999
    assert report.tower.min_pooled_cosine > 0.99 and len(report.tower.pooled_cosines) == 1
    prompt = make_spec(loaded, synthetic="2x32x32").build(1)["input_ids"]
    assert report.end_to_end.positions == prompt.shape[1] and report.end_to_end.kl_mean >= 0
    assert patched_modules(loaded.model) == []  # the model is stock again
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


def test_cli_verify_json_with_precision_honesty(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_vl")
    result = CliRunner().invoke(app, ["verify", "--model", str(path), "--synthetic", "2x32x32", "--generate", "2",
                                      "--batch-size", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = VerifyReport.model_validate(json.loads(result.stdout))
    assert report.passed and report.failed == [] and report.dtype == "bfloat16"
    assert report.verdict().startswith("PASS: patch layer fp32 max |diff|")
    assert len(report.tower.pooled_cosines) == 2
    e2e = report.end_to_end
    assert e2e.generated_tokens == 2 and 0 <= e2e.top1 <= 1 and 0 <= e2e.top5 <= 1
    assert e2e.positions % 2 == 0 and e2e.positions >= 2 * 3  # two equal prompts: start, image, end, text
    levels = {(row.level, row.variant) for row in report.honesty}
    assert levels == {("patch_layer", "stock bf16"), ("patch_layer", "patched bf16 native"),
                      ("patch_layer", "patched bf16 fp32"), ("vision_tower", "stock bf16"),
                      ("vision_tower", "patched bf16 native"), ("vision_tower", "patched bf16 fp32")}
    assert {row.reference for row in report.honesty} == {"float64"}
    # errors are real bf16 rounding errors: above zero, below bf16's relative precision
    for row in report.honesty:
        assert 0 < row.relative_rms < 0.05, row


@pytest.fixture
def corrupted_fast_path(monkeypatch):
    """A deliberately wrong GEMM path (test only): every patched conv output is off by 1e-3 relative."""
    original = patch_embed.gemm_conv_forward

    def wrong(conv, x):
        out = original(conv, x)
        return out + 1e-3 * out.abs().mean() * torch.ones_like(out)

    monkeypatch.setattr(patch_embed, "gemm_conv_forward", wrong)


def test_cli_verify_fails_with_exit_2_naming_the_check(tiny_checkpoint, corrupted_fast_path):
    path = tiny_checkpoint("qwen3_vl")
    result = CliRunner().invoke(app, ["verify", "--model", str(path), "--synthetic", "1x32x32", "--generate", "0",
                                      "--no-tower-reference", "--json"])
    assert result.exit_code == 3, result.output
    report = VerifyReport.model_validate(json.loads(result.stdout))
    assert not report.passed
    assert "patch_layer.fp32_max_abs_diff" in report.failed
    assert "verify failed: patch_layer.fp32_max_abs_diff" in result.stderr
    layer = report.layers[0]
    assert layer.fp32_max_abs_diff > 1e-5


def test_a_float32_model_is_compared_on_a_bf16_copy_and_left_untouched(tiny_checkpoint):
    from vlforge.models import load

    loaded = load(tiny_checkpoint("qwen2_vl"), dtype="float32")
    before = {name: p.clone() for name, p in loaded.model.named_parameters()}
    report = run_verify(VerifyOptions(model="unused", synthetic="1x32x32", generate_tokens=0, tower_reference=False),
                        loaded=loaded)
    assert report.passed and report.dtype == "bfloat16"
    after = dict(loaded.model.named_parameters())
    assert all(after[name].dtype == torch.float32 and torch.equal(after[name], before[name]) for name in before)
    assert patched_modules(loaded.model) == []


def test_stricter_threshold_flags_fail_a_correct_patch(loaded_bf16):
    report = run_verify(VerifyOptions(model="unused", synthetic="1x32x32", generate_tokens=0, tower_reference=False,
                                      max_fp32_layer_diff=1e-12, max_kl=1.0, min_top1=0.0), loaded=loaded_bf16("qwen3_vl"))
    assert report.failed == ["patch_layer.fp32_max_abs_diff"]
    assert report.verdict().startswith("FAIL: patch_layer.fp32_max_abs_diff = ")
    assert [c.name for c in report.checks][-2:] == ["end_to_end.kl_mean", "end_to_end.top1"]
