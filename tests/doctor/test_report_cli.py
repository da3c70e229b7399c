"""The JSON schema, the exit codes, and the `vlforge doctor` command."""

from __future__ import annotations

import json
import subprocess

import pytest
from rich.console import Console
from typer.testing import CliRunner

import warmstart
from vlforge.cli import app
from vlforge.diagnosis import SCHEMA_VERSION, report
from vlforge.diagnosis.facts import Facts
from vlforge.doctor import render

runner = CliRunner()

FINDING_KEYS = {"rule": str, "severity": str, "subject": str, "message": str, "fix": str, "cost": str,
                "source": str, "facts": dict, "action": (str, type(None))}
MEASUREMENT_KEYS = {"convs": list, "kernel": list, "in_channels": int, "out_channels": int, "windows": int,
                    "device": str, "dtype": str, "repeats": int, "forward_ms": dict,
                    "train_ms": (dict, type(None)), "train_repeats": (int, type(None)), "extrapolated": bool,
                    "complete": bool, "note": (str, type(None)), "ratio_forward": (float, type(None)),
                    "ratio_train": (float, type(None))}


def check_schema(doc: dict) -> None:
    """The schema documented in docs/doctor.md, checked key by key."""
    assert set(doc) == {"schema", "version", "verdict", "exit_code", "facts", "model", "bench", "measurements",
                        "findings"}
    assert doc["schema"] == "vlforge.doctor" and doc["version"] == SCHEMA_VERSION
    assert doc["verdict"] in ("ok", "warning", "error") and doc["exit_code"] in (0, 1, 3)
    assert set(doc["facts"]) == set(Facts().names())
    for fact in doc["facts"].values():
        assert set(fact) == {"value", "assumed"} and isinstance(fact["assumed"], bool)
        assert fact["value"] is None or isinstance(fact["value"], (str, int, bool))
    assert set(doc["bench"]) == {"status", "reason", "seconds", "windows", "elapsed"}
    assert doc["bench"]["status"] in ("measured", "skipped", "off")
    if doc["model"] is not None:
        assert {"source", "model_type", "attn_implementation", "dtype", "convs"} <= set(doc["model"])
    for finding in doc["findings"]:
        assert set(finding) == set(FINDING_KEYS)
        for key, kind in FINDING_KEYS.items():
            assert isinstance(finding[key], kind), key
        assert finding["severity"] in ("info", "warning", "error")
    for m in doc["measurements"]:
        assert set(m) == set(MEASUREMENT_KEYS)
        for key, kind in MEASUREMENT_KEYS.items():
            assert isinstance(m[key], kind), key
        assert set(m["forward_ms"]) <= {"conv", "gemm"}  # a variant the budget did not reach is absent
        assert (m["ratio_forward"] is None) == (set(m["forward_ms"]) != {"conv", "gemm"})
        assert m["complete"] == (m["note"] is None)
        if m["complete"]:
            assert set(m["forward_ms"]) == {"conv", "gemm"} and m["repeats"] >= 1 and not m["extrapolated"]
    severities = {f["severity"] for f in doc["findings"]}
    expected_code = 3 if "error" in severities else 1 if "warning" in severities else 0
    assert doc["exit_code"] == expected_code


def test_json_schema_with_a_measured_model(patch_model) -> None:
    rep = report(patch_model, dtype="bf16", assume="torch=2.9.1,cudnn=9.10", windows=16, bench_seconds=0.3)
    doc = json.loads(rep.to_json())
    check_schema(doc)
    assert doc["facts"]["torch"] == {"value": "2.9.1", "assumed": True}
    assert doc["facts"]["dtype"] == {"value": "bfloat16", "assumed": False}
    assert doc["model"]["convs"][0]["name"] == "proj" and doc["model"]["convs"][0]["kernel"] == [2, 4, 4]
    assert len(doc["measurements"]) == 1 and doc["measurements"][0]["dtype"] == "bfloat16"


@pytest.mark.parametrize(("assume", "code", "rules"), [
    ("device=cpu,threads=4,torch=2.10.0", 0, []),
    ("device=cpu,threads=1", 1, ["cpu-one-thread"]),
    ("torch=2.9.1,cudnn=91002,device=cuda", 1, ["cudnn-conv3d-skipped-env"]),
    ("attn=flash_attention_2,flash_attn=absent,threads=1,device=cpu", 3, ["flash-attn-missing", "cpu-one-thread"]),
])
def test_cli_json_and_exit_codes(assume: str, code: int, rules: list[str]) -> None:
    result = runner.invoke(app, ["doctor", "--assume", assume, "--json"])
    assert result.exit_code == code, result.output
    doc = json.loads(result.stdout)
    check_schema(doc)
    assert [f["rule"] for f in doc["findings"]] == rules
    assert doc["exit_code"] == code and doc["model"] is None and doc["bench"]["status"] == "off"


def test_cli_table_marks_assumed_facts() -> None:
    result = runner.invoke(app, ["doctor", "--assume", "torch=2.9.0,device=cuda,dtype=fp16"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "2.9.0 (assumed)" in result.stdout
    assert "cudnn-conv3d-skipped-env" in result.stdout and "doctor: warning" in result.stdout


def test_cli_unknown_assume_key_is_one_line_exit_2() -> None:
    proc = subprocess.run([warmstart.python(), "-m", "vlforge.cli", "doctor", "--assume", "cudn=9.10"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown fact 'cudn'" in lines[0] and "did you mean 'cudnn'" in lines[0]


def test_render_shows_findings_and_measurements(patch_model) -> None:
    rep = report(patch_model, assume="torch=2.9.0,device=cpu", windows=8, bench_seconds=0.2)
    console = Console(record=True, width=200)
    render(rep, console)
    text = console.export_text()
    assert "measurement" in text and "proj" in text
    assert f"exit code {rep.exit_code}" in text


def test_cli_with_a_tiny_checkpoint(tiny_checkpoint) -> None:
    models = pytest.importorskip("vlforge.models")
    if not hasattr(models, "load"):
        pytest.skip("vlforge.models.load has not landed yet")
    path = tiny_checkpoint("qwen3_vl")
    result = runner.invoke(app, ["doctor", "--model", str(path), "--dtype", "bf16", "--windows", "16",
                                 "--bench-seconds", "0.5", "--assume", "torch=2.9.1,cudnn=9.14,device=cuda",
                                 "--json"])
    doc = json.loads(result.stdout)
    check_schema(doc)
    assert doc["model"]["model_type"] == "qwen3_vl"
    assert doc["bench"]["status"] == "skipped"  # the device is assumed: nothing to time here
    assert [f["rule"] for f in doc["findings"]] == ["cudnn-conv3d-skipped"]
    assert result.exit_code == 3
