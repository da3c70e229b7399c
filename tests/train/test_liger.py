"""``use_liger_kernel``: what vlforge would replace in every family against the installed transformers and
liger-kernel, found by probing the stock modules on the CPU (no Triton kernel runs here; the kernels themselves are
checked in tests/gpu/test_cuda_levers.py), the one warning for what it cannot replace, and the swap mechanics."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch
from torch import nn

from vlforge.models.families import FAMILIES, family
from vlforge.models.presets import meta_model

liger = pytest.importorskip("liger_kernel", reason="liger-kernel is a dev dependency (pip install -e .[dev])")
from vlforge.train import liger as vl_liger  # noqa: E402

# (replaced kinds + targets, words of each skipped reason) per family, for transformers 5.24 and liger-kernel 0.8.5
EXPECTED = {
    "qwen2_vl": ({"rms_norm Qwen2VLRMSNorm", "swiglu Qwen2MLP", "rope apply_rotary_pos_emb"}, []),
    "qwen2_5_vl": ({"rms_norm Qwen2_5_VLRMSNorm", "swiglu Qwen2MLP", "swiglu Qwen2_5_VLMLP",
                    "rope apply_rotary_pos_emb"}, []),
    "qwen3_vl": ({"rms_norm Qwen3VLTextRMSNorm", "swiglu Qwen3VLTextMLP", "rope apply_rotary_pos_emb"}, []),
    "qwen3_vl_moe": ({"rms_norm Qwen3VLMoeTextRMSNorm", "rope apply_rotary_pos_emb"},
                     ["Qwen3VLMoeTextExperts: Liger has no kernel"]),
    "qwen3_5": ({"rms_norm Qwen3_5RMSNorm", "swiglu Qwen3_5MLP"},
                ["rope apply_rotary_pos_emb: partial rotary", "Qwen3_5RMSNormGated: Liger has no kernel"]),
    "qwen3_5_moe": ({"rms_norm Qwen3_5MoeRMSNorm", "swiglu Qwen3_5MoeMLP"},
                    ["rope apply_rotary_pos_emb: partial rotary", "Qwen3_5MoeRMSNormGated: Liger has no kernel",
                     "Qwen3_5MoeExperts: Liger has no kernel"]),
    "glm4v": ({"rms_norm Glm4vRMSNorm", "swiglu Glm4vTextMLP", "swiglu Glm4VisionMlp"},
              ["rope apply_rotary_pos_emb: partial rotary"]),
    "glm4v_moe": ({"rms_norm Glm4vMoeTextRMSNorm", "rms_norm Glm4vMoeRMSNorm", "swiglu Glm4vMoeTextMLP",
                   "swiglu Glm4vMoeisionMlp"},
                  ["rope apply_rotary_pos_emb: partial rotary", "Glm4vMoeTextExperts: Liger has no kernel"]),
}


def test_every_family_has_an_expectation():
    assert set(EXPECTED) == set(FAMILIES)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_what_would_be_replaced_in_each_family(name):
    model = meta_model(f"tiny:{name}")  # shapes only: the norms and the rope are probed with CPU tensors
    plan = vl_liger.plan_liger(model, name)
    replaced, skipped = EXPECTED[name]
    got = {f"{r.kind} {r.target}" for r in plan.replacements if r.kind != "fused_linear_cross_entropy"}
    assert got == replaced
    assert [r.paths for r in plan.replacements if r.kind == "fused_linear_cross_entropy"] == [["lm_head"]]
    assert len(plan.skipped) == len(skipped) and all(any(words in s for s in plan.skipped) for words in skipped)
    norms = [path for r in plan.replacements if r.kind == "rms_norm" for path in r.paths]
    text = model.config.get_text_config()
    text_norms = [path for path in norms if ".language_model." in f".{path}"]
    assert len(text_norms) >= 2 * text.num_hidden_layers + 1  # two per layer + the final norm, at least
    warning = plan.warning()
    assert (warning is None) == (not skipped)
    if warning:
        assert warning.startswith(f"use_liger_kernel ({name}): not applied: ") and "\n" not in warning


def test_norm_probe_tells_one_plus_w_from_w_and_the_casting():
    qwen3_5 = importlib.import_module(family("qwen3_5").modeling_module)
    qwen3_vl = importlib.import_module(family("qwen3_vl").modeling_module)
    assert vl_liger._probe_norm(qwen3_5.Qwen3_5RMSNorm(16)) == (1.0, "gemma")
    assert vl_liger._probe_norm(qwen3_vl.Qwen3VLTextRMSNorm(16)) == (0.0, "llama")

    class CenteredNorm(nn.Module):  # a layer norm without bias, named like an RMSNorm: not Liger's maths
        def __init__(self) -> None:
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(16)), 1e-6

        def forward(self, x):
            x = x - x.mean(-1, keepdim=True)
            return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    assert "neither" in vl_liger._probe_norm(CenteredNorm())


def test_swiglu_probe_runs_the_module_and_refuses_other_activations():
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

    modeling = importlib.import_module(family("qwen3_vl").modeling_module)
    config = Qwen3VLTextConfig(hidden_size=16, intermediate_size=32, hidden_act="silu")
    assert vl_liger._probe_swiglu(modeling.Qwen3VLTextMLP(config)) is None
    gelu = modeling.Qwen3VLTextMLP(Qwen3VLTextConfig(hidden_size=16, intermediate_size=32, hidden_act="gelu"))
    assert "not SiLU" in vl_liger._probe_swiglu(gelu)


def test_rope_probe_refuses_an_interleaved_rope():
    glm = importlib.import_module(family("glm4v").modeling_module)
    qwen3_vl = importlib.import_module(family("qwen3_vl").modeling_module)
    assert vl_liger._probe_rope(qwen3_vl.apply_rotary_pos_emb, 8, 8) is None
    assert "rotate_half" in vl_liger._probe_rope(glm.apply_rotary_pos_emb, 8, 8)  # GLM's interleaved rope
    assert "partial rotary" in vl_liger._probe_rope(qwen3_vl.apply_rotary_pos_emb, 8, 4)


def test_liger_s_own_entries_are_read_for_what_they_leave_undone():
    qwen2_vl = " ".join(vl_liger.audit_liger_entry("qwen2_vl"))
    assert "apply_multimodal_rotary_pos_emb" in qwen2_vl and "would do nothing" in qwen2_vl
    assert any("swiglu= and never reads it" in note for note in vl_liger.audit_liger_entry("qwen3_vl"))


def test_the_swaps_keep_weights_and_names_and_undo(caplog):
    """The mechanics of apply_liger (class swaps, the family's rope function) without launching a kernel."""
    from vlforge.train.loss import fused_loss_head

    model = meta_model("tiny:qwen3_vl")
    keys = list(model.state_dict())
    modeling = importlib.import_module(family("qwen3_vl").modeling_module)
    stock_rope = modeling.apply_rotary_pos_emb
    with caplog.at_level(logging.INFO, logger="vlforge.train.liger"):
        plan = vl_liger.apply_liger(model, "qwen3_vl", torch.device("cuda"))  # classes only: nothing runs here
    try:
        assert plan is not None and not plan.skipped
        assert "liger: rms_norm (offset 0, llama casting) replaces Qwen3VLTextRMSNorm (9)" in caplog.text
        assert "liger: fused_linear_cross_entropy (over the label rows) replaces Linear (1): lm_head" in caplog.text
        assert modeling.apply_rotary_pos_emb is not stock_rope
        norm = model.model.language_model.norm
        assert vl_liger.is_liger(norm) and isinstance(norm, modeling.Qwen3VLTextRMSNorm)
        assert fused_loss_head(model) is model.lm_head and list(model.state_dict()) == keys
    finally:
        restored = vl_liger.remove_liger(model)
    assert restored == 9 + 2 + 1 and modeling.apply_rotary_pos_emb is stock_rope
    assert not any(vl_liger.is_liger(m) for m in model.modules()) and fused_loss_head(model) is None


def test_without_cuda_one_warning_and_nothing_replaced(tmp_path):
    from pathlib import Path

    from vlforge.config.load import resolve_config

    tiny = Path(__file__).resolve().parents[2] / "examples" / "qwen3_vl_tiny.yaml"
    resolved = resolve_config(tiny, ["use_liger_kernel=true", "training.use_cpu=true"])
    notes = [w for w in resolved.warnings if "use_liger_kernel" in w]
    assert notes == ["use_liger_kernel: true has no effect: no CUDA GPU here (Liger's kernels are Triton kernels "
                     "for CUDA devices)"]
    model = meta_model("tiny:qwen3_vl")
    assert vl_liger.apply_liger(model, "qwen3_vl", torch.device("cpu")) is None
    assert not any(vl_liger.is_liger(m) for m in model.modules())
