"""The tunable shape parameters of the token verdicts, importable without torch (checked before work).

Example:
    >>> from vlforge.vocab.thresholds import check_thresholds
    >>> check_thresholds({"untrained": 0.9})
    {'untrained': 0.9}
    >>> check_thresholds({"nope": 1})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vlforge.errors.ConfigError: --threshold nope: unknown; known: min_z, gap, weak_fraction, untrained, weak
"""

from __future__ import annotations

from vlforge.errors import ConfigError

# Shape parameters of the cuts (model-independent; the scale comes from each model's own scores).
THRESHOLDS: dict[str, float] = {
    "min_z": 1.0,  # untrained cut at least bulk median + min_z x 1.4826 MAD
    "gap": 0.2,  # an empty score stretch this share of (reference - bulk median) wide is a cut
    "weak_fraction": 0.85,  # weak cut = bulk median + weak_fraction x (untrained cut - bulk median)
}
# absolute cuts on the score, overriding the derived ones (``--threshold untrained=0.9``)
CUT_KEYS = ("untrained", "weak")
THRESHOLD_KEYS = (*THRESHOLDS, *CUT_KEYS)


def check_thresholds(values: dict[str, float]) -> dict[str, float]:
    """``values`` when every key is known, else a one-line ConfigError naming the first unknown one."""
    unknown = sorted(set(values) - set(THRESHOLD_KEYS))
    if unknown:
        raise ConfigError(f"--threshold {unknown[0]}: unknown; known: {', '.join(THRESHOLD_KEYS)}")
    return values
