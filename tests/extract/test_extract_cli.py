"""``vlforge extract`` on the command line: --json summary on stdout, one-line error for a mismatched cache."""

from __future__ import annotations

import json
import sys

from vlforge import cli


def _run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["vlforge", "extract", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_json_summary_then_refuses_other_options(tmp_path, monkeypatch, capsys, qwen3_ckpt, image_dataset):
    out = tmp_path / "cache"
    base = ["--model", str(qwen3_ckpt), "--data", str(image_dataset), "--out", str(out), "--features",
            "vision_pooled,hidden_last", "--shard-size", "8", "--batch-size", "4"]
    code, stdout, _ = _run(monkeypatch, capsys, *base, "--json")
    assert code == 0
    summary = json.loads(stdout)
    assert summary["rows_written"] == 17 and summary["shards_written"] == 3 and summary["complete"]
    assert summary["cache"] == {"num_rows": 17, "num_skipped": 0, "skipped": {}}

    code, stdout, err = _run(monkeypatch, capsys, *base[:-1], "2", "--json")
    assert code == 2 and stdout == ""
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "options.batch_size was 4, now 2" in lines[0]


def test_cli_rejects_an_unknown_feature(tmp_path, monkeypatch, capsys, image_dataset):
    code, _, err = _run(monkeypatch, capsys, "--model", "tiny:qwen3_vl", "--data", str(image_dataset),
                        "--out", str(tmp_path / "x"), "--features", "vision_pooled,pooled")
    assert code == 2 and "unknown feature 'pooled'" in err
    assert not (tmp_path / "x").exists()


def test_preflight_accepts_a_real_preset_without_a_checkpoint(tmp_path, image_dataset):
    """`real:` presets have no directory before they are resolved (seen on an H200 in benchmarks/gpu_suite.py)."""
    from vlforge.extract.options import ExtractOptions
    from vlforge.extract.preflight import preflight

    opts = ExtractOptions(model="real:qwen3_vl_2b", data=str(image_dataset), out=tmp_path / "cache")
    root, _, _, entries = preflight(opts)
    assert root == tmp_path / "cache" and entries
