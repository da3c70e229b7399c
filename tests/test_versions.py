"""The start-up version check: an older torch or transformers than supported is one line and exit 2, never a
traceback; the minimums are pyproject's lower bounds; a family needing a newer transformers says so.

The installed versions are monkeypatched here; ``make matrix`` (scripts/version_matrix.py) installs real ones.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from packaging.requirements import Requirement

from vlforge import versions
from vlforge.models.families import FAMILIES, check_transformers

REPO = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _installed(**fake: str | None):
    real = versions.installed
    return lambda package: fake[package] if package in fake else real(package)


def test_versions_parse_as_numbers_not_text():
    assert versions.parse("5.17.0") < versions.parse("5.24") < versions.parse("5.100")
    assert versions.parse("2.11.0+cu130") == (2, 11, 0)
    assert versions.parse("5.25.0.dev0") == (5, 25, 0)
    with pytest.raises(ValueError, match="not a version"):
        versions.parse("nightly")


def test_pyproject_lower_bounds_are_the_minimums():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {}
    for text in deps:
        req = Requirement(text)
        for spec in req.specifier:
            if spec.operator == ">=":
                bounds[req.name] = spec.version
    assert {name: bounds[name] for name in versions.MINIMUMS} == versions.MINIMUMS


def test_the_installed_versions_pass():
    assert versions.startup_problem() is None


@pytest.mark.parametrize(("fake", "expected"), [
    ({"transformers": "5.16.1"}, "vlforge needs transformers >= 5.17, this environment has transformers 5.16.1: "
                                 "pip install 'transformers>=5.17'"),
    ({"torch": "2.4.1+cu121"}, "vlforge needs torch >= 2.11, this environment has torch 2.4.1+cu121: "
                               "pip install 'torch>=2.11'"),
    ({"transformers": None}, "vlforge needs transformers >= 5.17, which is not installed here: "
                             "pip install 'transformers>=5.17'"),
])
def test_an_old_or_missing_package_is_one_line(monkeypatch, fake, expected):
    monkeypatch.setattr(versions, "installed", _installed(**fake))
    assert versions.startup_problem() == expected
    with pytest.raises(versions.VersionError) as raised:
        versions.check_startup()
    assert str(raised.value) == expected and "\n" not in expected


@pytest.mark.parametrize("entry", ["cli", "train"])
def test_every_command_starts_with_the_check(monkeypatch, capsys, entry):
    """``vlforge ...`` and ``python -m vlforge.train``: one ``error:`` line on stderr, exit 2, nothing else."""
    from vlforge.cli import main as cli_main
    from vlforge.train.__main__ import main as train_main

    monkeypatch.setattr(versions, "installed", _installed(transformers="5.0.0"))
    with pytest.raises(SystemExit) as exited:
        if entry == "cli":
            cli_main(["--help"])
        else:
            train_main(["examples/qwen3_vl_tiny.yaml"])
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        "error: vlforge needs transformers >= 5.17, this environment has transformers 5.0.0: "
        "pip install 'transformers>=5.17'"]


def test_a_family_needing_a_newer_transformers_is_refused_by_name(monkeypatch):
    newer = {name: record.transformers_min for name, record in FAMILIES.items() if record.transformers_min}
    assert newer == {"qwen3_5": "5.24", "qwen3_5_moe": "5.24"}
    monkeypatch.setattr(versions, "installed", _installed(transformers="5.17.0"))
    with pytest.raises(versions.VersionError, match=r"^Qwen3\.5-MoE \(qwen3_5_moe\) needs transformers >= 5\.24, "
                       r"this environment has transformers 5\.17\.0: pip install 'transformers>=5\.24'$"):
        check_transformers("qwen3_5_moe")
    check_transformers("qwen3_vl")  # the global minimum is enough
    check_transformers("llava")  # no record: nothing to say
    from vlforge.models.tiny import write_tiny

    with pytest.raises(versions.VersionError, match=r"Qwen3\.5 \(qwen3_5\) needs transformers >= 5\.24"):
        write_tiny("qwen3_5", Path("/nonexistent/never-written"))


def test_masked_logits_without_mask_support_select_the_same_rows(monkeypatch):
    """transformers < 5.21 takes positions, not a boolean mask: the columns any row keeps, then the mask."""
    from vlforge.train import loss

    hidden = torch.randn(3, 7, 5)
    keep = torch.rand(3, 7) > 0.5
    keep[1] = False  # a row without targets

    def model(logits_to_keep, **kwargs):
        if logits_to_keep.dtype == torch.bool:
            return SimpleNamespace(logits=hidden[logits_to_keep])
        assert logits_to_keep.ndim == 1
        return SimpleNamespace(logits=hidden[:, logits_to_keep])

    monkeypatch.setattr(loss, "_takes_mask", lambda: True)
    _, with_mask = loss.masked_logits(model, {}, keep)
    monkeypatch.setattr(loss, "_takes_mask", lambda: False)
    _, by_columns = loss.masked_logits(model, {}, keep)
    assert torch.equal(with_mask, by_columns) and with_mask.shape == (int(keep.sum()), 5)
