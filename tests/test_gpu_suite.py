"""benchmarks/gpu_suite.py at --size tiny on the CPU: one command, every section in the JSON, positive numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import warmstart

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tiny_suite_runs_every_section_on_this_machine(tmp_path):
    table = tmp_path / "suite.md"
    proc = subprocess.run([warmstart.python(), str(REPO / "benchmarks" / "gpu_suite.py"), "--size", "tiny",
                           "--device", "cpu", "--markdown", str(table)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"VLFORGE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin",
                               "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for section in ("environment", "patch_op", "vision_tower", "training", "extraction"):
        assert section in report, section
    assert report["environment"]["torch"] and report["environment"]["clocks"]["value"] is None
    assert set(report["patch_op"]) == {"qwen2_5_vl/fp32", "qwen2_5_vl/bf16", "qwen3_vl/fp32", "qwen3_vl/bf16"}
    for entry in (*report["patch_op"].values(), report["vision_tower"]):
        for mode in ("forward", "forward_backward"):
            assert all(value > 0 for value in entry[mode].values()), entry[mode]
    assert report["patch_op"]["qwen3_vl/fp32"]["max_abs_diff_vs_conv3d"] < 1e-3
    assert report["vision_tower"]["max_abs_diff_stock_vs_patched"] < 1e-3
    train = report["training"]
    assert train["tokens_per_s"] > 0 and train["flops_per_token"] > 0 and train["peak_memory_bytes"] > 0
    assert train["mfu"] is None and "cpu" in train["mfu_reason"]  # no peak figure for a CPU
    assert all(loss == loss and loss > 0 for loss in train["losses"])  # finite, positive
    assert report["extraction"]["samples_per_s"] > 0 and report["extraction"]["images"] == 8
    assert "| training" in table.read_text() and report["section_seconds"].keys() == set(report) & {
        "patch_op", "vision_tower", "training", "extraction", "patch_trace"}
    trace = report["patch_trace"]
    for name in ("patched", "linear"):  # host side only on a CPU: no kernel timeline
        assert trace[name]["aten_ops_per_call"] > 0 and trace[name]["kernels_per_call"] == 0
    assert trace["patched"]["aten_ops_per_call"] - trace["linear"]["aten_ops_per_call"] <= 10


def test_mfu_formula_counts_parameters_and_causal_context():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from gpu_suite import flops_per_token, peak_tflops
    from vlforge.models.presets import meta_model

    model = meta_model("tiny:qwen3_vl")
    short, long = flops_per_token(model, [4] * 4), flops_per_token(model, [16])
    text = model.config.get_text_config()
    attention = 12 * text.num_hidden_layers * text.num_attention_heads * text.head_dim
    assert long - short == pytest.approx(attention * (16 / 2 - 4 / 2))  # 16 mean causal keys vs 4
    import torch

    assert peak_tflops(torch.device("cpu"))[0] is None
