"""Build a :class:`DoctorReport`: facts (+ assumptions), the model's convs, measurements, findings.

Example (environment only, no model):
    >>> from vlforge.diagnosis.report import report
    >>> rep = report(assume="torch=2.9.1,cudnn=91002,device=cuda,dtype=bf16")
    >>> rep.exit_code, [f.rule for f in rep.findings]
    (1, ['cudnn-conv3d-skipped-env'])
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from vlforge.diagnosis.facts import DoctorError, Facts, apply_assume, canonical_dtype, collect_facts
from vlforge.diagnosis.model_info import ModelInfo, inspect_model
from vlforge.diagnosis.rules import Context, Finding, Measurement, evaluate, exit_code, worst
from vlforge.diagnosis.tokens import TokenOptions, TokensAudit, checkpoint_dir, run_tokens_audit

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DEFAULT_BENCH_SECONDS = 5.0


@dataclass
class BenchStatus:
    """Whether the measurement ran: ``measured`` (``reason`` set when the budget left it partial),
    ``skipped`` (with the reason) or ``off``."""

    status: str = "off"
    reason: str | None = None
    seconds: float | None = None
    windows: int | None = None
    elapsed: float | None = None
    """Seconds the measurement took (the budget is ``seconds``; a call that started inside it may end after)."""


@dataclass
class DoctorReport:
    """Everything ``vlforge doctor`` found; ``to_dict()`` is the documented JSON schema (docs/doctor.md)."""

    facts: Facts
    findings: list[Finding]
    model: ModelInfo | None = None
    model_source: str | None = None
    measurements: list[Measurement] = field(default_factory=list)
    bench: BenchStatus = field(default_factory=BenchStatus)

    @property
    def exit_code(self) -> int:
        """OK: nothing above info; WARNING: warnings; FAILED: errors (:class:`vlforge.errors.ExitCode`)."""
        return exit_code(self.findings)

    @property
    def verdict(self) -> str:
        return {None: "ok", "info": "ok", "warning": "warning", "error": "error"}[worst(self.findings)]

    def to_dict(self) -> dict[str, Any]:
        model = None
        if self.model is not None:
            model = {"source": self.model_source, **self.model.to_dict()}
        return {
            "schema": "vlforge.doctor",
            "version": SCHEMA_VERSION,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "facts": self.facts.to_dict(),
            "model": model,
            "bench": {"status": self.bench.status, "reason": self.bench.reason,
                      "seconds": self.bench.seconds, "windows": self.bench.windows,
                      "elapsed": self.bench.elapsed},
            "measurements": [m.to_dict() for m in self.measurements],
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


def _load(source: str | Path, dtype: str | None, device: str) -> tuple[nn.Module, Any, Path]:
    from vlforge.models import load

    loaded = load(str(source), dtype=dtype or "float32", device=device)
    return loaded.model, loaded.processor, loaded.path


def tokens_audit(tokens: bool | TokenOptions, checkpoint: Path | None) -> TokensAudit:
    """The tokens audit for ``checkpoint`` (``off`` when ``tokens`` is False)."""
    if tokens is False:
        return TokensAudit("off", "--no-tokens")
    options = tokens if isinstance(tokens, TokenOptions) else TokenOptions()
    logger.info("tokens audit of %s: checking the chat template's special tokens (a few seconds; off with "
                "--no-token-audit in train/extract, --no-tokens in doctor)", checkpoint or "in-memory model")
    start = time.perf_counter()
    audit = run_tokens_audit(checkpoint, options)
    logger.info("tokens audit of %s: %s%s (%.1f s)", checkpoint or "in-memory model", audit.status,
                f" ({audit.reason})" if audit.reason else "", time.perf_counter() - start)
    return audit


def _bench_device(model: nn.Module) -> str | None:
    for param in model.parameters():
        return param.device.type if param.device.index is None else str(param.device)
    return None


def report(
    model: nn.Module | str | Path | None = None,
    dtype: str | None = None,
    assume: str | dict[str, str] | None = None,
    bench: bool = True,
    *,
    processor: Any = None,
    windows: int | None = None,
    bench_seconds: float = DEFAULT_BENCH_SECONDS,
    facts: Facts | None = None,
    tokens: bool | TokenOptions = True,
) -> DoctorReport:
    """Diagnose this process (and ``model`` when given: a module, a ``LoadedModel``, a checkpoint dir or a preset).

    ``dtype`` is the run's compute dtype (default: the model's); ``assume`` overrides facts
    (``"torch=2.9.1,cudnn=91002"``); ``bench`` measures the model's patch convs here (skipped when
    the device is assumed, since this machine cannot time another one). ``facts`` lets a caller
    reuse facts it collected. ``tokens`` audits the untrained special tokens of the model's chat template
    (and of ``TokenOptions``' format / regex / tags) on its local checkpoint directory, about 2-3 s on a
    tiny model (loading the tokenizer); False skips it.
    """
    if isinstance(tokens, TokenOptions) and tokens.extra_sources and model is None:
        raise DoctorError("--format / --reward-regex / --tags need --model (the checkpoint to audit)")
    facts = facts if facts is not None else collect_facts()
    detected_device = facts.device
    apply_assume(facts, assume)
    if dtype is not None and "dtype" not in facts.assumed:
        facts.dtype = canonical_dtype(dtype)
    source = checkpoint = None
    if model is not None and not isinstance(model, (nn.Module, str, Path)) and hasattr(model, "model"):
        # A vlforge.models.LoadedModel: take its model, processor, source and directory.
        processor = processor if processor is not None else getattr(model, "processor", None)
        source = getattr(model, "source", None)
        checkpoint = checkpoint_dir(model)
        model = model.model
    if isinstance(model, (str, Path)):
        source = str(model)
        model, loaded_processor, checkpoint = _load(model, facts.dtype, detected_device or "cpu")
        processor = processor if processor is not None else loaded_processor
    info = None
    if model is not None:
        info = inspect_model(model, processor)
        info.extra["tokens"] = tokens_audit(tokens, checkpoint or checkpoint_dir(model))
        if facts.dtype is None and info.dtype is not None and info.dtype.startswith(("float", "bfloat")):
            facts.dtype = canonical_dtype(info.dtype)
        if "attn_implementation" not in facts.assumed and info.attn_implementation is not None:
            facts.attn_implementation = info.attn_implementation
    status = BenchStatus()
    measurements: list[Measurement] = []
    if bench and info is not None:
        status = _run_bench(facts, info, model, detected_device, windows, bench_seconds, measurements)
    findings = evaluate(Context(facts=facts, model=info, measurements=measurements or None))
    return DoctorReport(facts=facts, findings=findings, model=info, model_source=source,
                        measurements=measurements, bench=status)


def _run_bench(
    facts: Facts, info: ModelInfo, model: nn.Module, detected_device: str | None,
    windows: int | None, seconds: float, out: list[Measurement],
) -> BenchStatus:
    if "device" in facts.assumed and facts.device != detected_device:
        return BenchStatus("skipped", f"device assumed {facts.device}; this machine has {detected_device}")
    if not any(c.patchable for c in info.convs):
        return BenchStatus("skipped", "the model has no stride==kernel convolution")
    device = _bench_device(model) or "cpu"
    dtype = facts.dtype or "float32"
    from vlforge.diagnosis.bench import default_windows, measure_model

    started = time.perf_counter()
    try:
        out.extend(measure_model(info, device=device, dtype=dtype, windows=windows, seconds=seconds))
    except RuntimeError as error:  # e.g. no conv kernel for this dtype on this device
        out.clear()
        return BenchStatus("skipped", f"measurement failed: {str(error).splitlines()[0]}")
    first = next(c for c in info.convs if c.patchable)
    used = windows or default_windows(first, info.processor_max_pixels)
    partial = [m for m in out if not m.complete]
    reason = None
    if partial:  # the figures that are there are real; what the budget did not reach is said, not estimated
        reason = (f"partial: the {seconds:g} s budget did not fit every figure of {len(partial)} of {len(out)} "
                  "conv shape(s) (see each measurement's note; --bench-seconds raises it)")
    return BenchStatus("measured", reason, seconds, used, round(time.perf_counter() - started, 3))
