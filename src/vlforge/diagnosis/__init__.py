"""Runtime diagnosis shared by the jobs: facts, a table of rules, on-device measurement, findings and fixes.

``vlforge doctor`` renders it; train, extract and profile call :func:`guard` at load time.

Example (what-if, no GPU needed):
    >>> from vlforge.diagnosis import report
    >>> rep = report(assume="torch=2.9.0,device=cuda,dtype=bf16")
    >>> rep.verdict, rep.facts.display("torch"), "torch" in rep.facts.assumed
    ('warning', '2.9.0', True)
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy).
_EXPORTS = {
    "DoctorError": "vlforge.diagnosis.facts",
    "Facts": "vlforge.diagnosis.facts",
    "apply_assume": "vlforge.diagnosis.facts",
    "collect_facts": "vlforge.diagnosis.facts",
    "parse_assume": "vlforge.diagnosis.facts",
    "UnfixableError": "vlforge.diagnosis.guard",
    "guard": "vlforge.diagnosis.guard",
    "ConvInfo": "vlforge.diagnosis.model_info",
    "ModelInfo": "vlforge.diagnosis.model_info",
    "inspect_model": "vlforge.diagnosis.model_info",
    "SCHEMA_VERSION": "vlforge.diagnosis.report",
    "DoctorReport": "vlforge.diagnosis.report",
    "report": "vlforge.diagnosis.report",
    "RULES": "vlforge.diagnosis.rules",
    "Context": "vlforge.diagnosis.rules",
    "Finding": "vlforge.diagnosis.rules",
    "Measurement": "vlforge.diagnosis.rules",
    "Rule": "vlforge.diagnosis.rules",
    "evaluate": "vlforge.diagnosis.rules",
    "exit_code": "vlforge.diagnosis.rules",
    "TokenOptions": "vlforge.diagnosis.tokens",
    "TokensAudit": "vlforge.diagnosis.tokens",
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
    "report",
]
