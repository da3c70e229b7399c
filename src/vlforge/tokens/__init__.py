"""``vlforge tokens``: scan a vocabulary, audit tags, repair rows (the audits themselves: :mod:`vlforge.vocab`).

Example:
    >>> from vlforge.tokens import run_scan
    >>> run_scan.__name__
    'run_scan'
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy).
_EXPORTS = {
    "ScanOptions": "vlforge.tokens.scan",
    "ScanReport": "vlforge.tokens.scan",
    "run_scan": "vlforge.tokens.scan",
    "FixOptions": "vlforge.tokens.fix",
    "FixReport": "vlforge.tokens.fix",
    "fix_checkpoint": "vlforge.tokens.fix",
}
lazy_exports(__name__, _EXPORTS)

__all__ = ["FixOptions", "FixReport", "ScanOptions", "ScanReport", "fix_checkpoint", "run_scan"]
