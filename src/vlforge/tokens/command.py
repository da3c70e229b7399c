"""Glue between the ``vlforge tokens`` CLI and the job modules: parse lists, print, pick the exit code.

Example:
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


def _console() -> Console:
    """The stdout console (its tables print whole in logs and pipes: :func:`vlforge.tables.print_table`)."""
    return report_console()


def resolve_model(model: Path | str | None) -> Path | None:
    """A checkpoint directory, ``tiny:FAMILY`` preset or hub id as a local directory."""
    if model is None:
        return None
    from vlforge.models import resolve

    return resolve(str(model))


def check_paths(*, model: Path | str | None, tokenizer: Path | None = None, template: Path | None = None) -> None:
    """The model reference and input files, refused before torch or transformers is imported."""
    from vlforge.models.refs import check_model_ref

    if model is not None:
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
    from vlforge.tokens.audit import AuditOptions, run_audit
    from vlforge.tokens.detect import THRESHOLDS
    from vlforge.tokens.render import print_audit

    th = key_values(thresholds, "--threshold", numbers=True)
    unknown = sorted(set(th) - set(THRESHOLDS))
    if unknown:
        raise ConfigError(f"--threshold {unknown[0]}: unknown; known: {', '.join(THRESHOLDS)}")
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
