"""The doctor as a load-time guard for train / extract / profile: fix what it can, refuse what it cannot.

Example:
    >>> import torch
    >>> from vlforge.diagnosis import guard
    >>> model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, (2, 4, 4), stride=(2, 4, 4)))
    >>> findings = guard(model, "float32", assume="device=cpu")
    >>> [f.severity for f in findings if f.severity == "error"]
    []
"""

from __future__ import annotations

import logging
import os
from typing import Any

from torch import nn

from vlforge.diagnosis.facts import DoctorError, Facts
from vlforge.diagnosis.model_info import inspect_model
from vlforge.diagnosis.report import DEFAULT_BENCH_SECONDS, report
from vlforge.diagnosis.rules import RULES, Context, Finding, evaluate
from vlforge.diagnosis.tokens import TokenOptions

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
    tokens: bool | TokenOptions = True,
) -> list[Finding]:
    """Diagnose ``model`` for this run, patch the convs a rule says to patch, log one line per finding.

    Raises :class:`UnfixableError` (one line, naming each rule) for error-level findings left after
    patching (e.g. flash-attn requested but missing, bf16 on a device without it). Error-level findings
    of rules with ``guard_raises=False`` are logged as warnings instead: an untrained *generated*
    template token does not stop a training run (training updates that row, if the embeddings are
    trainable). ``bench=True`` also measures the patch convs (seconds), so a measured >= 2x slowdown
    gets patched too. ``tokens`` runs the tokens audit on the model's checkpoint directory
    (``config._name_or_path``), once per process and checkpoint, on rank 0 only.
    Returns the findings after the fixes.
    """
    import vlforge

    rep = report(model, dtype, assume, bench, processor=processor, facts=facts,
                 bench_seconds=bench_seconds, windows=windows, tokens=tokens if _rank() == 0 else False)
    findings = rep.findings
    to_patch = _patch_targets(findings, model)
    if to_patch:
        patch_report = vlforge.patch(model, precision=precision, include=sorted(to_patch))
        logger.info("guard: %s", patch_report.summary())
        # Same facts and measurements, the model as it is now: the fixed findings turn into info.
        info = inspect_model(model, processor)
        info.extra = dict(rep.model.extra) if rep.model is not None else {}
        ctx = Context(facts=rep.facts, model=info, measurements=rep.measurements or None)
        findings = evaluate(ctx)
    not_fatal = {rule.id for rule in RULES if not rule.guard_raises}
    for finding in findings:
        subject = f" [{finding.subject}]" if finding.subject else ""
        level = logging.WARNING if finding.rule in not_fatal else _LOG_LEVEL[finding.severity]
        logger.log(level, "doctor %s %s%s: %s (fix: %s)",
                   finding.severity, finding.rule, subject, finding.message, finding.fix)
    unfixable = [f for f in findings if f.severity == "error" and f.rule not in not_fatal]
    if unfixable:
        raise UnfixableError("cannot fix for this run: " + "; ".join(
            f"{f.rule}: {f.message} (fix: {f.fix})" for f in unfixable))
    return findings


def _rank() -> int:
    """This process's rank (0 when not distributed): the tokens audit reads files, one rank is enough."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK", "0")
    return int(value) if value.isdigit() else 0


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

