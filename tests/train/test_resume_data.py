"""A checkpoint records the data files it was saved reading: a resume on other files is one line before the model
loads (a JSON Lines stream would resume at a byte offset of another file), unless checkpointing.ignore_data_skip
resumes the weights and reads the data from its start (transformers' key, LMMS Engine's trainer_args too)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from trainkit import REPO, tiny_config, train_command, train_env, write_config

from vlforge.data.identity import data_files, first_change


@pytest.fixture
def run(tmp_path, tiny_checkpoint):
    data = tmp_path / "data"
    shutil.copytree(REPO / "examples" / "data", data)
    cfg = tiny_config(tmp_path / "out", tiny_checkpoint("qwen3_vl"), data={"dataset_path": str(data / "dataset.yaml")},
                      checkpointing={"save_steps": 1, "resume": "auto"})
    config = write_config(tmp_path / "run.yaml", cfg)
    return config, data


def _train(config, *overrides):
    return subprocess.run(train_command(config, 1, *overrides), env=train_env(), capture_output=True, text=True,
                          timeout=600, cwd=REPO)


def test_changed_data_refuses_the_resume_unless_ignore_data_skip(run):
    config, data = run
    first = _train(config)
    assert first.returncode == 0, first.stderr[-3000:]
    out = config.parent / "out"
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert [f["path"] for f in state["data_files"]] == [str(data / "train.jsonl")]

    records = data / "train.jsonl"
    before = records.stat().st_size
    records.write_text(records.read_text() + records.read_text().splitlines()[0] + "\n")  # one record appended
    refused = _train(config, "training.max_steps=3")
    assert refused.returncode == 2 and refused.stdout == ""
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: checkpointing.resume: {out / 'checkpoint-2'} was saved reading other data: {records} "
                      f"changed ({before:,} bytes then, {records.stat().st_size:,} now); resuming where it left the "
                      "data needs the same files: restore them, or set checkpointing.ignore_data_skip: true to "
                      "resume the weights and read the data from its start"], refused.stderr[-3000:]
    assert "loading" not in refused.stderr.lower() and not (out / "checkpoint-3").exists()

    resumed = _train(config, "training.max_steps=3", "checkpointing.ignore_data_skip=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "loading " in resumed.stderr.lower()  # the model loads here; the refused run stopped before it did
    assert "checkpointing.ignore_data_skip: checkpoint-2 resumes at step 2 with its weights, optimiser and " \
           "schedule; the data is read from its start" in resumed.stderr
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["data_files"] == data_files([records])

    records.write_text(records.read_text() + records.read_text().splitlines()[1] + "\n")  # a finished run reads none
    again = _train(config, "training.max_steps=3")
    assert again.returncode == 0 and "was saved reading other data" not in again.stderr, again.stderr[-3000:]


def test_first_change_names_added_removed_and_changed_files_and_ignores_a_move(tmp_path):
    a, b, c = (tmp_path / name for name in ("a.jsonl", "b.jsonl", "c.jsonl"))
    for path in (a, b, c):
        path.write_text(f'{{"{path.stem}": 1}}\n' * 3)
    saved = data_files([a, b])
    moved = tmp_path / "moved"
    moved.mkdir()
    for path in (a, b):
        shutil.copy(path, moved / path.name)
    assert first_change(saved, data_files([moved / "a.jsonl", moved / "b.jsonl"])) is None  # the same bytes
    assert first_change(saved, data_files([a, b, c])) == f"2 data file(s) then, 3 now; new or changed: {c}"
    assert first_change(saved, data_files([a])) == f"2 data file(s) then, 1 now; gone or changed: {b}"
    assert first_change(saved, data_files([b, a])) == f"the same files in another order ({b} was data file 2, now 1)"
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    shutil.copy(a, swapped / "b.jsonl")  # the names swapped: each file holds the other's records
    shutil.copy(b, swapped / "a.jsonl")
    assert first_change(data_files([moved / "a.jsonl", moved / "b.jsonl"]),
                        data_files([swapped / "a.jsonl", swapped / "b.jsonl"])) == \
        f"the same files in another order ({swapped / 'a.jsonl'} now holds what {moved / 'b.jsonl'} held)"
    assert first_change(saved, data_files([a, b, a])) == f"2 data file(s) then, 3 now; listed again: {a}"
    assert first_change(saved, data_files([a, c])) == f"data file 2 was {b}, now {c} (the same size, other bytes)"
    b.write_text(b.read_text().replace("1", "2"))  # the same size, other bytes
    assert first_change(saved, data_files([a, b])) == f"{b} changed (the same size, other bytes)"
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * 300_000)  # more than both hashed ends (16 KiB each)
    then = data_files([big])
    big.write_bytes(b"x" * 150_000 + b"y" + b"x" * 149_999)  # a change in the middle of a large file is not seen
    assert first_change(then, data_files([big])) is None
    big.write_bytes(b"x" * 299_999 + b"y")
    assert first_change(then, data_files([big])) == f"{big} changed (the same size, other bytes)"
