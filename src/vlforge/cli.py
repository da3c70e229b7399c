"""The ``vlforge`` command line: thin typer commands, each calling one job module.

Run ``vlforge --help`` for the list; every reporting command takes ``--json`` (machine-readable on
stdout, nothing else there) and exits non-zero when its verdict is a failure. User errors print one
line on stderr and exit 2.

Example (CPU, seconds):
    vlforge tiny qwen3_vl /tmp/tiny-qwen3-vl --seed 0
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.logging import RichHandler

from vlforge.errors import VlforgeError

app = typer.Typer(
    name="vlforge",
    help="Fast and correct Qwen-VL-family vision-language models: patch, diagnose, profile, verify, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)


def _setup_logging(verbose: bool) -> None:
    root = logging.getLogger("vlforge")
    if any(isinstance(h, RichHandler) for h in root.handlers):
        return
    handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")] = False,
) -> None:
    _setup_logging(verbose)
    if quiet:
        logging.getLogger("vlforge").setLevel(logging.WARNING)


@app.command()
def tiny(
    family: Annotated[str, typer.Argument(help="Model family, e.g. qwen3_vl (see `vlforge tiny --list`).")] = "",
    out_dir: Annotated[Path | None, typer.Argument(help="Directory to write the checkpoint into.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    list_families: Annotated[bool, typer.Option("--list", help="List the families and exit.")] = False,
) -> None:
    """Write a small random-initialised, loadable Hugging Face checkpoint of FAMILY into OUT_DIR."""
    from vlforge.models import tiny as tiny_models

    if list_families:
        for name in tiny_models.families():
            typer.echo(name)
        return
    if not family or out_dir is None:
        raise VlforgeError("usage: vlforge tiny FAMILY OUT_DIR [--seed N] (families: "
                           + ", ".join(tiny_models.families()) + ")")
    path = tiny_models.write_tiny(family, out_dir, seed=seed)
    typer.echo(str(path))


@app.command()
def demo(
    seconds: Annotated[float, typer.Option(help="Time budget for the speed measurement.")] = 20.0,
) -> None:
    """Build a tiny Qwen3-VL, patch it and show the report, the equivalence and the speed ratio here."""
    from vlforge import demo as demo_job

    demo_job.run(console=Console(), seconds=seconds)


# --- further commands register below (doctor, tokens, profile, verify, validate, train, export, extract) ---


def main() -> None:
    """Console-script entry point: user errors become one line on stderr and a non-zero exit."""
    try:
        app()
    except VlforgeError as error:
        console.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
