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

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "DoctorError": "vlforge.doctor.facts",
    "Facts": "vlforge.doctor.facts",
    "apply_assume": "vlforge.doctor.facts",
    "collect_facts": "vlforge.doctor.facts",
    "parse_assume": "vlforge.doctor.facts",
    "UnfixableError": "vlforge.doctor.guard",
    "guard": "vlforge.doctor.guard",
    "ConvInfo": "vlforge.doctor.model_info",
    "ModelInfo": "vlforge.doctor.model_info",
    "inspect_model": "vlforge.doctor.model_info",
    "render": "vlforge.doctor.render",
    "SCHEMA_VERSION": "vlforge.doctor.report",
    "DoctorReport": "vlforge.doctor.report",
    "report": "vlforge.doctor.report",
    "RULES": "vlforge.doctor.rules",
    "Context": "vlforge.doctor.rules",
    "Finding": "vlforge.doctor.rules",
    "Measurement": "vlforge.doctor.rules",
    "Rule": "vlforge.doctor.rules",
    "evaluate": "vlforge.doctor.rules",
    "exit_code": "vlforge.doctor.rules",
    "TokenOptions": "vlforge.doctor.tokens",
    "TokensAudit": "vlforge.doctor.tokens",
}
lazy_exports(__name__, _EXPORTS)

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
