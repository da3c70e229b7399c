"""Metric sinks of a training run (rank 0 only): JSONL in ``output_dir``, TensorBoard, wandb, a rich progress bar.

The loop accumulates loss, label tokens and gradient norms on the device and hands them over only
every ``logging_steps`` steps, so this module is where the host waits for the device.

A run that starts at step S (a resume, or 0 for a fresh run) first drops what a previous run in the same
``output_dir`` logged after S from every sink: records of ``metrics.jsonl``, TensorBoard events
(``purge_step``) and wandb history (the run is rewound with ``resume_from="ID?_step=S"``), so each step
is logged once, in order.

Example:
    >>> import json, pathlib, tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> with MetricsLogger(out, main=True, report_to=[], run_name="demo", total_steps=2, progress=False) as log:
    ...     log.log({"step": 1, "loss": 2.5})
    >>> json.loads((out / "metrics.jsonl").read_text())["loss"]
    2.5
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from vlforge.config.preflight import METRICS_FILE
from vlforge.errors import ConfigError, first_line
from vlforge.outputs import atomic_write_text, record

logger = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
CLOSING_KEY = "data_report"
"""The key only the record that closes a run carries."""
WANDB_RUN_ID_FILE = "vlforge-run-id"  # under output_dir/wandb: the run a resume rewinds and continues


def _strict(value: Any) -> Any:
    """A non-finite float as the string Python and JavaScript spell it (``"NaN"``, ``"Infinity"``, ``"-Infinity"``):
    every line stays strict JSON (jq and JavaScript refuse a bare ``NaN``), and the value is kept."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    return value


class MetricsLogger:
    """Writes metric records to every configured sink; does nothing on ranks other than 0."""

    def __init__(self, output_dir: Path, *, main: bool, report_to: list[str], run_name: str, total_steps: int,
                 progress: bool = True, start_step: int = 0, carried_steps: int = 0,
                 config: dict[str, Any] | None = None) -> None:
        self.main, self.total, self.start = main, total_steps, start_step
        self.path = output_dir / METRICS_FILE
        self.tb = self.wandb = self.bar = None
        self._task = None
        self._wandb_row: int | None = None  # the step of wandb's open history row (sent on flush/next step)
        self._wandb_done = start_step  # rows up to this step are written: later records of it go to the summary
        self.started = time.perf_counter()
        if not main:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._truncate_after(start_step, carried_steps)
        self.file = self.path.open("a", encoding="utf-8")
        record(self.path, writer="train", growing=True)
        try:
            if "tensorboard" in report_to:
                self.tb = _tensorboard(output_dir / TENSORBOARD_DIR, start_step)
            if "wandb" in report_to:
                self.wandb, self._wandb_done = _wandb(output_dir / WANDB_DIR, run_name, start_step, config)
        except BaseException:
            self.close()
            raise
        if progress:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.start()
            self._task = self.bar.add_task("train", total=total_steps, completed=start_step, info="")

    def _truncate_after(self, step: int, carried: int = 0) -> None:
        """Drop records after ``step``: a killed run may have logged steps past the checkpoint resumed from
        (a fresh run, step 0, drops them all); a line cut short by the kill goes too, and so does the closing
        record of a run that stopped (this run writes its own at its end). ``carried``: the checkpoint holds its
        last ``carried`` steps for the next record, so a training record of them (a stop's) goes too."""
        text = self.path.read_text(encoding="utf-8")
        lines = text.splitlines()
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            at = int(record.get("step", 0))
            if at <= step and CLOSING_KEY not in record and not ("loss" in record and at > step - carried):
                kept.append(line)
        wanted = "".join(line + "\n" for line in kept)
        if wanted != text:  # also a last line without its newline: the next record must not join it
            logger.info("%s: dropped %d record(s) after step %d", self.path, len(lines) - len(kept), step)
            atomic_write_text(self.path, wanted)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def advance(self, step: int) -> None:
        """Move the progress bar (no device sync)."""
        if self.bar is not None:
            self.bar.update(self._task, completed=step)

    def log(self, record: dict[str, Any]) -> None:
        if not self.main:
            return
        record = {"time": round(time.time(), 3), **record}
        self.file.write(json.dumps({k: _strict(v) for k, v in record.items()}) + "\n")
        self.file.flush()
        step = record.get("step", 0)
        scalars = {k: v for k, v in record.items() if isinstance(v, int | float) and k not in ("step", "time")}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None and step > self._wandb_done:
            self.wandb.log(scalars, step=step)  # an eval record of the same step joins this row
            self._wandb_row = step
        elif self.wandb is not None:  # wandb would drop a record of a written row: the summary keeps it
            self.wandb.summary.update(scalars)
        if self.bar is not None and "loss" in record:
            info = (f"loss {record['loss']:.4f}  lr {record.get('lr', 0):.2e}  "
                    f"gnorm {record.get('grad_norm', 0):.3f}  {record.get('tokens_per_s', 0):.0f} tok/s")
            self.bar.update(self._task, completed=step, info=info)
        elif "loss" in record:
            logger.info("step %d/%d  loss %.4f  lr %.3g  grad norm %.3f  %.0f tok/s", step, self.total,
                        record["loss"], record.get("lr", 0.0), record.get("grad_norm", 0.0),
                        record.get("tokens_per_s", 0.0))
        elif "eval_loss" in record:
            logger.info("step %d/%d  eval loss %.4f", step, self.total, record["eval_loss"])

    def flush(self) -> None:
        """Hand everything logged so far to disk in every sink (the trainer calls it before a checkpoint, so a
        run killed later and resumed from that checkpoint finds each sink complete up to its step)."""
        if not self.main:
            return
        self.file.flush()
        if self.tb is not None:
            self.tb.flush()
        if self.wandb is not None and self._wandb_row is not None:
            self.wandb.log({}, step=self._wandb_row, commit=True)  # wandb holds a row until the next step
            self._wandb_done, self._wandb_row = self._wandb_row, None

    def close(self) -> None:
        if not self.main:
            return
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
        if not self.file.closed:
            self.file.close()


def _tensorboard(log_dir: Path, start_step: int) -> Any:
    """A SummaryWriter whose readers drop the events a previous run logged after ``start_step``."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        logger.warning("logging.report_to: tensorboard is not installed; skipping it")
        return None
    return SummaryWriter(log_dir=str(log_dir), purge_step=start_step + 1)


def _wandb(directory: Path, run_name: str, start_step: int, config: dict[str, Any] | None) -> tuple[Any, int]:
    """A wandb run under ``directory``, and the last step it already holds.

    A resume continues the run of this output_dir: rewound to ``start_step`` (``resume_from``, a wandb
    preview feature: the history the interrupted run logged after it is dropped). Where the rewind is
    refused, the run is continued as it is (``resume="allow"``) and the steps it already holds are not sent
    again (wandb would drop them). wandb itself reads WANDB_MODE (``offline`` writes only ``directory``),
    WANDB_PROJECT, WANDB_ENTITY. A run that cannot start is a one-line :class:`ConfigError`, before any
    step is trained.
    """
    try:
        import wandb
    except ImportError:
        logger.warning("logging.report_to: wandb is not installed; skipping it")
        return None, start_step
    id_file = directory / WANDB_RUN_ID_FILE
    previous = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else ""
    kwargs: dict[str, Any] = {"name": run_name, "dir": str(directory.parent), "config": config}
    directory.mkdir(parents=True, exist_ok=True)
    done = start_step
    if start_step > 0 and previous:
        try:
            run = wandb.init(**kwargs, resume_from=f"{previous}?_step={start_step}")
        except Exception as error:
            logger.warning("wandb: run %s cannot be rewound to step %d (%s); continuing it as it is, without the "
                           "steps it already holds", previous, start_step, first_line(error))
            run = _wandb_init(wandb, **kwargs, id=previous, resume="allow")
            done = max(start_step, int(getattr(run, "starting_step", 0) or 0) - 1)
    else:
        run = _wandb_init(wandb, **kwargs)
    atomic_write_text(id_file, run.id + "\n")
    return run, done


def _wandb_init(wandb: Any, **kwargs: Any) -> Any:
    try:
        return wandb.init(**kwargs)
    except Exception as error:
        raise ConfigError(f"logging.report_to: wandb could not start a run: {first_line(error)} (set "
                          "WANDB_MODE=offline to log only to OUTPUT_DIR/wandb, or remove wandb from "
                          "logging.report_to)") from None


