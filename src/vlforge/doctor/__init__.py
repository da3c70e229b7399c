"""``vlforge doctor``: runtime facts + a table of rules + on-device measurement -> findings and fixes.

Public API: :func:`report` (diagnose, optionally a model), :func:`render` (rich tables),
:func:`guard` (load-time check for train / extract / profile), the rule table :data:`RULES`,
:class:`TokenOptions` (extra tags for the untrained-template-token audit).

Example (what-if, no GPU needed):
    >>> from vlforge.doctor import report
    >>> rep = report(assume="torch=2.9.0,device=cuda,dtype=bf16")
    >>> rep.verdict, rep.facts.display("torch"), "torch" in rep.facts.assumed
    ('warning', '2.9.0', True)
"""

from __future__ import annotations

from vlforge.doctor.facts import DoctorError, Facts, apply_assume, collect_facts, parse_assume
from vlforge.doctor.guard import UnfixableError, guard
from vlforge.doctor.model_info import ConvInfo, ModelInfo, inspect_model
from vlforge.doctor.render import render
from vlforge.doctor.report import SCHEMA_VERSION, DoctorReport, report
from vlforge.doctor.rules import RULES, Context, Finding, Measurement, Rule, evaluate, exit_code
from vlforge.doctor.tokens import TokenOptions, TokensAudit

__all__ = [
    "RULES",
    "SCHEMA_VERSION",
    "Context",
    "ConvInfo",
    "DoctorError",
    "DoctorReport",
    "Facts",
    "Finding",
    "Measurement",
    "ModelInfo",
    "Rule",
    "TokenOptions",
    "TokensAudit",
    "UnfixableError",
    "apply_assume",
    "collect_facts",
    "evaluate",
    "exit_code",
    "guard",
    "inspect_model",
    "parse_assume",
    "render",
    "report",
]
