"""The ``vlforge`` command line: a table of commands, each one job whose options model declares its flags.

Every command follows one convention (:mod:`vlforge.command`): options from the flags -> checks before work
(before torch loads) -> run -> report (tables, or with ``--json`` only JSON on stdout) -> exit code
(:class:`vlforge.errors.ExitCode`: 0 ok, 1 warnings, 2 bad input, 3 a failing verdict; every ``--help`` says
so). User errors print one line on stderr. ``python -m vlforge.train`` and ``python -m vlforge.extract`` (the
torchrun entry points) run these same commands.

A command is a line of :data:`COMMANDS`: its one-line summary and the :class:`~vlforge.command.Cli` object of
its job module (``module:NAME``). The flags are built from that object's options model (:mod:`vlforge.flags`)
when the command is asked for, so a command imports its own module only, and ``vlforge --help`` none of them.

Example (CPU, seconds):
    vlforge tiny qwen3_vl /tmp/tiny-qwen3-vl --seed 0
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from vlforge.about import version_line
from vlforge.collector import freeze_at_exit
from vlforge.command import execute
from vlforge.errors import EXIT_CODES_HELP, Interrupted, Terminated, VlforgeError
from vlforge.flags import Flag, build, parameters
from vlforge.strict import StrictModel
from vlforge.tables import report_console
from vlforge.terminate import TerminateSignal, sigterm_raises
from vlforge.versions import check_startup


@dataclass(frozen=True)
class Entry:
    """A command: what ``vlforge --help`` lists, and where its :class:`~vlforge.command.Cli` lives."""

    summary: str
    target: str
    """``module:NAME`` of the job's ``Cli``."""


@dataclass(frozen=True)
class Group:
    """A group of commands (``vlforge tokens ...``)."""

    summary: str
    commands: dict[str, Entry] = field(default_factory=dict)


COMMANDS: dict[str, Entry | Group] = {
    "tiny": Entry("Write a small random-initialised, loadable Hugging Face checkpoint of FAMILY into OUT_DIR.",
                  "vlforge.models.tiny:CLI"),
    "demo": Entry("Tiny Qwen3-VL through doctor, patch, profile, verify, speed, train and extract, measured here.",
                  "vlforge.demo:CLI"),
    "version": Entry("vlforge, torch, transformers and Python versions (the line `vlforge --version` prints).",
                     "vlforge.about:CLI"),
    "profile": Entry("Time every component of a VLM through forward hooks: share, FLOPs, anomalies, stock vs patched.",
                     "vlforge.profile.command:CLI"),
    "verify": Entry("Prove the patched model computes the same outputs as the stock one; exit 3 naming any failed "
                    "check.", "vlforge.verify.command:CLI"),
    "validate": Entry("Check a training config: print it resolved (exit 0) or one line per problem (exit 2).",
                      "vlforge.config.validate:CLI"),
    "train": Entry("Train in this process (for several: torchrun ... -m vlforge.train CONFIG); export to "
                   "OUTPUT_DIR/final.", "vlforge.train.command:CLI"),
    "plan": Entry("Estimate peak memory per rank of a training config (meta device, no weights) and what makes it "
                  "fit; exit 1 when it does not fit.", "vlforge.plan.command:CLI"),
    "init": Entry("Write a commented starter training config for a model and a dataset, sized by the memory plan to "
                  "fit the stated GPUs; exit 1 when nothing fits.", "vlforge.plan.init_command:CLI"),
    "export": Entry("Write a training checkpoint as a Hugging Face directory (safetensors + config + processor "
                    "files).", "vlforge.train.export:CLI"),
    "doctor": Entry("Diagnose this machine (and a model): facts, rules, measurement, fixes. Exit 0 ok, 1 warnings, "
                    "3 errors.", "vlforge.doctor.command:CLI"),
    "tokens": Group("Under-trained tokens: scan a vocabulary, audit template / reward-format tags, repair.", {
        "audit": Entry("Audit tags: encoding, generated vs prefilled, weights verdicts. Exit 3 untrained, 1 weak, "
                       "0 fine (2: bad input).", "vlforge.tokens.command:AUDIT_CLI"),
        "scan": Entry("Score every vocabulary id: untrained / weak / trained from the weights alone. Exit 0 "
                      "(2: bad input).", "vlforge.tokens.command:SCAN_CLI"),
        "fix": Entry("Write a copy of the checkpoint whose flagged embedding rows are re-initialised.",
                     "vlforge.tokens.command:FIX_CLI"),
    }),
    "rl": Group("Zero-RL pre-flight: will a GRPO run learn its reward's format (verl, EasyR1, TRL, OpenRLHF files)?", {
        "check": Entry("From the files: tags the reward needs, their rows, the engine's decode, the template's pre-fill; "
                       "fixes. Exit 3 cannot learn, 1 weak.", "vlforge.rl.command:CHECK_CLI"),
        "probe": Entry("Sample K completions for N prompts, score them with the run's reward: spread per group. Exit 3 "
                       "when no group has any.", "vlforge.rl.command:PROBE_CLI"),
    }),
    "extract": Entry("Extract features into a sharded, resumable cache (works under torchrun; see docs/extract.md).",
                     "vlforge.extract.command:CLI"),
}
"""Every command, in the order ``vlforge --help`` lists them."""

console = Console(stderr=True)


def _setup_logging(verbose: bool) -> None:
    """Rich log lines in a terminal; plain, unwrapped ``LEVEL message`` lines in a log file or pipe. Under
    torchrun (``WORLD_SIZE`` > 1) each line names its rank and the other ranks than 0 log warnings only."""
    root = logging.getLogger("vlforge")
    if any(getattr(h, "_vlforge_cli", False) for h in root.handlers):
        return
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    prefix = f"[rank {rank}] " if world > 1 else ""
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter(prefix + "%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(prefix + "%(levelname)-7s %(message)s"))
    handler._vlforge_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    level = logging.DEBUG if verbose else logging.INFO
    root.setLevel(level if rank == 0 else max(level, logging.WARNING))


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _hide_bool_metavars(command: Any) -> Any:
    """Flags show no value type in ``--help`` (typer renders ``--verbose <bool>`` otherwise) and every help ends
    with the exit codes (:class:`vlforge.errors.ExitCode`). Only this command object changes."""
    def flagless(get_help_option):  # --help itself is made per context, when help is asked for
        def get(ctx):
            option = get_help_option(ctx)
            if option is not None:
                option.metavar = ""
            return option

        return get

    command.epilog = EXIT_CODES_HELP
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    command.get_help_option = flagless(command.get_help_option)
    return command


def build_command(name: str, entry: Entry) -> Any:
    """The click command of ``entry``: its parameters from the options model, its body the job's convention."""
    from vlforge.flags import json_parameter

    spec = _load(entry.target)
    params = parameters(spec.flags) + ([json_parameter()] if spec.json else [])

    def command(**values: Any) -> None:
        as_json = bool(values.pop("as_json", False))
        options = build(spec.flags, values)
        job_options = spec.to_options(options, as_json) if spec.to_options else options
        raise typer.Exit(execute(spec.job, job_options, as_json=as_json, console=report_console()))

    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = entry.summary
    single = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    single.command(name)(command)
    return _hide_bool_metavars(typer.main.get_command(single))


class LazyGroup(typer.core.TyperGroup):
    """A group whose commands are built from :data:`COMMANDS` when asked for: running one imports its module only;
    listing them (``--help``) imports none."""

    entries: dict[str, Entry | Group] = COMMANDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.entries)

    def get_command(self, ctx: Any, name: str) -> Any:
        entry = self.entries.get(name)
        if entry is None:
            return None
        if self._listing:  # the summary is all a listing shows
            return typer.core.TyperCommand(name, help=entry.summary)
        if isinstance(entry, Group):
            group = type("TokensGroup", (LazyGroup,), {"entries": entry.commands})(
                name=name, help=entry.summary, no_args_is_help=True)
            return _hide_bool_metavars(group)
        return build_command(name, entry)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="vlforge",
    cls=LazyGroup,
    help="Fast and correct Qwen-VL-family vision-language models: patch, diagnose, profile, verify, train.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class RootFlags(StrictModel):
    """The flags before the command: ``vlforge [--verbose | --quiet] COMMAND`` or ``vlforge --version``."""

    verbose: Annotated[bool, Flag("--verbose", "-v")] = False
    """Debug logging."""
    quiet: Annotated[bool, Flag("--quiet", "-q")] = False
    """Warnings and errors only."""
    version: bool = False
    """Print the versions of vlforge, torch, transformers and Python on one line and exit."""


def _main(ctx: typer.Context, **values: Any) -> None:
    flags = build(RootFlags, values)
    if flags.version:
        typer.echo(version_line())
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    _setup_logging(flags.verbose)
    # Hugging Face's own progress bars ("Loading weights") would interleave with vlforge's log lines;
    # vlforge logs what it loads instead. HF_HUB_DISABLE_PROGRESS_BARS=0 brings them back.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if flags.quiet:
        logging.getLogger("vlforge").setLevel(logging.WARNING)


_main.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
     *parameters(RootFlags)])
app.callback(invoke_without_command=True)(_main)


def _command() -> typer.core.TyperGroup:
    """``app`` as a click group (its commands built when asked for)."""
    return _hide_bool_metavars(typer.main.get_command(app))  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``argv``: the arguments after ``vlforge``, default ``sys.argv``): user errors
    become one line on stderr per problem and their exit code (2). An older torch or transformers than vlforge
    supports (:mod:`vlforge.versions`) is such an error, for every command and for ``python -m vlforge.train``.

    The message is printed literally (escaped), so text such as ``pip install 'vlforge[plot]'`` is never
    read as rich markup.
    """
    freeze_at_exit()  # the interpreter's shutdown then skips walking the heap (~1.3 s with torch imported)
    try:
        with sigterm_raises():
            check_startup()  # an older torch or transformers than supported: one line, before any of it is imported
            _command()(args=argv, prog_name="vlforge")
    except (VlforgeError, KeyboardInterrupt, TerminateSignal) as caught:  # outside a command: as in one
        error = caught if isinstance(caught, VlforgeError) else \
            Interrupted() if isinstance(caught, KeyboardInterrupt) else Terminated()
        for line in str(error).splitlines() or [""]:
            console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
