"""Facts: read from this process, absent when unknown, overridable with --assume."""

from __future__ import annotations

import pytest
import torch

from vlforge.diagnosis import DoctorError, apply_assume, collect_facts, parse_assume
from vlforge.diagnosis.facts import format_cudnn, parse_cudnn, torch_release
from vlforge.errors import VlforgeError


def test_collected_facts_match_this_process() -> None:
    facts = collect_facts()
    assert facts.torch == torch.__version__
    assert facts.cpu_threads == torch.get_num_threads()
    expected_cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    assert facts.cudnn == expected_cudnn
    assert facts.device == ("cuda" if torch.cuda.is_available() else facts.device)
    assert facts.assumed == set()
    import transformers

    assert facts.transformers == transformers.__version__


def test_absent_facts_are_none_and_shown_as_absent() -> None:
    facts = collect_facts()
    if torch.cuda.is_available():
        pytest.skip("this check is for a machine without CUDA")
    assert facts.gpu_name is None and facts.capability is None and facts.torch_cuda is None
    assert facts.display("gpu_name") == "absent"
    assert facts.to_dict()["capability"] == {"value": None, "assumed": False}


@pytest.mark.parametrize(("text", "value"), [("91002", 91002), ("9.10.2", 91002), ("9.10", 91000),
                                             ("9.7", 90700), ("9.15.1", 91501), ("8.9.2", 8902)])
def test_parse_cudnn(text: str, value: int) -> None:
    assert parse_cudnn(text) == value
    assert parse_cudnn(format_cudnn(value)) == value


@pytest.mark.parametrize(("text", "release"), [("2.9.1+cu128", (2, 9, 1)), ("2.10", (2, 10, 0)),
                                               ("2.13.0+cpu", (2, 13, 0)), ("nonsense", None)])
def test_torch_release(text: str, release) -> None:
    assert torch_release(text) == release


def test_assume_overrides_and_marks_assumed() -> None:
    facts = apply_assume(collect_facts(), "torch=2.9.1,cudnn=91002,device=cuda,capability=12.0,dtype=bfloat16,"
                                          "gpu=NVIDIA GeForce RTX 5090")
    assert (facts.torch, facts.cudnn, facts.device, facts.capability, facts.dtype) == (
        "2.9.1", 91002, "cuda", (12, 0), "bfloat16")
    assert facts.gpu_name == "NVIDIA GeForce RTX 5090"
    assert facts.assumed == {"torch", "cudnn", "device", "capability", "dtype", "gpu_name"}
    as_json = facts.to_dict()
    assert as_json["capability"] == {"value": "12.0", "assumed": True}
    assert as_json["python"]["assumed"] is False


def test_assuming_another_device_drops_facts_read_from_this_one() -> None:
    detected = collect_facts()
    other = "xpu" if detected.device == "cuda" else "cuda"
    facts = apply_assume(collect_facts(), f"device={other}")
    assert facts.bf16_supported is None and facts.capability is None and facts.gpu_name is None
    assert facts.cpu_threads == detected.cpu_threads


def test_assume_absent_makes_a_fact_absent() -> None:
    facts = apply_assume(collect_facts(), "transformers=absent")
    assert facts.transformers is None and "transformers" in facts.assumed


@pytest.mark.parametrize(("spec", "needle"), [
    ("tourch=2.9.1", "did you mean 'torch'"),
    ("cudn=91002", "did you mean 'cudnn'"),
    ("capabilty=12.0", "did you mean 'capability'"),
    ("zzzz=1", "known keys:"),
    ("cudnn=nine", "cudnn"),
    ("capability=12", "capability"),
    ("dtype=int8", "dtype"),
    ("threads=many", "threads"),
    ("torch", "key=value"),
])
def test_bad_assume_is_one_line_error(spec: str, needle: str) -> None:
    with pytest.raises(DoctorError) as caught:
        parse_assume(spec)
    assert isinstance(caught.value, VlforgeError)
    message = str(caught.value)
    assert needle in message and "\n" not in message
