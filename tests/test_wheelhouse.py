"""scripts/wheelhouse.py: the host's package list decides what is carried (offline parts; the build is slow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("wheelhouse", REPO / "scripts" / "wheelhouse.py")
WH = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(WH)


def test_host_list_reads_pip_freeze_and_names_bad_lines(tmp_path):
    host = tmp_path / "host.txt"
    host.write_text("# comment\ntorch==2.11.0+cu130\nPyYAML==6.0.3\nav\nmy_pkg @ file:///x\n\n", encoding="utf-8")
    got = WH.read_host(host)
    assert str(got["torch"]) == "2.11.0+cu130" and str(got["pyyaml"]) == "6.0.3"
    assert got["av"] is None and got["my-pkg"] is None
    host.write_text("torch==2.11\nnumpy>=2\n", encoding="utf-8")
    with pytest.raises(WH.WheelhouseError, match=r"host.txt:2: expected 'name==version'"):
        WH.read_host(host)
    host.write_text("numpy==2.0\n", encoding="utf-8")
    with pytest.raises(WH.WheelhouseError, match="has no torch"):
        WH.read_host(host)
    assert WH.read_host(None) == {"torch": None}


def test_markers_are_evaluated_for_the_target_python():
    env = WH.target_environment("3.12")
    assert WH.applies(Requirement('tomli; python_version < "3.11"'), WH.target_environment("3.10"), set())
    assert not WH.applies(Requirement('tomli; python_version < "3.11"'), env, set())
    assert not WH.applies(Requirement('peft; extra == "lora"'), env, set())
    assert WH.applies(Requirement('peft; extra == "lora"'), env, {"lora"})
    assert not WH.applies(Requirement('pywin32; sys_platform == "win32"'), env, set())


def test_the_project_wheel_metadata_is_what_the_walk_reads(tmp_path):
    """vlforge's own requirements come from its built wheel; the wheel holds every non-Python file the code reads."""
    import zipfile

    wheel = WH.build_vlforge(tmp_path)
    names = {Requirement(str(r)).name for r in WH.wheel_requirements(wheel)}
    assert {"torch", "transformers", "av", "pydantic"} <= names
    shipped = set(zipfile.ZipFile(wheel).namelist())
    data_files = [p for p in (REPO / "src").rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
                  and "egg-info" not in str(p) and "__pycache__" not in p.parts]
    assert data_files, "expected package data (the LMMS schema)"
    for path in data_files:
        assert str(path.relative_to(REPO / "src")) in shipped, path


def test_transformers_is_carried_at_the_version_every_family_needs():
    """vlforge runs on transformers 5.17, Qwen3.5 needs 5.24: a host holding 5.17 gets 5.24 (the GPU check trains it)."""
    from vlforge.models.families import FAMILIES
    from vlforge.versions import TRANSFORMERS_MIN, parse

    assert WH.every_family() == ("transformers>=5.24",)
    assert parse(FAMILIES["qwen3_5"].transformers_min) > parse(TRANSFORMERS_MIN)
