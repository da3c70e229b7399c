"""The numerical pieces of verify: reference logic, KL / top-k agreement, pooled cosines."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from vlforge.verify import check_layer
from vlforge.verify.checks import abs_diff, cosine, logits_agreement, reference_error, split_pooled
from vlforge.verify.runner import first_divergence, reference_dtype_for


def _conv() -> tuple[nn.Conv3d, torch.Tensor]:
    torch.manual_seed(3)
    conv = nn.Conv3d(3, 32, kernel_size=(2, 8, 8), stride=(2, 8, 8))
    return conv, torch.randn(40, 3, 2, 8, 8)


def test_layer_reference_is_the_exact_result_of_the_bf16_weights_and_input():
    conv, x = _conv()
    result, honesty = check_layer("proj", conv, x, precision="native", reference_dtype=torch.float64)
    assert [row.variant for row in honesty] == ["stock bf16", "patched bf16 native", "patched bf16 fp32"]
    # recompute the reference by hand: bf16-rounded weights and input, evaluated in fp64
    exact = nn.functional.conv3d(x.bfloat16().double(), conv.weight.bfloat16().double(),
                                 conv.bias.bfloat16().double(), stride=conv.stride)
    stock = conv.to(torch.bfloat16)(x.bfloat16())
    conv.float()
    assert honesty[0].max_abs == pytest.approx(reference_error(stock, exact)["max_abs"])
    assert honesty[0].relative_rms == pytest.approx(reference_error(stock, exact)["relative_rms"])
    # the fp32-accumulated patched path rounds once to bf16: within bf16's half-ulp relative bound
    assert 0 < honesty[2].relative_rms < 2.0 ** -8
    assert result.fp32_max_abs_diff < 1e-5 and result.bf16_cosine > 0.999
    assert result.input_shape == [40, 3, 2, 8, 8] and result.kernel == [2, 8, 8]
    # the module under test is untouched: still stock fp32
    assert type(conv) is nn.Conv3d and conv.weight.dtype == torch.float32


def test_reference_dtype_is_fp64_on_cpu_and_fp32_on_accelerators():
    assert reference_dtype_for(torch.device("cpu")) == torch.float64
    assert reference_dtype_for(torch.device("cuda", 0)) == torch.float32


def test_kl_and_topk_agreement_against_hand_computed_values():
    stock = torch.tensor([[[2.0, 1.0, 0.0, -1.0, -2.0, -3.0]]])
    same = logits_agreement(stock, stock.clone())
    assert same["kl_mean"] == 0 and same["top1"] == 1 and same["topk"] == 1
    swapped = stock.clone()
    swapped[..., [0, 1]] = swapped[..., [1, 0]]
    result = logits_agreement(stock, swapped, k=3)
    p = torch.softmax(stock[0, 0].double(), -1)
    q = torch.softmax(swapped[0, 0].double(), -1)
    assert result["kl_mean"] == pytest.approx(float((p * (p / q).log()).sum()), rel=1e-5)
    assert result["top1"] == 0 and result["topk"] == 1  # same top-3 set, different argmax
    moved = stock.clone()
    moved[..., 5] = 10.0
    assert logits_agreement(stock, moved, k=3)["topk"] == 0


def test_diff_cosine_pooling_and_generation_divergence():
    a = torch.tensor([[1.0, 0.0], [3.0, 4.0], [0.0, 2.0]])
    assert abs_diff(a, a + torch.tensor([[0.0, 0.5], [0, 0], [0, 0]])) == {"max": 0.5, "mean": 0.5 / 6}
    assert cosine(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0
    assert cosine(torch.zeros(3), torch.zeros(3)) == 1.0
    pooled = split_pooled(a, [1, 2])
    assert pooled[1].tolist() == [1.5, 3.0]
    with pytest.raises(ValueError, match="do not split"):
        split_pooled(a, [1, 1])
    gen = torch.tensor([[5, 6, 7], [5, 6, 7]])
    assert first_divergence(gen, gen.clone()) is None
    other = gen.clone()
    other[1, 2] = 0
    assert first_divergence(gen, other) == 2
    assert first_divergence(gen, gen[:, :2]) == 2
    assert math.isclose(cosine(a, 2 * a), 1.0)


def test_a_nan_in_a_later_layer_or_sample_fails_its_check() -> None:
    import math

    from vlforge.verify.report import EndToEnd, LayerResult, TowerResult
    from vlforge.verify.runner import VerifyOptions, _threshold_checks

    fields = set(LayerResult.model_fields)
    base = {name: 0.0 for name in fields if name not in ("name", "fp32_max_abs_diff", "bf16_cosine")}
    layers = [LayerResult.model_construct(name="a", fp32_max_abs_diff=1e-7, bf16_cosine=0.99999, **base),
              LayerResult.model_construct(name="b", fp32_max_abs_diff=math.nan, bf16_cosine=math.nan, **base)]
    tower = TowerResult.model_construct(module="visual", min_pooled_cosine=math.nan)
    e2e = EndToEnd.model_construct(kl_mean=0.0, top1=1.0, generated_tokens=0, generation_identical=True)
    checks = _threshold_checks(VerifyOptions(model="m"), layers, tower, e2e)
    failed = {check.name: check.where for check in checks if not check.passed}
    assert failed.get("patch_layer.fp32_max_abs_diff") == "b"
    assert failed.get("patch_layer.bf16_cosine") == "b"
    assert "vision_tower.pooled_cosine" in failed
