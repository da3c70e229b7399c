"""Vocabulary audits shared by the jobs: how tags encode, which embedding rows are trained, alternatives.

``vlforge tokens`` and ``vlforge doctor`` report them; train and extract audit the chat template at start-up.

Example:
    >>> from vlforge.vocab import audit_template_tokens
    >>> findings = audit_template_tokens("ckpt", fmt="r1")             # doctest: +SKIP
    >>> [(f.tag, f.verdict) for f in findings if f.role == "generated"]   # doctest: +SKIP
    [('<think>', 'untrained'), ('</think>', 'untrained'), ('<answer>', 'trained'), ('</answer>', 'trained')]
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy).
_EXPORTS = {
    "AuditOptions": "vlforge.vocab.audit",
    "AuditReport": "vlforge.vocab.audit",
    "TokenFinding": "vlforge.vocab.audit",
    "audit_template_tokens": "vlforge.vocab.audit",
    "run_audit": "vlforge.vocab.audit",
    "THRESHOLDS": "vlforge.vocab.thresholds",
    "WeightStats": "vlforge.vocab.detect",
}
lazy_exports(__name__, _EXPORTS)

__all__ = [
    "THRESHOLDS",
    "AuditOptions",
    "AuditReport",
    "TokenFinding",
    "WeightStats",
    "audit_template_tokens",
    "run_audit",
]
