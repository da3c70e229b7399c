"""Skipped samples are never silent in training: warnings with file:line, data_report.json, metrics, the
summary, and ``data.max_skip_fraction`` stopping the run (exit 2) on every rank together.

The data: 15 JSONL lines, 5 of them bad in different ways (truncated PNG, missing image, malformed JSON,
no assistant turn, corrupt MP4; see ``tests/badrows.py``), trained with the tiny Qwen2.5-VL preset.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from trainkit import free_port, tiny_config, write_config

from badrows import BAD_LINES, vlforge_cli, write_bad_dataset
from vlforge.config.load import load_config
from vlforge.data.errors import MIN_SEEN, SkipLimitError, over_limit
from vlforge.errors import ConfigError
from vlforge.outputs import owned
from vlforge.train.trainer import run

MODEL = "tiny:qwen2_5_vl"
REASONS = {reason: 1 for reason in BAD_LINES.values()}


def _config(root: Path, *, data: dict | None = None, training: dict | None = None) -> Path:
    """One epoch of the bad dataset, 5 samples per step (2 steps), no token audit."""
    dataset = write_bad_dataset(root / "data")
    cfg = tiny_config(root / "out", MODEL, data={"dataset_path": str(dataset), "on_error": "skip", **(data or {})},
                      processor={"max_pixels": 3136}, video={"video_max_frames": 2, "video_max_pixels": 3136},
                      model={"token_audit": False},
                      training={"max_steps": None, "num_train_epochs": 1, "per_device_train_batch_size": 5,
                                **(training or {})})
    return write_config(root / "run.yaml", cfg)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_skips_are_logged_reported_and_totalled(tmp_path, monkeypatch):
    config = _config(tmp_path, data={"max_skip_fraction": 0.5})
    code, stdout, stderr = vlforge_cli(["train", str(config)], monkeypatch)
    assert code == 0, stderr[-3000:]
    out = tmp_path / "out"
    # a warning per reason, naming the file and line of its first sample; no line per sample beyond that
    for line, reason in BAD_LINES.items():
        assert f"skipping bad samples ({reason}), first: {tmp_path / 'data' / 'bad.jsonl'}:line {line}: " in stderr
    assert stderr.count("skipping bad samples") == 5
    # data_report.json: counts per reason, the examples with file and line, seen / used / share
    report = json.loads((out / "data_report.json").read_text())
    assert report["skipped"] == REASONS and report["skipped_total"] == 5
    assert (report["samples_seen"], report["samples_used"], report["skipped_share"]) == (15, 10, pytest.approx(1 / 3))
    assert {reason: [e.split(": ")[0].rsplit(":", 1)[1] for e in examples]
            for reason, examples in report["examples"].items()} == {r: [f"line {n}"] for n, r in BAD_LINES.items()}
    assert report["max_skip_fraction"] == 0.5 and report["over_limit"] is False and report["step"] == 2
    assert owned(out / "data_report.json")  # in output_dir's ledger: a later run may replace it
    # metrics.jsonl: running counts on each logged step, and a final summary record
    records = _records(out)
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and steps[-1]["skipped"] == 5 and steps[-1]["samples_seen"] == 15
    assert 0 < steps[0]["skipped"] <= steps[0]["samples_seen"] < 15
    final = records[-1]
    assert final["skipped_by_reason"] == REASONS and final["skipped"] == 5 and final["samples_seen"] == 15
    # totals at the end: the log line and the command's summary
    assert "data: 5 of 15 samples skipped (33.3%, limit 50.0%)" in stderr
    assert "skipped 5 of 15 samples (33.3%: corrupt_image=1, corrupt_video=1, malformed_json=1" in stdout
    assert (out / "final").is_dir()


def test_default_limit_stops_with_exit_2_and_still_writes_the_report(tmp_path, monkeypatch):
    config = _config(tmp_path)
    code, stdout, stderr = vlforge_cli(["train", str(config)], monkeypatch)
    assert code == 2 and stdout == ""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr
    line = errors[0]
    for words in ("5 of 15 samples skipped (33.3%)", "more than data.max_skip_fraction = 0.1 allows",
                  "top reasons: corrupt_image=1, corrupt_video=1, malformed_json=1", "bad.jsonl:line 2",
                  str(tmp_path / "out" / "data_report.json"), "raise data.max_skip_fraction"):
        assert words in line, (words, line)
    report = json.loads((tmp_path / "out" / "data_report.json").read_text())
    assert report["skipped"] == REASONS and report["over_limit"] is True
    assert _records(tmp_path / "out")[-1]["skipped"] == 5
    assert not (tmp_path / "out" / "final").exists()  # stopped before the export ...
    assert (tmp_path / "out" / "checkpoint-2").is_dir()  # ... after the last checkpoint: resume exports it
    code, _, stderr = vlforge_cli(["train", str(config), "data.max_skip_fraction=0.5", "checkpointing.resume=auto"],
                                  monkeypatch)
    assert code == 0 and (tmp_path / "out" / "final").is_dir(), stderr[-3000:]
    assert json.loads((tmp_path / "out" / "data_report.json").read_text())["skipped_total"] == 5  # restored


def test_the_running_check_stops_long_before_the_end(tmp_path):
    """Data repeated for 40 steps: the share is clearly over the limit after a few steps, not only at the end."""
    config = _config(tmp_path, training={"max_steps": 40})
    with pytest.raises(SkipLimitError, match=r"samples skipped \(3\d\.\d%\)"):
        run(config, progress=False)
    report = json.loads((tmp_path / "out" / "data_report.json").read_text())
    assert MIN_SEEN <= report["samples_seen"] < 40 and report["step"] < 8
    assert report["skipped_total"] / report["samples_seen"] > 0.3


def test_over_limit_rule():
    assert not over_limit(10, 5, 0.1, final=False)  # fewer than MIN_SEEN: the running check waits
    assert over_limit(10, 5, 0.1, final=True)  # ... the final check does not
    assert not over_limit(10, 1, 0.1, final=True)  # exactly the limit is allowed
    assert not over_limit(100, 15, 0.1, final=False) and over_limit(100, 15, 0.1, final=True)  # not clearly over
    assert over_limit(100, 20, 0.1, final=False)  # 20 > 10 + 3 * 3
    assert over_limit(MIN_SEEN, 1, 0.0, final=False) and not over_limit(1000, 1000, 1.0, final=False)
    assert not over_limit(0, 0, 0.0, final=True)


@pytest.mark.parametrize("value", ["-0.1", "1.5", "lots"])
def test_max_skip_fraction_is_checked(tmp_path, value):
    config = _config(tmp_path)
    with pytest.raises(ConfigError, match=r"data\.max_skip_fraction"):
        load_config(config, [f"data.max_skip_fraction={value}"])
    assert load_config(config, []).data.max_skip_fraction == 0.1


def _sum_worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from vlforge.dist import DistContext
    from vlforge.train.trainer import step_totals

    ctx = DistContext(rank, 2, 0, torch.device("cpu"), True)
    batch = {"labels": torch.tensor([[-100, 5, 6, 7]])}
    mine = [(12, 0), (7, 5)][rank]  # all the bad samples on rank 1
    count, totals = step_totals(ctx, [batch], skips=mine)
    decision = over_limit(*totals, 0.1, final=True)
    ended, _ = step_totals(ctx, [batch] if rank == 0 else None, skips=mine)
    results[rank] = (float(count), totals, decision, ended is None)
    ctx.close()


def test_skip_counts_are_summed_over_ranks_and_every_rank_decides_alike():
    results = mp.Manager().dict()
    mp.spawn(_sum_worker, args=(free_port(), results), nprocs=2, join=True)
    assert dict(results) == {0: (6.0, (19, 5), True, True), 1: (6.0, (19, 5), True, True)}


def _train_worker(rank: int, port: int, config: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    try:
        run(config, progress=False)
        results[rank] = "finished"
    except SkipLimitError as err:
        results[rank] = str(err)


@pytest.mark.slow
def test_two_ranks_sum_their_skips_and_stop_together(tmp_path):
    """2 gloo ranks (FSDP): the bad rows (even lines) all land on rank 1; the limit stops both ranks alike."""
    dataset = write_bad_dataset(tmp_path / "data", bad_lines=(2, 4, 6, 8, 10))
    cfg = tiny_config(tmp_path / "out", MODEL, data={"dataset_path": str(dataset), "on_error": "skip"},
                      processor={"max_pixels": 3136}, video={"video_max_frames": 2, "video_max_pixels": 3136},
                      model={"token_audit": False},
                      training={"max_steps": None, "num_train_epochs": 1, "per_device_train_batch_size": 2})
    config = write_config(tmp_path / "run.yaml", cfg)
    results = mp.Manager().dict()
    workers = mp.spawn(_train_worker, args=(free_port(), str(config), results), nprocs=2, join=False)
    deadline = time.monotonic() + 300
    while not workers.join(timeout=2):
        assert time.monotonic() < deadline, f"a rank hangs: {dict(results)}"
    report = json.loads((tmp_path / "out" / "data_report.json").read_text())
    assert report["data_shards"] == 2 and report["skipped"] == REASONS  # rank 1's skips in the summed report
    seen = report["samples_seen"]
    assert 7 < seen <= 15  # rank 1 read its 7 records, rank 0 some of its 8
    assert results[0] == results[1] and results[0].startswith(f"data: 5 of {seen} samples skipped")
