"""An unexpected tokens-audit crash is a warning (exit 1), never a silent info-level skip."""

from __future__ import annotations

import pytest

from vlforge.diagnosis import report
from vlforge.diagnosis import tokens as doctor_tokens


def test_unexpected_audit_error_is_a_warning(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise KeyError("lm_head.weight")

    doctor_tokens.clear_cache()
    monkeypatch.setattr(doctor_tokens, "_audit", broken)
    rep = report(str(tiny_checkpoint("qwen3_vl")), bench=False)
    failed = [f for f in rep.findings if f.rule == "tokens-audit-failed"]
    assert failed and failed[0].severity == "warning" and "KeyError" in failed[0].message
    assert rep.exit_code >= 1
    doctor_tokens.clear_cache()


def test_an_audit_is_reused_from_disk_by_a_later_process_until_the_files_or_options_change(
        tiny_checkpoint, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `vlforge train` start audits the checkpoint (16 s for Qwen3.5's 248k rows on 2 cores); the same
    files, options and audit code give the same answer, so a later process reads it from the cache."""
    import os
    import shutil

    monkeypatch.setenv("VLFORGE_CACHE_DIR", str(tmp_path / "cache"))
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint("qwen3_vl"), checkpoint)
    options = doctor_tokens.TokenOptions(format="r1")
    first = doctor_tokens.run_tokens_audit(checkpoint, options)
    assert first.status == "audited" and first.findings
    doctor_tokens._CACHE.clear()  # as in a new process

    def must_not_run(*args, **kwargs):
        raise AssertionError("audited again although the files did not change")

    with monkeypatch.context() as patched:
        patched.setattr(doctor_tokens, "_audit", must_not_run)
        again = doctor_tokens.run_tokens_audit(checkpoint, options)
    assert again.to_dict() == first.to_dict()
    assert [f.id_reports for f in again.findings] == [f.id_reports for f in first.findings]
    calls, reports = [], []
    real = doctor_tokens._audit

    def counted(*args, **kwargs):
        calls.append(1)
        reports.append(real(*args, **kwargs))
        return reports[-1]

    monkeypatch.setattr(doctor_tokens, "_audit", counted)
    doctor_tokens._CACHE.clear()
    assert doctor_tokens.run_tokens_audit(checkpoint, doctor_tokens.TokenOptions()).status == "audited"
    assert len(calls) == 1  # other options: audited
    weights = next(checkpoint.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    doctor_tokens._CACHE.clear()
    assert doctor_tokens.run_tokens_audit(checkpoint, options).status == "audited"
    assert len(calls) == 2  # a rewritten weights file: audited again

    # Processes auditing the same files at once (a torchrun job's ranks): one audits, the others read its result.
    # Threads stand in for them: each takes the entry's file lock through its own open file, as a process does.
    import threading
    import time

    def slow_audit(*args, **kwargs):  # the last real audit's answer, after both have missed the disk cache
        calls.append(1)
        time.sleep(0.5)
        return reports[-1]

    monkeypatch.setattr(doctor_tokens, "_audit", slow_audit)
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    doctor_tokens._CACHE.clear()
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(doctor_tokens.run_tokens_audit(checkpoint, options)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 3 and [r.status for r in results] == ["audited", "audited"]
    assert results[0].to_dict() == results[1].to_dict()
    assert [f.id_reports for f in results[1].findings] == [f.id_reports for f in results[0].findings]
    doctor_tokens.clear_cache()
    assert not (tmp_path / "cache" / "token_audits").exists()
