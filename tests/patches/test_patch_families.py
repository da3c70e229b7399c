"""Every installed transformers family with a stride==kernel patch conv: patched tower == stock tower.

The families are discovered, not listed (see ``patch_family_discovery.py``): every modeling file that
calls ``nn.Conv3d(...)`` with a stride is a candidate and gets one test; candidates whose tiny tower
cannot be built generically are skipped with the reason, except the Qwen/GLM families, which must run.
The Conv2d sweep (SigLIP/CLIP/ViT-style image towers) runs under ``-m slow``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from patch_family_discovery import (
    Family,
    candidate_modules,
    discover,
    discover_family,
    make_inputs,
    run_tower,
)

import vlforge

KNOWN = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v"}
"""A floor for discovery, not the list of families it finds."""
FP32_MAX_ABS = 1e-5
BF16_MIN_COSINE = 0.999


def _must_run(family: Family) -> bool:
    return family.kind == "Conv3d" and (family.name in KNOWN or family.name.startswith(("qwen", "glm")))


def _is_channels_last(x: torch.Tensor) -> bool:
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return fmt is not None and not x.is_contiguous() and x.is_contiguous(memory_format=fmt)


def _cosine(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    # float64: some towers (SAM's neck) output values ~1e-20 whose squares underflow in fp32.
    flat_a = torch.cat([t.double().flatten() for t in a])
    flat_b = torch.cat([t.double().flatten() for t in b])
    if torch.equal(flat_a, flat_b):
        return 1.0
    return F.cosine_similarity(flat_a, flat_b, dim=0).item()


def _check(family: Family) -> None:
    if family.tower is None:
        if _must_run(family):
            pytest.fail(f"{family.name} must build tiny but did not: {family.skip_reason}")
        pytest.skip(f"{family.name}: {family.skip_reason}")
    torch.manual_seed(0)
    model = family.tower(copy.deepcopy(family.config)).eval()
    try:
        inputs = make_inputs(family)
        stock = run_tower(model, inputs)
    except Exception as exc:
        if _must_run(family):
            raise
        pytest.skip(f"{family.name}: generic inputs do not fit {family.tower.__name__}: {exc}"[:300])
    if not stock:
        assert not _must_run(family), f"{family.tower.__name__} returned no floating tensor"
        pytest.skip(f"{family.name}: {family.tower.__name__} returned no floating tensor for a generic config")

    report = vlforge.patch(model)
    patched_names = [entry.name for entry in report.patched]
    assert set(family.conv_names) <= set(patched_names)
    stock_calls: list[str] = []
    for name in family.conv_names:
        conv = model.get_submodule(name)
        original = conv._conv_forward

        def spy(*args, _name=name, _original=original):
            stock_calls.append((_name, _is_channels_last(args[0])))
            return _original(*args)

        conv._conv_forward = spy
    patched = run_tower(model, inputs)
    for name in family.conv_names:
        del model.get_submodule(name)._conv_forward
    # The only documented fallback is a channels-last input (ConvNeXt-style downsamplers get one);
    # the Qwen/GLM patch embeddings must never fall back.
    assert all(channels_last for _, channels_last in stock_calls), f"unexpected fallback: {stock_calls}"
    if _must_run(family):
        assert stock_calls == [], f"patch conv fell back to the stock conv: {stock_calls}"
    assert [t.shape for t in patched] == [t.shape for t in stock]
    # Conv3d towers: absolute 1e-5 (their outputs reach ~5). The Conv2d sweep scales it by the output's
    # magnitude where that exceeds 1 (e.g. Phi-4-multimodal's pooled output reaches ~80).
    scale = max(1.0, max(t.abs().max().item() for t in stock)) if family.kind == "Conv2d" else 1.0
    worst = max((p - s).abs().max().item() for p, s in zip(patched, stock, strict=True))
    assert worst <= FP32_MAX_ABS * scale, f"{family.name}: fp32 max abs diff {worst:.3g} (scale {scale:.3g})"

    vlforge.unpatch(model)
    model = model.to(torch.bfloat16)
    bf16_inputs = make_inputs(family, torch.bfloat16)
    stock_bf16 = run_tower(model, bf16_inputs)
    vlforge.patch(model)
    patched_bf16 = run_tower(model, bf16_inputs)
    cosine = _cosine(patched_bf16, stock_bf16)
    assert cosine >= BF16_MIN_COSINE, f"{family.name}: bf16 cosine {cosine:.6f}"


@pytest.mark.parametrize("module_dir", sorted(candidate_modules("Conv3d")))
def test_conv3d_family_patched_tower_equals_stock(module_dir: str) -> None:
    _check(discover_family(module_dir, "Conv3d"))


def test_discovery_finds_at_least_the_known_families() -> None:
    found = {family.name: family for family in discover("Conv3d")}
    assert len(found) >= 8, sorted(found)
    assert set(found) >= KNOWN, sorted(found)
    for module_dir in candidate_modules("Conv3d"):
        family = discover_family(module_dir, "Conv3d")
        if _must_run(family):
            assert family.tower is not None, f"{family.name}: {family.skip_reason}"
    for family in found.values():
        assert family.tower.config_class is type(family.config)
        assert family.tower.__module__ == family.module
        for name in family.conv_names:
            conv = family.tower(copy.deepcopy(family.config)).get_submodule(name)
            assert type(conv) is torch.nn.Conv3d and conv.stride == conv.kernel_size


@pytest.mark.slow
@pytest.mark.parametrize("module_dir", sorted(candidate_modules("Conv2d")))
def test_conv2d_family_patched_tower_equals_stock(module_dir: str) -> None:
    family = discover_family(module_dir, "Conv2d")
    if family.tower is None and family.skip_reason is None:
        pytest.skip(f"{family.name}: no tower holds a stride==kernel Conv2d")
    _check(family)
