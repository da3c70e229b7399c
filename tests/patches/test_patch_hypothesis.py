"""Property tests: the GEMM forward equals the stock conv over random shapes, kernels, strides and dtypes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import vlforge
from vlforge.patches import is_patchable

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


@dataclass
class Case:
    nd: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    shape: tuple[int, ...]
    out_channels: int
    bias: bool
    dtype: str
    precision: str
    seed: int


@st.composite
def cases(draw: st.DrawFn, stride_equals_kernel: bool = True) -> Case:
    nd = draw(st.sampled_from([2, 3]))
    kernel = tuple(draw(st.integers(1, 5)) for _ in range(nd))
    stride = kernel if stride_equals_kernel else tuple(draw(st.integers(1, 5)) for _ in range(nd))
    windows = [draw(st.integers(1, 4)) for _ in range(nd)]
    remainders = [draw(st.integers(0, k - 1)) for k in kernel]  # the conv drops these; so must we
    spatial = tuple(n * k + r for n, k, r in zip(windows, kernel, remainders, strict=True))
    channels = draw(st.integers(1, 4))
    layout = draw(st.sampled_from(["batched", "unbatched", "windows"]))
    if layout == "windows":  # Qwen-VL layout: one window per row, (N, C, *kernel)
        shape = (draw(st.integers(1, 6)), channels, *kernel)
    elif layout == "batched":
        shape = (draw(st.integers(1, 3)), channels, *spatial)
    else:
        shape = (channels, *spatial)
    return Case(
        nd=nd,
        kernel=kernel,
        stride=stride,
        shape=shape,
        out_channels=draw(st.integers(1, 8)),
        bias=draw(st.booleans()),
        dtype=draw(st.sampled_from(sorted(DTYPES))),
        precision=draw(st.sampled_from(["native", "fp32"])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def _build(case: Case) -> tuple[nn.Module, torch.Tensor]:
    generator = torch.Generator().manual_seed(case.seed)
    conv_cls = nn.Conv2d if case.nd == 2 else nn.Conv3d
    channels = case.shape[-case.nd - 1]
    torch.manual_seed(case.seed)
    conv = conv_cls(channels, case.out_channels, case.kernel, stride=case.stride, bias=case.bias)
    conv = conv.to(DTYPES[case.dtype])
    x = torch.randn(case.shape, generator=generator, dtype=torch.float64).to(DTYPES[case.dtype])
    return conv, x


def _tolerance(case: Case, reference: torch.Tensor) -> dict[str, float]:
    if case.dtype == "float64":
        return {"rtol": 1e-12, "atol": 1e-12}
    if case.dtype == "float32":
        return {"rtol": 1e-5, "atol": 1e-5}
    # bf16: both round one fp32-accumulated result; allow two bf16 ulps of the largest output.
    scale = max(1.0, reference.abs().max().item())
    return {"rtol": 2**-7, "atol": 2 * 2**-8 * scale}


@settings(deadline=None, max_examples=60, database=None)
@given(cases())
def test_gemm_forward_equals_the_conv(case: Case) -> None:
    conv, x = _build(case)
    assert is_patchable(conv)
    stock = conv(x).detach()
    report = vlforge.patch(nn.Sequential(conv), precision=case.precision)
    assert report.patched[0].in_features == conv.in_channels * math.prod(case.kernel)
    out = conv(x).detach()
    assert out.shape == stock.shape and out.dtype == stock.dtype
    torch.testing.assert_close(out, stock, **_tolerance(case, stock))


@settings(deadline=None, max_examples=30, database=None)
@given(cases().filter(lambda c: c.dtype != "bfloat16"))
def test_gemm_gradients_equal_the_convs(case: Case) -> None:
    conv, x = _build(case)

    def grads() -> list[torch.Tensor]:
        conv.zero_grad()
        leaf = x.clone().requires_grad_(True)
        out = conv(leaf)
        out.backward(torch.ones_like(out) + torch.arange(out.numel(), dtype=out.dtype).view(out.shape) / 7)
        return [leaf.grad, *(p.grad for p in conv.parameters())]

    stock = grads()
    vlforge.patch(nn.Sequential(conv), precision=case.precision)
    for got, want in zip(grads(), stock, strict=True):
        tolerance = _tolerance(case, want)
        # a gradient sums many products: both paths' rounding grows with the size of the sum, so the absolute
        # bound scales with the largest element (seen: weight gradients near 920, both 3e-4..7e-4 from fp64)
        scale = max(1.0, want.abs().max().item())
        torch.testing.assert_close(got, want, rtol=tolerance["rtol"], atol=tolerance["atol"] * 10 * scale)


@settings(deadline=None, max_examples=30, database=None)
@given(cases(stride_equals_kernel=False))
def test_other_strides_are_left_to_the_conv(case: Case) -> None:
    conv, _ = _build(case)
    report = vlforge.patch(nn.Sequential(conv))
    assert (len(report) == 1) == (case.stride == case.kernel)
    assert is_patchable(conv) == (case.stride == case.kernel)
