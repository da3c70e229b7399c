"""The doctor as a load-time guard for train / extract / profile: fix what it can, refuse what it cannot.

Example:
    >>> import torch
    >>> from vlforge.doctor import guard
    >>> model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)))
    >>> findings = guard(model, "float32", assume="device=cpu")
    >>> [f.severity for f in findings if f.severity == "error"]
    []
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from vlforge.doctor.facts import DoctorError, Facts
from vlforge.doctor.model_info import inspect_model
from vlforge.doctor.report import DEFAULT_BENCH_SECONDS, report
from vlforge.doctor.rules import Context, Finding, evaluate

logger = logging.getLogger(__name__)

_LOG_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


class UnfixableError(DoctorError):
    """The doctor found an error-level problem that vlforge cannot fix for this run."""


def guard(
    model: nn.Module,
    dtype: str | None = None,
    *,
    assume: str | dict[str, str] | None = None,
    bench: bool = False,
    bench_seconds: float = DEFAULT_BENCH_SECONDS,
    windows: int | None = None,
    precision: str = "native",
    processor: Any = None,
    facts: Facts | None = None,
) -> list[Finding]:
    """Diagnose ``model`` for this run, patch the convs a rule says to patch, log one line per finding.

    Raises :class:`UnfixableError` (one line, naming each rule) for error-level findings left after
    patching (e.g. flash-attn requested but missing, bf16 on a device without it). ``bench=True``
    also measures the patch convs (seconds), so a measured >= 2x slowdown gets patched too.
    Returns the findings after the fixes.
    """
    import vlforge

    rep = report(model, dtype, assume, bench, processor=processor, facts=facts,
                 bench_seconds=bench_seconds, windows=windows)
    findings = rep.findings
    to_patch = _patch_targets(findings, model)
    if to_patch:
        patch_report = vlforge.patch(model, precision=precision, include=sorted(to_patch))
        logger.info("guard: %s", patch_report.summary())
        # Same facts and measurements, the model as it is now: the fixed findings turn into info.
        ctx = Context(facts=rep.facts, model=inspect_model(model, processor), measurements=rep.measurements or None)
        findings = evaluate(ctx)
    for finding in findings:
        subject = f" [{finding.subject}]" if finding.subject else ""
        logger.log(_LOG_LEVEL[finding.severity], "doctor %s %s%s: %s (fix: %s)",
                   finding.severity, finding.rule, subject, finding.message, finding.fix)
    unfixable = [f for f in findings if f.severity == "error"]
    if unfixable:
        raise UnfixableError("cannot fix for this run: " + "; ".join(
            f"{f.rule}: {f.message} (fix: {f.fix})" for f in unfixable))
    return findings


def _patch_targets(findings: list[Finding], model: nn.Module) -> set[str]:
    from vlforge.patches import is_patchable, is_patched

    patchable = {name for name, m in model.named_modules() if is_patchable(m) and not is_patched(m)}
    targets: set[str] = set()
    for f in findings:
        if f.action != "patch" or f.severity == "info":
            continue
        names = {s.strip() for s in f.subject.split(",")} & patchable
        targets |= names
    return targets

