"""Metric sinks through a kill and a resume: metrics.jsonl, TensorBoard and wandb (offline) each hold every
logged step once, in order, with the values of metrics.jsonl.

The end-to-end runs are real ``vlforge train`` processes (tiny Qwen3-VL) killed with SIGKILL (whole process
group, wandb's service included) right after they logged a step past their last checkpoint, then resumed
with ``checkpointing.resume: auto``. TensorBoard files are read back with tensorboard's own
``EventAccumulator`` / ``EventFileLoader``, wandb's offline run directories with wandb's own reader
(``wandb leet inspect --json``). wandb never goes online here: WANDB_MODE=offline, its config and cache
directories under tmp_path. wandb's service writes its run file every 15 s by default and dies with the
killed run, so the test shortens that interval (WANDB__TRANSACTION_LOG_FLUSH_INTERVAL, as docs/train.md
suggests for runs that may be killed); what it checks is vlforge's part: the rows up to the checkpoint
are handed over before the checkpoint exists, and the resumed run rewinds to it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from trainkit import REPO, tiny_config, train_env, write_config

from vlforge.train.metrics import METRICS_FILE, TENSORBOARD_DIR, WANDB_DIR, WANDB_RUN_ID_FILE, MetricsLogger

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
HAS_WANDB = importlib.util.find_spec("wandb") is not None
NEEDS_TENSORBOARD = pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed: "
                                       "pip install -c constraints.txt -e '.[tensorboard]' (part of .[dev])")
NEEDS_WANDB = pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed: "
                                 "pip install -c constraints.txt -e '.[wandb]' (part of .[dev])")


def _records(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a metrics.jsonl (a line a kill cut short is left out)."""
    records = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _train_losses(records: list[dict[str, Any]]) -> dict[int, float]:
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == sorted(set(steps)), f"train steps repeated or out of order: {steps}"
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def _wandb_env(home: Path) -> dict[str, str]:
    (home / "tmp").mkdir(parents=True, exist_ok=True)  # wandb's temporary folders stay under tmp_path too
    env = train_env()
    env.pop("WANDB_API_KEY", None)
    # an in-process wandb test of this session exports WANDB_SERVICE: a child attached to that service would
    # find the killed run's stream still open there ("run ID ... is in use"); each run starts its own
    env.pop("WANDB_SERVICE", None)
    env.update(WANDB_MODE="offline", WANDB_ERROR_REPORTING="false", WANDB_SILENT="true",
               WANDB_CONFIG_DIR=str(home / "config"), WANDB_CACHE_DIR=str(home / "cache"),
               WANDB_DATA_DIR=str(home / "data"), HOME=str(home), TMPDIR=str(home / "tmp"),
               WANDB__TRANSACTION_LOG_FLUSH_INTERVAL="0.1")
    return env


def _train(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "vlforge.cli", "train", "--json", "--no-token-audit", str(config)]
    with log.open("ab") as stderr:
        return subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr,
                                start_new_session=True)


def _checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*"))


@dataclass(frozen=True)
class Case:
    logging_steps: int
    save_steps: int
    max_steps: int
    kill_after: int  # SIGKILL once a train record of this step is in metrics.jsonl (past a checkpoint)

    @property
    def expected_steps(self) -> list[int]:
        return sorted({*range(self.logging_steps, self.max_steps + 1, self.logging_steps), self.max_steps})


@dataclass
class Resumed:
    case: Case
    out: Path
    killed: list[dict[str, Any]]  # metrics.jsonl as the killed run left it
    checkpoint: int  # the step the second run resumed from
    final: list[dict[str, Any]]
    summary: dict[str, Any]  # `vlforge train --json` of the resumed run


CASES = {"every-step": Case(logging_steps=1, save_steps=2, max_steps=4, kill_after=3),
         "logging_steps-2": Case(logging_steps=2, save_steps=3, max_steps=6, kill_after=4)}


@pytest.fixture(scope="module", params=sorted(CASES))
def resumed(request, tmp_path_factory, tiny_checkpoint) -> Resumed:
    """A run with both sinks killed after logging a step past its checkpoint, then resumed to the end."""
    case = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    out = root / "out"
    cfg = tiny_config(out, tiny_checkpoint("qwen3_vl"), training={"max_steps": case.max_steps},
                      logging={"logging_steps": case.logging_steps, "report_to": ["tensorboard", "wandb"]},
                      checkpointing={"save_steps": case.save_steps, "resume": "auto"})
    config, env, log = write_config(root / "run.yaml", cfg), _wandb_env(root / "home"), root / "stderr.log"

    proc = _train(config, env, log)
    deadline = time.monotonic() + 600
    while not any(r.get("step", 0) >= case.kill_after and "loss" in r for r in _records(out / METRICS_FILE)):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the first run did not reach the kill step"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    killed = _records(out / METRICS_FILE)
    checkpoint = _checkpoint_steps(out)[-1]
    assert max(r["step"] for r in killed) > checkpoint, "the killed run logged nothing past its checkpoint"
    assert not (out / "final").exists()

    again = _train(config, env, log)
    stdout, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log.read_text()[-3000:]
    summary = json.loads(stdout)  # --json: wandb's and TensorBoard's chatter stays off stdout
    return Resumed(case, out, killed, checkpoint, _records(out / METRICS_FILE), summary)


@pytest.mark.slow
def test_metrics_jsonl_holds_each_step_once_in_order_after_kill_and_resume(resumed: Resumed):
    case, c = resumed.case, resumed.checkpoint
    assert resumed.summary["resumed_from"] == str(resumed.out / f"checkpoint-{c}")
    assert resumed.summary["steps"] == case.max_steps
    lines = (resumed.out / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(resumed.final)  # every line is one whole record
    losses = _train_losses(resumed.final)
    assert list(losses) == case.expected_steps
    steps = [r["step"] for r in resumed.final]
    assert steps == sorted(steps)  # eval/data records too: nothing logged out of order
    # up to the checkpoint: the killed run's own records, verbatim; after it: the resumed run's
    before = [r for r in resumed.killed if r["step"] <= c]
    assert resumed.final[:len(before)] == before
    assert all(r["time"] > max(k["time"] for k in resumed.killed) for r in resumed.final[len(before):])
    # every record after the checkpoint is the killed run's again, an interval that began before it too (the
    # checkpoint holds the steps since the last record): same steps, same label tokens, same loss
    killed_losses = _train_losses(resumed.killed)
    replayed = [s for s in killed_losses if s > c]
    assert replayed and all(losses[s] == pytest.approx(killed_losses[s], rel=1e-6) for s in replayed)
    tokens = {r["step"]: r["label_tokens"] for r in resumed.final if "loss" in r}
    assert all(tokens[s] == r["label_tokens"] for r in resumed.killed if "loss" in r and (s := r["step"]) > c)


@pytest.mark.slow
@NEEDS_TENSORBOARD
def test_tensorboard_events_read_back_match_metrics_without_duplicates(resumed: Resumed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    directory = resumed.out / TENSORBOARD_DIR
    events = EventAccumulator(str(directory))
    events.Reload()
    losses = _train_losses(resumed.final)
    scalars = [(e.step, e.value) for e in events.Scalars("loss")]
    assert [step for step, _ in scalars] == list(losses)
    assert all(value == pytest.approx(losses[step], rel=1e-6) for step, value in scalars)  # float32 in the file
    lrs = {e.step: e.value for e in events.Scalars("lr")}
    assert lrs == {s: pytest.approx(r["lr"]) for s, r in ((r["step"], r) for r in resumed.final if "lr" in r)}
    # the resumed run's file opens with the purge marker for everything the killed run logged after the checkpoint
    newest = sorted(directory.glob("events.out.tfevents.*"))[-1]
    marks = [e for e in EventFileLoader(str(newest)).Load() if e.HasField("session_log")]
    assert marks and marks[0].step == resumed.checkpoint + 1 and marks[0].session_log.status == 1  # START


def _wandb_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of an offline run directory's transaction log, by wandb's own reader."""
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 and "No such command" in proc.stderr:
        pytest.skip("this wandb has no offline reader (`wandb leet inspect`, wandb 0.2x and later)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _wandb_segments(directory: Path) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(run record, history rows) of every offline run directory under ``directory``, oldest first."""
    segments = []
    for run_dir in directory.glob("offline-run-*"):
        records = _wandb_records(run_dir)
        run = next(r["run"] for r in records if r["type"] == "run")
        segments.append((run, [r["history"]["item"] for r in records if r["type"] == "history"]))
    return sorted(segments, key=lambda segment: segment[0]["start_time"])


@pytest.mark.slow
@NEEDS_WANDB
def test_wandb_offline_history_is_rewound_to_the_checkpoint_and_matches_metrics(resumed: Resumed):
    directory = resumed.out / WANDB_DIR
    (first, first_rows), (second, second_rows) = _wandb_segments(directory)
    assert "branch_point" not in first
    run_id = first["run_id"]
    assert second["run_id"] == run_id == (directory / WANDB_RUN_ID_FILE).read_text().strip()
    assert second["branch_point"] == {"metric": "_step", "run": run_id, "value": resumed.checkpoint}
    for rows in (first_rows, second_rows):
        steps = [row["_step"] for row in rows]
        assert steps == sorted(set(steps))
    assert all(row["_step"] > resumed.checkpoint for row in second_rows)  # nothing wandb would drop
    # what `wandb sync` of both gives: the first run's history up to the branch point, then the second's
    history = [row for row in first_rows if row["_step"] <= resumed.checkpoint] + second_rows
    losses = _train_losses(resumed.final)
    assert {row["_step"]: row["loss"] for row in history if "loss" in row} == losses
    # (so the killed run had written its rows up to the checkpoint: wandb holds the last row until told)
    assert [row["_step"] for row in history if "loss" in row] == list(losses)


@pytest.mark.slow
@NEEDS_WANDB
def test_wandb_that_cannot_start_stops_the_run_with_one_line(tmp_path, tiny_checkpoint):
    out = tmp_path / "out"
    cfg = tiny_config(out, tiny_checkpoint("qwen3_vl"), logging={"report_to": ["wandb"]})
    config = write_config(tmp_path / "run.yaml", cfg)
    env = _wandb_env(tmp_path / "home")
    env["WANDB_MODE"] = "online"  # and no API key anywhere: wandb.init refuses at once, without the network
    proc = subprocess.run([sys.executable, "-m", "vlforge.cli", "train", "--no-token-audit", str(config)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: logging.report_to: wandb could not start a run: ")
    assert "WANDB_MODE=offline" in errors[0] and "Traceback" not in proc.stderr
    assert not _records(out / METRICS_FILE) and not list(out.glob("checkpoint-*"))  # no step was trained


# -- MetricsLogger on its own (no training) -------------------------------------------------------------------
def _write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def test_a_fresh_run_drops_an_old_runs_records_and_a_torn_last_line(tmp_path):
    old = "".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2))
    _write(tmp_path / METRICS_FILE, old)
    with MetricsLogger(tmp_path, main=True, report_to=[], run_name="r", total_steps=2, progress=False) as log:
        log.log({"step": 1, "loss": 0.5})  # resume: none into a used output_dir starts the file over
    assert [(r["step"], r["loss"]) for r in _records(tmp_path / METRICS_FILE)] == [(1, 0.5)]

    _write(tmp_path / METRICS_FILE, old + json.dumps({"step": 3, "loss": 1.0}))  # killed before its newline
    with MetricsLogger(tmp_path, main=True, report_to=[], run_name="r", total_steps=4, progress=False,
                       start_step=3) as log:
        log.log({"step": 4, "loss": 0.5})
    lines = (tmp_path / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]

    closing = json.dumps({"step": 4, "samples_seen": 8, "data_report": "data_report.json"}) + "\n"
    with open(tmp_path / METRICS_FILE, "a", encoding="utf-8") as fh:  # a run stopped by a signal at step 4
        fh.write(closing)
    with MetricsLogger(tmp_path, main=True, report_to=[], run_name="r", total_steps=5, progress=False,
                       start_step=4) as log:  # resumed from step 4: its closing record goes, step 4 stays once
        log.log({"step": 5, "loss": 0.25})
    assert [sorted(r) for r in _records(tmp_path / METRICS_FILE)][-2:] == [["loss", "step", "time"]] * 2


@NEEDS_TENSORBOARD
def test_tensorboard_resume_purges_the_steps_after_the_checkpoint_only(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def run(start: int, steps: range, loss: float) -> None:
        with MetricsLogger(tmp_path, main=True, report_to=["tensorboard"], run_name="r", total_steps=4,
                           progress=False, start_step=start) as log:
            for step in steps:
                log.log({"step": step, "loss": loss + step})

    run(0, range(1, 5), 10.0)
    time.sleep(1.1)  # event files are read in name order, and a name carries the second it was opened
    run(2, range(3, 5), 20.0)  # resumed from step 2: steps 3 and 4 again
    raw = EventAccumulator(str(tmp_path / TENSORBOARD_DIR), purge_orphaned_data=False)
    raw.Reload()
    assert [e.step for e in raw.Scalars("loss")] == [1, 2, 3, 4, 3, 4]  # both runs' events are in the files
    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 11.0), (2, 12.0), (3, 23.0), (4, 24.0)]


FLUSH_THEN_KILLED = """
import os, signal, sys, time
from pathlib import Path
from vlforge.train.metrics import MetricsLogger

log = MetricsLogger(Path(sys.argv[1]), main=True, report_to=["wandb"], run_name="r", total_steps=4, progress=False)
log.log({"step": 1, "loss": 1.0})
log.log({"step": 2, "loss": 2.0})
log.log({"step": 2, "eval_loss": 0.5})  # joins row 2
log.flush()  # what the trainer does before writing checkpoint-2
log.log({"step": 2, "samples_seen": 5})  # row 2 is written: kept in the summary instead
time.sleep(1)  # killed before step 3 (and longer than the flush interval the test sets)
os.kill(os.getpid(), signal.SIGKILL)
"""


@NEEDS_WANDB
def test_wandb_rows_flushed_before_a_checkpoint_survive_a_kill(tmp_path):
    proc = subprocess.run([sys.executable, "-c", FLUSH_THEN_KILLED, str(tmp_path / "out")], cwd=REPO,
                          env=_wandb_env(tmp_path / "home"), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    records = _wandb_records(next((tmp_path / "out" / WANDB_DIR).glob("offline-run-*")))
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    assert [(row["_step"], row.get("loss"), row.get("eval_loss")) for row in rows] == [(1, 1.0, None), (2, 2.0, 0.5)]
    summaries = [r["summary"]["update"] for r in records if r["type"] == "summary"]
    assert any(update.get("samples_seen") == 5 for update in summaries)  # not dropped as an out-of-order step


LOG_STEPS = """
import logging, sys
from pathlib import Path
from vlforge.train.metrics import MetricsLogger

logging.basicConfig(level=logging.WARNING)
start, end = int(sys.argv[2]), int(sys.argv[3])
with MetricsLogger(Path(sys.argv[1]), main=True, report_to=["wandb"], run_name="r", total_steps=end,
                   progress=False, start_step=start) as log:
    for step in range(start + 1, end + 1):
        log.log({"step": step, "loss": float(10 * start + step)})
"""


@NEEDS_WANDB
def test_wandb_run_that_cannot_be_rewound_is_continued_with_a_warning(tmp_path):
    out, env = tmp_path / "out", _wandb_env(tmp_path / "home")

    def run(start: int, end: int, **extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-c", LOG_STEPS, str(out), str(start), str(end)], cwd=REPO,
                              env={**env, **extra}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    run(0, 4)
    # WANDB_RESUME next to resume_from is a real refusal of wandb.init (as a server without rewind would be)
    continued = run(2, 4, WANDB_RESUME="allow")
    assert "cannot be rewound to step 2" in continued.stderr and "continuing it" in continued.stderr
    (first, first_rows), (second, second_rows) = _wandb_segments(out / WANDB_DIR)
    assert first["run_id"] == second["run_id"] and "branch_point" not in second
    assert [row["_step"] for row in first_rows] == [1, 2, 3, 4]
    assert [(row["_step"], row["loss"]) for row in second_rows] == [(3, 23.0), (4, 24.0)]
