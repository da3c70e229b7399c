"""Tables that read well anywhere: every report table goes through :func:`print_table`.

Off a terminal (a pipe, a log file, a CI job, a cluster scheduler) rich squeezes tables to 80
columns and cuts cells to ``1…`` or ``model.vis…``. :func:`print_table` prints them at the width
their content needs there, so no number or module name is ever cut. In a terminal a table fits the
terminal, and a cell that does not fit folds onto more lines instead of ending in ``…``.
:func:`report_console` is the stdout console the commands print reports on. ``--json`` output never
goes through here.

Example (a 40-column log file; nothing is cut):
    >>> from io import StringIO
    >>> from rich.console import Console
    >>> from rich.table import Table
    >>> table = Table("module", "ms")
    >>> table.add_row("model.visual.blocks.0.attn.qkv", "12,345.678")
    >>> log = Console(file=StringIO(), width=40)
    >>> print_table(log, table)
    >>> "model.visual.blocks.0.attn.qkv" in log.file.getvalue(), "…" in log.file.getvalue()
    (True, False)
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.segment import Segments
from rich.table import Table

UNBOUNDED_WIDTH = 100_000
"""Width a table is measured at off a terminal (its natural width is what it prints at)."""


def fold(table: Table) -> Table:
    """Let every column wrap, folding long words, so a narrow terminal never cuts a cell to ``…``."""
    for column in table.columns:
        column.no_wrap = False
        if column.overflow in ("ellipsis", "crop"):
            column.overflow = "fold"
    return table


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` whole: wider than the console when it is not a terminal and the content needs it."""
    fold(table)
    if console.is_terminal:
        console.print(table)
        return
    width = console.measure(table, options=console.options.update_width(UNBOUNDED_WIDTH)).maximum
    if width <= console.width:
        console.print(table)
        return
    # console.print(width=...) cannot exceed the console's width: render at the table's own width and print
    # the lines uncropped.
    console.print(Segments(console.render(table, console.options.update_width(width))), crop=False)


def report_console(**kwargs: Any) -> Console:
    """The stdout Console reports print on (``kwargs`` go to ``Console``).

    Off a terminal its text lines are not hard-wrapped at 80 columns either (one report line is one
    line of the log); its tables go through :func:`print_table`.
    """
    console = Console(**kwargs)
    if not console.is_terminal and "soft_wrap" not in kwargs:
        console.soft_wrap = True
    return console


def progress_bar(label: str, total: int) -> tuple[Any, Any]:
    """A started rich progress bar on stderr (``label``, bar, done/total, time left) and its task; stop it with
    ``bar.stop()``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   console=Console(stderr=True))
    task = bar.add_task(label, total=total)
    bar.start()
    return bar, task

