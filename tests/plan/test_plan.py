"""`vlforge plan`: estimates from the meta device, the CLI contract, suggestions, and estimate vs measurement."""

from __future__ import annotations

import json
import resource
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import warmstart
from vlforge.cli import app
from vlforge.config.load import load_config
from vlforge.errors import ConfigError
from vlforge.memory.estimate import estimate_memory
from vlforge.memory.probe import find_stack, meta_model, register_standin, saved_bytes, text_layer_bytes
from vlforge.models.load import load_model_config
from vlforge.plan.options import parse_memory
from vlforge.plan.report import make_plan

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "qwen3_vl_tiny.yaml"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the example config's data paths are relative to the repository


def test_memory_sizes_parse_and_bad_ones_name_the_flag():
    assert parse_memory("80GB") == 80 * 10**9 and parse_memory("80GiB") == 80 * 2**30
    assert parse_memory("24") == 24 * 10**9 and parse_memory("512MiB") == 512 * 2**20
    for bad in ("lots", "", "-3GB", "0GB", "80XB"):
        with pytest.raises(ConfigError, match="--gpu-memory"):
            parse_memory(bad)


def test_a_layer_on_meta_keeps_what_the_same_layer_keeps_on_the_cpu():
    """The meta-device probe is faithful: the same decoder layer run on real CPU tensors saves the same bytes."""
    cfg = load_model_config("tiny:qwen3_vl")
    meta = meta_model(cfg, torch.float32)
    on_meta = text_layer_bytes(meta, 96, torch.float32)
    from transformers import AutoModelForImageTextToText

    from vlforge.memory.probe import STANDIN

    register_standin()
    real = AutoModelForImageTextToText.from_config(cfg, attn_implementation=STANDIN)
    owner, layers = find_stack(real, "text")
    hidden = torch.randn(1, 96, owner.config.hidden_size, requires_grad=True)
    positions = torch.zeros(3, 1, 96, dtype=torch.long)
    cos, sin = owner.rotary_emb(hidden, positions)
    on_cpu = saved_bytes(layers[0], hidden, attention_mask=None, position_ids=positions,
                         position_embeddings=(cos.detach(), sin.detach()))[0]
    assert on_meta == on_cpu > 0


def test_each_lever_moves_the_part_it_should():
    cfg = load_config(TINY)
    mc = load_model_config(cfg.model.load_from_pretrained_path)
    base = estimate_memory(cfg, mc, visual_share=0.0)
    longer = estimate_memory(cfg.model_copy(update={"packing": cfg.packing.model_copy(update={"packing_length": 2048})}),
                             mc, visual_share=0.0)
    gc = estimate_memory(cfg.model_copy(update={"model": cfg.model.model_copy(update={"gradient_checkpointing": True})}),
                         mc, visual_share=0.0)
    sharded = estimate_memory(cfg, mc, world=4, visual_share=0.0)
    assert longer.parts["activations"] > 3 * base.parts["activations"] / 1.5
    assert gc.parts["activations"] < base.parts["activations"]
    assert sharded.parts["optimizer"] * 4 == pytest.approx(base.parts["optimizer"], rel=1e-6)
    assert sharded.parts["parameters"] < base.parameters * 4 / 2  # a quarter of the fp32 weights, plus gathered
    images = estimate_memory(cfg, mc, visual_share=0.5)
    assert images.parts["vision_activations"] > base.parts["vision_activations"] == 0


def test_a_real_size_model_is_planned_without_its_weights():
    """Qwen2.5-VL's default config (72B-class dims) on meta: seconds, and no allocation of its weights."""
    from transformers import Qwen2_5_VLConfig

    cfg = load_config(TINY, ["packing.packing_length=8192", "model.gradient_checkpointing=true",
                             "training.bf16=true"])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = make_plan(cfg, gpus=8, gpu_memory=80 * 10**9, model_config=Qwen2_5_VLConfig())
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert report.estimate.parameters > 60e9
    assert grown_mb < 2000  # fp32 weights alone would be > 240 GB
    assert not report.fits and report.suggestions  # 72B on 8 x 80 GB with full AdamW does not fit
    assert report.to_dict()["peak_bytes_per_rank"] == report.estimate.peak_bytes


def test_the_lora_suggestion_adapts_the_family_s_own_projections():
    """Qwen3.5's Gated DeltaNet layers (3 of every 4) project through in_proj_qkv / in_proj_z / out_proj: a LoRA
    suggestion that named only q/k/v/o would leave them untouched."""
    from vlforge.models.presets import preset_config

    cfg = load_config(TINY, ["packing.packing_length=8192", "training.bf16=true",
                             "model.load_from_pretrained_path=real:qwen3_5_9b"])
    report = make_plan(cfg, gpus=1, gpu_memory=24 * 10**9, model_config=preset_config("real:qwen3_5_9b"))
    [lora] = [s for s in report.suggestions if s.change.startswith("model.lora")]
    assert all(name in lora.change for name in ("q_proj", "down_proj", "in_proj_qkv", "in_proj_z", "out_proj"))
    assert lora.peak_bytes < report.estimate.peak_bytes
    qwen3_vl = make_plan(load_config(TINY, ["training.bf16=true"]), gpus=1, gpu_memory=10**8)
    assert any(s.change.startswith("model.lora") and "in_proj" not in s.change for s in qwen3_vl.suggestions)


@pytest.mark.parametrize("preset", ["tiny:qwen3_vl_moe", "tiny:glm4v", "real:qwen3_vl_30b_a3b"])
def test_over_budget_plans_of_fused_mlp_families_suggest_lora_on_their_own_modules(preset):
    """Qwen3-VL-MoE (experts as fused parameters) and GLM-4.1V (a fused gate_up_proj) have no text gate_proj: a
    plan over budget stopped with "'gate_proj' matches no module" (or adapted the vision MLPs instead)."""
    result = runner.invoke(app, ["plan", str(TINY), "--json", "--gpu-memory", "1MB",
                                 f"model.load_from_pretrained_path={preset}"])
    assert result.exit_code == 1, result.output  # a plan that does not fit: a warning-level verdict, not an error
    report = json.loads(result.stdout)
    [lora] = [s for s in report["suggestions"] if s["change"].startswith("model.lora")]
    assert "gate_proj" not in lora["change"] and "q_proj" in lora["change"]


@pytest.mark.parametrize("preset", ["tiny:qwen3_5_moe", "tiny:qwen3_vl_moe"])
def test_moe_experts_are_measured_in_any_dtype(preset):
    """torch's meta kernel of grouped_mm takes bfloat16 only: an fp32 MoE plan raised from the probe. The stand-in
    keeps what the real grouped matmul keeps (bf16, where both run), and an fp32 layer keeps more."""
    import torch
    import transformers.integrations.moe as moe

    from vlforge.memory import probe
    from vlforge.models.load import load_model_config

    config = load_model_config(preset)
    bf16 = probe.meta_model(config, torch.bfloat16)
    real = probe.text_layer_bytes(bf16, 256, torch.bfloat16)
    original = moe._grouped_mm
    moe._grouped_mm = lambda x, weight, offs: probe._GroupedMatmulStandin.apply(x.to(weight.dtype), weight)
    try:
        standin = probe.text_layer_bytes(bf16, 256, torch.bfloat16)
    finally:
        moe._grouped_mm = original
    assert abs(standin - real) <= 64 and real > 0  # the routing offsets aside
    assert probe.text_layer_bytes(probe.meta_model(config, torch.float32), 256, torch.float32) > real
    assert moe._grouped_mm is original  # restored


def test_the_real_moe_preset_plans_in_fp32_and_under_sp():
    from vlforge.models.presets import preset_config

    preset = "real:qwen3_5_35b_a3b"
    cfg = load_config(TINY, [f"model.load_from_pretrained_path={preset}", "sp_ulysses_degree=2"])
    report = make_plan(cfg, gpus=8, gpu_memory=80 * 10**9, model_config=preset_config(preset))
    assert report.estimate.sp == 2 and report.estimate.peak_bytes > report.estimate.parts["activations"] > 0


def test_cli_json_fits_and_suggestions():
    result = runner.invoke(app, ["plan", str(TINY), "--json", "--gpu-memory", "80GB"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["fits"] is True and report["peak_bytes_per_rank"] > 0 and isinstance(report["suggestions"], list)
    small = runner.invoke(app, ["plan", str(TINY), "--json", "--gpu-memory", "300MB"])
    assert small.exit_code == 1
    tight = json.loads(small.stdout)
    assert tight["fits"] is False and tight["suggestions"]
    fits = [s["fits"] for s in tight["suggestions"]]
    assert fits == sorted(fits, reverse=True)  # fitting ones first
    assert all(s["peak_bytes_per_rank"] < tight["peak_bytes_per_rank"] for s in tight["suggestions"])


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu-memory", "huge"], "--gpu-memory 'huge'"),
    (["--gpus", "0"], "--gpus 0"),
    (["sp_ulysses_degree=3", "--gpus", "3"], "sp_ulysses_degree: 3 does not divide the 4 attention heads"),
    (["sp_ulysses_degree=2", "--gpus", "3"], "sp_ulysses_degree: 2 does not divide the 3 GPU(s)"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = subprocess.run([warmstart.python(), "-m", "vlforge.cli", "plan", str(TINY), *args], capture_output=True,
                            text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr


@pytest.mark.slow
def test_estimate_is_within_20_percent_of_a_measured_training_step(tmp_path):
    """One real configuration through benchmarks/plan_accuracy.py: the measured peak RSS of real steps."""
    proc = subprocess.run([warmstart.python(), str(REPO / "benchmarks" / "plan_accuracy.py"), "--only", "small-padded",
                           "--keep", str(tmp_path)], capture_output=True, text=True, timeout=1200, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)["records"][0]
    assert 0.8 <= record["ratio"] <= 1.2, record


def test_train_logs_the_verdict_and_warns_above_the_free_memory(monkeypatch, caplog, tmp_path):
    import logging

    from vlforge.memory import verdict as memory_verdict
    from vlforge.train.trainer import Trainer

    cfg = load_config(TINY, [f"checkpointing.output_dir={tmp_path / 'out'}"])
    trainer = Trainer(cfg, progress=False, export=False)
    with caplog.at_level(logging.INFO, logger="vlforge.train"):
        trainer.plan_verdict()
    lines = [r for r in caplog.records if r.getMessage().startswith("plan: about")]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO and "free on cpu" in lines[0].getMessage()
    caplog.clear()
    monkeypatch.setattr(memory_verdict, "free_bytes", lambda device, local=1: 10 * 2**20)  # a 10 MiB device
    with caplog.at_level(logging.INFO, logger="vlforge.train"):
        trainer.plan_verdict()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "may run out of memory" in warned[0].getMessage()
    quiet = Trainer(cfg.model_copy(update={"model": cfg.model.model_copy(update={"memory_plan": False})}),
                    progress=False, export=False)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vlforge.train"):
        quiet.plan_verdict()
    assert not [r for r in caplog.records if "plan:" in r.getMessage()]


def test_the_start_up_verdict_leaves_the_random_state_alone(tmp_path):
    """Only rank 0 plans: a plan that drew random numbers would give the ranks different LoRA initialisations."""
    from vlforge.train.trainer import Trainer

    cfg = load_config(TINY, [f"checkpointing.output_dir={tmp_path / 'out'}"])
    trainer = Trainer(cfg, progress=False, export=False)
    from vlforge.memory.probe import attention_cost

    attention_cost.cache_clear()  # measured afresh: the path that runs SDPA on real tensors
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    trainer.plan_verdict()
    assert torch.equal(torch.rand(4), expected)


@pytest.mark.parametrize(("preset", "layers"), [("tiny:glm4v_moe", 5), ("real:qwen3_5_9b", None), ("tiny:qwen3_vl", 4)])
def test_each_kind_of_layer_is_probed_and_counted(preset, layers):
    """GLM-4.5V's dense first layer and Qwen3.5's linear-attention layers keep other activations than the rest of the
    stack: the plan probes one layer of each kind and counts it as often as the stack holds it, which is what
    probing every layer gives."""
    from vlforge.memory.probe import counting_attention, layer_kinds

    config = load_model_config(preset)
    if layers:
        config.text_config.num_hidden_layers = layers
    model = meta_model(config, torch.bfloat16)
    _, layers = find_stack(model, "text")
    every = [text_layer_bytes(model, 128, torch.bfloat16, index=i) for i in range(len(layers))]
    kinds = layer_kinds(layers)
    assert sum(count for _, count in kinds) == len(layers)
    assert sum(count * every[first] for first, count in kinds) == sum(every)
    assert (len(set(every)) > 1) == (preset != "tiny:qwen3_vl")  # a one-kind stack is probed by layer 0 alone
    attending = 0
    for first, count in kinds:  # the plan charges softmax attention to the layers that run it
        with counting_attention() as calls:
            text_layer_bytes(model, 128, torch.bfloat16, index=first)
        attending += count if calls.count else 0
    assert attending == (8 if preset == "real:qwen3_5_9b" else len(layers))  # Qwen3.5: 1 in 4 layers


def test_lora_on_moe_experts_is_planned_on_meta():
    """peft puts LoRA on GLM-4.5V's fused expert weights when the MLP names are targeted (transformers' MoE weight
    conversion) and builds their delta weight under ``torch.autocast(device_type=<the weight's>)``, which torch has
    none of for meta tensors: the probe runs it as the CPU's, and the adapters' delta weights count."""
    base = ["model.load_from_pretrained_path=tiny:glm4v_moe", "fsdp.transformer_layer_cls_to_wrap=null",
            "model.lora={r: 8, alpha: 16, target_modules: [q_proj]}"]
    attention_only = estimate_memory(load_config(TINY, base), load_model_config("tiny:glm4v_moe"), visual_share=0.0)
    experts = estimate_memory(load_config(TINY, [*base[:2], "model.lora={r: 8, alpha: 16, target_modules: "
                                                              "[q_proj, gate_proj, up_proj, down_proj]}"]),
                              load_model_config("tiny:glm4v_moe"), visual_share=0.0)
    assert experts.parts["activations"] > attention_only.parts["activations"] > 0
