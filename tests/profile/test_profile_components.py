"""Component discovery on every tiny family, and exclusive-time accounting of the hook timer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vlforge.errors import ModelLoadError
from vlforge.models.components import discover
from vlforge.profile import ProfileOptions, run_profile
from vlforge.profile.report import ComponentStats, RunProfile, TotalStats, compare, summarise, timing
from vlforge.profile.timer import ComponentTimer

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe"]


@pytest.mark.parametrize("family", FAMILIES)
def test_discover_finds_the_named_components_of_every_family(loaded_tiny, family):
    model = loaded_tiny(family).model
    found = {c.name: c for c in discover(model)}
    vision = model.config.vision_config
    text = getattr(model.config, "text_config", model.config)
    assert isinstance(found["vision.patch_embed"].module.proj, nn.Conv3d)
    assert [n for n in found if n.startswith("vision.block.")] == [f"vision.block.{i}" for i in range(vision.depth)]
    layers = [n for n in found if n.startswith("text.layer.")]
    assert layers == [f"text.layer.{i}" for i in range(text.num_hidden_layers)]
    for name in ("model.other", "vision.other", "vision.rotary_embed", "vision.merger", "text.other",
                 "text.embed_tokens", "text.norm", "text.rotary_embed", "lm_head"):
        assert name in found, f"{family}: {name} missing from {sorted(found)}"
    assert found["lm_head"].module is model.get_output_embeddings()
    assert found["text.embed_tokens"].module is model.get_input_embeddings()
    if family.startswith("qwen3_vl"):
        assert "vision.pos_embed" in found
        assert len([n for n in found if n.startswith("vision.deepstack_merger.")]) == len(
            vision.deepstack_visual_indexes)
    if family == "glm4v":
        assert found["vision.pos_embed"].path.endswith("embeddings")
        assert found["vision.downsample"].kind == "extra"
    # no module is timed twice
    assert len({id(c.module) for c in found.values()}) == len(found)
    # and a profile of this family times every one of them
    report = run_profile(ProfileOptions(model="unused", synthetic="2x32x32", repeats=1, warmup=0),
                         loaded=loaded_tiny(family))
    run = report.runs[0]
    assert [c.name for c in run.components] == list(found)
    for component in run.components:
        assert component.calls >= 1 and component.time.median_ms > 0, (family, component.name)
    assert sum(c.share_pct for c in run.components) == pytest.approx(100.0)
    assert {c.name: c.flops for c in run.components}["vision.patch_embed"] > 0


def test_discover_rejects_a_model_without_patch_convolution():
    with pytest.raises(ModelLoadError, match="no stride==kernel patch convolution"):
        discover(nn.Sequential(nn.Conv2d(3, 4, kernel_size=3)))


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(64, 64)
        self.tail = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for _ in range(20):  # work of the outer module itself
            y = torch.tanh(y @ y.T @ y / 64)
        return self.tail(self.inner(y) + self.inner(x))


def test_exclusive_times_add_up_to_the_root_and_calls_are_counted():
    model = _Outer()
    timer = ComponentTimer([("root", model), ("inner", model.inner), ("tail", model.tail)])
    with timer.attached(), torch.no_grad():
        model(torch.randn(64, 64))
        times = timer.detach_calls()
    assert times["inner"].calls == 2 and times["tail"].calls == 1 and times["root"].calls == 1
    root = times["root"]
    children = times["inner"].inclusive_ms + times["tail"].inclusive_ms
    assert root.exclusive_ms == pytest.approx(root.inclusive_ms - children, abs=1e-9)
    assert sum(t.exclusive_ms for t in times.values()) == pytest.approx(root.inclusive_ms, abs=1e-9)
    assert all(t.exclusive_ms > 0 for t in times.values())
    # the hooks are gone after the block
    model(torch.randn(64, 64))
    assert timer.detach_calls()["root"].calls == 0


def test_flops_are_charged_to_the_innermost_component():
    model = _Outer()
    timer = ComponentTimer([("root", model), ("inner", model.inner), ("tail", model.tail)])
    with timer.attached(), timer.counting_flops() as flops, torch.no_grad():
        model(torch.randn(64, 64))
    assert flops["inner"] == 2 * (2 * 64 * 64 * 64)
    assert flops["tail"] == 2 * 64 * 64 * 8
    assert flops["root"] == 20 * 2 * (2 * 64 * 64 * 64)


def _run(variant: str, times: dict[str, float]) -> RunProfile:
    meta = {name: (name, "vision", "x") for name in times}
    summary = summarise([times], dict.fromkeys(times, 1), meta=meta, calls=dict.fromkeys(times, 1))
    return RunProfile(variant=variant, attn="sdpa", batch_size=1, processor=timing([1.0]),
                      host_to_device=timing([1.0]), forward=timing([sum(times.values())]),
                      components=[ComponentStats(**row) for row in summary["components"]],
                      totals=[TotalStats(**row) for row in summary["totals"]], anomalies=summary["anomalies"])


def test_a_ratio_needs_time_on_both_sides():
    """A component with no exclusive time in the baseline has no ratio, not a 0.00x 'slowdown'."""
    rows = {row.name: row for row in compare(_run("stock", {"a": 2.0, "b": 0.0, "c": 1.0}),
                                             _run("patched", {"a": 1.0, "b": 0.5, "c": 0.0})).rows}
    assert rows["a"].ratio == 2.0
    assert rows["b"].ratio is None and rows["c"].ratio is None
