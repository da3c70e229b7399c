"""The console reports print on: a terminal's width in a terminal, otherwise wide enough for any table.

rich squeezes tables to 80 columns when stdout is not a terminal (a log file, a pipe, a CI job, a cluster
scheduler), cutting numbers to ``1…`` and module names to ``model.vis…``. Reports printed on
:func:`report_console` keep every cell whole there: tables are never expanded, so they take the width
their content needs.

Example:
    >>> from rich.table import Table
    >>> table = Table("component", "ms")
    >>> table.add_row("model.visual.blocks.0.attn.qkv" * 4, "12345.678")
    >>> console = report_console(force_terminal=False)
    >>> with console.capture() as captured:
    ...     console.print(table)
    >>> "…" in captured.get()
    False
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

UNBOUNDED_WIDTH = 100_000


def report_console(**kwargs: Any) -> Console:
    """A stdout Console for reports: unbounded width when not a terminal (``kwargs`` go to ``Console``)."""
    console = Console(**kwargs)
    if not console.is_terminal and "width" not in kwargs:
        console = Console(width=UNBOUNDED_WIDTH, **kwargs)
    return console
