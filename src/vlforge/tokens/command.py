"""Glue between the ``vlforge tokens`` CLI and the job modules: parse lists, print, pick the exit code.

Example:
    vlforge tokens scan --model ./gemma-3-270m --top 20
    vlforge tokens audit --model ./Qwen3-VL-2B-Base --format r1 --json
    vlforge tokens fix --model ./Qwen3-VL-2B-Base --out ./fixed --tags '<think>,</think>' --trainable-rows rows.json
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from vlforge.cli_args import build_options
from vlforge.errors import ConfigError
from vlforge.outputs import atomic_write_text, check_output_file
from vlforge.tables import report_console
from vlforge.tokens.thresholds import check_thresholds


def _console() -> Console:
    """The stdout console (its tables print whole in logs and pipes: :func:`vlforge.tables.print_table`)."""
    return report_console()


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


def key_values(values: list[str] | None, option: str, *, numbers: bool = False) -> dict:
    """``KEY=VALUE`` pairs; values are parsed as JSON when possible (``enable_thinking=false``)."""
    out = {}
    for item in values or []:
        if "=" not in item:
            raise ConfigError(f"{option} {item!r}: expected KEY=VALUE")
        key, raw = item.split("=", 1)
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        if numbers and not isinstance(value, int | float):
            raise ConfigError(f"{option} {item!r}: the value must be a number")
        out[key.strip()] = value
    return out


def audit_command(*, model: Path | None, tokenizer: Path | None, tags: list[str] | None, template: Path | None,
                  model_template: bool, template_vars: list[str] | None, reward_regex: str | None,
                  fmt: str | None, reference_ids: list[str] | None, thresholds: list[str] | None, verify: bool,
                  verify_dtype: str, rewrite_out: Path | None, json_output: bool) -> int:
    """Run the audit, print it (table or JSON) and return the exit code."""
    check_paths(model=model, tokenizer=tokenizer, template=template)
    if rewrite_out is not None:
        check_output_file(rewrite_out, flag="--rewrite-out")
    th = check_thresholds(key_values(thresholds, "--threshold", numbers=True))
    from vlforge.tokens.audit import AuditOptions, run_audit
    from vlforge.tokens.render import print_audit

    opts = build_options(
        AuditOptions, model=resolve_model(model), tokenizer=tokenizer, tags=split_list(tags), template=template, model_template=model_template,
        template_vars=key_values(template_vars, "--template-var"), reward_regex=reward_regex, format=fmt,
        reference_ids=int_list(reference_ids, "--reference-ids"), thresholds=th, verify=verify,
        verify_dtype=verify_dtype,
    )
    report = run_audit(opts)
    if rewrite_out is not None:
        text = report.rewritten.template or report.rewritten.regex or report.rewritten.format_regex
        if text is None:
            raise ConfigError("--rewrite-out: nothing was rewritten (no problem tag with a checked alternative)")
        atomic_write_text(rewrite_out, text, writer="tokens audit")
    if json_output:
        typer.echo(report.model_dump_json(indent=1))
    else:
        print_audit(report, _console())
    return report.exit_code


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


def scan_command(*, model: Path, tokenizer: Path | None, top: int | None, reference_ids: list[str] | None,
                 thresholds: list[str] | None, verify: bool, verify_dtype: str, verify_batch: int,
                 verify_max: int, json_output: bool) -> int:
    """Scan the whole vocabulary, print it (table or JSON) and return 0 (2 for bad input, raised)."""
    check_paths(model=model, tokenizer=tokenizer)
    from vlforge.models.refs import dtype_name

    if top is not None and top <= 0:
        raise ConfigError(f"--top {top}: must be a positive number of ids")
    for flag, value in (("--verify-batch", verify_batch), ("--verify-max", verify_max)):
        if value <= 0:
            raise ConfigError(f"{flag} {value}: must be positive")
    dtype = dtype_name(verify_dtype)
    th = check_thresholds(key_values(thresholds, "--threshold", numbers=True))
    ref_ids = int_list(reference_ids, "--reference-ids")
    if verify and (Path(model) / "config.json").is_file():
        refuse_non_causal(Path(model))
    resolved = resolve_model(model)
    from vlforge.tokens.render import print_scan
    from vlforge.tokens.scan import ScanOptions, run_scan

    report = run_scan(build_options(
        ScanOptions, model=resolved, tokenizer=tokenizer, top=top, reference_ids=ref_ids, thresholds=th,
        verify=verify, verify_dtype=dtype, verify_batch=verify_batch, verify_max=verify_max))
    if json_output:
        typer.echo(report.model_dump_json(indent=1))
    else:
        print_scan(report, _console())
    return 0


def fix_command(*, model: Path, out: Path, strategy: str, ids: list[str] | None, tags: list[str] | None,
                seed: int, noise: float, trainable_rows: Path | None, json_output: bool) -> int:
    """Write the repaired checkpoint and print which rows changed."""
    check_paths(model=model)
    from vlforge.tokens.fix import FixOptions, fix_checkpoint
    from vlforge.tokens.render import print_fix

    report = fix_checkpoint(build_options(
        FixOptions, model=resolve_model(model), out=out, strategy=strategy, ids=int_list(ids, "--ids"),
        tags=split_list(tags), seed=seed, noise=noise, trainable_rows=trainable_rows))
    if json_output:
        typer.echo(report.model_dump_json(indent=1))
    else:
        print_fix(report, _console())
    return 0
