"""Rich tables for the audit and fix reports (the CLI prints them on stdout unless ``--json``).

Example:
    >>> from rich.console import Console
    >>> from vlforge.tokens.render import print_audit
    >>> print_audit(report, Console())      # doctest: +SKIP
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlforge.tables import print_table
from vlforge.tokens.fix import FixReport
from vlforge.tokens.scan import ScanReport
from vlforge.vocab.audit import AuditReport, WeightsSummary

STYLE = {"untrained": "bold red", "weak": "yellow", "trained": "green", "unknown": "dim"}


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def weights_line(w: WeightsSummary) -> str:
    """One line: tensor, rows, reference set and cuts."""
    cuts = ", ".join(f"{k} >= {v:.3f}" if v is not None else f"{k}: none" for k, v in w.cuts.items())
    return (f"weights: {w.checkpoint}  {w.output_tensor} {w.dtype} rows={w.vocab_rows} tokenizer={w.tokenizer_len} "
            f"tied={w.tied} reference={w.reference_rows} structural + {w.candidate_rows} candidates "
            f"({', '.join(f'{k}={v}' for k, v in w.reference_reasons.items() if v)}) cuts: {cuts or '-'}")


def print_audit(report: AuditReport, console: Console) -> None:
    """Tags table, per-id table, suggestions, rewrites and the verdict."""
    w = report.weights
    if w is not None:
        console.print(weights_line(w), highlight=False, markup=False)
    tags = Table(title="tags", show_lines=False)
    for col in ("tag", "role", "sources", "ids", "pieces", "added", "special", "skip_special strips", "verdict"):
        tags.add_column(col)
    for f in report.findings:
        # Tags and pieces are the template's text: '[INST]' is a tag, not rich markup.
        tags.add_row(escape(repr(f.tag)), f.role, ",".join(f.sources), str(f.ids),
                     escape(" ".join(map(repr, f.pieces))),
                     "yes" if any(f.added) else "no", "yes" if any(f.special) else "no",
                     "yes" if f.stripped_by_skip_special else "no",
                     f"[{STYLE[f.verdict]}]{f.verdict}[/]")
    print_table(console, tags)
    ids = Table(title="ids (generated and prefilled tags)")
    for col in ("id", "piece", "verdict", "score", "percentile", "input norm/median", "repeat p"):
        ids.add_column(col)
    seen = set()
    for f in report.findings:
        if f.role not in ("generated", "prefilled"):
            continue
        for r in f.id_reports:
            if r.id in seen:
                continue
            seen.add(r.id)
            ids.add_row(str(r.id), escape(repr(r.piece)), f"[{STYLE[r.verdict]}]{r.verdict}[/]"
                        + (" (reference)" if r.reference else ""), _fmt(r.score),
                        _fmt(r.percentile, 1), _fmt(r.input_norm_ratio), _fmt(r.verify_prob, 4))
    if seen:
        print_table(console, ids)
    for s in report.suggestions:
        alts = "; ".join(" ".join(f"{o!r}->{n!r}" for o, n in a.mapping.items()) for a in s.alternatives)
        console.print(f"alternatives for {', '.join(map(repr, s.tags))}: {alts or 'none found'}", highlight=False,
                      markup=False)
    rw = report.rewritten
    if rw.regex is not None:
        console.print(f"rewritten reward regex: {rw.regex}  (checked: {rw.regex_checked})", highlight=False,
                      markup=False)
    if rw.format_regex is not None:
        console.print(f"rewritten format regex: {rw.format_regex}", highlight=False, markup=False)
    if rw.template is not None:
        console.print(f"rewritten chat template: {len(rw.template)} chars (checked: {rw.template_checked}); "
                      "write it with --rewrite-out FILE", highlight=False, markup=False)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    console.print(f"verdict: [{STYLE[report.verdict]}]{report.verdict}[/] (exit {report.exit_code})")


def print_fix(report: FixReport, console: Console) -> None:
    """The rows that changed."""
    table = Table(title=f"re-initialised rows -> {escape(str(report.out))}")
    for col in ("id", "token", "before", "strategy", "pieces", "tensors", "norm before -> after"):
        table.add_column(col)
    for r in report.rows:
        norms = ", ".join(f"{r.norm_before[k]:.3g}->{r.norm_after[k]:.3g}" for k in r.tensors)
        table.add_row(str(r.id), escape(repr(r.token)), r.verdict_before, r.strategy, str(r.pieces),
                      ", ".join(r.tensors), norms)
    print_table(console, table)
    if report.trainable_rows:
        console.print(f"trainable rows written to {report.trainable_rows}", highlight=False, markup=False)


SCAN_ROWS = 40  # table rows without --top


def print_scan(report: ScanReport, console: Console) -> None:
    """Counts, the reference set and the highest-scoring flagged ids."""
    console.print(weights_line(report.weights), highlight=False, markup=False)
    console.print("counts: " + ", ".join(f"{k}={v}" for k, v in report.counts.items()) + f"  ({report.seconds:.1f} s)",
                  highlight=False, markup=False)
    shown = report.flagged if report.top is not None else report.flagged[:SCAN_ROWS]
    verify = report.verified > 0
    table = Table(title=f"flagged ids ({len(shown)} of {report.flagged_total}, highest score first)")
    for col in ("id", "token", "piece", "verdict", "score", "percentile", "reference",
                *(("repeat p", "repeat verdict") if verify else ())):
        table.add_column(col)
    for r in shown:
        cells = [str(r.id), escape(repr(r.token)), escape(repr(r.piece)), f"[{STYLE[r.verdict]}]{r.verdict}[/]",
                 _fmt(r.score), _fmt(r.percentile, 1), r.reference or "-"]
        if verify:
            cells += [_fmt(r.verify_prob, 4),
                      f"[{STYLE[r.verify_verdict]}]{r.verify_verdict}[/]" if r.verify_verdict else "-"]
        table.add_row(*cells)
    print_table(console, table)
    if len(shown) < report.flagged_total:
        console.print(f"{report.flagged_total - len(shown)} more flagged ids: --top N or --json", highlight=False,
                      markup=False)
    for note in report.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
