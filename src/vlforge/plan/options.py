"""`vlforge plan` options checked before torch is imported: memory sizes, process counts.

Example:
    >>> parse_memory("80GB"), parse_memory("141 GiB") == 141 * 2**30, parse_memory("24g")
    (80000000000, True, 24000000000)
    >>> parse_memory("lots")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vlforge.errors.ConfigError: --gpu-memory 'lots': expected a size such as 80GB, 80GiB or 24G
"""

from __future__ import annotations

import re

from vlforge.errors import ConfigError

_SIZE = re.compile(r"^\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_memory(text: str, flag: str = "--gpu-memory") -> int:
    """Bytes of a size string: ``80GB`` (decimal), ``80GiB`` (binary), ``24G``; a bare number is GB."""
    match = _SIZE.match(text or "")
    if match is None:
        raise ConfigError(f"{flag} {text!r}: expected a size such as 80GB, 80GiB or 24G")
    unit = (match["unit"] or "").lower().removesuffix("b")
    value = float(match["value"])
    factor = _UNITS[unit] if match["unit"] else 10**9
    size = int(value * factor)
    if size <= 0:
        raise ConfigError(f"{flag} {text!r}: must be more than 0")
    return size


def check_layout(gpus: int, nodes: int) -> int:
    """Processes of the run (``gpus`` per node x ``nodes``)."""
    if gpus < 1:
        raise ConfigError(f"--gpus {gpus}: must be at least 1")
    if nodes < 1:
        raise ConfigError(f"--nodes {nodes}: must be at least 1")
    return gpus * nodes
