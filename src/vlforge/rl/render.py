"""Tables for ``vlforge rl check`` and ``vlforge rl probe`` (stdout unless ``--json``).

Example:
    >>> from rich.console import Console
    >>> from vlforge.rl.render import print_check
    >>> print_check(report, Console())      # doctest: +SKIP
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vlforge.rl.check import CheckReport
from vlforge.rl.probe import ProbeReport
from vlforge.tables import print_table

STYLE = {"untrained": "bold red", "weak": "yellow", "trained": "green", "unknown": "dim",
         "ok": "green", "dead": "bold red", "error": "bold red", "warning": "yellow", "note": "dim"}


def _line(console: Console, text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def print_check(report: CheckReport, console: Console) -> None:
    _line(console, f"engine: {report.engine} ({report.sources.get('engine', 'flag')}); model: {report.model}; "
                   f"reward: {report.reward}")
    _line(console, f"decode: skip_special_tokens={report.skip_special_tokens} "
                   f"({report.sources.get('skip_special_tokens', 'flag')}); template: {report.template}; "
                   f"pre-fill: {report.prefill!r}")
    tags = Table(title="tags the reward needs")
    for col in ("tag", "ids", "pieces", "added", "special", "decode strips", "pre-filled", "rows"):
        tags.add_column(col)
    for t in report.tags:
        tags.add_row(escape(repr(t.tag)), str(t.ids), escape(" ".join(map(repr, t.pieces))),
                     "yes" if any(t.added) else "no", "yes" if any(t.special) else "no",
                     "yes" if t.stripped else "no", "yes" if t.prefilled else "no",
                     f"[{STYLE.get(t.verdict, '')}]{t.verdict}[/]")
    if report.tags:
        print_table(console, tags)
    for p in report.problems:
        console.print(f"[{STYLE[p.severity]}]{p.severity}[/] {escape(p.message)}", highlight=False, soft_wrap=True)
        _line(console, f"  fix: {p.fix}")
    for path, what in report.rewrites.items():
        _line(console, f"wrote {path}: {what}")
    for note in report.notes:
        _line(console, f"note: {note}")
    console.print(f"verdict: [{STYLE[report.verdict]}]{report.verdict}[/] (exit {report.exit_code})",
                  highlight=False)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def print_probe(report: ProbeReport, console: Console) -> None:
    _line(console, f"engine: {report.engine}; model: {report.model}; reward: {report.reward}")
    _line(console, f"{report.prompts} prompts x {report.samples} completions, <= {report.max_new_tokens} new tokens, "
                   f"temperature {report.temperature:g}, seed {report.seed}, skip_special_tokens="
                   f"{report.skip_special_tokens}  ({report.seconds['load']:.1f} s load, "
                   f"{report.seconds['sample_and_score']:.1f} s sample + score)")
    groups = Table(title="groups")
    for col in ("prompt", "mean", "std", "spread", "rewards"):
        groups.add_column(col)
    for g in report.groups:
        groups.add_row(str(g.prompt), _num(g.mean), _num(g.std), _num(g.spread),
                       " ".join(_num(r) for r in g.rewards))
    print_table(console, groups)
    if report.tags:
        tags = Table(title="tags in the completions")
        for col in ("tag", "ids", "as its added id", "as plain pieces", "seen by the reward"):
            tags.add_column(col)
        total = report.prompts * report.samples
        for t in report.tags:
            tags.add_row(escape(repr(t.tag)), str(t.ids), f"{t.as_ids}/{total}", f"{t.as_pieces}/{total}",
                         f"{t.seen_by_reward}/{total}")
        print_table(console, tags)
    for example in report.examples[:3]:
        _line(console, f"prompt {example.prompt}, reward {_num(example.reward)}: {example.completion!r}")
    _line(console, f"format hits: {report.format_hit_rate:.0%} ({report.format}); reward mean "
                   f"{_num(report.reward_mean)}; groups without spread: {report.zero_spread_share:.0%}; cut at the "
                   f"token limit: {report.truncated_share:.0%}")
    for note in report.notes:
        _line(console, f"note: {note}")
    console.print(f"verdict: [{STYLE[report.verdict]}]{report.verdict}[/]: {escape(report.message)} "
                  f"(exit {report.exit_code})", highlight=False, soft_wrap=True)
