"""Per-sample errors and the skip ledger: every sample we cannot use is named and counted.

The ledger also counts the samples seen, so the skipped share can be held to a limit
(:func:`over_limit`, :func:`limit_error`); :class:`SkipWarnings` logs skips without a line per sample.

Example:
    >>> from vlforge.data.errors import SampleError, SkipLedger
    >>> ledger = SkipLedger(seen=4)
    >>> ledger.record(SampleError("missing_file", "a.jsonl", "line 3", "image 'x.png' not found"))
    >>> ledger.counts, ledger.share, over_limit(ledger.seen, ledger.total, 0.1, final=True)
    ({'missing_file': 1}, 0.25, True)
    >>> print(limit_error(ledger, 0.1, what="data", key="data.max_skip_fraction", report=None))
    data: 1 of 4 samples skipped (25.0%), more than data.max_skip_fraction = 0.1 allows; top reasons: \
missing_file=1; e.g. a.jsonl:line 3: missing_file: image 'x.png' not found; fix the data or raise \
data.max_skip_fraction
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import DataError

logger = logging.getLogger(__name__)

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
    """Samples seen, skipped ones counted per reason, and the first few examples (``file:line``) of each. A count is
    per read: a bad record read in two epochs counts twice (as its good neighbours count twice in ``seen``)."""

    max_examples: int = 5
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)
    seen: int = 0
    """Samples looked at, used or skipped (the denominator of the skipped share)."""

    def record(self, error: SampleError) -> None:
        self.add(error.reason, str(error))

    def add(self, reason: str, example: str) -> None:
        """Count one skipped sample of ``reason``; ``example`` names it (``FILE:line N: reason: detail``)."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.max_examples and example not in shown:  # a record read again (an epoch) is named once
            shown.append(example)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def share(self) -> float:
        """Skipped / seen (0 when nothing was seen)."""
        return self.total / self.seen if self.seen else 0.0

    def merge(self, other: SkipLedger) -> None:
        self.seen += other.seen
        for reason, n in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + n
            shown = self.examples.setdefault(reason, [])
            fresh = [example for example in other.examples.get(reason, []) if example not in shown]
            shown.extend(fresh[: max(0, self.max_examples - len(shown))])

    @classmethod
    def merged(cls, ledgers: list[SkipLedger]) -> SkipLedger:
        """One ledger summing ``ledgers`` (e.g. one per rank, in rank order)."""
        total = cls()
        for ledger in ledgers:
            total.merge(ledger)
        return total

    def top(self, n: int = 3) -> str:
        """``reason=count`` of the ``n`` most frequent reasons, e.g. ``corrupt_image=4, missing_file=1``."""
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{reason}={count}" for reason, count in ranked[:n]) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"samples_seen": self.seen, "samples_used": self.seen - self.total, "skipped_total": self.total,
                "skipped_share": round(self.share, 6), "skipped": dict(sorted(self.counts.items())),
                "examples": {k: list(v) for k, v in sorted(self.examples.items())}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SkipLedger:
        """The ledger of a :meth:`to_dict` (or ``DataStream.report()``) document."""
        return cls(counts=dict(data.get("skipped", {})),
                   examples={k: list(v) for k, v in data.get("examples", {}).items()},
                   seen=int(data.get("samples_seen", 0)))

    def state_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "examples": {k: list(v) for k, v in self.examples.items()},
                "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = dict(state["counts"])
        self.examples = {k: list(v) for k, v in state["examples"].items()}
        self.seen = int(state.get("seen", 0))  # states saved before vlforge counted seen samples have none

    def write_json(self, path: str | Path, *, writer: str | None = None, **extra: Any) -> Path:
        """Write the report atomically (fsynced temp file + rename; recorded for ``writer``) and return its path."""
        from vlforge.outputs import atomic_write_json

        return atomic_write_json(path, {**self.to_dict(), **extra}, writer=writer)


# --- the limit on the skipped share ------------------------------------------------------------------------------
MIN_SEEN = 20
"""Samples seen before the running check may stop a run (the final check always applies)."""


def over_limit(seen: int, skipped: int, limit: float, *, final: bool) -> bool:
    """True when ``skipped`` of ``seen`` samples is more than the ``limit`` share allows.

    ``final`` (the data ended or the run is done): the exact share, ``skipped / seen > limit``.
    While running: only once ``MIN_SEEN`` samples were seen and the share is clearly above the limit,
    ``skipped > limit * seen + 3 * sqrt(limit * (1 - limit) * seen)`` (three standard deviations of
    the count a ``limit`` rate gives), so a few bad samples early on do not stop a run whose share is fine.
    """
    if seen <= 0:
        return False
    if final:
        return skipped / seen > limit
    if seen < MIN_SEEN:
        return False
    return skipped > limit * seen + 3.0 * math.sqrt(limit * (1.0 - limit) * seen)


class SkipLimitError(DataError):
    """More samples were skipped than the configured share allows."""


def limit_error(ledger: SkipLedger, limit: float, *, what: str, key: str, report: str | Path | None) -> SkipLimitError:
    """The one-line error of a ledger over ``limit``: the share, the limit, the top reasons, where to look."""
    where = f"; details in {report}" if report else ""
    commonest = max(ledger.counts, key=lambda reason: ledger.counts[reason]) if ledger.counts else ""
    first = next(iter(ledger.examples.get(commonest, [])), None)
    example = f"; e.g. {first}" if first else ""
    return SkipLimitError(
        f"{what}: {ledger.total} of {ledger.seen} samples skipped ({ledger.share:.1%}), more than {key} = {limit:g} "
        f"allows; top reasons: {ledger.top()}{example}{where}; fix the data or raise {key}")


class SkipWarnings:
    """Warnings that stay few: one the first time each reason occurs (naming that sample's ``file:line``),
    then at most one running count per ``interval`` seconds, and only when the count grew.

    Feed it the ledger as it grows (:meth:`update`); it never logs per sample.
    """

    def __init__(self, what: str, *, interval: float = 60.0, log: logging.Logger | None = None) -> None:
        self.what, self.interval, self.log = what, interval, log or logger
        self.warned: set[str] = set()
        self.last_total = 0
        self.last_time = time.monotonic()

    def update(self, ledger: SkipLedger) -> None:
        for reason in sorted(ledger.counts):
            if reason not in self.warned:
                self.warned.add(reason)
                first = next(iter(ledger.examples.get(reason, [])), reason)
                self.log.warning("%s: skipping bad samples (%s), first: %s", self.what, reason, first)
                self.last_total = ledger.total
        now = time.monotonic()
        if ledger.total > self.last_total and now - self.last_time >= self.interval:
            self.log.warning("%s: %d of %d samples skipped so far (%.1f%%): %s", self.what, ledger.total,
                             ledger.seen, 100 * ledger.share, ledger.top(len(ledger.counts)))
            self.last_total, self.last_time = ledger.total, now
