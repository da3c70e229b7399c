"""The rule matrix: torch x cuDNN x dtype x memory format x patched, each against an independent statement."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import vlforge
from vlforge.diagnosis import report

TORCHES = ["2.8.0", "2.9.0", "2.9.1", "2.10.0"]
CUDNNS = [(9, 7), (9, 10), (9, 14), (9, 15)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FORMATS = ["contiguous", "channels_last_3d"]
CUDNN_RULES = {"cudnn-conv3d-skipped", "cudnn-conv3d-skipped-patched", "cudnn-conv3d-skipped-unpatchable"}


def expected_cudnn_verdict(torch_version: str, cudnn: tuple[int, int], dtype: str, memory_format: str,
                           patched: bool) -> str | None:
    """The rule in words: on CUDA, PyTorch runs a 3-D convolution with a non-1 kernel on its slow native
    path instead of cuDNN when the input is bf16 or fp16, the memory format is the default one, and
    the torch build is 2.9.0 (whatever the cuDNN) or 2.9.1 and later with a runtime cuDNN from 9.8 up
    to, but not including, 9.15. torch 2.8 is not affected. An unpatched conv is an error; once
    vlforge runs it as a GEMM it is only worth an info line."""
    version = tuple(int(part) for part in torch_version.split("."))
    if dtype not in ("bf16", "fp16") or memory_format != "contiguous":
        return None
    if version < (2, 9, 0):
        return None
    broken = True if version == (2, 9, 0) else (9, 8) <= cudnn < (9, 15)
    if not broken:
        return None
    return "info" if patched else "error"


def _conv_model(dtype: torch.dtype, memory_format: str, patched: bool) -> nn.Module:
    model = nn.Sequential(nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))).to(dtype)
    if memory_format == "channels_last_3d":
        model = model.to(memory_format=torch.channels_last_3d)
    if patched:
        vlforge.patch(model)
    return model


MATRIX = list(itertools.product(TORCHES, CUDNNS, list(DTYPES), FORMATS, [False, True]))


@pytest.mark.parametrize(("torch_version", "cudnn", "dtype", "memory_format", "patched"), MATRIX,
                         ids=["-".join(map(str, case)).replace(" ", "") for case in MATRIX])
def test_cudnn_conv3d_rule_matrix(torch_version, cudnn, dtype, memory_format, patched) -> None:
    model = _conv_model(DTYPES[dtype], memory_format, patched)
    assume = f"torch={torch_version},cudnn={cudnn[0]}.{cudnn[1]},device=cuda"
    rep = report(model, assume=assume, bench=False)

    found = [f for f in rep.findings if f.rule in CUDNN_RULES]
    expected = expected_cudnn_verdict(torch_version, cudnn, dtype, memory_format, patched)
    if expected is None:
        assert found == []
        assert rep.exit_code == 0
    else:
        assert [(f.severity, f.subject) for f in found] == [(expected, "0")]
        assert rep.exit_code == (3 if expected == "error" else 0)
        assert f"torch {torch_version}" in found[0].message
    assert rep.facts.assumed >= {"torch", "cudnn", "device"}


def test_matrix_covers_both_verdicts() -> None:
    verdicts = {expected_cudnn_verdict(*case) for case in MATRIX}
    assert verdicts == {None, "info", "error"}


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_cudnn_rule_needs_cuda(device: str) -> None:
    rep = report(_conv_model(torch.bfloat16, "contiguous", False), assume=f"torch=2.9.0,device={device}",
                 bench=False)
    assert not [f for f in rep.findings if f.rule in CUDNN_RULES]


def test_assumed_memory_format_overrides_the_weight() -> None:
    model = _conv_model(torch.bfloat16, "contiguous", False)
    rep = report(model, assume="torch=2.9.0,device=cuda,memory_format=channels_last_3d", bench=False)
    assert not [f for f in rep.findings if f.rule in CUDNN_RULES]


def test_overlapping_conv3d_is_a_warning_vlforge_cannot_patch() -> None:
    model = nn.Sequential(nn.Conv3d(3, 4, kernel_size=3, padding=1)).to(torch.bfloat16)
    rep = report(model, assume="torch=2.9.1,cudnn=9.13,device=cuda", bench=False)
    assert [(f.rule, f.severity) for f in rep.findings] == [("cudnn-conv3d-skipped-unpatchable", "warning")]
    assert rep.findings[0].action is None
    assert rep.exit_code == 1


def test_kernel_of_ones_is_not_affected() -> None:
    model = nn.Sequential(nn.Conv3d(3, 4, kernel_size=1)).to(torch.float16)
    rep = report(model, assume="torch=2.9.0,device=cuda", bench=False)
    assert rep.findings == []


@pytest.mark.parametrize("layers", [
    [nn.Linear(8, 8)],
    [nn.Conv2d(3, 8, kernel_size=14, stride=14)],  # a 2-D patch embedding: 4-D weight, not affected
])
def test_model_without_matching_conv_has_no_conv_finding(layers: list[nn.Module]) -> None:
    model = nn.Sequential(*layers).to(torch.bfloat16)
    rep = report(model, assume="torch=2.9.0,cudnn=91002,device=cuda,capability=12.0", bench=False)
    assert [f for f in rep.findings if "conv" in f.rule] == []
    assert rep.exit_code == 0


def expected_blackwell(capability: tuple[int, int], cudnn: tuple[int, int], dtype: str) -> bool:
    """Compute capability 12.x (consumer Blackwell) with cuDNN 9.10 has no fast bf16 conv3d kernel."""
    return capability[0] == 12 and cudnn == (9, 10) and dtype == "bf16"


@pytest.mark.parametrize("capability", [(8, 0), (9, 0), (12, 0), (12, 1)])
@pytest.mark.parametrize("cudnn", [(9, 10), (9, 15)])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("patched", [False, True])
def test_slow_bf16_conv3d_kernel_rule(capability, cudnn, dtype, patched) -> None:
    model = _conv_model(DTYPES[dtype], "contiguous", patched)
    # torch 2.8: cuDNN is used, so only the kernel-quality rule can fire.
    assume = f"torch=2.8.0,device=cuda,cudnn={cudnn[0]}.{cudnn[1]},capability={capability[0]}.{capability[1]}"
    rules = {f.rule: f.severity for f in report(model, assume=assume, bench=False).findings}
    if expected_blackwell(capability, cudnn, dtype):
        key = "slow-bf16-conv3d-kernel-patched" if patched else "slow-bf16-conv3d-kernel"
        assert rules == {key: "info" if patched else "error"}
    else:
        assert rules == {}


def test_cudnn_920_bf16_backward_warning() -> None:
    model = _conv_model(torch.bfloat16, "contiguous", False)
    rep = report(model, assume="torch=2.10.0,device=cuda,cudnn=9.20.0", bench=False)
    assert [(f.rule, f.severity) for f in rep.findings] == [("cudnn-920-bf16-backward", "warning")]


def _threads_pinned(assume: str) -> str:
    """The case with ``threads=2`` unless it names them: the live count is this process's (an xdist worker of two
    on 2 cores computes with one thread, which ``cpu-one-thread`` would rightly flag)."""
    return assume if "threads=" in assume else f"{assume},threads=2"


@pytest.mark.parametrize(("assume", "rule", "severity"), [
    ("attn=flash_attention_2,flash_attn=absent", "flash-attn-missing", "error"),
    ("attn=flash_attention_3,flash_attn_3=absent", "flash-attn-missing", "error"),
    ("dtype=bf16,device=cuda,bf16_supported=false", "bf16-unsupported", "error"),
    ("device=cpu,threads=1", "cpu-one-thread", "warning"),
    ("device=cuda,capability=8.0,tf32_matmul=false,dtype=fp32", "tf32-off", "warning"),
])
def test_environment_rules_fire(assume: str, rule: str, severity: str) -> None:
    rep = report(assume=_threads_pinned(assume))
    assert [(f.rule, f.severity) for f in rep.findings] == [(rule, severity)]


@pytest.mark.parametrize("assume", [
    "attn=flash_attention_2,flash_attn=2.8.3",
    "attn=sdpa,flash_attn=absent",
    "dtype=bf16,device=cuda,bf16_supported=true",
    "device=cpu,threads=2",
    "device=cuda,capability=7.5,tf32_matmul=false,dtype=fp32",
    "device=cuda,capability=9.0,tf32_matmul=false,dtype=bf16",
    "device=cuda,capability=9.0,tf32_matmul=true,dtype=fp32",
])
def test_environment_rules_stay_quiet(assume: str) -> None:
    assert report(assume=_threads_pinned(assume + ",torch=2.10.0,cudnn=absent")).findings == []


@pytest.mark.parametrize(("torch_version", "cudnn", "dtype", "fires"), [
    ("2.9.0", "absent", "bf16", True),
    ("2.9.1", "9.13", "absent", True),
    ("2.9.1", "9.13", "fp32", False),
    ("2.9.1", "9.16", "bf16", False),
    ("2.8.0", "9.10", "bf16", False),
])
def test_environment_only_conv3d_warning(torch_version, cudnn, dtype, fires) -> None:
    rep = report(assume=f"torch={torch_version},cudnn={cudnn},dtype={dtype},device=cuda")
    rules = [f.rule for f in rep.findings]
    assert rules == (["cudnn-conv3d-skipped-env"] if fires else [])
