"""CUDA-only paths (skipped with the reason where there is no CUDA device): the patch under bf16 autocast,
CUDA-event timing in doctor/profile, and one FSDP2 bf16 training step through benchmarks/gpu_suite.py."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import vlforge

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())")]


@pytest.mark.parametrize("kernel", [(2, 14, 14), (2, 16, 16)])
def test_patch_equals_conv3d_under_bf16_autocast(kernel):
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 256, kernel, stride=kernel, bias=True).cuda()
    patched = copy.deepcopy(conv)
    assert vlforge.patch(patched) is not None
    x = torch.randn(1024, 3, *kernel, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a, b = conv(x), patched(x)
    assert a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(b.float(), a.float(), rtol=2e-2, atol=2e-2)
    a.float().sum().backward()
    b.float().sum().backward()
    torch.testing.assert_close(patched.weight.grad, conv.weight.grad, rtol=2e-2, atol=5e-1)


def test_doctor_timing_uses_cuda_events():
    from vlforge.patches.timing import time_once

    device = torch.device("cuda")
    time_once(lambda: torch.cuda._sleep(1_000_000), device, inner=1)  # warm-up: context, kernel load
    one = time_once(lambda: torch.cuda._sleep(1_000_000), device, inner=3)
    eight = time_once(lambda: torch.cuda._sleep(8_000_000), device, inner=3)
    assert 0 < 2 * one < eight  # GPU-side time: the host returns before the sleep kernel ends


def test_profile_component_timer_records_cuda_events():
    from vlforge.profile.timer import ComponentTimer

    layer = nn.Linear(2048, 2048).cuda()
    x = torch.randn(4096, 2048, device="cuda")
    timer = ComponentTimer([("linear", layer)], device=torch.device("cuda"))
    assert timer.cuda
    with timer.attached(), torch.no_grad():
        layer(x)
        layer(x)
    times = timer.detach_calls()["linear"]
    assert times.calls == 2 and times.inclusive_ms > 0 and times.exclusive_ms > 0


def test_doctor_command_runs_on_cuda(tmp_path):
    env = {**os.environ, "VLFORGE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "vlforge.cli", "doctor", "--model", "tiny:qwen3_vl", "--dtype",
                           "bf16", "--bench-seconds", "2", "--json"], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=600)
    assert proc.returncode in (0, 1, 3), proc.stderr[-2000:]  # 1 = warnings, 3 = a failing verdict (a slow conv)
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode
    assert report["facts"]["device"]["value"].startswith("cuda"), report["facts"]["device"]
    assert all(m["device"].startswith("cuda") for m in report["measurements"]), report["measurements"]
    print(json.dumps({"verdict": report["verdict"], "findings": report["findings"],
                      "measurements": report["measurements"]}))  # kept in the log (-rA / junit)


def test_fsdp2_bf16_training_step_on_cuda(monkeypatch, tmp_path):
    monkeypatch.setenv("VLFORGE_CACHE_DIR", str(tmp_path))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_suite import SIZES, training

    result = training(SIZES["tiny"], torch.device("cuda"))
    assert result["precision"].startswith("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    assert result["tokens_per_s"] > 0 and result["peak_memory_bytes"] > 0
    assert all(math.isfinite(loss) for loss in result["losses"])
    assert (result["mfu"] is None) == (result["peak_bf16_tflops"] is None)
