"""Metric sinks of a training run (rank 0 only): JSONL in ``output_dir``, TensorBoard, wandb, a rich progress bar.

The loop accumulates loss, label tokens and gradient norms on the device and hands them over only
every ``logging_steps`` steps, so this module is where the host waits for the device.

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
import time
from pathlib import Path
from typing import Any

from vlforge.outputs import atomic_write_text, record

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


class MetricsLogger:
    """Writes metric records to every configured sink; does nothing on ranks other than 0."""

    def __init__(self, output_dir: Path, *, main: bool, report_to: list[str], run_name: str, total_steps: int,
                 progress: bool = True, start_step: int = 0) -> None:
        self.main, self.total, self.start = main, total_steps, start_step
        self.path = output_dir / METRICS_FILE
        self.tb = self.wandb = self.bar = None
        self._task = None
        self.started = time.perf_counter()
        if not main:
            return
        output_dir.mkdir(parents=True, exist_ok=True)
        if start_step > 0 and self.path.exists():
            self._truncate_after(start_step)
        self.file = self.path.open("a", encoding="utf-8")
        record(self.path, writer="train", growing=True)
        if "tensorboard" in report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(output_dir / "tensorboard"))
            except ImportError:
                logger.warning("logging.report_to: tensorboard is not installed; skipping it")
        if "wandb" in report_to:
            try:
                import wandb

                self.wandb = wandb.init(name=run_name, dir=str(output_dir))
            except ImportError:
                logger.warning("logging.report_to: wandb is not installed; skipping it")
        if progress:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("step {task.completed}/{task.total}"), BarColumn(),
                                TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=Console(stderr=True))
            self.bar.start()
            self._task = self.bar.add_task("train", total=total_steps, completed=start_step, info="")

    def _truncate_after(self, step: int) -> None:
        """Drop records after ``step``: a killed run may have logged steps past the checkpoint resumed from."""
        lines = self.path.read_text(encoding="utf-8").splitlines()
        kept = []
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by the kill
            if int(record.get("step", 0)) <= step:
                kept.append(line)
        if len(kept) != len(lines):
            logger.info("%s: dropped %d record(s) after resumed step %d", self.path, len(lines) - len(kept), step)
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))

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
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        step = record.get("step", 0)
        scalars = {k: v for k, v in record.items() if isinstance(v, int | float) and k not in ("step", "time")}
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)
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

    def close(self) -> None:
        if not self.main:
            return
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if not self.file.closed:
            self.file.close()
