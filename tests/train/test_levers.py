"""The speed levers equal the plain path on the CPU: activation checkpointing (selective, full), regional
``torch.compile`` (inductor) and AdamW with bfloat16 moments; their config keys and `vlforge plan`'s view of them."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
from trainkit import logged, run_training, tiny_config, token_mean_grads, write_config

from vlforge.config.load import load_config
from vlforge.config.problems import ConfigValidationError
from vlforge.config.schema import TrainConfig
from vlforge.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "qwen3_vl_tiny.yaml"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


def _trainer(tmp_path: Path, checkpoint: Path, data: Path | None = None, **sections) -> Trainer:
    sections["model"] = {"load_from_pretrained_path": str(checkpoint), "token_audit": False, "memory_plan": False,
                         **sections.get("model", {})}
    raw = tiny_config(tmp_path / "out", checkpoint, **sections)
    if data is not None:
        raw["data"] = {"dataset_path": str(data)}
    trainer = Trainer(TrainConfig.model_validate(raw), progress=False, export=False)
    trainer.setup()
    return trainer



def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], rtol: float) -> float:
    assert a.keys() == b.keys()
    scale = max(float(g.abs().max()) for g in b.values())
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= rtol * scale, (worst, scale)
    return worst


def test_selective_and_full_checkpointing_keep_loss_and_grads(tmp_path, checkpoint, caplog):
    plain = _trainer(tmp_path, checkpoint)
    batches = plain._draw()
    assert any("image_grid_thw" in b for b in batches) or any("pixel_values_videos" in b for b in batches)
    loss, grads = token_mean_grads(plain, batches)
    for mode in ("selective", "full"):
        with caplog.at_level(logging.INFO, logger="vlforge.models.blocks"):
            other = _trainer(tmp_path, checkpoint, model={"activation_checkpointing": mode})
        assert f"activation checkpointing: {mode} on 2 Qwen3VLTextDecoderLayer + 2 Qwen3VLVisionBlock" in caplog.text
        blocks = [m for m in other.model.modules() if type(m).__name__.endswith(("DecoderLayer", "VisionBlock"))]
        assert blocks and all(m.gradient_checkpointing for m in blocks)
        other_loss, other_grads = token_mean_grads(other, batches)
        assert other_loss == pytest.approx(loss, rel=1e-6), mode
        _close(other_grads, grads, 1e-5)


def test_selective_checkpointing_keeps_only_matmul_and_attention_outputs():
    """What a selective-checkpointed layer keeps, measured by the probe the plan uses: less than the plain layer,
    more than its input alone."""
    from vlforge.memory.probe import selective_bytes, text_layer_bytes
    from vlforge.models.presets import meta_model

    model = meta_model("tiny:qwen3_vl")  # float32 weights: every matmul output is float32
    plain = text_layer_bytes(model, 256, torch.float32)
    kept = text_layer_bytes(model, 256, torch.float32, measure=selective_bytes)
    text = model.config.get_text_config()
    q, kv = text.num_attention_heads * text.head_dim, text.num_key_value_heads * text.head_dim
    outputs = q + 2 * kv + text.hidden_size + 2 * text.intermediate_size + text.hidden_size  # q k v o, gate up down
    assert kept == 256 * outputs * 4
    assert 0 < kept < plain


def test_checkpointing_keys_resolve_and_conflicts_are_one_error_line():
    cfg = load_config(TINY, ["model.gradient_checkpointing=true"])
    assert cfg.model.checkpointing() == "full" and cfg.model.activation_checkpointing is None
    cfg = load_config(TINY, ["model.activation_checkpointing=full"])
    assert cfg.model.gradient_checkpointing is True  # the LMMS key follows: an exact round trip
    assert load_config(TINY, ["model.activation_checkpointing=selective"]).model.checkpointing() == "selective"
    with pytest.raises(ConfigValidationError) as error:
        load_config(TINY, ["model.gradient_checkpointing=true", "model.activation_checkpointing=selective"])
    text = str(error.value)
    assert "model.activation_checkpointing" in text and "gradient_checkpointing: true" in text
    assert len(text.strip().splitlines()) == 1


def test_low_precision_optimizer_states_equal_adamw_at_first_then_stay_close():
    from vlforge.config.schema import TrainingConfig
    from vlforge.train.optim import AdamWLowPrecisionStates, build_optimizer

    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 6)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    settings = {"learning_rate": 1e-2, "weight_decay": 0.1, "optim": "adamw_torch"}  # foreach: the same op order
    plain = build_optimizer(nets[0].parameters(), TrainingConfig(**settings), torch.device("cpu"))
    low = build_optimizer(nets[1].parameters(), TrainingConfig(**settings, optimizer_state_dtype="bfloat16"),
                          torch.device("cpu"))
    assert isinstance(low, AdamWLowPrecisionStates) and not isinstance(plain, AdamWLowPrecisionStates)
    x, y = torch.randn(64, 24), torch.randn(64, 6)
    losses = []
    for step in range(4):
        pair = []
        for net, opt in zip(nets, (plain, low), strict=True):
            loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            pair.append(loss.item())
        losses.append(pair)
        worst = max(float((a - b).abs().max()) for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True))
        if step == 0:
            assert worst == 0.0  # moments computed in float32 before they are stored rounded
    assert all(a == pytest.approx(b, rel=1e-3) for a, b in losses) and losses[-1][0] < losses[0][0]
    state = low.state[next(iter(nets[1].parameters()))]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16 and int(state["step"]) == 4
    assert sorted(state) == sorted(plain.state[next(iter(nets[0].parameters()))])  # torch's state keys


H200_BYTES = 150109880320
"""``torch.cuda.get_device_properties(0).total_memory`` of the H200 in benchmarks/records/gpu_suite_h200.json
(sold as "141 GB")."""


def test_plan_fits_qwen3_vl_8b_on_one_h200_with_bfloat16_states_only():
    from vlforge.memory.estimate import estimate_memory
    from vlforge.models.load import load_model_config
    from vlforge.plan.report import MARGIN, make_plan

    model_config = load_model_config("real:qwen3_vl_8b")
    budget = int(H200_BYTES * MARGIN)

    def config(*overrides: str) -> TrainConfig:
        return load_config(TINY, ["model.load_from_pretrained_path=real:qwen3_vl_8b", "training.bf16=true",
                                  "packing.packing_length=8192", *overrides])

    def peak(*overrides: str) -> int:
        return estimate_memory(config(*overrides), model_config, world=1).peak_bytes

    peaks = {(mode, states): peak(f"model.activation_checkpointing={mode}", f"training.optimizer_state_dtype={states}")
             for mode in ("none", "selective", "full") for states in ("float32", "bfloat16")}
    assert all(peaks[(mode, "float32")] > budget for mode in ("none", "selective", "full"))  # fp32 moments: never
    assert peaks[("full", "bfloat16")] <= budget and peaks[("selective", "bfloat16")] <= budget
    assert peaks[("none", "bfloat16")] > budget  # checkpointing is still needed at 8192-token rows
    print(json.dumps({"budget": budget, **{f"{m}/{s}": v for (m, s), v in peaks.items()}}))
    plain = make_plan(config(), gpus=1, gpu_memory=H200_BYTES, model_config=model_config)
    assert not plain.fits and plain.recommended_checkpointing is None
    first = plain.suggestions[0]
    assert first.fits and first.change == ("model.activation_checkpointing: selective + "
                                           "training.optimizer_state_dtype: bfloat16")
    report = plain.to_dict()
    assert report["recommended_checkpointing"] is None and report["checkpointing_peaks"] == {
        mode: peaks[(mode, "float32")] for mode in ("none", "selective", "full")}
    combined = []
    for decimal in (141 * 10**9, 100 * 10**9, 80 * 10**9):  # tighter budgets: each key once in a combination
        combined += [s.change for s in make_plan(config(), gpus=1, gpu_memory=decimal, model_config=model_config)
                     .suggestions if " + " in s.change]
    keys = [[part.partition(":")[0] for part in change.split(" + ")] for change in combined]
    assert combined and all(len(k) == len(set(k)) for k in keys), combined


def test_plan_recommends_no_checkpointing_when_everything_fits():
    from vlforge.plan.report import make_plan, render

    cfg = load_config(TINY, ["model.gradient_checkpointing=true"])
    report = make_plan(cfg, gpus=1, gpu_memory=80 * 10**9)
    assert report.fits and report.recommended_checkpointing == "none"
    assert any("the fastest that fits is none: set model.activation_checkpointing: none (now full)" in line
               for line in render(report))


def _text_rows(path: Path, n: int = 12, lengths: int = 3) -> Path:
    """``n`` text chats of ``lengths`` lengths (packed rows with several samples each)."""
    rows = [{"messages": [{"role": "user", "content": f"Name colour {i % 10}."},
                          {"role": "assistant", "content": "Blue, as the sky. " * (1 + i % lengths)}]}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_regional_compile_equals_eager_on_the_cpu(tmp_path, checkpoint, caplog):
    """inductor on this CPU (gcc), packed rows: the compiled blocks (vlforge's packed attention as one op inside
    them) against eager ones, alone and around each checkpointing mode: gradients; text rows, and for
    ``selective`` the example's image and video rows (the vision blocks compile too) and the losses of two
    optimiser steps (rows of two lengths: the second compiles dynamic shapes)."""
    from vlforge.models.blocks import CompileWatch, compiled_graphs, is_compiled

    text = _text_rows(tmp_path / "text.jsonl")
    packed = {"packing": {"packing": True, "packing_length": 200}}
    times = []
    for mode, data in (("none", text), ("full", text), ("selective", None)):
        eager = _trainer(tmp_path, checkpoint, data, **packed)
        batches = [eager._draw() for _ in range(2)]
        assert all(len(b["cu_seqlens"]) > 2 for step in batches for b in step)  # several samples per row
        assert (data is None) == any("pixel_values" in b for step in batches for b in step)
        loss, grads = token_mean_grads(eager, batches[0])
        expected = [float(eager.train_step(b)[1]) for b in batches] if mode == "selective" else []
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vlforge.models"):
            compiled = _trainer(tmp_path, checkpoint, data, model={"compile": True, "activation_checkpointing": mode},
                                **packed)
            begin = time.perf_counter()
            watch = CompileWatch()  # counts from here: the gradient pass below compiles the first shapes
            got_loss, got_grads = token_mean_grads(compiled, batches[0])
            # dynamo compiled the blocks, checkpointed ones included: one graph for the text layers, one more for the
            # vision blocks where the rows hold pictures
            assert compiled_graphs() - watch.graphs >= (1 if data else 2), mode
            got = []
            for step, batch in enumerate(batches if mode == "selective" else [], 1):
                watch.begin()
                got.append(float(compiled.train_step(batch)[1]))
                watch.end(step)
        times.append(f"{mode}: {time.perf_counter() - begin:.1f} s")
        assert "compile: torch.compile on 2 Qwen3VLTextDecoderLayer + 2 Qwen3VLVisionBlock" in caplog.text
        assert ("their checkpoints inside the compiled code (4 blocks)" in caplog.text) == (mode != "none")
        assert "vision tower: per-image attention as one op" in caplog.text
        assert "compiled no graph" not in caplog.text and "broke" not in caplog.text  # no graph break in a block
        layer = next(m for m in compiled.model.modules() if type(m).__name__ == "Qwen3VLTextDecoderLayer")
        assert is_compiled(layer) and not layer.gradient_checkpointing  # the checkpoint runs inside the compiled code
        assert "model.language_model.layers.0.self_attn.q_proj.weight" in dict(compiled.model.named_parameters())
        assert got_loss == pytest.approx(loss, rel=1e-5)  # inductor reorders float sums: equal to 1e-5, not bitwise
        _close(got_grads, grads, rtol=1e-4)
        assert got == pytest.approx(expected, rel=1e-5)
    print("compile test:", ", ".join(times))


def test_a_graph_break_in_a_step_is_a_warning(caplog):
    """CompileWatch names a step's graph breaks (one inside a checkpointed block runs the block eager)."""
    from vlforge.models.blocks import CompileWatch

    def broken(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    compiled = torch.compile(broken, backend="eager")
    watch = CompileWatch()
    with caplog.at_level(logging.WARNING, logger="vlforge.models.blocks"):
        watch.begin()
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 4.0))
        watch.end(1)
        watch.begin()
        compiled(torch.ones(2))  # the same graphs again: no new break
        watch.end(2)
    assert "model.compile: step 1 broke 1 graph(s)" in caplog.text and "step 2 broke" not in caplog.text


def test_compiled_qwen3_5_layers_of_both_kinds_keep_loss_and_grads(tmp_path, tiny_checkpoint):
    """Qwen3.5 with selective checkpointing: its Gated DeltaNet layers compile too (the packed row's conv and delta
    rule as ops), so both layer kinds give a graph; one packed step's loss and gradients equal eager's."""
    from vlforge.models.blocks import compiled_graphs

    checkpoint = tiny_checkpoint("qwen3_5")
    data = _text_rows(tmp_path / "text.jsonl")
    packed = {"packing": {"packing": True, "packing_length": 200}}
    eager = _trainer(tmp_path, checkpoint, data, **packed)
    batches = eager._draw()
    loss, grads = token_mean_grads(eager, batches)
    compiled = _trainer(tmp_path, checkpoint, data, model={"compile": True, "activation_checkpointing": "selective"},
                        **packed)
    before = compiled_graphs()
    got_loss, got_grads = token_mean_grads(compiled, batches)
    assert compiled_graphs() - before >= 2  # the linear-attention layer's graph and the full-attention layer's
    assert got_loss == pytest.approx(loss, rel=1e-5)
    assert any("linear_attn" in name for name in got_grads)
    _close(got_grads, grads, rtol=1e-4)


@pytest.mark.slow
def test_compile_and_selective_checkpointing_under_fsdp2_train_like_eager(tmp_path, checkpoint):
    """`vlforge train` on two gloo ranks with FSDP2 units on the blocks: compiled blocks with their checkpoints
    inside (FSDP2's hooks outside the compiled code) log the losses of the eager run. Text rows of one length:
    one compiled shape (the dynamic-shape and vision graphs are the one-process test's)."""
    data = _text_rows(tmp_path / "text.jsonl", n=48, lengths=1)

    def config(name: str, **model) -> Path:
        raw = tiny_config(tmp_path / name, checkpoint, model={"token_audit": False, "memory_plan": False, **model},
                          packing={"packing": True, "packing_length": 200}, training={"max_steps": 2},
                          data={"dataset_path": str(data)})
        raw["fsdp"] = {"fsdp2": True, "transformer_layer_cls_to_wrap": ["Qwen3VLTextDecoderLayer", "Qwen3VLVisionBlock"]}
        return write_config(tmp_path / f"{name}.yaml", raw)

    run_training(config("eager"), 2)
    proc = run_training(config("compiled", compile=True, activation_checkpointing="selective"), 2, timeout=900)
    assert "their checkpoints inside the compiled code (4 blocks)" in proc.stderr
    assert "compile: step 1 compiled" in proc.stderr and "compiled no graph" not in proc.stderr
    assert "broke" not in proc.stderr  # FSDP2's hooks stay outside the compiled code: no graph break
    eager = logged(tmp_path / "eager", "loss")
    assert len(eager) == 2 and logged(tmp_path / "compiled", "loss") == pytest.approx(eager, rel=1e-5)


def test_reshard_after_forward_auto_follows_the_start_up_plan(monkeypatch):
    from vlforge.dist import DistContext
    from vlforge.memory.estimate import estimate_memory
    from vlforge.memory.verdict import startup_verdict
    from vlforge.models.load import load_model_config
    from vlforge.train.model_setup import resolve_reshard

    cfg = load_config(TINY, ["fsdp.reshard_after_forward=null"])
    assert cfg.fsdp.reshard_after_forward is None and TrainConfig.model_fields  # auto (the schema's default)
    assert load_config(TINY, []).fsdp.reshard_after_forward is True  # the example writes true
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), owns_group=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert resolve_reshard(cfg, ctx, keep_gathered=True) is False
    assert resolve_reshard(cfg, ctx, keep_gathered=False) is True
    assert resolve_reshard(cfg, ctx, keep_gathered=None) is True  # no plan (model.memory_plan: false): reshard
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # a node-local size unlike the world size: several nodes
    assert resolve_reshard(cfg, ctx, keep_gathered=True) is True
    explicit = load_config(TINY, ["fsdp.reshard_after_forward=false"])
    assert resolve_reshard(explicit, ctx, keep_gathered=False) is False  # as written
    model_config = load_model_config("real:qwen3_vl_2b")  # 28 layers: keeping them gathered costs 26 more
    sharded = estimate_memory(cfg, model_config, world=4)
    kept = estimate_memory(explicit, model_config, world=4)
    assert sharded.gathered_extra > 0 and kept.gathered_extra == 0
    assert kept.parts["gathered_weights"] - sharded.parts["gathered_weights"] == sharded.gathered_extra
    facts: dict = {}
    startup_verdict(cfg, world=4, device=torch.device("cpu"), local_processes=4, facts=facts)
    assert facts["keep_gathered"] is True  # the tiny model fits this host many times over

