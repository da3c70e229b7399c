"""Under-trained tokens in templates and reward formats: audit them, suggest alternatives, repair rows.

Example:
    >>> from vlforge.tokens import audit_template_tokens
    >>> findings = audit_template_tokens("ckpt", fmt="r1")             # doctest: +SKIP
    >>> [(f.tag, f.verdict) for f in findings if f.role == "generated"]   # doctest: +SKIP
    [('<think>', 'untrained'), ('</think>', 'untrained'), ('<answer>', 'trained'), ('</answer>', 'trained')]
"""

from vlforge.tokens.audit import AuditOptions, AuditReport, TokenFinding, audit_template_tokens, run_audit
from vlforge.tokens.detect import THRESHOLDS, WeightStats
from vlforge.tokens.fix import FixOptions, FixReport, fix_checkpoint

__all__ = [
    "THRESHOLDS",
    "AuditOptions",
    "AuditReport",
    "FixOptions",
    "FixReport",
    "TokenFinding",
    "WeightStats",
    "audit_template_tokens",
    "fix_checkpoint",
    "run_audit",
]
