"""Datasets in the layouts users hold, from the CLI: ``vlforge validate`` reports each file's layout, the records it
read and the first that fail; ``vlforge train`` on a LLaVA JSON file and on a parquet file with the image bytes
inside trains exactly as on the same conversations in the ``messages`` layout (the same losses, step by step)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainkit import logged, tiny_config, write_config

from badrows import vlforge_cli
from layoutkit import write_layout_datasets

MODEL = "tiny:qwen2_5_vl"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return write_layout_datasets(tmp_path_factory.mktemp("layout-data"))


def _config(root: Path, dataset: Path, **data: object) -> Path:
    cfg = tiny_config(root / "out", MODEL, data={"dataset_path": str(dataset), **data}, processor={"max_pixels": 3136},
                      model={"token_audit": False},
                      training={"max_steps": 2, "per_device_train_batch_size": 2})
    return write_config(root / "run.yaml", cfg)


def test_training_on_llava_json_and_parquet_bytes_equals_the_messages_layout(tmp_path, monkeypatch, data):
    losses = {}
    for name, dataset in data.items():
        root = tmp_path / name
        root.mkdir()
        code, stdout, stderr = vlforge_cli(["train", str(_config(root, dataset))], monkeypatch)
        assert code == 0, stderr[-3000:]
        assert "no sample skipped" in stdout
        losses[name] = logged(root / "out", "loss")
    assert len(losses["messages"]) == 2
    assert losses["llava"] == losses["messages"] and losses["parquet"] == losses["messages"]


def test_validate_reports_layout_records_and_failures(tmp_path, monkeypatch, data):
    code, stdout, _ = vlforge_cli(["validate", str(_config(tmp_path, data["parquet"]))], monkeypatch)
    assert code == 0
    assert (f"# data: {data['parquet']}: sharegpt: conversations of {{from, value}} (detected from row 1); "
            "4 of 4 records read, none fails") in stdout
    bad = data["llava"].parent / "bad.json"
    records = json.loads(data["llava"].read_text())
    records[1]["image"] = "gone.png"
    records[2]["conversations"][1]["from"] = "bot"
    bad.write_text(json.dumps(records))
    code, stdout, stderr = vlforge_cli(["validate", str(_config(tmp_path, bad))], monkeypatch)
    assert code == 2 and stdout == ""
    assert f"data: {bad}: sharegpt: conversations of {{from, value}} (detected from item 1); 4 of 4 records read, " \
           "2 fail (missing_file=1, schema=1)" in stderr
    assert f"  {bad}:item 2: missing_file: media file" in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {tmp_path / 'run.yaml'}: data.dataset_path: {bad}:item 2: missing_file: media file "
                      f"'{bad.parent / 'gone.png'}' not found (data.on_error: raise stops training at the first such "
                      "record; 2 of the first 4 fail)"]
    # on_error: skip: within data.max_skip_fraction a report (exit 0), above it the limit's one line (exit 2)
    code, stdout, _ = vlforge_cli(["validate", str(_config(tmp_path, bad, on_error="skip", max_skip_fraction=0.5)),
                                   "--json"], monkeypatch)
    report = json.loads(stdout)
    assert code == 0 and report["ok"]
    (check,) = report["datasets"]
    assert (check["read"], check["records"], check["skipped"]) == (4, 4, {"missing_file": 1, "schema": 1})
    assert check["layout"]["layout"] == "sharegpt" and check["layout"]["messages"] == "conversations"
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in check["examples"]] == ["item 2", "item 3"]
    code, _, stderr = vlforge_cli(["validate", str(_config(tmp_path, bad, on_error="skip"))], monkeypatch)
    assert code == 2 and "the first 4 records: 2 of 4 samples skipped (50.0%), more than data.max_skip_fraction = " \
                          "0.1 allows; top reasons: missing_file=1, schema=1" in stderr


def test_a_file_without_chat_records_stops_train_before_the_model_loads(tmp_path, monkeypatch):
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(3)))
    code, stdout, stderr = vlforge_cli(["train", str(_config(tmp_path, tmp_path / "rows.jsonl"))], monkeypatch)
    assert code == 2 and stdout == ""
    assert stderr.strip() == (
        f"error: {tmp_path / 'run.yaml'}: data.dataset_path: {tmp_path / 'rows.jsonl'}:line 1: no chat record in the "
        "first 3 record(s) of the file (first: schema: record needs a non-empty 'messages' list of {role, content} "
        "turns, a 'conversations' list of {from, value} turns (LLaVA / ShareGPT), a 'texts' list of {user, "
        "assistant} exchanges (The Cauldron), 'prompt' and 'completion' (TRL) or 'instruction' and 'output' keys (alpaca))")
    assert not (tmp_path / "out").exists()
