"""CUDA-only: the speed levers on a GPU equal the plain path (selective and full checkpointing, regional compile,
bfloat16 AdamW moments, Liger's kernels including the fused linear cross-entropy over label rows), each through
`vlforge train`'s own trainer on the tiny Qwen3-VL in bf16; and no host sync in the loss path of a packed row."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "train"))
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())")]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


def _trainer(tmp_path, checkpoint, **sections):
    from trainkit import tiny_config

    from vlforge.config.schema import TrainConfig
    from vlforge.train.trainer import Trainer

    top = {key: sections.pop(key) for key in list(sections) if not isinstance(sections[key], dict)}
    sections["model"] = {"load_from_pretrained_path": str(checkpoint), "token_audit": False, "memory_plan": False,
                         **sections.get("model", {})}
    raw = {**tiny_config(tmp_path / "out", checkpoint, **sections), **top}
    raw["training"].update(bf16=True)
    raw["packing"] = {"packing": True, "packing_length": 400}
    trainer = Trainer(TrainConfig.model_validate(raw), progress=False, export=False)
    trainer.setup()
    return trainer


def _steps(trainer, batches) -> list[float]:
    out = []
    for batch in batches:
        count, loss_sum, _ = trainer.train_step(batch)
        out.append(float(loss_sum / count))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory, checkpoint):
    tmp = tmp_path_factory.mktemp("eager")
    plain = _trainer(tmp, checkpoint)
    batches = [plain._draw() for _ in range(3)]
    return batches, _steps(plain, batches)


@pytest.mark.parametrize("sections", [
    {"model": {"activation_checkpointing": "selective"}},
    {"model": {"activation_checkpointing": "full"}},
    {"model": {"compile": True}},
    {"model": {"compile": True, "activation_checkpointing": "selective"}},
    {"model": {"compile": True, "activation_checkpointing": "full"}},
    {"training": {"optimizer_state_dtype": "bfloat16"}},
], ids=["selective", "full", "compile", "compile+selective", "compile+full", "bf16_states"])
def test_levers_equal_the_plain_path_on_cuda(tmp_path, checkpoint, reference, sections):
    from vlforge.models.blocks import compiled_graphs

    batches, expected = reference
    lever = _trainer(tmp_path, checkpoint, **sections)
    graphs = compiled_graphs()
    got = _steps(lever, batches)
    if sections.get("model", {}).get("compile"):  # checkpointed blocks too: compiled around their checkpoint
        assert compiled_graphs() > graphs
    assert got[0] == pytest.approx(expected[0], rel=2e-3)  # bf16 compute: kernels may round differently
    assert got == pytest.approx(expected, rel=2e-2)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel is not installed")
def test_liger_kernels_replace_modules_and_keep_the_loss(tmp_path, checkpoint, reference, caplog):
    from vlforge.train.liger import is_liger
    from vlforge.train.loss import fused_loss_head

    batches, expected = reference
    with caplog.at_level(logging.INFO, logger="vlforge.train.liger"):
        lever = _trainer(tmp_path, checkpoint, use_liger_kernel=True)
    assert "liger: rms_norm (offset 0, llama casting) replaces Qwen3VLTextRMSNorm" in caplog.text
    assert "liger: swiglu replaces Qwen3VLTextMLP" in caplog.text
    assert "liger: fused_linear_cross_entropy" in caplog.text
    assert fused_loss_head(lever.model) is not None and sum(is_liger(m) for m in lever.model.modules()) >= 12
    got = _steps(lever, batches)
    assert got == pytest.approx(expected, rel=2e-2)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="liger-kernel is not installed")
def test_liger_rms_norm_and_swiglu_match_the_stock_modules_in_bf16():
    import importlib

    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    from vlforge.models.families import family
    from vlforge.train.liger import apply_liger, remove_liger

    modeling = importlib.import_module(family("qwen3_vl").modeling_module)
    config = Qwen3VLTextConfig(hidden_size=256, intermediate_size=512, hidden_act="silu")
    holder = torch.nn.Module()
    holder.norm = modeling.Qwen3VLTextRMSNorm(256).cuda().bfloat16()
    holder.mlp = modeling.Qwen3VLTextMLP(config).cuda().bfloat16()
    torch.nn.init.normal_(holder.norm.weight, 1.0, 0.2)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    stock = (holder.norm(x), holder.mlp(x))
    model = torch.nn.Module()
    model.model = holder
    model.get_output_embeddings = lambda: None
    plan = apply_liger(model, "qwen3_vl", torch.device("cuda"))
    try:
        assert {r.kind for r in plan.replacements} >= {"rms_norm", "swiglu"}
        torch.testing.assert_close(holder.norm(x), stock[0], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(holder.mlp(x), stock[1], rtol=2e-2, atol=2e-2)
    finally:
        remove_liger(model)


def test_packed_loss_path_reads_nothing_back_from_the_gpu(tmp_path, checkpoint):
    """The forward of a packed text row queues its work without a host sync (label positions and row bounds are read
    on the host): torch.cuda.set_sync_debug_mode("error") raises on a synchronising call."""
    import json

    from vlforge.train.loss import forward_loss

    data = tmp_path / "text.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i}."},
                                                     {"role": "assistant", "content": f"{i} it is."}]}) + "\n"
                            for i in range(8)), encoding="utf-8")
    trainer = _trainer(tmp_path, checkpoint, data={"dataset_path": str(data)})
    batch = {k: (v.pin_memory() if isinstance(v, torch.Tensor) else v) for k, v in trainer._draw()[0].items()}
    assert "cu_seqlens" in batch and "pixel_values" not in batch
    with torch.autocast("cuda", dtype=torch.bfloat16):
        forward_loss(trainer.model, batch, trainer.ctx.device, torch.bfloat16)  # warm-up: lazy inits may sync
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            terms = forward_loss(trainer.model, batch, trainer.ctx.device, torch.bfloat16)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(terms.token_sum)
