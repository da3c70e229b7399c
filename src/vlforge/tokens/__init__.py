"""Under-trained tokens: scan a vocabulary, audit template / reward-format tags, suggest alternatives, repair rows.

Example:
    >>> from vlforge.tokens import audit_template_tokens
    >>> findings = audit_template_tokens("ckpt", fmt="r1")             # doctest: +SKIP
    >>> [(f.tag, f.verdict) for f in findings if f.role == "generated"]   # doctest: +SKIP
    [('<think>', 'untrained'), ('</think>', 'untrained'), ('<answer>', 'trained'), ('</answer>', 'trained')]
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "AuditOptions": "vlforge.tokens.audit",
    "AuditReport": "vlforge.tokens.audit",
    "TokenFinding": "vlforge.tokens.audit",
    "audit_template_tokens": "vlforge.tokens.audit",
    "run_audit": "vlforge.tokens.audit",
    "ScanOptions": "vlforge.tokens.scan",
    "ScanReport": "vlforge.tokens.scan",
    "run_scan": "vlforge.tokens.scan",
    "THRESHOLDS": "vlforge.tokens.thresholds",
    "WeightStats": "vlforge.tokens.detect",
    "FixOptions": "vlforge.tokens.fix",
    "FixReport": "vlforge.tokens.fix",
    "fix_checkpoint": "vlforge.tokens.fix",
}
lazy_exports(__name__, _EXPORTS)

__all__ = [
    "THRESHOLDS",
    "AuditOptions",
    "AuditReport",
    "FixOptions",
    "FixReport",
    "ScanOptions",
    "ScanReport",
    "TokenFinding",
    "WeightStats",
    "audit_template_tokens",
    "fix_checkpoint",
    "run_audit",
    "run_scan",
]
