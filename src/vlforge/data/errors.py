"""Per-sample errors and the skip ledger: every sample we cannot use is named and counted.

Example:
    >>> from vlforge.data.errors import SampleError, SkipLedger
    >>> ledger = SkipLedger()
    >>> ledger.record(SampleError("missing_file", "a.jsonl", "line 3", "image 'x.png' not found"))
    >>> ledger.counts
    {'missing_file': 1}
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import DataError

#: Every reason a sample can be rejected for; reports list counts per reason.
REASONS = (
    "missing_file",  # a media file that does not exist
    "corrupt_image",  # Pillow cannot decode the image
    "corrupt_video",  # PyAV cannot decode the video (or it has no frames)
    "malformed_json",  # a JSONL line / JSON document that does not parse
    "schema",  # a record that is not in the chat "messages" format
    "placeholder_mismatch",  # <image>/<video> placeholders in text do not match the media items
    "path_escape",  # a relative media path that leaves data_folder
    "remote_url",  # http(s) media (no network is assumed)
    "overlong",  # longer than packing_length / max_length (filter_overlong)
    "no_labels",  # no assistant token to learn from
)


class SampleError(DataError):
    """One sample that cannot be used; the message names the source file and line/row.

    ``reason`` is one of :data:`REASONS`; ``source`` the dataset file; ``location`` e.g. ``"line 12"``.
    """

    def __init__(self, reason: str, source: str, location: str, detail: str) -> None:
        assert reason in REASONS, reason
        self.reason, self.source, self.location, self.detail = reason, source, location, detail
        super().__init__(f"{source}:{location}: {reason}: {detail}")


@dataclass
class SkipLedger:
    """Counts skipped samples per reason and keeps the first few examples of each."""

    max_examples: int = 5
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def record(self, error: SampleError) -> None:
        self.counts[error.reason] = self.counts.get(error.reason, 0) + 1
        shown = self.examples.setdefault(error.reason, [])
        if len(shown) < self.max_examples:
            shown.append(str(error))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def merge(self, other: SkipLedger) -> None:
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
            shown = self.examples.setdefault(reason, [])
            shown.extend(other.examples.get(reason, [])[: max(0, self.max_examples - len(shown))])

    def to_dict(self) -> dict[str, Any]:
        return {"skipped_total": self.total, "skipped": dict(sorted(self.counts.items())),
                "examples": {k: list(v) for k, v in sorted(self.examples.items())}}

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "examples": {k: list(v) for k, v in self.examples.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = dict(state["counts"])
        self.examples = {k: list(v) for k, v in state["examples"].items()}

    def write_json(self, path: str | Path, **extra: Any) -> Path:
        """Write the report atomically (temp file + rename) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {**self.to_dict(), **extra}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
        return path
