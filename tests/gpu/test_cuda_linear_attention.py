"""CUDA-only: Qwen3.5's Gated DeltaNet in a packed row through the optional kernels (fla's chunked delta rule and
Triton conv with ``cu_seqlens``, causal-conv1d's ``seq_idx`` where installed) equals separate forwards, and
`vlforge train` on packed Qwen3.5 / Qwen3.5-MoE rows on CUDA gives the CPU run's fp32 losses.

Each test prints which kernels ran, so a GPU log says whether the kernel branch or the torch branch was checked.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())")]
LENGTHS = (37, 70, 3, 130)


def _model(family: str):
    from vlforge.models.load import load

    model = load(f"tiny:{family}", dtype=torch.float32).model.cuda().train()
    model.config.get_text_config()._experts_implementation = "eager"
    return model


def _row_inputs():
    generator = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 5000, (n,), generator=generator).cuda() for n in LENGTHS]
    cu = torch.tensor([0, *itertools.accumulate(LENGTHS)], dtype=torch.int32, device="cuda")
    kwargs = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(LENGTHS), "max_length_k": max(LENGTHS)}
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None].cuda()
    return seqs, kwargs, positions


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_packed_row_through_the_kernels_equals_separate_forwards(family, capsys):
    from vlforge.models import linear_attention as la
    from vlforge.models.varlen import use_for_text

    model = _model(family)
    seqs, kwargs, positions = _row_inputs()
    with torch.no_grad():
        separate = torch.cat([model.model(input_ids=s[None], use_cache=False).last_hidden_state[0] for s in seqs])
        leaked = model.model(input_ids=torch.cat(seqs)[None], position_ids=positions,
                             use_cache=False).last_hidden_state[0]
    use_for_text(model)
    patch = la.use_for_packed_rows(model)
    try:
        row = torch.cat(seqs)[None].clone()
        packed = model.model(input_ids=row, position_ids=positions, use_cache=False, **kwargs).last_hidden_state[0]
        packed.float().pow(2).mean().backward()  # the kernels' backward runs with cu_seqlens too
    finally:
        patch.restore()
    checked = "; ".join(f"{device}: {found.describe()}" for device, found in la._CHECKED.items())
    scale = separate.abs().max().item()
    error = (packed.detach() - separate).abs().max().item()
    leak = (leaked - separate).abs().max().item()
    with capsys.disabled():
        print(f"\n[{family}] kernels that passed their check: {checked or 'none found'}; packed vs separate "
              f"max |diff| {error:.2e}, stock leak {leak:.2e}, scale {scale:.2f}")
    assert error <= 2e-2 * scale, (error, scale)  # tf32 dots inside the Triton kernels
    assert leak > 5 * error  # the check can tell a leaking row from a correct one
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def _train(tmp: Path, name: str, family: str, cuda: bool) -> list[float]:
    out = tmp / name
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("VLFORGE_CACHE_DIR", str(tmp / "cache"))  # one cache for both runs (the tokenizer builds once)
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    layer = {"qwen3_5": "Qwen3_5DecoderLayer", "qwen3_5_moe": "Qwen3_5MoeDecoderLayer"}[family]
    proc = subprocess.run([sys.executable, "-m", "vlforge.train", "examples/qwen3_vl_tiny.yaml",
                           f"model.load_from_pretrained_path=tiny:{family}",
                           f"fsdp.transformer_layer_cls_to_wrap=[{layer}]", f"checkpointing.output_dir={out}",
                           "logging.logging_steps=1", "logging.report_to=[]", "training.max_steps=3",
                           "training.bf16=false", "checkpointing.save_steps=100"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_train_packed_qwen3_5_on_cuda_matches_cpu(family, tmp_path):
    from vlforge.models.families import check_transformers

    check_transformers(family)  # the subprocesses would refuse an older transformers: skipped with that line here
    gpu = _train(tmp_path, "gpu", family, cuda=True)
    cpu = _train(tmp_path, "cpu", family, cuda=False)
    assert len(gpu) == len(cpu) == 3
    assert gpu == pytest.approx(cpu, rel=5e-3)
