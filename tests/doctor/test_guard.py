"""guard(): patches what it can, logs one line per finding, raises only for what it cannot fix."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from vlforge.diagnosis import UnfixableError, guard
from vlforge.errors import VlforgeError
from vlforge.patches import is_patched, patched_modules

BROKEN = "torch=2.9.1,cudnn=91002,device=cuda"


def test_guard_patches_the_affected_conv(tiny_vision, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vlforge")
    findings = guard(tiny_vision, "bf16", assume=BROKEN)
    assert sorted(patched_modules(tiny_vision)) == ["patch_embed.proj", "video_embed.proj"]
    assert {(f.rule, f.severity) for f in findings} == {("cudnn-conv3d-skipped-patched", "info")}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("doctor ")]
    assert len(lines) == len(findings) == 2


def test_guard_leaves_an_unaffected_model_alone(tiny_vision) -> None:
    findings = guard(tiny_vision, "float32", assume=BROKEN)
    assert findings == [] and patched_modules(tiny_vision) == []


def test_guard_does_not_raise_for_an_unpatchable_slow_conv() -> None:
    model = nn.Sequential(nn.Conv3d(3, 4, kernel_size=3, padding=1))
    findings = guard(model, "fp16", assume=BROKEN)
    assert [f.rule for f in findings] == ["cudnn-conv3d-skipped-unpatchable"]
    assert not is_patched(model[0])


@pytest.mark.parametrize(("assume", "rule"), [
    ("attn=flash_attention_2,flash_attn=absent", "flash-attn-missing"),
    ("device=cuda,bf16_supported=false", "bf16-unsupported"),
])
def test_guard_raises_for_what_it_cannot_fix(tiny_vision, assume: str, rule: str) -> None:
    with pytest.raises(UnfixableError) as caught:
        guard(tiny_vision, "bf16", assume=assume)
    assert isinstance(caught.value, VlforgeError)
    assert rule in str(caught.value) and "\n" not in str(caught.value)


def test_guard_fixes_first_then_raises_only_the_rest(tiny_vision) -> None:
    with pytest.raises(UnfixableError) as caught:
        guard(tiny_vision, "bf16", assume=BROKEN + ",attn=flash_attention_2,flash_attn=absent")
    assert "cudnn-conv3d-skipped" not in str(caught.value)
    assert patched_modules(tiny_vision)  # the fixable part was fixed before raising


def test_guard_with_bench_patches_a_measured_slowdown() -> None:
    # fp32 Conv3d at a Qwen patch shape on CPU is usually several times slower than the GEMM (DESIGN.md).
    model = nn.Sequential(nn.Conv3d(3, 64, (2, 16, 16), stride=(2, 16, 16)))
    findings = guard(model, "float32", assume="device=cpu", bench=True, windows=256, bench_seconds=0.6)
    bench_rules = [f.rule for f in findings if f.rule.startswith("bench-")]
    assert len(bench_rules) == 1
    # Patched exactly when the measurement said the conv costs >= 2x; then the finding became info.
    assert is_patched(model[0]) == (bench_rules == ["bench-conv-slow-patched"])
    assert all(f.severity != "error" for f in findings)
    assert torch.is_tensor(model(torch.randn(2, 3, 2, 16, 16)))
