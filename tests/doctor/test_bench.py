"""Measurement on CPU with tiny models, its findings, and precision="auto"."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import vlforge
from vlforge.diagnosis import Context, Measurement, evaluate, inspect_model, report
from vlforge.diagnosis.bench import default_windows, measure_conv, measure_model
from vlforge.patches import auto


def test_measure_conv_times_both_paths_on_cpu(patch_model) -> None:
    m = measure_conv(patch_model.proj, windows=32, seconds=0.3, names=["proj"])
    assert m.device == "cpu" and m.dtype == "float32" and m.windows == 32
    assert set(m.forward_ms) == {"conv", "gemm"} and set(m.train_ms) == {"conv", "gemm"}
    assert all(v > 0 for v in [*m.forward_ms.values(), *m.train_ms.values()])
    assert m.repeats >= 1
    assert m.ratio_forward == pytest.approx(m.forward_ms["conv"] / m.forward_ms["gemm"])
    assert patch_model.proj.weight.grad is None  # measuring never touches the model


def test_measure_model_once_per_distinct_shape(tiny_vision) -> None:
    info = inspect_model(tiny_vision)
    results = measure_model(info, device="cpu", dtype="bfloat16", windows=16, seconds=0.4, backward=False)
    assert sorted(tuple(m.convs) for m in results) == [("patch_embed.proj",), ("video_embed.proj",)]
    assert {m.kernel for m in results} == {(2, 4, 4), (2, 2, 2)}
    assert all(m.dtype == "bfloat16" and m.train_ms is None for m in results)


def test_default_windows_is_one_megapixel_image_capped_by_processor() -> None:
    info = inspect_model(torch.nn.Conv3d(3, 8, (2, 16, 16), stride=(2, 16, 16)))
    assert default_windows(info.convs[0]) == 4096
    assert default_windows(info.convs[0], max_pixels=256 * 256) == 256


def _measurement(conv_ms: float, gemm_ms: float) -> Measurement:
    return Measurement(convs=["0"], kernel=(2, 4, 4), in_channels=3, out_channels=8, windows=10, device="cpu",
                       dtype="float32", repeats=3, forward_ms={"conv": conv_ms, "gemm": gemm_ms},
                       train_ms={"conv": conv_ms * 2, "gemm": gemm_ms * 2})


@pytest.mark.parametrize(("conv_ms", "gemm_ms", "patched", "rule", "severity"), [
    (30.0, 10.0, False, "bench-conv-slow", "error"),
    (30.0, 10.0, True, "bench-conv-slow-patched", "info"),
    (15.0, 10.0, False, "bench-conv-mild", "info"),
    (10.0, 27.0, False, "bench-gemm-slower-unpatched", "info"),
    (10.0, 27.0, True, "bench-gemm-slower", "warning"),
])
def test_measurement_findings(conv_ms, gemm_ms, patched, rule, severity) -> None:
    from vlforge.diagnosis.facts import Facts

    model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)))
    if patched:
        vlforge.patch(model)
    ctx = Context(facts=Facts(device="cpu"), model=inspect_model(model),
                  measurements=[_measurement(conv_ms, gemm_ms)])
    findings = evaluate(ctx)
    assert [(f.rule, f.severity) for f in findings] == [(rule, severity)]
    ratio = max(conv_ms, gemm_ms) / min(conv_ms, gemm_ms)
    assert f"{ratio:.1f}x" in findings[0].message


def test_report_measures_a_real_qwen3_vl_on_cpu(tiny_qwen3_vl) -> None:
    rep = report(tiny_qwen3_vl, windows=64, bench_seconds=0.6)  # a LoadedModel
    assert rep.bench.status == "measured" and rep.bench.windows == 64
    assert rep.model_source == tiny_qwen3_vl.source and rep.model.processor_max_pixels is not None
    [m] = rep.measurements
    assert m.convs == ["model.visual.patch_embed.proj"] and m.kernel == (2, 16, 16)
    assert (m.in_channels, m.out_channels) == (3, 32)
    bench_rules = [f.rule for f in rep.findings if f.rule.startswith("bench-")]
    # Exactly one measurement finding, and it is the one the measured ratio calls for.
    if m.ratio >= 2:
        assert bench_rules == ["bench-conv-slow"] and rep.exit_code == 3
    elif m.gemm_slower:
        assert bench_rules == ["bench-gemm-slower-unpatched"]
    else:
        assert bench_rules == ["bench-conv-mild"]


def test_default_windows_follow_the_loaded_processor(tiny_qwen3_vl) -> None:
    info = inspect_model(tiny_qwen3_vl.model, tiny_qwen3_vl.processor)
    max_pixels = tiny_qwen3_vl.processor.image_processor.size.longest_edge
    assert info.processor_max_pixels == max_pixels
    assert info.model_type == "qwen3_vl" and info.attn_implementation == "sdpa"
    [conv] = [c for c in info.convs if c.patchable]
    assert conv.kernel == (2, 16, 16)
    assert default_windows(conv, info.processor_max_pixels) == min(1024 * 1024, max_pixels) // (16 * 16)
    assert default_windows(conv, 128 * 128) == 64


def test_bench_skipped_when_device_is_assumed(patch_model) -> None:
    rep = report(patch_model, assume="device=npu")
    assert rep.bench.status == "skipped" and "assumed" in rep.bench.reason
    assert rep.measurements == []


@pytest.fixture
def clear_auto_cache():
    auto.clear_auto_cache()
    yield
    auto.clear_auto_cache()


def _auto_logs(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision=auto")]


def test_precision_auto_measures_once_per_key_and_caches(patch_model, clear_auto_cache, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vlforge")
    report_ = vlforge.patch(patch_model, precision="auto")
    assert report_.patched[0].precision == "auto"
    conv = patch_model.proj
    x = torch.randn(24, 3 * 2 * 4 * 4)
    expected = F.conv3d(x.view(24, 3, 2, 4, 4), conv.weight, conv.bias, stride=(2, 4, 4)).view(24, -1)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(patch_model(x), expected)
    assert len(_auto_logs(caplog)) == 1
    [(key, choice)] = auto._AUTO_CHOICES.items()
    assert choice in ("gemm", "conv") and key[-1] == (32, 4, 2, 4, 4) and key[2] == torch.float32
    with torch.inference_mode():
        patch_model(torch.randn(8, 96))  # a new shape: a new decision, under inference mode
    out = patch_model(x)  # gradients flow now: decided separately
    out.sum().backward()
    assert conv.weight.grad is not None
    assert len(_auto_logs(caplog)) == 3 and len(auto._AUTO_CHOICES) == 3


def test_precision_auto_never_measures_while_compiling(patch_model, clear_auto_cache, caplog) -> None:
    caplog.set_level(logging.INFO, logger="vlforge")
    vlforge.patch(patch_model, precision="auto")
    compiled = torch.compile(patch_model, backend="eager", fullgraph=True)
    x = torch.randn(12, 96)
    with torch.no_grad():
        out = compiled(x)
        expected = F.conv3d(x.view(12, 3, 2, 4, 4), patch_model.proj.weight, patch_model.proj.bias,
                            stride=(2, 4, 4)).view(12, -1)
    torch.testing.assert_close(out, expected)
    assert _auto_logs(caplog) == [] and auto._AUTO_CHOICES == {}
    torch._dynamo.reset()


def test_precision_auto_decides_for_the_autocast_dtype(patch_model, clear_auto_cache) -> None:
    vlforge.patch(patch_model, precision="auto")
    x = torch.randn(6, 96)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = patch_model(x)
    assert out.dtype == torch.bfloat16
    [key] = auto._AUTO_CHOICES
    assert torch.bfloat16 in key and torch.float32 not in key
