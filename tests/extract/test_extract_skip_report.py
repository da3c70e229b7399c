"""Skipped samples are never silent in ``vlforge extract``: warnings with file:line, totals at the end, the
manifest and errors.jsonl, and ``--max-skip-fraction`` (exit 2, the same on every rank).

The data: 15 JSONL lines, 5 of them bad in different ways (see ``tests/badrows.py``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from badrows import BAD_LINES, free_port, vlforge_cli, write_bad_dataset
from vlforge.data.errors import SkipLimitError

MODEL = "tiny:qwen2_5_vl"
REASONS = {reason: 1 for reason in BAD_LINES.values()}


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    return ["extract", "--model", MODEL, "--data", str(data), "--out", str(out), "--batch-size", "4",
            "--shard-size", "6", "--no-token-audit", "--no-progress", *extra]


def _errors(out: Path) -> dict[str, str]:
    """errors.jsonl as reason -> 'FILE:line N'."""
    rows = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    return {row["reason"]: f"{Path(row['source']).name}:{row['location']}" for row in rows}


def test_skips_are_logged_and_totalled(tmp_path, monkeypatch):
    data = write_bad_dataset(tmp_path / "data")
    code, stdout, stderr = vlforge_cli(_argv(data, tmp_path / "cache", "--max-skip-fraction", "0.5", "--json"),
                                       monkeypatch)
    assert code == 0, stderr[-3000:]
    for line, reason in BAD_LINES.items():  # a warning per reason, naming its first sample's file and line
        assert f"extract: skipping bad samples ({reason}), first: {data}:line {line}: " in stderr
    assert stderr.count("skipping bad samples") == 5
    assert "10 rows, 5 of 15 samples skipped (33.3%): corrupt_image=1, corrupt_video=1" in stderr  # the totals
    summary = json.loads(stdout)
    assert summary["skipped"] == REASONS and summary["cache"]["num_skipped"] == 5
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert manifest["num_rows"] == 10 and manifest["skipped"] == REASONS
    assert _errors(tmp_path / "cache") == {reason: f"bad.jsonl:line {n}" for n, reason in BAD_LINES.items()}


def test_default_limit_exits_2_after_writing_the_report(tmp_path, monkeypatch):
    data = write_bad_dataset(tmp_path / "data")
    out = tmp_path / "cache"
    code, stdout, stderr = vlforge_cli(_argv(data, out, "--json"), monkeypatch)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in stderr
    summary = json.loads(stdout)  # --json: the summary of the written cache, the verdict in the exit code
    assert summary["complete"] and summary["skip_limit"] == errors[0].removeprefix("error: ")
    assert summary["cache"]["num_skipped"] == 5 and summary["rows_written"] == 10
    for words in (f"extract {out}: 5 of 15 samples skipped (33.3%)", "more than --max-skip-fraction = 0.1 allows",
                  "top reasons: corrupt_image=1, corrupt_video=1, malformed_json=1", "bad.jsonl:line 2",
                  f"details in {out / 'errors.jsonl'}", "raise --max-skip-fraction"):
        assert words in errors[0], (words, errors[0])
    assert len(_errors(out)) == 5 and json.loads((out / "manifest.json").read_text())["num_skipped"] == 5
    # the cache is complete: a rerun that accepts the share reuses every shard and succeeds
    code, stdout, stderr = vlforge_cli(_argv(data, out, "--max-skip-fraction", "0.4", "--json"), monkeypatch)
    assert code == 0, stderr[-3000:]
    assert json.loads(stdout)["shards_written"] == 0


def test_max_skip_fraction_is_checked(tmp_path, monkeypatch):
    data = write_bad_dataset(tmp_path / "data")
    code, _, stderr = vlforge_cli(_argv(data, tmp_path / "cache", "--max-skip-fraction", "1.5"), monkeypatch)
    assert code == 2 and "--max-skip-fraction" in stderr and "less than or equal to 1" in stderr
    assert not (tmp_path / "cache").exists()


def _extract_worker(rank: int, port: int, data: str, out: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2")
    torch.set_num_threads(1)
    from vlforge.extract import run_extract

    try:
        summary = run_extract(model=MODEL, data=data, out=out, batch_size=4, shard_size=3, token_audit=False)
        results[rank] = ("finished", summary.skipped)
    except SkipLimitError as err:
        results[rank] = (str(err), None)


@pytest.mark.slow
def test_two_ranks_count_the_whole_cache_and_stop_together(tmp_path):
    """2 gloo ranks, shards of 3: each rank skips only its own share; the verdict covers the whole cache."""
    data = write_bad_dataset(tmp_path / "data")
    results = mp.Manager().dict()
    workers = mp.spawn(_extract_worker, args=(free_port(), str(data), str(tmp_path / "cache"), results), nprocs=2,
                       join=False)
    deadline = time.monotonic() + 300
    while not workers.join(timeout=2):
        assert time.monotonic() < deadline, f"a rank hangs: {dict(results)}"
    assert results[0] == results[1] and results[0][0].startswith(f"extract {tmp_path / 'cache'}: 5 of 15 samples")
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())["skipped"] == REASONS
