"""``vlforge tokens audit | scan | fix`` as :class:`~vlforge.command.Job` s: each command's flags as one options
model, checked before torch loads; the run; the tables or JSON; the exit code.

Example:
    vlforge tokens scan --model ./gemma-3-270m --top 20
    vlforge tokens audit --model ./Qwen3-VL-2B-Base --format r1 --json
    vlforge tokens fix --model ./Qwen3-VL-2B-Base --out ./fixed --tags '<think>,</think>' --trainable-rows rows.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from vlforge.command import Cli, Job, always_ok
from vlforge.errors import ConfigError
from vlforge.flags import Flag, key_values
from vlforge.outputs import atomic_write_text, check_output_file
from vlforge.strict import StrictModel, build_options
from vlforge.vocab.thresholds import check_thresholds


def resolve_model(model: Path | str | None) -> Path | None:
    """A checkpoint directory, ``tiny:FAMILY`` preset or hub id as a local directory."""
    if model is None:
        return None
    from vlforge.models import resolve

    return resolve(str(model))


GGUF_HINT = ("vlforge tokens reads Hugging Face checkpoints (safetensors); convert it first: transformers' "
             "AutoModelForCausalLM.from_pretrained(DIR, gguf_file=NAME) then save_pretrained (docs/tokens.md, GGUF)")


def refuse_gguf(model: Path | str) -> None:
    """A GGUF file (or a directory holding only GGUF weights) is one line saying how to convert it."""
    path = Path(model).expanduser()
    if path.is_file():
        with path.open("rb") as handle:
            magic = handle.read(4)
        if magic == b"GGUF" or path.suffix.lower() == ".gguf":
            raise ConfigError(f"{path}: a GGUF file; {GGUF_HINT}")
    elif path.is_dir() and any(path.glob("*.gguf")) and not any(path.glob("*.safetensors")):
        raise ConfigError(f"{path}: holds GGUF weights only; {GGUF_HINT}")


def check_paths(*, model: Path | str | None, tokenizer: Path | None = None, template: Path | None = None) -> None:
    """The model reference and input files, refused before torch or transformers is imported."""
    from vlforge.models.refs import check_model_ref

    if model is not None:
        refuse_gguf(model)
        check_model_ref(model)
    for flag, path, kind in (("--tokenizer", tokenizer, "dir"), ("--template", template, "file")):
        if path is None:
            continue
        if not path.exists():
            raise ConfigError(f"{flag} {path}: not found")
        if kind == "file" and not path.is_file():
            raise ConfigError(f"{flag} {path}: is a directory, not a template file")
        if kind == "dir" and not path.is_dir():
            raise ConfigError(f"{flag} {path}: is a file; pass the tokenizer directory")


def check_rows(model: Path | str | None, ids: list[int], flag: str) -> None:
    """``ids`` against a local checkpoint's ``vocab_size`` (config.json; its embedding rows), before it loads: the
    same line the loaded model would give, seconds earlier. Presets and hub ids are checked once loaded."""
    from vlforge.models.presets import PRESET_PREFIX, REAL_PREFIX
    from vlforge.models.refs import local_checkpoint, text_setting

    if model is None or not ids or str(model).startswith((PRESET_PREFIX, REAL_PREFIX)):
        return
    local = local_checkpoint(str(model))
    if local is None:
        return
    try:
        config = json.loads((local / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # the loader names an unreadable config
    rows = text_setting(config, "vocab_size")
    bad = [i for i in ids if isinstance(rows, int) and not 0 <= i < rows]
    if bad:
        raise ConfigError(f"{flag} {bad}: outside the embedding rows [0, {rows})")


def split_list(values: list[str] | None) -> list[str]:
    """Repeatable, comma-separated option values as one list (``--tags '<a>,</a>' --tags '<b>'``)."""
    out: list[str] = []
    for value in values or []:
        out.extend(v.strip() for v in value.split(",") if v.strip())
    return out


def int_list(values: list[str] | None, option: str) -> list[int]:
    try:
        return [int(v) for v in split_list(values)]
    except ValueError as error:
        raise ConfigError(f"{option}: expected integers separated by commas ({error})") from None


def refuse_non_causal(model: Path) -> None:
    """``--verify`` needs a model that generates text: an encoder's config is one line naming the file."""
    path = model / "config.json"
    try:
        archs = json.loads(path.read_text()).get("architectures") or []
    except ValueError as error:
        raise ConfigError(f"{path}: invalid JSON ({error})") from None
    if archs and not any(a.endswith(("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")) for a in archs):
        raise ConfigError(f"--verify: {path} describes {', '.join(archs)}, not a causal LM; the repeat check "
                          "needs a model that generates text")


class AuditRequest(StrictModel):
    """``vlforge tokens audit``'s flags (lists as given: repeatable, comma-separated)."""

    unknown_label = "option"
    model: Annotated[Path | None, Flag("--model", "-m")] = None
    """Checkpoint dir (safetensors), tiny:FAMILY or hub id."""
    tokenizer: Path | None = None
    """Tokenizer directory (default: --model)."""
    tags: list[str] = Field(default_factory=list)
    """Tags to generate, comma-separated, repeatable."""
    template: Path | None = None
    """Chat template (jinja) file to probe."""
    model_template: bool = False
    """Probe the tokenizer's template (default when no other source is given)."""
    template_vars: Annotated[list[str], Flag("--template-var")] = Field(default_factory=list)
    """Template variable KEY=VALUE, e.g. enable_thinking=false (repeatable)."""
    reward_regex: str | None = None
    """Reward regex; its literal tags must be generated."""
    fmt: Annotated[str | None, Flag("--format")] = None
    """Built-in format: r1 (<think>..</think><answer>..</answer>)."""
    reference_ids: list[str] = Field(default_factory=list)
    """Extra known-unused ids for the reference set."""
    thresholds: Annotated[list[str], Flag("--threshold")] = Field(default_factory=list)
    """Override a threshold KEY=VALUE (see docs/tokens.md; repeatable)."""
    verify: bool = False
    """Forward-pass repeat check of the tag ids."""
    verify_dtype: str = "float32"
    """dtype for --verify."""
    rewrite_out: Path | None = None
    """Write the rewritten template / regex here."""


def check_audit(request: AuditRequest) -> None:
    check_paths(model=request.model, tokenizer=request.tokenizer, template=request.template)
    if request.rewrite_out is not None:
        check_output_file(request.rewrite_out, flag="--rewrite-out")
    check_thresholds(key_values(request.thresholds, "--threshold", numbers=True))
    check_rows(request.model, int_list(request.reference_ids, "--reference-ids"), "--reference-ids")
    key_values(request.template_vars, "--template-var")


def run_audit_request(request: AuditRequest) -> Any:
    from vlforge.vocab.audit import AuditOptions, run_audit

    options = build_options(
        AuditOptions, model=resolve_model(request.model), tokenizer=request.tokenizer, tags=split_list(request.tags),
        template=request.template, model_template=request.model_template,
        template_vars=key_values(request.template_vars, "--template-var"), reward_regex=request.reward_regex,
        format=request.fmt, reference_ids=int_list(request.reference_ids, "--reference-ids"),
        thresholds=check_thresholds(key_values(request.thresholds, "--threshold", numbers=True)),
        verify=request.verify, verify_dtype=request.verify_dtype,
    )
    report = run_audit(options)
    if request.rewrite_out is not None:
        text = report.rewritten.template or report.rewritten.regex or report.rewritten.format_regex
        if text is None:
            raise ConfigError("--rewrite-out: nothing was rewritten (no problem tag with a checked alternative)")
        atomic_write_text(request.rewrite_out, text, writer="tokens audit")
    return report


def _print_audit(request: AuditRequest, report: Any, console: Any) -> None:
    from vlforge.tokens.render import print_audit

    print_audit(report, console)


AUDIT: Job[AuditRequest, Any] = Job(
    check=check_audit, run=run_audit_request, render=_print_audit,
    to_json=lambda report: report.model_dump_json(indent=1), exit_code=lambda report: report.exit_code,
)


class ScanRequest(StrictModel):
    """``vlforge tokens scan``'s flags."""

    unknown_label = "option"
    model: Annotated[Path, Flag("--model", "-m")]
    """Checkpoint dir (safetensors), tiny:FAMILY or hub id."""
    tokenizer: Path | None = None
    """Tokenizer directory (default: --model)."""
    top: int | None = None
    """Report only the N highest-scoring flagged ids."""
    reference_ids: list[str] = Field(default_factory=list)
    """Extra known-unused ids for the reference set."""
    thresholds: Annotated[list[str], Flag("--threshold")] = Field(default_factory=list)
    """Override a threshold or cut KEY=VALUE (see docs/tokens.md; repeatable)."""
    verify: bool = False
    """Repeat-prompt check of the flagged ids (causal LMs)."""
    verify_dtype: str = "float32"
    """dtype for --verify."""
    verify_batch: int = 32
    """Prompts per forward pass for --verify."""
    verify_max: int = 512
    """Verify at most this many flagged ids (highest score first)."""


def check_scan(request: ScanRequest) -> None:
    from vlforge.models.refs import dtype_name

    check_paths(model=request.model, tokenizer=request.tokenizer)
    if request.top is not None and request.top <= 0:
        raise ConfigError(f"--top {request.top}: must be a positive number of ids")
    for flag, value in (("--verify-batch", request.verify_batch), ("--verify-max", request.verify_max)):
        if value <= 0:
            raise ConfigError(f"{flag} {value}: must be positive")
    dtype_name(request.verify_dtype)
    check_thresholds(key_values(request.thresholds, "--threshold", numbers=True))
    check_rows(request.model, int_list(request.reference_ids, "--reference-ids"), "--reference-ids")
    if request.verify and (Path(request.model) / "config.json").is_file():
        refuse_non_causal(Path(request.model))


def run_scan_request(request: ScanRequest) -> Any:
    from vlforge.models.refs import dtype_name
    from vlforge.tokens.scan import ScanOptions, run_scan

    return run_scan(build_options(
        ScanOptions, model=resolve_model(request.model), tokenizer=request.tokenizer, top=request.top,
        reference_ids=int_list(request.reference_ids, "--reference-ids"),
        thresholds=check_thresholds(key_values(request.thresholds, "--threshold", numbers=True)),
        verify=request.verify, verify_dtype=dtype_name(request.verify_dtype), verify_batch=request.verify_batch,
        verify_max=request.verify_max))


def _print_scan(request: ScanRequest, report: Any, console: Any) -> None:
    from vlforge.tokens.render import print_scan

    print_scan(report, console)


SCAN: Job[ScanRequest, Any] = Job(
    check=check_scan, run=run_scan_request, render=_print_scan,
    to_json=lambda report: report.model_dump_json(indent=1), exit_code=always_ok,
)


class FixRequest(StrictModel):
    """``vlforge tokens fix``'s flags."""

    unknown_label = "option"
    model: Annotated[Path, Flag("--model", "-m")]
    """Checkpoint directory (safetensors)."""
    out: Path
    """New checkpoint directory (must not exist or be empty)."""
    strategy: str = "mean-of-pieces"
    """mean-of-pieces or trained-mean."""
    ids: list[str] = Field(default_factory=list)
    """Ids to re-initialise, comma-separated."""
    tags: list[str] = Field(default_factory=list)
    """Re-initialise the untrained / weak ids of these tags."""
    seed: int = 0
    """Seed of the added noise."""
    noise: float = 0.02
    """Noise std relative to the per-element row scale."""
    trainable_rows: Path | None = None
    """Write the changed ids (to unfreeze) as JSON."""


def check_fix(request: FixRequest) -> None:
    check_paths(model=request.model)
    check_rows(request.model, int_list(request.ids, "--ids"), "--ids")


def run_fix_request(request: FixRequest) -> Any:
    from vlforge.tokens.fix import FixOptions, fix_checkpoint

    return fix_checkpoint(build_options(
        FixOptions, model=resolve_model(request.model), out=request.out, strategy=request.strategy,
        ids=int_list(request.ids, "--ids"), tags=split_list(request.tags), seed=request.seed, noise=request.noise,
        trainable_rows=request.trainable_rows))


def _print_fix(request: FixRequest, report: Any, console: Any) -> None:
    from vlforge.tokens.render import print_fix

    print_fix(report, console)


FIX: Job[FixRequest, Any] = Job(
    check=check_fix, run=run_fix_request, render=_print_fix,
    to_json=lambda report: report.model_dump_json(indent=1), exit_code=always_ok,
)
AUDIT_CLI = Cli(flags=AuditRequest, job=AUDIT)
SCAN_CLI = Cli(flags=ScanRequest, job=SCAN)
FIX_CLI = Cli(flags=FixRequest, job=FIX)
