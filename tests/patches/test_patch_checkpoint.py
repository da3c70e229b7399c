"""A model saved while patched is a stock checkpoint: stock transformers loads it and computes the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from patch_family_discovery import float_outputs
from patch_tiny_qwen import image_batch, tiny_qwen3_vl_config
from safetensors import safe_open
from transformers import AutoModelForImageTextToText, Qwen3VLForConditionalGeneration

import vlforge
from vlforge.patches import is_patched, patched_modules


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    assert files, f"no safetensors in {directory}"
    tensors = {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            tensors.update({key: handle.get_tensor(key) for key in handle.keys()})  # noqa: SIM118
    return tensors


def test_save_pretrained_while_patched_loads_into_stock_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = tiny_qwen3_vl_config()
    model = Qwen3VLForConditionalGeneration(config).eval()
    stock_dir, patched_dir = tmp_path / "stock", tmp_path / "patched"
    model.save_pretrained(stock_dir)
    batch = image_batch(config)
    with torch.no_grad():
        stock_logits = model(**batch).logits

    vlforge.patch(model)
    with torch.no_grad():
        patched_logits = model(**batch).logits
    model.save_pretrained(patched_dir)
    assert patched_modules(model) == ["model.visual.patch_embed.proj"]

    stock_tensors, patched_tensors = _tensors(stock_dir), _tensors(patched_dir)
    assert list(patched_tensors) == list(stock_tensors)
    assert any(key.endswith("patch_embed.proj.weight") for key in patched_tensors)
    for key, value in stock_tensors.items():
        assert torch.equal(patched_tensors[key], value), key
        assert patched_tensors[key].shape == value.shape
    assert (patched_dir / "config.json").read_text() == (stock_dir / "config.json").read_text()

    loaded = AutoModelForImageTextToText.from_pretrained(patched_dir).eval()
    assert type(loaded) is Qwen3VLForConditionalGeneration
    assert patched_modules(loaded) == [] and not is_patched(loaded.model.visual.patch_embed.proj)
    assert type(loaded.model.visual.patch_embed.proj) is torch.nn.Conv3d
    with torch.no_grad():
        loaded_logits = loaded(**batch).logits
    assert torch.equal(loaded_logits, stock_logits)  # same weights, same stock code: bit-identical
    assert (patched_logits - stock_logits).abs().max().item() <= 1e-5


def test_patched_model_loads_a_stock_checkpoint_and_matches(tmp_path: Path) -> None:
    torch.manual_seed(1)
    config = tiny_qwen3_vl_config()
    Qwen3VLForConditionalGeneration(config).save_pretrained(tmp_path)
    stock = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    with vlforge.patch_transformers():
        fast = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert patched_modules(fast) == ["model.visual.patch_embed.proj"]
    assert list(fast.state_dict()) == list(stock.state_dict())
    batch = image_batch(config, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(fast(**batch).logits, stock(**batch).logits, atol=1e-5, rtol=1e-5)


def _tiny_families() -> list[str]:
    from vlforge.models.tiny import families

    return families()


@pytest.mark.parametrize("family", _tiny_families())
def test_tiny_checkpoint_round_trip_while_patched(family: str, tiny_checkpoint, tmp_path: Path) -> None:
    source = tiny_checkpoint(family)
    model = AutoModelForImageTextToText.from_pretrained(source).eval()
    vision = model.config.vision_config
    merge = vision.spatial_merge_size
    grid = torch.tensor([[1, 2 * merge, 2 * merge], [1, merge, 2 * merge]])
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    pixels = torch.randn(int(grid.prod(dim=1).sum()), width, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        stock = float_outputs(model.model.visual(pixels, grid_thw=grid))
    report = vlforge.patch(model)
    assert "model.visual.patch_embed.proj" in report.newly_patched
    with torch.no_grad():
        patched = float_outputs(model.model.visual(pixels, grid_thw=grid))
    worst = max((p - s).abs().max().item() for p, s in zip(patched, stock, strict=True))
    assert worst <= 1e-5, f"{family}: {worst:.3g}"
    model.save_pretrained(tmp_path)
    saved, original = _tensors(tmp_path), _tensors(source)
    assert sorted(saved) == sorted(original)
    assert all(torch.equal(saved[key], value) for key, value in original.items())
    loaded = AutoModelForImageTextToText.from_pretrained(tmp_path).eval()
    assert patched_modules(loaded) == []
    with torch.no_grad():
        again = float_outputs(loaded.model.visual(pixels, grid_thw=grid))
    assert all(torch.equal(a, s) for a, s in zip(again, stock, strict=True))
