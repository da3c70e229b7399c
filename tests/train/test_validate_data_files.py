"""`vlforge validate` (and train, before loading) names every data file, dataset YAML and media folder that is
missing or of the wrong kind, one line each, exit 2; a config whose files all exist stays valid."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import warmstart
from vlforge.config.validate import check

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copytree(REPO / "examples" / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump({"data": data, "model": {"load_from_pretrained_path": "tiny:qwen3_vl"},
                                    "training": {"max_steps": 1}}))
    return Path(path.name)  # as a user types it, from the working directory


def test_existing_files_validate(workdir: Path) -> None:
    report = check(_config(workdir / "run.yaml", {"dataset_path": "data/dataset.yaml"}))
    assert report.ok, report.error_lines()


@pytest.mark.parametrize(("data", "expected"), [
    ({"dataset_path": "nothere.yaml"}, ["run.yaml: data.dataset_path: nothere.yaml: file not found"]),
    ({"datasets": [{"path": "data"}]},
     ["run.yaml: data.datasets.0.path: data: mixes json, jsonl files; name one kind (a pattern or data_type)"]),
    ({"datasets": [{"path": "data/train-*.jsonl"}]},
     ["run.yaml: data.datasets.0.path: data/train-*.jsonl: the pattern matches no file"]),
    ({"dataset_path": "data/nothere.jsonl"}, ["run.yaml: data.dataset_path: data/nothere.jsonl: file not found"]),
    ({"datasets": [{"path": "data/train.jsonl"}, {"path": "data/gone.jsonl"}]},
     ["run.yaml: data.datasets.1.path: data/gone.jsonl: file not found"]),
    ({"datasets": [{"path": "data/train.jsonl", "data_folder": "data/no_media"}]},
     ["run.yaml: data.datasets.0.data_folder: data/no_media: media folder not found"]),
    ({"datasets": [{"path": "data/train.jsonl", "data_folder": "data/train.jsonl"}]},
     ["run.yaml: data.datasets.0.data_folder: data/train.jsonl: is a file, not a media folder"]),
    ({"dataset_path": "data/dataset.yaml", "eval_dataset_path": "data/eval.jsonl"},
     ["run.yaml: data.eval_dataset_path: data/eval.jsonl: file not found"]),
])
def test_missing_data_is_a_problem(workdir: Path, data: dict, expected: list[str]) -> None:
    report = check(_config(workdir / "run.yaml", data))
    assert not report.ok and report.error_lines() == expected


def test_entries_of_a_dataset_yaml_are_named_in_that_yaml(workdir: Path) -> None:
    (workdir / "data" / "mix.yaml").write_text(yaml.safe_dump([
        {"path": "train.jsonl", "data_folder": "missing_media"}, {"path": "other.jsonl"}]))
    report = check(_config(workdir / "run.yaml", {"dataset_path": "data/mix.yaml"}))
    assert report.error_lines() == [
        "data/mix.yaml: datasets.0.data_folder: data/missing_media: media folder not found",
        "data/mix.yaml: datasets.1.path: data/other.jsonl: file not found",
    ]


def test_cli_validate_exits_2_with_one_line_per_missing_file(workdir: Path) -> None:
    _config(workdir / "run.yaml", {"datasets": [{"path": "a.jsonl"}, {"path": "b.jsonl"}]})
    proc = subprocess.run([warmstart.python(), "-m", "vlforge.cli", "validate", "run.yaml"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == ["error: run.yaml: data.datasets.0.path: a.jsonl: file not found",
                                        "error: run.yaml: data.datasets.1.path: b.jsonl: file not found"]


def test_the_files_of_a_directory_entry_share_the_records_validate_reads(tmp_path: Path) -> None:
    """A directory of many shards is not read 1,000 records per shard: its files share the budget, 20 at least."""
    import json

    from vlforge.config.data_check import SHARD_RECORDS, record_checks
    from vlforge.config.schema import TrainConfig

    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "shards").mkdir()
    for i in range(4):
        (tmp_path / "shards" / f"part-{i}.jsonl").write_text((json.dumps(row) + "\n") * 60)
    (tmp_path / "one.jsonl").write_text((json.dumps(row) + "\n") * 60)
    cfg = TrainConfig(data={"datasets": [{"path": str(tmp_path / "shards")}, {"path": str(tmp_path / "one.jsonl")}]},
                      model={"load_from_pretrained_path": "tiny:qwen3_vl"})
    checks, problems = record_checks(cfg, "run.yaml", limit=100)
    assert not problems
    assert [(Path(c.path).name, c.read, c.records) for c in checks] == [
        *[(f"part-{i}.jsonl", 25, 60) for i in range(4)], ("one.jsonl", 60, 60)]
    checks, _ = record_checks(cfg, "run.yaml", limit=40)
    assert [c.read for c in checks] == [SHARD_RECORDS] * 4 + [40]


def test_a_directory_of_many_clean_shards_is_summed_up_in_one_line(tmp_path: Path, monkeypatch) -> None:
    import json

    from vlforge.config.data_check import CHECK_RECORDS
    from vlforge.config.validate import SHOWN_CLEAN

    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    (tmp_path / "shards").mkdir()
    for i in range(SHOWN_CLEAN + 5):
        (tmp_path / "shards" / f"part-{i:02}.jsonl").write_text((json.dumps(row) + "\n") * 3)
    gone = {"messages": [{"role": "user", "content": [{"type": "image", "image": "gone.png"}]},
                         {"role": "assistant", "content": "x"}]}
    (tmp_path / "shards" / "part-99.jsonl").write_text(json.dumps(gone) + "\n")  # fails: listed
    monkeypatch.chdir(tmp_path)
    report = check(_config(tmp_path / "run.yaml", {"datasets": [{"path": "shards"}], "on_error": "skip",
                                                   "max_skip_fraction": 0.5}), records=CHECK_RECORDS)
    lines = report.data_lines()
    assert len(report.datasets) == SHOWN_CLEAN + 6 and len(lines) == SHOWN_CLEAN + 3, lines
    assert any("part-99.jsonl" in line and "1 fail" in line for line in lines)
    assert lines[-1] == "# data: 5 more data file(s), none fails (15 of 15 records read; --json lists each)"
