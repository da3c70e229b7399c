"""``vlforge tokens audit``: which tags a format needs, how they encode, and whether their rows are trained.

Example:
    >>> from vlforge.vocab import AuditOptions, run_audit
    >>> report = run_audit(AuditOptions(model="ckpt", format="r1"))     # doctest: +SKIP
    >>> report.verdict, report.exit_code                                # doctest: +SKIP
    ('untrained', 2)
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from vlforge.errors import ConfigError, ExitCode, ModelLoadError
from vlforge.strict import StrictModel
from vlforge.vocab import detect as det
from vlforge.vocab import templates as tpl
from vlforge.vocab.reference import detect_for
from vlforge.vocab.suggest import suggest
from vlforge.vocab.tokenizer import added_tokens, encode_tag, load_tokenizer
from vlforge.vocab.verify import MIN_PROB

log = logging.getLogger(__name__)

SCHEMA = "vlforge.vocab.audit/2"
Verdict = Literal["untrained", "weak", "trained", "unknown"]
EXIT_CODES = {det.UNTRAINED: ExitCode.FAILED, det.WEAK: ExitCode.WARNING, det.UNKNOWN: ExitCode.OK,
              det.TRAINED: ExitCode.OK}
MAX_VERIFY_IDS = 64


class AuditOptions(StrictModel):
    """What to audit. With no tag source given, the model's own chat template is used."""

    unknown_label: ClassVar[str] = "option"

    model: Path | None = Field(None, description="Checkpoint directory (safetensors); tokenizer too unless given.")
    tokenizer: Path | None = Field(None, description="Tokenizer directory (default: the model directory).")
    tags: list[str] = Field(default_factory=list, description="Tags the policy must generate.")
    template: Path | None = Field(None, description="Jinja chat template file to probe.")
    template_text: str | None = Field(None, description="A chat template's text to probe (instead of a file).")
    model_template: bool = Field(False, description="Probe the tokenizer's own chat template.")
    template_vars: dict[str, Any] = Field(default_factory=dict, description="Extra template variables.")
    reward_regex: str | None = Field(None, description="Reward regex whose literal tags must be generated.")
    format: str | None = Field(None, description="Built-in format name (r1).")
    reference_ids: list[int] = Field(default_factory=list, description="Extra known-unused ids.")
    thresholds: dict[str, float] = Field(default_factory=dict, description="Overrides of detect.THRESHOLDS "
                                         "and the cuts (untrained, weak).")
    verify: bool = Field(False, description="Also run the repeat-prompt forward check.")
    verify_dtype: str = Field("float32", description="dtype to load the model in for --verify.")
    chunk_rows: int = Field(8192, gt=0, description="Rows per streamed chunk.")


class IdReport(BaseModel):
    id: int
    piece: str
    added: bool
    special: bool
    verdict: Verdict
    reference: bool = False
    candidate: bool = False
    score: float | None = None
    percentile: float | None = None
    input_norm_ratio: float | None = None
    verify_prob: float | None = None


class TokenFinding(BaseModel):
    """One tag: how it encodes, where it is used and whether the policy can emit it."""

    tag: str
    role: Literal["generated", "prefilled", "prompt", "unexercised"]
    roles: list[str]
    sources: list[str]
    ids: list[int]
    pieces: list[str]
    added: list[bool]
    special: list[bool]
    stripped_by_skip_special: bool
    context_ids: list[int]
    checked_ids: list[int]
    verdict: Verdict
    id_reports: list[IdReport]

    @property
    def problem(self) -> bool:
        return self.verdict in (det.UNTRAINED, det.WEAK)


class WeightsSummary(BaseModel):
    checkpoint: str
    input_tensor: str
    output_tensor: str
    dtype: str
    tied: bool
    vocab_rows: int
    tokenizer_len: int
    reference_rows: int
    candidate_rows: int
    reference_reasons: dict[str, int]
    dropped_candidates: int
    bulk_median: float | None
    bulk_mad: float | None
    reference_median: float | None
    median_input_norm: float | None
    cuts: dict[str, float | None]  # None: no cut (the reference set does not stand apart)
    thresholds: dict[str, float]
    counts: dict[str, int]


class Alternative(BaseModel):
    name: str
    mapping: dict[str, str]
    checks: list[dict[str, Any]]


class Suggestion(BaseModel):
    family: str
    tags: list[str]
    alternatives: list[Alternative]


class Rewritten(BaseModel):
    mapping: dict[str, str] = Field(default_factory=dict)
    template: str | None = None
    template_checked: bool | None = None
    regex: str | None = None
    regex_checked: bool | None = None
    format_sample: str | None = None
    format_regex: str | None = None


class AuditReport(BaseModel):
    schema_version: str = SCHEMA
    model: str | None
    tokenizer: str
    tokenizer_len: int
    weights: WeightsSummary | None
    findings: list[TokenFinding]
    suggestions: list[Suggestion]
    rewritten: Rewritten
    verify_min_prob: float = MIN_PROB
    verdict: Verdict
    exit_code: int
    notes: list[str] = Field(default_factory=list)


def weights_summary(model: Path, emb, stats: det.WeightStats) -> WeightsSummary:
    """The weights part of a report (shared by ``tokens audit`` and ``tokens scan``)."""
    counts = {v: stats.verdicts[: stats.tokenizer_len].count(v) for v in det.VERDICT_ORDER}
    return WeightsSummary(
        checkpoint=str(model), input_tensor=emb.input.name, output_tensor=emb.output.name,
        dtype=emb.output.dtype, tied=emb.tied, vocab_rows=emb.vocab_rows, tokenizer_len=stats.tokenizer_len,
        reference_rows=int(stats.reference.sum()), candidate_rows=int(stats.candidates.sum()),
        reference_reasons=stats.reference_reasons, dropped_candidates=len(stats.dropped_candidates),
        bulk_median=stats.bulk_median, bulk_mad=stats.bulk_mad, reference_median=stats.reference_median,
        median_input_norm=stats.median_input_norm,
        cuts={k: (v if math.isfinite(v) else None) for k, v in stats.cuts.items()}, thresholds=stats.thresholds, counts=counts,
    )


def _has_weights(path: Path) -> bool:
    if not path.is_dir():
        raise ModelLoadError(f"{path}: not a checkpoint directory")
    return any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file()


def _collect(tok, opts: AuditOptions, added: list[str]) -> tuple[dict[str, tpl.TagUse], str | None]:
    uses: dict[str, tpl.TagUse] = {}
    template_text: str | None = None
    for tag in opts.tags:
        if not tag:
            raise ConfigError("--tags: empty tag")
        uses.setdefault(tag, tpl.TagUse(tag)).add("generated", "tags")
    if opts.format:
        fmt = tpl.get_format(opts.format)
        spans = tpl.find_tags(fmt.sample, added)
        ids = tpl.context_ids(tok, fmt.sample, spans)
        for _s, _e, tag in spans:
            uses.setdefault(tag, tpl.TagUse(tag)).add("generated", f"format:{fmt.name}", ids[tag])
    if opts.reward_regex is not None:
        for tag in tpl.regex_tags(opts.reward_regex, added):
            uses.setdefault(tag, tpl.TagUse(tag)).add("generated", "regex")
    want_template = opts.template is not None or opts.template_text is not None or opts.model_template
    if want_template:
        if opts.template_text is not None:
            template_text = opts.template_text
        elif opts.template is not None:
            if not opts.template.is_file():
                raise ConfigError(f"--template {opts.template}: no such file")
            template_text = opts.template.read_text()
        else:
            template_text = tok.chat_template if isinstance(tok.chat_template, str) else None
        found, _probe = tpl.template_tags(tok, template_text, opts.template_vars, "template", added)
        for tag, use in found.items():
            into = uses.setdefault(tag, tpl.TagUse(tag))
            for role in use.roles:
                into.add(role, "template", use.context_ids)
    return uses, template_text


def _worst(verdicts: list[str]) -> str:
    return max(verdicts, key=det.VERDICT_ORDER.__getitem__) if verdicts else det.UNKNOWN


def _effective(report: IdReport) -> str:
    """Weights verdict, adjusted by --verify: emitting untrained -> weak; emitting weak -> trained;
    trained not emitting -> weak."""
    if report.verify_prob is None:
        return report.verdict
    if report.verdict == det.UNTRAINED and report.verify_prob >= MIN_PROB:
        return det.WEAK
    if report.verdict == det.WEAK and report.verify_prob >= MIN_PROB:
        return det.TRAINED
    if report.verdict == det.TRAINED and report.verify_prob < MIN_PROB:
        return det.WEAK
    return report.verdict


def run_audit(opts: AuditOptions, *, tok: Any = None) -> AuditReport:
    """Run the tokenizer audit, the weights audit (when weights exist), suggestions and rewrites (``tok``: the
    tokenizer of ``opts.tokenizer or opts.model`` when the caller has already read it)."""
    if opts.model is None and opts.tokenizer is None:
        raise ConfigError("give --model (a checkpoint directory) or --tokenizer")
    if not (opts.tags or opts.template or opts.template_text is not None or opts.model_template
            or opts.reward_regex is not None or opts.format):
        opts = opts.model_copy(update={"model_template": True})
    tok_path = opts.tokenizer or opts.model
    tok = tok if tok is not None else load_tokenizer(tok_path)
    added_map = added_tokens(tok)
    added = [content for content, _special in added_map.values()]
    uses, template_text = _collect(tok, opts, added)
    notes: list[str] = []

    stats = weights = None
    if opts.model is not None and _has_weights(opts.model):
        from vlforge.vocab.weights import open_embeddings

        emb = open_embeddings(opts.model)
        if len(tok) > emb.vocab_rows:
            notes.append(f"tokenizer has {len(tok)} entries but the model only {emb.vocab_rows} rows")
        own = tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else ""
        stats = detect_for(tok, emb, user_reference_ids=opts.reference_ids, thresholds=opts.thresholds,
                           chunk_rows=opts.chunk_rows, template=own + (template_text or ""))
        weights = weights_summary(opts.model, emb, stats)
        if stats.score is None:
            notes.append("no reference set (no known-unused rows): verdicts are 'unknown'; "
                         "pass --reference-ids or use --verify")
        elif not math.isfinite(stats.cuts["untrained"]):
            notes.append("the reference rows do not stand apart from the other rows: no id is flagged by its "
                         "score; use --verify")
    elif opts.model is not None:
        raise ModelLoadError(f"{opts.model}: no *.safetensors weights (for a tokenizer-only audit pass "
                             "--tokenizer DIR without --model)")
    else:
        notes.append("no --model: tokenizer audit only (verdicts 'unknown')")
    verdicts = stats.verdicts if stats is not None else []

    def id_report(i: int) -> IdReport:
        info = added_map.get(i)
        piece = str(tok.convert_ids_to_tokens([i])[0])
        if stats is None:
            return IdReport(id=i, piece=piece, added=info is not None, special=bool(info and info[1]),
                            verdict=det.UNKNOWN)
        if i >= stats.vocab_rows:
            return IdReport(id=i, piece=piece, added=info is not None, special=bool(info and info[1]),
                            verdict=det.UNTRAINED)
        row = stats.row(i)
        row.pop("id")
        return IdReport(id=i, piece=piece, added=info is not None, special=bool(info and info[1]), **row)

    findings: list[TokenFinding] = []
    for tag, use in uses.items():
        enc = encode_tag(tok, tag)
        checked = list(enc.ids) + [i for i in use.context_ids if i not in enc.ids]
        reports = [id_report(i) for i in checked]
        findings.append(TokenFinding(
            tag=tag, role=use.role, roles=use.roles, sources=use.sources, ids=enc.ids, pieces=enc.pieces,
            added=enc.added, special=enc.special, stripped_by_skip_special=enc.stripped_by_skip_special,
            context_ids=use.context_ids, checked_ids=checked, verdict=_worst([r.verdict for r in reports]),
            id_reports=reports,
        ))

    if opts.verify:
        if opts.model is None or stats is None:
            raise ConfigError("--verify needs --model with safetensors weights")
        from vlforge.vocab.verify import repeat_probabilities

        want = sorted({r.id for f in findings if f.role in ("generated", "prefilled") for r in f.id_reports})
        if len(want) > MAX_VERIFY_IDS:
            notes.append(f"--verify checked the first {MAX_VERIFY_IDS} of {len(want)} ids")
            want = want[:MAX_VERIFY_IDS]
        probs = repeat_probabilities(opts.model, want, dtype=opts.verify_dtype)
        for f in findings:
            for r in f.id_reports:
                r.verify_prob = probs.get(r.id)
            f.verdict = _worst([_effective(r) for r in f.id_reports])

    suggestions: list[Suggestion] = []
    rewritten = Rewritten()
    problems = [f.tag for f in findings if f.problem and f.role in ("generated", "prefilled")]
    if problems and stats is not None:
        raw = suggest(tok, problems, [f.tag for f in findings], verdicts)
        suggestions = [Suggestion(family=s["family"], tags=s["tags"],
                                  alternatives=[Alternative(**a) for a in s["alternatives"]]) for s in raw]
        for s in suggestions:
            if s.alternatives:
                rewritten.mapping.update(s.alternatives[0].mapping)
            else:
                notes.append(f"no checked alternative for {', '.join(s.tags)}")
        _rewrite(tok, opts, template_text, rewritten, added)
    elif problems:
        notes.append("alternatives are only suggested with weights (they must be checked, not guessed)")

    generated = [f.verdict for f in findings if f.role == "generated"]
    verdict = _worst(generated) if generated else det.UNKNOWN
    exit_code = max((EXIT_CODES[v] for v in generated), default=ExitCode.OK)
    return AuditReport(
        model=str(opts.model) if opts.model else None, tokenizer=str(tok_path), tokenizer_len=len(tok),
        weights=weights, findings=findings, suggestions=suggestions, rewritten=rewritten, verdict=verdict,
        exit_code=exit_code, notes=notes,
    )


def _rewrite(tok, opts: AuditOptions, template_text: str | None, out: Rewritten, added: list[str]) -> None:
    """Rewritten template / regex / format with the first checked alternative of each family."""
    mapping = out.mapping
    if not mapping:
        return
    if template_text is not None:
        out.template = tpl.rewrite(template_text, mapping)
        try:
            probe = tpl.probe_template(tok, out.template, opts.template_vars)
            old_generated = {t for _s, _e, t in tpl.find_tags(
                tpl.probe_template(tok, template_text, opts.template_vars).generated, added)}
            out.template_checked = all(mapping[t] in probe.generated for t in old_generated if t in mapping)
        except tpl.TemplateError as error:
            log.warning("rewritten template does not render: %s", error)
            out.template_checked = False
    if opts.format:
        fmt = tpl.get_format(opts.format)
        out.format_sample = tpl.rewrite(fmt.sample, mapping)
        out.format_regex = tpl.rewrite(fmt.regex, mapping)
    if opts.reward_regex is not None:
        out.regex = tpl.rewrite(opts.reward_regex, mapping)
        try:
            compiled = re.compile(out.regex, re.DOTALL)
            wanted = [mapping[t] for t in tpl.regex_tags(opts.reward_regex, added) if t in mapping]
            ok = all(t in tpl.regex_tags(out.regex, added) for t in wanted)
            if opts.format and out.format_sample is not None and re.search(
                    opts.reward_regex, tpl.get_format(opts.format).sample, re.DOTALL):
                ok = ok and compiled.search(out.format_sample) is not None
            out.regex_checked = ok
        except re.error:
            out.regex_checked = False


def audit_template_tokens(model_dir: str | Path, *, template: str | Path | None = None,
                          tags: list[str] | None = None, reward_regex: str | None = None,
                          fmt: str | None = None, template_vars: dict[str, Any] | None = None) -> list[TokenFinding]:
    """Findings for the tags of a model's chat template (or the given sources); for ``vlforge doctor``.

    Example:
        >>> from vlforge.vocab import audit_template_tokens
        >>> [f.tag for f in audit_template_tokens("ckpt") if f.role == "generated" and f.problem]  # doctest: +SKIP
        ['<think>', '</think>']
    """
    opts = AuditOptions(model=Path(model_dir), template=Path(template) if template else None,
                        tags=tags or [], reward_regex=reward_regex, format=fmt,
                        template_vars=template_vars or {})
    return run_audit(opts).findings
