"""benchmarks/train_gpu.py at --size tiny on the CPU: every lever variant through `vlforge train`'s own step, the
media kinds, the Trainer peer, the record's fields; and its two FLOP conventions against their definitions."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import warmstart

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.mark.slow
def test_tiny_run_covers_every_variant_data_kind_and_the_trainer(tmp_path):
    from train_gpu import VARIANTS

    out = tmp_path / "train_gpu_cpu.json"
    # dynamo off: the compile variants run model.compile's path without inductor's minutes of C++ builds here (the
    # compiled maths is checked against eager in tests/train/test_levers.py)
    env = {"VLFORGE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "TORCHDYNAMO_DISABLE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    proc = subprocess.run([warmstart.python(), str(REPO / "benchmarks" / "train_gpu.py"), "--size", "tiny",
                           "--device", "cpu", "--variants-media", "eager", "--peers", "trainer", "--peer-data",
                           "image", "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    assert json.loads(out.read_text()) == record
    runs = {(r["engine"], r["data"], r["variant"]): r for r in record["runs"]}
    assert {v for (e, d, v) in runs if e == "vlforge" and d == "text"} == set(VARIANTS)
    assert {(e, d) for (e, d, _) in runs} == {("vlforge", "text"), ("vlforge", "image"), ("vlforge", "video"),
                                              ("transformers.Trainer", "image")}
    for run in record["runs"]:
        assert "error" not in run, run
        assert run["tokens_per_s"] > 0 and run["tokens"] > 0 and run["flops"]["text"] > 0
        assert run["mfu_vlforge"] is None and run["mfu_lmms"] is None and "cpu" in run["mfu_reason"]
        assert run["peak_memory_bytes"] is None and run["gpu_idle_share"] is None
        assert all(math.isfinite(x) for x in run["losses"])
    text = {v: r for (e, d, v), r in runs.items() if e == "vlforge" and d == "text"}
    eager = text["eager"]["losses"]
    for variant in ("selective", "full", "liger", "compile", "compile+liger", "compile+selective"):  # the same maths, the same losses
        assert text[variant]["losses"] == pytest.approx(eager, rel=1e-5), variant
    assert text["bf16_states"]["losses"][0] == eager[0]  # the first update equals AdamW's; later ones round
    assert text["bf16_states"]["levers_applied"]["optimizer_state_dtype"] == "bfloat16"
    assert text["liger"]["levers_applied"]["liger"] is False  # no CUDA here: one warning, nothing replaced
    assert text["selective"]["levers_applied"]["checkpointing"] == "selective"
    assert text["eager"]["vision_patches"] == 0 and text["eager"]["flops"]["vision"] == 0
    for kind in ("image", "video"):
        run = runs[("vlforge", kind, "eager")]
        assert run["vision_patches"] > 0 and 0 < run["vision_flops_share"] < 1
    hf = next(r for (e, _, _), r in runs.items() if e == "transformers.Trainer")
    assert 0 < hf["padding_efficiency"] <= 1 and hf["vision_patches"] > 0
    assert set(record["ratios"]) == {"text", "image", "video"}
    assert record["ratios"]["image"]["best_vs_trainer"] > 0
    assert set(record["ratios"]["text"]["vs_eager"]) == set(VARIANTS)
    assert "LMMS Engine 0.1.4" in record["conventions"]["mfu_lmms"]


def test_flop_conventions_follow_their_definitions():
    from gpu_suite import flops_per_token
    from train_gpu import flops, model_params
    from vlforge.models.presets import meta_model

    model = meta_model("tiny:qwen3_vl")
    vision, text_params, head = model_params(model)
    stats = [{"tokens": 96, "samples": [32, 64], "rows": [96], "labels": 40, "patch_units": [16, 16, 64]}]
    got = flops(model.config, vision, text_params, head, stats)
    assert got["text"] == pytest.approx(flops_per_token(model, [32, 64]) * 96)  # the GPU suite's counting
    text = model.config.get_text_config()
    h, i, layers, vocab = text.hidden_size, text.intermediate_size, text.num_hidden_layers, text.vocab_size
    q = text.num_attention_heads * text.head_dim
    kv = text.num_key_value_heads * text.head_dim
    dense = (3 * h * i + h * (2 * q + 2 * kv)) * layers + 2 * vocab * h
    assert got["lmms"] == pytest.approx(6 * dense * 96 + 12 * 96**2 * q * layers)  # one packed row: its length^2
    vc = model.config.vision_config
    assert got["vision"] == pytest.approx(6 * vision * 96 + 12 * vc.depth * vc.hidden_size * (16**2 * 2 + 64**2))
    assert vision == sum(p.numel() for p in model.model.visual.parameters())


def test_lmms_peer_says_why_it_did_not_run(tmp_path):
    from train_gpu import SIZES, run_lmms

    entry = run_lmms(tmp_path / "data.jsonl", "text", SIZES["tiny"], torch.device("cuda"), tmp_path)
    assert entry["engine"] == "lmms-engine" and entry["tokens_per_s"] is None and entry["skipped"]


def test_the_figures_region_renders_a_record_and_says_when_there_is_none():
    import readme_figures

    missing = readme_figures.render_train_gpu({"missing": True, "record": "benchmarks/records/train_gpu_h200.json"})
    assert missing.startswith("No GPU record yet") and "train_gpu_h200.json" in missing
    run = {"engine": "vlforge", "data": "text", "variant": "eager", "tokens_per_s": 1000.0, "mfu_vlforge": 0.36,
           "mfu_lmms": 0.41, "vision_flops_share": 0.0, "peak_memory_bytes": 2**31, "gpu_idle_share": 0.05}
    hf = {**run, "engine": "transformers.Trainer", "variant": "padded", "tokens_per_s": 500.0, "mfu_vlforge": 0.18}
    record = {"record": "r.json", "size": "real", "utc_end": "2026-12-01T10:00:00+00:00",
              "environment": {"gpu": "GPU X", "torch": "2.x", "cuda": "13"},  # made-up figures, never quoted
              "runs": [run, hf, {"engine": "lmms-engine", "data": "text", "variant": "hf", "skipped": "no venv"}],
              "ratios": {"text": {"best_variant": "eager", "best_vs_trainer": 2.0}}, "not_run": []}
    text = readme_figures.render_train_gpu(record)
    assert "| text | vlforge | eager | 1,000 | 36.0% | 41.0% | 0.0% | 2.0 | 5.0% |" in text
    assert "target 35%: met" in text and "2.00x `transformers.Trainer` (target 1.5x: met)" in text
    assert "not run: no venv" in text


def test_busy_time_is_the_union_of_kernel_intervals():
    from train_gpu import _union_busy

    assert _union_busy([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17  # overlaps counted once, the gap left out
    assert _union_busy([]) == 0
