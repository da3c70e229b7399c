"""scripts/version_matrix.py (``make matrix``): the offline parts; the matrix itself builds venvs (~25 minutes)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("version_matrix", REPO / "scripts" / "version_matrix.py")
VM = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(VM)


def test_the_core_suite_names_files_that_exist_and_the_minimum_is_vlforge_s():
    from vlforge.versions import TORCH_MIN, TRANSFORMERS_MIN

    assert all((REPO / path).exists() for path in VM.CORE_TESTS)
    assert VM._minimum() == TRANSFORMERS_MIN and VM._release("5.17") == "5.17.0"
    assert VM._minimum("torch") == TORCH_MIN and VM._older(VM.TORCH_BELOW, TORCH_MIN)
    assert VM._older(VM.BELOW, TRANSFORMERS_MIN) and not VM._older(VM.NEWEST, TRANSFORMERS_MIN)


def test_junit_counts_name_the_failed_tests(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text('<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1">'
                      '<testcase classname="tests.a" name="ok"/><testcase classname="tests.a" name="bad">'
                      '<failure message="x"/></testcase><testcase classname="tests.b" name="s"><skipped/></testcase>'
                      '<testcase classname="tests.b" name="ok2"/></testsuite></testsuites>')
    assert VM._junit_counts(report) == {"tests": 4, "failures": 1, "errors": 0, "skipped": 1, "passed": 2,
                                        "failed_tests": ["tests.a::bad"]}


def test_the_committed_record_is_what_the_docs_quote():
    record = json.loads((REPO / "benchmarks" / "records" / "version_matrix.json").read_text())
    points = {point["point"]: point for point in record["points"]}
    assert set(points) == set(VM.POINTS)
    readme = (REPO / "README.md").read_text()
    for name in ("oldest", "newest", "torch_oldest", "torch_newest"):
        point = points[name]
        assert point["ok"] and point["vlforge_from_wheel"], name
        assert f"| {point['versions']['torch']} | {point['versions']['transformers']} | " \
               f"{point['pytest']['passed']} passed" in readme, name
    assert points["torch_newest"]["versions"]["torch"].startswith(VM.TORCH_NEWEST)
    assert points["torch_oldest"]["versions"]["torch"].startswith(VM._release(VM._minimum("torch")))
    below = points["torch_below"]
    assert below["versions"]["torch"].startswith(VM.TORCH_BELOW) and below["refusals"]
    assert all(r["ok"] and "needs torch >= " in r["line"] for r in below["refusals"])
    assert all(r["ok"] for r in points["below"]["refusals"])
    development = (REPO / "docs" / "development.md").read_text()
    assert points["offline"]["ok"] and f"{points['offline']['wheelhouse']['megabytes']} MB" in development
