"""The patch API on real transformers models: report, logging, unpatch, include, precision, fallbacks."""

from __future__ import annotations

import logging

import pytest
import torch
from patch_tiny_qwen import image_batch, tiny_qwen3_vl_config, tiny_vision_config, vision_inputs
from torch import nn
from transformers import AutoModelForImageTextToText, Qwen3VLForConditionalGeneration
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

import vlforge
from vlforge.errors import PatchError, VlforgeError
from vlforge.patches import (
    GemmConv3d,
    TransformersPatch,
    is_patchable,
    is_patched,
    patched_modules,
    unpatch_transformers,
)

PROJ = "patch_embed.proj"


@pytest.fixture
def tower() -> Qwen3VLVisionModel:
    torch.manual_seed(0)
    return Qwen3VLVisionModel(tiny_vision_config()).eval()


@pytest.fixture
def inputs() -> dict[str, torch.Tensor]:
    return vision_inputs(tiny_vision_config(), [[1, 4, 4], [2, 2, 4]])


@pytest.fixture(autouse=True)
def _no_class_level_patch():
    unpatch_transformers()
    yield
    unpatch_transformers()


def _tower_out(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def test_report_lists_every_patch_conv_with_its_shape(tower: Qwen3VLVisionModel) -> None:
    report = vlforge.patch(tower)
    assert len(report) == 1
    (entry,) = report.patched
    assert entry.name == PROJ
    assert entry.conv == "Conv3d"
    assert entry.kernel == (2, 16, 16)
    assert entry.in_features == 3 * 2 * 16 * 16
    assert entry.out_features == tower.config.hidden_size
    assert entry.bias is True
    assert entry.precision == "native"
    assert entry.newly_patched is True
    assert report.newly_patched == [PROJ]
    as_dict = report.to_dict()
    assert as_dict["precision"] == "native"
    assert as_dict["patched"][0]["kernel"] == (2, 16, 16)
    assert PROJ in report.summary() and "1 convolution" in report.summary()
    assert patched_modules(tower) == [PROJ]


def test_each_swap_and_each_restore_is_logged(tower: Qwen3VLVisionModel, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="vlforge.patches.registry"):
        vlforge.patch(tower, precision="fp32")
    swaps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("patched ")]
    assert len(swaps) == 1
    assert PROJ in swaps[0] and "(1536 -> 32)" in swaps[0] and "fp32" in swaps[0]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vlforge.patches.registry"):
        assert vlforge.unpatch(tower) == 1
    assert any(PROJ in r.getMessage() and "unpatched" in r.getMessage() for r in caplog.records)


def test_patched_tower_equals_stock_and_unpatch_restores_stock_exactly(tower, inputs) -> None:
    stock = _tower_out(tower, inputs)
    vlforge.patch(tower)
    conv = tower.get_submodule(PROJ)
    assert isinstance(conv, GemmConv3d) and isinstance(conv, nn.Conv3d) and is_patched(conv)
    patched = _tower_out(tower, inputs)
    assert (patched - stock).abs().max().item() <= 1e-5
    assert vlforge.unpatch(tower) == 1
    assert type(conv) is nn.Conv3d and not is_patched(conv)
    assert "_vlforge_precision" not in conv.__dict__
    assert torch.equal(_tower_out(tower, inputs), stock)
    assert vlforge.unpatch(tower) == 0


def test_patching_twice_is_a_no_op(tower, inputs) -> None:
    vlforge.patch(tower)
    conv = tower.get_submodule(PROJ)
    klass = type(conv)
    first = _tower_out(tower, inputs)
    again = vlforge.patch(tower)
    assert again.newly_patched == []
    assert [e.name for e in again.patched] == [PROJ] and not again.patched[0].newly_patched
    assert type(conv) is klass and klass.__mro__.count(GemmConv3d) == 1
    assert torch.equal(_tower_out(tower, inputs), first)
    assert vlforge.unpatch(tower) == 1 and type(conv) is nn.Conv3d


def test_parameters_storage_and_state_dict_are_untouched(tower) -> None:
    before = {name: (id(p), p.data_ptr(), tuple(p.shape)) for name, p in tower.named_parameters()}
    keys = list(tower.state_dict())
    values = {k: v.clone() for k, v in tower.state_dict().items()}
    vlforge.patch(tower)
    assert {name: (id(p), p.data_ptr(), tuple(p.shape)) for name, p in tower.named_parameters()} == before
    assert list(tower.state_dict()) == keys
    assert all(torch.equal(v, values[k]) for k, v in tower.state_dict().items())
    vlforge.unpatch(tower)
    assert {name: (id(p), p.data_ptr(), tuple(p.shape)) for name, p in tower.named_parameters()} == before
    assert list(tower.state_dict()) == keys


def test_include_limits_the_patch_to_named_modules() -> None:
    model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config())
    full = "model.visual.patch_embed.proj"
    for pattern in (full, "model.visual", "*.patch_embed.*"):
        report = vlforge.patch(model, include=[pattern])
        assert [e.name for e in report.patched] == [full], pattern
        vlforge.unpatch(model)
    two = nn.ModuleDict(
        {"a": nn.Conv2d(3, 4, 2, stride=2), "b": nn.Conv2d(3, 4, 2, stride=2), "c": nn.Conv2d(3, 4, 3)}
    )
    report = vlforge.patch(two, include="b")
    assert [e.name for e in report.patched] == ["b"]
    assert patched_modules(two) == ["b"] and not is_patched(two["a"])


def test_include_that_matches_nothing_raises_patch_error() -> None:
    model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config())
    with pytest.raises(PatchError, match=r"include='model\.visual\.nope' matches nothing.*no module has that name"):
        vlforge.patch(model, include=["model.visual.nope"])
    with pytest.raises(PatchError, match=r"names 'model\.language_model'.*no stride==kernel"):
        vlforge.patch(model, include=["model.visual", "model.language_model"])
    assert patched_modules(model) == []  # nothing half-applied
    assert issubclass(PatchError, VlforgeError)


def test_bad_precision_raises_patch_error(tower) -> None:
    with pytest.raises(PatchError, match="precision='fp16'"):
        vlforge.patch(tower, precision="fp16")
    with pytest.raises(PatchError, match="precision='bf16'"):
        vlforge.patch_transformers(precision="bf16")
    assert patched_modules(tower) == []


def _qwen_conv(dtype: torch.dtype, precision: str | None, state: dict[str, torch.Tensor]) -> nn.Conv3d:
    conv = nn.Conv3d(3, 64, (2, 16, 16), stride=(2, 16, 16))
    conv.load_state_dict(state)
    conv = conv.to(dtype)
    if precision is not None:
        vlforge.patch(nn.Sequential(conv), precision=precision)
    return conv


@pytest.mark.parametrize("shape", [(256, 3, 2, 16, 16), (2, 3, 4, 64, 64)], ids=["windows", "clip"])
def test_fp32_precision_with_bf16_input_is_closer_to_fp64_than_native(shape) -> None:
    # Mixed precision as trainers run it: fp32 weights, bf16 activations, autocast on. "native" lets
    # autocast round the weights to bf16 (as the stock conv does); "fp32" keeps them.
    torch.manual_seed(0)
    state = nn.Conv3d(3, 64, (2, 16, 16), stride=(2, 16, 16)).state_dict()
    x = torch.randn(shape).bfloat16()
    reference = _qwen_conv(torch.float64, None, state)(x.double()).detach()
    errors = {}
    for precision in ("native", "fp32", None):
        conv = _qwen_conv(torch.float32, precision, state)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = conv(x)
        assert out.dtype == torch.bfloat16
        errors[precision] = (out.double() - reference).abs().mean().item()
    assert errors["fp32"] < 0.9 * errors["native"], errors
    assert errors["native"] <= 1.01 * errors[None], errors  # native = what the stock conv gives


@pytest.mark.parametrize("shape", [(256, 3, 2, 16, 16), (2, 3, 4, 64, 64)], ids=["windows", "clip"])
def test_bf16_weights_native_is_as_accurate_as_the_conv_and_fp32_no_worse(shape) -> None:
    # Regression: the clip path added the bias after rounding the GEMM to bf16 (two roundings), mean
    # error 1.2x the stock conv's. The bias is now fused, as the conv fuses it.
    torch.manual_seed(0)
    state = nn.Conv3d(3, 64, (2, 16, 16), stride=(2, 16, 16)).state_dict()
    state["bias"] = state["bias"] * 50
    x = torch.randn(shape).bfloat16()
    reference = _qwen_conv(torch.float64, None, state)(x.double()).detach()
    errors = {}
    for precision in ("native", "fp32", None):
        out = _qwen_conv(torch.bfloat16, precision, state)(x)
        assert out.dtype == torch.bfloat16
        errors[precision] = (out.double() - reference).abs().mean().item()
    assert errors["native"] <= 1.01 * errors[None], errors
    assert errors["fp32"] <= 1.01 * errors["native"], errors


def test_fp32_precision_computes_in_fp32_under_autocast() -> None:
    # Regression: autocast used to re-cast the "fp32" GEMM back to bf16 (weights rounded to bf16).
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 64, (2, 16, 16), stride=(2, 16, 16))
    x = torch.randn(256, 3, 2, 16, 16)
    reference = conv.double()(x.double()).detach()
    conv = conv.float()
    vlforge.patch(nn.Sequential(conv), precision="fp32")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(x)
    assert out.dtype == torch.bfloat16  # what the stock conv returns under autocast
    rounding_only = (reference.bfloat16().double() - reference).abs().mean().item()
    assert (out.double() - reference).abs().mean().item() <= 1.01 * rounding_only


def test_fp32_precision_never_lowers_fp64() -> None:
    # Regression: "fp32" used to compute fp64 inputs in fp32 (error ~1e-7 instead of ~1e-15).
    conv = nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4)).double()
    x = torch.randn(10, 3, 2, 4, 4, dtype=torch.float64)
    y = torch.randn(2, 3, 4, 8, 12, dtype=torch.float64)
    stock_x, stock_y = conv(x), conv(y)
    vlforge.patch(nn.Sequential(conv), precision="fp32")
    assert conv(x).dtype == torch.float64
    torch.testing.assert_close(conv(x), stock_x, rtol=0, atol=1e-12)
    torch.testing.assert_close(conv(y), stock_y, rtol=0, atol=1e-12)


def test_empty_batch_works_like_the_conv() -> None:
    # Regression: reshape(0, -1) raised for a batch of zero windows.
    conv = nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4))
    vlforge.patch(nn.Sequential(conv))
    for shape in [(0, 3, 2, 4, 4), (0, 3, 4, 8, 8)]:
        x = torch.randn(shape)
        out = conv(x)
        assert out.shape == nn.functional.conv3d(x, conv.weight, conv.bias, stride=conv.stride).shape


def test_wrong_channel_count_raises_the_convs_own_error() -> None:
    conv = nn.Conv3d(3, 16, (2, 4, 4), stride=(2, 4, 4))
    x = torch.randn(5, 4, 2, 4, 4)
    with pytest.raises(RuntimeError) as stock:
        conv(x)
    vlforge.patch(nn.Sequential(conv))
    with pytest.raises(RuntimeError) as patched:
        conv(x)
    assert str(patched.value) == str(stock.value)


@pytest.mark.parametrize(
    "conv, patchable",
    [
        (nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)), True),
        (nn.Conv2d(3, 8, 4, stride=4, padding="valid"), True),
        (nn.Conv2d(3, 8, 1), True),  # pointwise: a GEMM too
        (nn.Conv3d(3, 8, (2, 4, 4), stride=(1, 4, 4)), False),
        (nn.Conv2d(3, 8, 4, stride=4, padding=1), False),
        (nn.Conv2d(3, 8, 4, stride=4, dilation=2), False),
        (nn.Conv2d(4, 8, 4, stride=4, groups=2), False),
        (nn.Conv2d(3, 8, 1, padding="same"), False),
        (nn.Conv1d(3, 8, 4, stride=4), False),
        (nn.ConvTranspose2d(3, 8, 4, stride=4), False),
        (nn.Linear(3, 8), False),
    ],
)
def test_the_patch_rule(conv: nn.Module, patchable: bool) -> None:
    assert is_patchable(conv) is patchable


def test_conv_subclasses_with_their_own_forward_are_left_alone() -> None:
    # Regression: a stride==kernel subclass that changes the forward (here BiT's weight-standardised
    # conv and Perceiver's same-padding conv, both real transformers classes) was patched and its
    # extra computation silently dropped.
    from transformers.models.bit.modeling_bit import WeightStandardizedConv2d
    from transformers.models.perceiver.modeling_perceiver import Conv2dSamePadding

    class Renamed(nn.Conv2d):  # a subclass that keeps the stock forward is still patchable
        pass

    ws = WeightStandardizedConv2d(3, 8, 4, stride=4, padding="VALID")
    same = Conv2dSamePadding(3, 8, 4, stride=4)
    plain = Renamed(3, 8, 4, stride=4)
    model = nn.ModuleDict({"ws": ws, "same": same, "plain": plain})
    x = torch.randn(2, 3, 8, 8)
    stock = {name: module(x) for name, module in model.items()}
    assert not is_patchable(ws) and not is_patchable(same) and is_patchable(plain)
    report = vlforge.patch(model)
    assert [e.name for e in report.patched] == ["plain"] and report.patched[0].conv == "Renamed"
    for name, module in model.items():
        torch.testing.assert_close(module(x), stock[name], atol=1e-5, rtol=1e-5)
    with pytest.raises(PatchError, match="include='ws'"):
        vlforge.patch(model, include=["ws"])
    assert vlforge.unpatch(model) == 1 and type(plain) is Renamed


def test_channels_last_input_falls_back_to_the_stock_conv(monkeypatch) -> None:
    conv = nn.Conv2d(3, 8, 4, stride=4)
    x = torch.randn(2, 3, 16, 16).contiguous(memory_format=torch.channels_last)
    stock = conv(x)
    vlforge.patch(nn.Sequential(conv))
    calls = []
    original = conv._conv_forward

    def spy(*args):
        calls.append(args[0].shape)
        return original(*args)

    monkeypatch.setattr(conv, "_conv_forward", spy)
    out = conv(x)
    assert calls == [x.shape]
    assert torch.equal(out, stock)
    conv3 = nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4))
    x3 = torch.randn(2, 3, 4, 8, 8).contiguous(memory_format=torch.channels_last_3d)
    stock3 = conv3(x3)
    vlforge.patch(nn.Sequential(conv3))
    torch.testing.assert_close(conv3(x3), stock3, rtol=0, atol=0)
    # A channels-first input of the same conv does take the GEMM path.
    calls.clear()
    conv(x.contiguous())
    assert calls == []


def test_patch_transformers_patches_models_built_later_and_its_context_undoes_it() -> None:
    config = tiny_qwen3_vl_config()
    with vlforge.patch_transformers(precision="fp32") as handle:
        assert isinstance(handle, TransformersPatch) and handle.active
        assert vlforge.patch_transformers(precision="fp32") is handle  # second call: no-op
        with pytest.raises(PatchError, match="already active"):
            vlforge.patch_transformers(precision="native")
        direct = Qwen3VLForConditionalGeneration(config)
        auto = AutoModelForImageTextToText.from_config(config)
    assert not handle.active
    after = Qwen3VLForConditionalGeneration(config)
    for model in (direct, auto):
        assert patched_modules(model) == ["model.visual.patch_embed.proj"]
        assert model.model.visual.patch_embed.proj._vlforge_precision == "fp32"
    assert patched_modules(after) == []
    # A model built under the patch computes what a stock one does.
    auto.load_state_dict(after.state_dict())
    batch = image_batch(config)
    with torch.no_grad():
        torch.testing.assert_close(auto.eval()(**batch).logits, after.eval()(**batch).logits, atol=1e-5, rtol=1e-5)


def test_patch_transformers_without_context_manager_until_undone() -> None:
    handle = vlforge.patch_transformers(include=["model.visual"])
    try:
        model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config())
        # Every PreTrainedModel inside (the tower too) runs post_init with its own names; the pattern
        # matches at the outer model, so the one conv under model.visual is patched once.
        assert patched_modules(model) == ["model.visual.patch_embed.proj"]
    finally:
        handle.undo()
    handle.undo()  # idempotent
    assert patched_modules(Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config())) == []
    assert unpatch_transformers() is False


def _grads(module: nn.Module, x: torch.Tensor, out_grad: torch.Tensor) -> list[torch.Tensor]:
    module.zero_grad()
    x = x.clone().requires_grad_(True)
    module(x).backward(out_grad)
    return [x.grad, *(p.grad for p in module.parameters())]


@pytest.mark.parametrize(
    "nd, shape", [(3, (64, 3, 2, 16, 16)), (3, (2, 3, 5, 35, 50)), (2, (3, 36, 33)), (2, (2, 3, 32, 48))]
)
def test_gradients_equal_the_convs(nd: int, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    conv = nn.Conv3d(3, 24, (2, 16, 16), stride=(2, 16, 16)) if nd == 3 else nn.Conv2d(3, 24, 16, stride=16)
    x = torch.randn(shape)
    with torch.no_grad():
        counts = [s // k for s, k in zip(shape[-len(conv.kernel_size):], conv.kernel_size, strict=True)]
    out_grad = torch.randn(*conv(x).shape)
    assert list(out_grad.shape[-len(counts):]) == counts
    stock = _grads(conv, x, out_grad)
    vlforge.patch(nn.Sequential(conv))
    patched = _grads(conv, x, out_grad)
    for got, want in zip(patched, stock, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_tower_gradients_equal_the_stock_towers(tower, inputs) -> None:
    def grads() -> dict[str, torch.Tensor]:
        tower.zero_grad()
        tower(**inputs).last_hidden_state.pow(2).mean().backward()
        return {name: p.grad.clone() for name, p in tower.named_parameters() if p.grad is not None}

    stock = grads()
    vlforge.patch(tower)
    patched = grads()
    assert set(patched) == set(stock) and f"{PROJ}.weight" in stock
    for name, want in stock.items():
        torch.testing.assert_close(patched[name], want, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("precision", ["native", "fp32"])
def test_torch_compile_of_the_patched_patch_module(tower, precision: str) -> None:
    torch._dynamo.reset()
    embed = tower.patch_embed
    x = vision_inputs(tower.config, [[1, 4, 4]])["hidden_states"]
    stock = embed(x).detach()
    vlforge.patch(embed, precision=precision)
    compiled = torch.compile(embed, fullgraph=True)  # fullgraph: a graph break would raise
    x_eager = x.clone().requires_grad_(True)
    x_comp = x.clone().requires_grad_(True)
    eager_out = embed(x_eager)
    out = compiled(x_comp)
    torch.testing.assert_close(out, stock, atol=1e-5, rtol=1e-5)
    eager_out.sum().backward()
    weight_grad = embed.proj.weight.grad.clone()
    embed.zero_grad()
    out.sum().backward()
    torch.testing.assert_close(x_comp.grad, x_eager.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(embed.proj.weight.grad, weight_grad, atol=1e-4, rtol=1e-4)
    if precision == "fp32":  # bf16 weights and input: still one graph, bf16 out, close to eager
        embed.bfloat16()
        with torch.no_grad():
            got, want = compiled(x.bfloat16()), embed(x.bfloat16())
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
