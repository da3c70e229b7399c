"""CUDA-only: packed-row attention through torch's varlen kernel, and `vlforge train` end to end on a GPU
(fp32 losses equal to the CPU run of the same config; bf16 with packing, checkpoint and resume)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())")]


def _reference(q, k, v, bounds):
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    parts = [F.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], is_causal=True)
             for a, b in bounds]
    return torch.cat(parts, dim=2).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_varlen_kernel_matches_per_sample_attention(dtype):
    from vlforge.models import varlen

    torch.manual_seed(0)
    bounds = [(0, 97), (97, 350), (350, 351), (351, 700)]
    cu = torch.tensor([0, 97, 350, 351, 700], device="cuda")
    q = torch.randn(1, 8, 700, 64, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(1, 2, 700, 64, device="cuda", dtype=dtype, requires_grad=True)  # grouped-query heads
    v = torch.randn(1, 2, 700, 64, device="cuda", dtype=dtype, requires_grad=True)
    out, _ = varlen.varlen_attention(None, q, k, v, None, cu_seq_lens_q=cu)
    ref = _reference(q.detach().float().requires_grad_(), k.detach().float().requires_grad_(),
                     v.detach().float().requires_grad_(), bounds)
    torch.testing.assert_close(out.float(), ref.detach(), rtol=2e-2, atol=2e-2)
    grad = torch.randn_like(out)
    out.backward(grad)
    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    _reference(qr, kr, vr, bounds).backward(grad.float())
    for got, want in ((q.grad, qr.grad), (k.grad, kr.grad), (v.grad, vr.grad)):
        torch.testing.assert_close(got.float(), want, rtol=5e-2, atol=5e-2)
    if varlen._kernel_options(True) is None:
        pytest.skip("this torch has no causal torch.nn.attention.varlen kernel: the per-sample SDPA path was checked")
    fused = varlen._cuda_varlen(q[0].transpose(0, 1), q[0].transpose(0, 1), q[0].transpose(0, 1), cu, 349, None, True)
    assert fused is not None and fused.shape == (700, 8, 64)  # the fused kernel, not the fallback, ran above


def _train(tmp: Path, name: str, *overrides: str, cuda: bool = True) -> list[dict]:
    out = tmp / name
    env = {**os.environ, "VLFORGE_CACHE_DIR": str(tmp / "cache"), "PYTHONUNBUFFERED": "1"}
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run([sys.executable, "-m", "vlforge.train", "examples/qwen3_vl_tiny.yaml",
                           f"checkpointing.output_dir={out}", "logging.logging_steps=1", "logging.report_to=[]",
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_train_fp32_on_cuda_matches_cpu(tmp_path):
    args = ("training.max_steps=3", "training.bf16=false", "checkpointing.save_steps=100")
    gpu = [r["loss"] for r in _train(tmp_path, "gpu", *args) if "loss" in r]
    cpu = [r["loss"] for r in _train(tmp_path, "cpu", *args, cuda=False) if "loss" in r]
    assert len(gpu) == len(cpu) == 3
    assert gpu == pytest.approx(cpu, rel=2e-3)


def test_train_bf16_packed_checkpoint_and_resume_on_cuda(tmp_path):
    first = _train(tmp_path, "run", "training.max_steps=4", "training.bf16=true", "checkpointing.save_steps=2")
    state = json.loads((tmp_path / "run" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["step"] == 4
    losses = [r["loss"] for r in first if "loss" in r]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    resumed = _train(tmp_path, "run", "training.max_steps=6", "training.bf16=true", "checkpointing.save_steps=2",
                     "checkpointing.resume=auto")
    steps = [r["step"] for r in resumed if "loss" in r]
    assert steps[-2:] == [5, 6] and steps.count(5) == 1
