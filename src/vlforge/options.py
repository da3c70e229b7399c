"""Turning command-line values into typed options: comma lists (pydantic errors as one line: ``vlforge.strict``).

Example:
    >>> from vlforge.options import parse_list
    >>> parse_list("1,4,8", cast=int, flag="--batch-sizes")
    [1, 4, 8]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vlforge.errors import VlforgeError


def parse_list(text: str | Sequence[str] | None, *, cast: Any = str, flag: str = "") -> list[Any]:
    """``"1,4,8"`` -> ``[1, 4, 8]``; one clear error naming the flag for a bad item."""
    if text is None:
        return []
    items = text.split(",") if isinstance(text, str) else [p for t in text for p in str(t).split(",")]
    out = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            out.append(cast(item))
        except ValueError as error:
            raise VlforgeError(f"{flag} {text!r}: {item!r} is not a valid {cast.__name__}") from error
    return out
