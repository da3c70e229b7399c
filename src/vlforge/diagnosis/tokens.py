"""The tokens audit (``vlforge.tokens``) as one input of the doctor: find the checkpoint, audit it, keep the result.

The doctor audits the model's own chat template (plus a reward format / regex / tags when given) on
the checkpoint *files* (the audit streams the embedding rows from safetensors; in-memory changes to
the weights are not seen). The result goes to ``ModelInfo.extra["tokens"]`` as a :class:`TokensAudit`
for the ``untrained-template-token*`` rules. An audit that cannot run becomes ``status="skipped"``
with the reason, never an exception. Results are cached in the process and on disk (``cache_root()/token_audits``),
keyed by the checkpoint's path, file names, sizes and mtimes, the options and a digest of the audit's code, so a
second doctor / guard / training start on the same checkpoint costs nothing.

Example:
    >>> from vlforge.diagnosis.tokens import TokenOptions, run_tokens_audit
    >>> run_tokens_audit(None, TokenOptions()).reason
    'no local checkpoint directory (in-memory model)'
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.diagnosis.facts import DoctorError
from vlforge.errors import VlforgeError, first_line

logger = logging.getLogger(__name__)

_CACHE: dict[tuple[Any, ...], TokensAudit] = {}
_PROBLEM = ("untrained", "weak")


@dataclass(frozen=True)
class TokenOptions:
    """Which tags besides the model's chat template the policy must generate (validated on creation).

    ``format``: a built-in format of ``vlforge.tokens`` (``r1``); ``reward_regex``: the reward's regex;
    ``tags``: literal tags.
    """

    format: str | None = None
    reward_regex: str | None = None
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.format is not None:
            from vlforge.vocab.templates import FORMATS

            if self.format not in FORMATS:
                raise DoctorError(f"--format {self.format!r}: unknown format; known: {', '.join(sorted(FORMATS))}")
        if self.reward_regex is not None:
            try:
                re.compile(self.reward_regex)
            except re.error as error:
                raise DoctorError(f"--reward-regex {self.reward_regex!r} does not compile: {error}") from None
        if any(not tag for tag in self.tags):
            raise DoctorError("--tags: empty tag")

    @property
    def extra_sources(self) -> bool:
        return self.format is not None or self.reward_regex is not None or bool(self.tags)


@dataclass
class TokensAudit:
    """What the doctor keeps of one tokens audit (``ModelInfo.extra["tokens"]``)."""

    status: str
    """``audited``, ``skipped`` (could not run, see ``reason``), ``failed`` (an unexpected error: a
    warning, since an untrained tag may then go unreported) or ``off`` (``--no-tokens``)."""
    reason: str | None = None
    checkpoint: str | None = None
    options: TokenOptions = field(default_factory=TokenOptions)
    findings: list[Any] = field(default_factory=list)
    """``vlforge.vocab.TokenFinding`` records (tag, role, verdict, ids, per-id reports)."""
    alternatives: dict[str, str] = field(default_factory=dict)
    """First checked alternative per problem tag (``{"<think>": "<thinking>"}``), empty when none."""
    notes: list[str] = field(default_factory=list)
    template_skipped: str | None = None
    """Why the chat template was not audited while the other tags were (no template, does not render)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "checkpoint": self.checkpoint,
            "format": self.options.format,
            "reward_regex": self.options.reward_regex,
            "tags": list(self.options.tags),
            "findings": [
                {"tag": f.tag, "role": f.role, "verdict": f.verdict, "sources": list(f.sources), "ids": list(f.ids),
                 "problem_ids": problem_ids(f)}
                for f in self.findings
            ],
            "alternatives": dict(self.alternatives),
            "notes": list(self.notes),
            "template_skipped": self.template_skipped,
        }


def problem_ids(finding: Any) -> list[int]:
    """Ids of a finding whose rows are ``untrained`` or ``weak``."""
    return [r.id for r in finding.id_reports if r.verdict in _PROBLEM]


def checkpoint_dir(model: Any) -> Path | None:
    """The local checkpoint directory behind ``model``: ``LoadedModel.path``, else ``config._name_or_path``
    when that is an existing directory; None otherwise (never guessed, never downloaded)."""
    path = getattr(model, "path", None)
    if isinstance(path, (str, Path)) and Path(path).is_dir():
        return Path(path)
    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    if isinstance(name, (str, os.PathLike)) and str(name) and Path(name).is_dir():
        return Path(name)
    return None


def _cache_key(path: Path, options: TokenOptions) -> tuple[Any, ...]:
    stats = [(p.name, p.stat()) for p in path.iterdir() if p.is_file()]
    return (str(path.resolve()), options, tuple(sorted((n, s.st_size, s.st_mtime_ns) for n, s in stats)))


@functools.cache
def _code_digest() -> str:
    """A digest of the audit's own code: a cached result is never reused by another version of it."""
    import vlforge.vocab

    digest = hashlib.sha256(Path(__file__).read_bytes())
    for source in sorted(Path(vlforge.vocab.__file__).parent.glob("*.py")):
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _disk_path(key: tuple[Any, ...]) -> Path:
    from vlforge.outputs import cache_root

    path, options, stats = key
    text = json.dumps([path, options.format, options.reward_regex, list(options.tags), stats, _code_digest()])
    return cache_root() / "token_audits" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def _from_disk(key: tuple[Any, ...], options: TokenOptions) -> TokensAudit | None:
    """The audit of the same files, options and code from an earlier process, or None."""
    from vlforge.vocab import TokenFinding

    try:
        saved = json.loads(_disk_path(key).read_text(encoding="utf-8"))
        return TokensAudit(saved["status"], saved["reason"], saved["checkpoint"], options,
                           [TokenFinding.model_validate(f) for f in saved["findings"]], saved["alternatives"],
                           saved["notes"], saved["template_skipped"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or unreadable: audit again
        return None


def _to_disk(key: tuple[Any, ...], audit: TokensAudit) -> None:
    from vlforge.outputs import atomic_write_json

    payload = {"status": audit.status, "reason": audit.reason, "checkpoint": audit.checkpoint,
               "findings": [f.model_dump(mode="json") for f in audit.findings], "alternatives": audit.alternatives,
               "notes": audit.notes, "template_skipped": audit.template_skipped}
    try:
        path = _disk_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, payload)
    except OSError as error:  # a cache that cannot be written costs the next run an audit, nothing else
        logger.debug("tokens audit not cached (%s)", error)


def _audit(path: Path, options: TokenOptions, template: bool):
    from vlforge.vocab import AuditOptions, run_audit

    return run_audit(AuditOptions(model=path, model_template=template, format=options.format,
                                  reward_regex=options.reward_regex, tags=list(options.tags)))


def run_tokens_audit(path: Path | None, options: TokenOptions) -> TokensAudit:
    """Audit the chat template of the checkpoint at ``path`` (and ``options``' tags); never raises.

    When the template cannot be probed (none, or it does not render) but ``options`` names other tags,
    those are still audited and the template problem is kept in ``template_skipped``.
    """
    if path is None:
        return TokensAudit("skipped", "no local checkpoint directory (in-memory model)", options=options)
    try:
        key = _cache_key(path, options)
    except OSError as error:
        return TokensAudit("skipped", f"cannot read {path}: {first_line(error)}", str(path), options)
    if key in _CACHE:
        return _CACHE[key]
    cached = _from_disk(key, options)
    if cached is None:
        # The ranks of a torchrun job (and parallel jobs) audit the same files at once: one of them does the work
        # under the entry's lock, the others wait and read its result.
        with _entry_lock(key):
            cached = _from_disk(key, options)
            if cached is None:
                return _audit_and_keep(key, path, options)
    _CACHE[key] = cached
    return cached


@contextlib.contextmanager
def _entry_lock(key: tuple[Any, ...]) -> Iterator[None]:
    """The disk entry's file lock; none when the cache folder cannot be written (each process audits then)."""
    from vlforge.outputs import file_lock

    path = _disk_path(key)
    with contextlib.ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(file_lock(path.with_suffix(".lock")))
        except OSError as error:
            logger.debug("tokens audit not locked (%s)", error)
        yield


def _audit_and_keep(key: tuple[Any, ...], path: Path, options: TokenOptions) -> TokensAudit:
    """Audit, then keep the result in this process and on disk (not an unexpected failure: worth a retry)."""
    from vlforge.vocab.templates import TemplateError

    template_skipped = None
    try:
        try:
            report = _audit(path, options, template=True)
        except TemplateError as error:
            if not options.extra_sources:
                raise
            template_skipped = first_line(error)
            report = _audit(path, options, template=False)
    except VlforgeError as error:
        result = TokensAudit("skipped", first_line(error), str(path), options)
    except Exception as error:  # a diagnostic must not crash on an unexpected checkpoint; say what happened
        logger.debug("tokens audit of %s failed", path, exc_info=True)
        result = TokensAudit("failed", f"tokens audit failed ({type(error).__name__}: {first_line(error)})",
                             str(path), options)
    else:
        result = TokensAudit("audited", None, str(path), options, list(report.findings),
                             dict(report.rewritten.mapping), list(report.notes), template_skipped)
    _CACHE[key] = result
    if result.status != "failed":  # an unexpected error is worth retrying; an audit or a refusal is not
        _to_disk(key, result)
    return result


def clear_cache() -> None:
    """Forget cached audits, in the process and on disk (tests, or after rewriting a checkpoint in place with the
    same mtimes)."""
    import shutil

    from vlforge.outputs import cache_root

    _CACHE.clear()
    shutil.rmtree(cache_root() / "token_audits", ignore_errors=True)
