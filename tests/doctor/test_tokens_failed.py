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
