"""``vlforge doctor``: the command that renders :mod:`vlforge.diagnosis` (facts, rules, measurement, fixes).

Example:
    >>> from vlforge.doctor import render
    >>> render.__name__
    'render'
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy).
_EXPORTS = {
    "render": "vlforge.doctor.render",
}
lazy_exports(__name__, _EXPORTS)

__all__ = ["render"]
