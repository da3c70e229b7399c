"""Runs you can leave alone: preemption, divergence, a full disk and a lost rank end in a known state (real CLI).

One process (``python -m vlforge.train``, 5 steps of the tiny Qwen3-VL): a reference run; then in one output
directory, each run resuming from the last: stopped by SIGUSR1 (a checkpoint at the step boundary, exit 4); a SIGTERM
with a grace period too short for any checkpoint (exit 143, nothing written); the next checkpoint under a file-size
limit (exit 5, its unfinished directory removed); the export under the limit (exit 5, no ``final/``); the rest of the
run with the loss-spike log on, bit-identical to the reference. Two torchrun ranks: non-finite steps (never applied,
the run stops), SIGTERM to every process of rank 1 alone, its DataLoader worker too (both ranks save and exit 4),
rank 1 SIGKILLed and rank 1 SIGSTOPped (rank 0 names it and exits 5 within seconds).
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from trainkit import (
    REPO,
    descendants,
    exported_weights,
    logged,
    tiny_config,
    train_command,
    train_env,
    write_config,
)

import warmstart
from vlforge.config.schema import TrainConfig
from vlforge.errors import ExitCode, Interrupted
from vlforge.outputs import make_staging
from vlforge.terminate import TerminateSignal
from vlforge.train.checkpoint import problem
from vlforge.train.guards import DivergenceError
from vlforge.train.preemption import PreemptedError, StopSignals
from vlforge.train.trainer import Trainer

pytestmark = pytest.mark.slow

LIMIT = 4 << 20
"""File-size limit (bytes) of the full-disk runs: the tiny model's checkpoint shard (~160 MB) and export (~40 MB)
cannot be written under it; the logs and reports can."""


@pytest.fixture(scope="module")
def model_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_vl")


def _start(config: Path, *overrides: str, nproc: int = 1, fsize: int | None = None) -> subprocess.Popen:
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))) if fsize else None
    return subprocess.Popen(train_command(config, nproc, *overrides), env=train_env(), cwd=REPO, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, stderr = proc.communicate(timeout=timeout)
    return proc.returncode, stderr


def _run(config: Path, *overrides: str, fsize: int | None = None) -> tuple[int, str]:
    return _finish(_start(config, *overrides, fsize=fsize))


def _program(pid: int) -> int:
    """The process running the program of ``pid`` (the served child of a warm-start client)."""
    return warmstart.served_pid(pid) or pid


def _handles(pid: int, signum: int, mask: str = "SigCgt") -> bool:
    """Whether ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask; ``SigIgn``: ignores it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(re.search(rf"{mask}:\s*([0-9a-f]+)", status).group(1), 16)
    return bool(caught >> (signum - 1) & 1)


def _stop_handlers_installed(launch: subprocess.Popen, pid: int, timeout: float = 300) -> int:
    """Wait until the program of ``pid`` handles SIGUSR1 (vlforge's stop signals are set: warm-start clients never
    handle it) and return that program's pid."""
    deadline = time.monotonic() + timeout
    while not _handles(_program(pid), signal.SIGUSR1):
        assert launch.poll() is None, launch.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return _program(pid)


def _rank_pid(launch: subprocess.Popen, rank: int, timeout: float = 300) -> int:
    """The process torchrun started for ``rank`` (its warm-start client, or the worker itself)."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in descendants(launch.pid):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ and b"vlforge.train" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        assert launch.poll() is None, launch.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _wait_for_step(out: Path, step: int, launch: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ((out / "metrics.jsonl").is_file() and step in logged(out, "step")):
        assert launch.poll() is None, launch.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def _shards(checkpoint: Path) -> dict[str, bytes]:
    """The bytes of each rank's DCP shard (every tensor of the model and of AdamW's state, as written); the
    checkpoint's ``.metadata`` names its own directory, so it is left out."""
    return {f.name: f.read_bytes() for f in sorted((checkpoint / "weights").glob("*.distcp"))}


# -- one process: stop, full disk, resume ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_process(tmp_path_factory, model_path):
    """The reference run and the chain of runs in one output directory; each stage's (exit code, stderr)."""
    root = tmp_path_factory.mktemp("longruns")
    cfg = tiny_config(root / "ref", model_path, training={"max_steps": 5},
                      checkpointing={"resume": "auto"}, model={"token_audit": False})
    config = write_config(root / "run.yaml", cfg)
    out = root / "out"
    here = f"checkpointing.output_dir={out}"
    runs: dict[str, Any] = {"reference": _run(config)}
    assert runs["reference"][0] == 0, runs["reference"][1][-3000:]

    launch = _start(config, here)  # SIGUSR1 (SLURM's --signal) as soon as the handlers are set: stops after step 1
    worker = _stop_handlers_installed(launch, launch.pid)
    warmstart.kill(worker, signal.SIGUSR1)
    runs["signal"] = _finish(launch)
    runs["signal_report"] = json.loads((out / "data_report.json").read_text())
    runs["signal_report"] = json.loads((out / "data_report.json").read_text())
    (out / "notes.txt").write_text("the user's")

    launch = _start(config, here, "training.stop_grace_period=0.001")  # no checkpoint fits in the grace period
    _stop_handlers_installed(launch, launch.pid)
    warmstart.kill(launch.pid, signal.SIGTERM)
    runs["grace"] = _finish(launch)

    launch = _start(config, here)  # Ctrl-C is not a stop signal: no checkpoint of its own, one line, exit 130
    os.kill(_stop_handlers_installed(launch, launch.pid), signal.SIGINT)  # as a terminal's Ctrl-C reaches it
    runs["interrupt"] = _finish(launch)

    runs["full_checkpoint"] = _run(config, here, fsize=LIMIT)  # steps 2-5, then checkpoint-5 cannot be written
    runs["full_export"] = _run(config, here, "training.max_steps=1", fsize=LIMIT)  # nothing to train: export only
    stage = make_staging(out / "checkpoint-4", writer="train")  # as a process killed while saving leaves it
    (stage / "rank-0.pt").write_bytes(b"half")
    (out / ".tmp-checkpoint-3").mkdir()  # killed between making its staging directory and writing the ledger
    runs["resumed"] = _run(config, here, "training.loss_spike_factor=1.01", "training.loss_spike_window=2")
    return root, out, runs


def test_a_stop_signal_saves_the_step_boundary_and_exits_4(one_process):
    _, out, runs = one_process
    code, stderr = runs["signal"]
    assert code == 4, stderr[-3000:]
    assert _errors(stderr) == [f"error: stopped by SIGUSR1 at step 1 of 5: saved {out / 'checkpoint-1'}; the same "
                               "command continues from it"]
    report = runs["signal_report"]
    assert report["step"] == 1 and report["samples_seen"] == 1 and report["nonfinite_steps"] == 0
    assert "Traceback" not in stderr


def test_the_grace_period_exits_at_once_without_a_checkpoint(one_process):
    _, out, runs = one_process
    code, stderr = runs["grace"]
    assert code == 128 + signal.SIGTERM, stderr[-3000:]
    assert ("ERROR   the stop grace period (training.stop_grace_period = 0.001 s) ended before the checkpoint was "
            f"written: exiting at once without saving; the newest complete checkpoint is {out / 'checkpoint-1'} (the "
            "same command continues from it)") in stderr


def test_ctrl_c_says_where_the_run_stopped_and_exits_130(one_process):
    _, out, runs = one_process
    code, stderr = runs["interrupt"]
    assert code == 130, stderr[-3000:]
    assert len(_errors(stderr)) == 1, stderr[-3000:]
    [line] = _errors(stderr)
    assert re.fullmatch(rf"error: interrupted \(Ctrl-C\) (in step \d+|while starting); the newest complete checkpoint is "
                        rf"{re.escape(str(out / 'checkpoint-1'))} \(the same command continues from it\)", line), line


def test_a_full_disk_removes_the_unfinished_checkpoint_and_keeps_everything_else(one_process):
    _, out, runs = one_process
    code, stderr = runs["full_checkpoint"]
    assert code == 5, stderr[-3000:]
    [line] = _errors(stderr)
    assert line.startswith(f"error: checkpoint-5: writing {out / '.tmp-checkpoint-5' / 'weights'} failed: ")
    assert "File too large" in line or "file-size limit 4.0 MB (ulimit -f)" in line
    assert line.endswith(f"removed the unfinished {out / '.tmp-checkpoint-5'}; the newest complete checkpoint is "
                         "checkpoint-1 (checkpointing.resume: auto continues from it once there is room)")
    assert "resumed from" in stderr and "Traceback" not in stderr


def test_a_full_disk_during_the_export_leaves_no_final_directory(one_process):
    _, out, runs = one_process
    code, stderr = runs["full_export"]
    assert code == 5, stderr[-3000:]
    [line] = _errors(stderr)
    assert line.startswith(f"error: exporting checkpoint-1 to {out / 'final'} failed: ")
    assert "File too large" in line
    assert line.endswith(f"{out / 'final'} is as it was and {out / 'checkpoint-1'} is complete (vlforge export "
                         f"{out / 'checkpoint-1'} {out / 'final'} retries)")


def test_after_every_stop_the_run_resumes_bit_identical_to_one_without_them(one_process):
    root, out, runs = one_process
    code, stderr = runs["resumed"]
    assert code == 0, stderr[-3000:]
    assert f"resumed from {out / 'checkpoint-1'} (step 1)" in stderr
    assert f"removing {out / '.tmp-checkpoint-4'}" in stderr  # the unfinished checkpoint of a killed save
    reference, resumed = exported_weights(root / "ref" / "final"), exported_weights(out / "final")
    assert reference.keys() == resumed.keys() and all(torch.equal(reference[k], resumed[k]) for k in reference)
    assert logged(out, "loss") == logged(root / "ref", "loss")  # each step once, the same values
    # nothing of the user's was touched, nothing unfinished is left
    assert (out / "notes.txt").read_text() == "the user's"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".tmp")) == []
    assert problem(out / "checkpoint-1") is None and problem(out / "checkpoint-5") is None
    # the loss-spike log (off by default): step 5's loss exceeds 1.01 x the mean of steps 3 and 4
    losses = logged(out, "loss")
    assert losses[4] > 1.01 * (losses[2] + losses[3]) / 2 and losses[3] < 1.01 * (losses[1] + losses[2]) / 2
    spike = [line for line in stderr.splitlines() if "loss spike" in line]
    assert len(spike) == 1 and re.search(r"step 5: loss spike: [\d.]+ > 1\.01 x [\d.]+ \(mean of the last 2 applied "
                                         r"steps\); samples: .*train\.jsonl:line 5$", spike[0])
    assert json.loads((out / "data_report.json").read_text())["loss_spike_first_steps"] == [5]


# -- in one process: a stop between two logs ------------------------------------------------------------------------
def _in_process(out: Path, model_path: Path, save_steps: int = 100, **training) -> Trainer:
    cfg = tiny_config(out, model_path, training={"max_steps": 4, **training}, logging={"logging_steps": 4},
                      checkpointing={"resume": "auto", "save_steps": save_steps},
                      model={"token_audit": False, "memory_plan": False})
    return Trainer(TrainConfig.model_validate(cfg), progress=False, export=False)


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_steps_since_the_last_log_are_logged_when_a_signal_or_divergence_stops_the_run(tmp_path, model_path):
    """logging_steps = 4: a stop signal in step 2 and a divergence in step 3 still log the steps before them; a
    signal-stopped run and its resumption log every label token of the uninterrupted run, each once; a run that
    crashed after its checkpoint at step 3 resumes with steps 1-3 in hand and logs the uninterrupted run's record."""
    _in_process(tmp_path / "ref", model_path).train()
    [whole] = [r for r in _records(tmp_path / "ref") if "loss" in r]

    stopped = _in_process(tmp_path / "out", model_path)
    step = stopped.train_step

    def signalled(*args, **kwargs):
        if stopped.step == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # arrives during step 2
        return step(*args, **kwargs)

    stopped.train_step = signalled
    with pytest.raises(PreemptedError, match="at step 2 of 4"):
        stopped.train()
    _in_process(tmp_path / "out", model_path).train()
    parts = [r for r in _records(tmp_path / "out") if "loss" in r]
    assert [r["step"] for r in parts] == [2, 4]
    assert sum(r["label_tokens"] for r in parts) == whole["label_tokens"]
    assert sum(r["loss"] * r["label_tokens"] for r in parts) == pytest.approx(whole["loss"] * whole["label_tokens"],
                                                                              rel=1e-5)

    crashed = _in_process(tmp_path / "crash", model_path, save_steps=3)
    step = crashed.train_step

    def crash(*args, **kwargs):
        if crashed.step == 3:
            raise RuntimeError("the node went away")  # in step 4, after checkpoint-3
        return step(*args, **kwargs)

    crashed.train_step = crash
    with pytest.raises(RuntimeError, match="the node went away"):
        crashed.train()
    assert not (tmp_path / "crash" / "metrics.jsonl").exists() or not [
        r for r in _records(tmp_path / "crash") if "loss" in r]
    _in_process(tmp_path / "crash", model_path, save_steps=3).train()
    [again] = [r for r in _records(tmp_path / "crash") if "loss" in r]
    assert (again["step"], again["label_tokens"]) == (4, whole["label_tokens"])
    assert (again["loss"], again["grad_norm"]) == pytest.approx((whole["loss"], whole["grad_norm"]), rel=1e-6)

    with pytest.raises(DivergenceError, match=r"step 3: .* not finite in 2 step"):
        _in_process(tmp_path / "nan", model_path, learning_rate=1e8, max_nonfinite_steps=2).train()
    records = _records(tmp_path / "nan")
    assert [(r["step"], r.get("loss"), r["nonfinite_steps"]) for r in records] == [(3, "NaN", 2), (3, None, 2)]
    assert records[0]["label_tokens"] > 0 and records[-1]["data_report"] == "data_report.json"

    rotten = _in_process(tmp_path / "rotten", model_path, save_steps=2)  # weights not finite at checkpoint-2
    rotten.setup()
    rotten.guard.check_weights = lambda model, at: DivergenceError(f"step {at}: a weight is not finite")
    with pytest.raises(DivergenceError, match="step 2: a weight is not finite"):
        rotten.train()
    records = _records(tmp_path / "rotten")
    assert [r["step"] for r in records] == [2, 2] and records[0]["label_tokens"] > 0  # steps 1-2, then the report
    assert records[-1]["data_report"] == "data_report.json" and not (tmp_path / "rotten" / "checkpoint-2").exists()


@pytest.mark.parametrize(("interrupt", "line", "code"), [
    (KeyboardInterrupt, "interrupted (Ctrl-C)", ExitCode.INTERRUPTED),
    (TerminateSignal, "terminated (SIGTERM)", ExitCode.TERMINATED),  # SIGTERM not named by training.stop_signals
], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_while_the_stop_signals_are_being_set_is_one_line(tmp_path, model_path, monkeypatch, interrupt,
                                                                      line, code):
    def interrupted(self):
        raise interrupt

    monkeypatch.setattr(StopSignals, "install", interrupted)
    with pytest.raises(Interrupted) as caught:
        _in_process(tmp_path / "out", model_path).train()
    assert str(caught.value) == f"{line} while starting; there is no complete checkpoint yet (the same command " \
                                "starts over)"
    assert caught.value.exit_code == code


@pytest.mark.parametrize(("interrupt", "line"), [(KeyboardInterrupt, "interrupted (Ctrl-C)"),
                                               (TerminateSignal, "terminated (SIGTERM)")], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_during_the_export_names_the_export_not_a_step(tmp_path, model_path, monkeypatch, interrupt,
                                                                    line):
    def interrupted(self, checkpoint):
        raise interrupt

    monkeypatch.setattr(Trainer, "_export", interrupted)
    trainer = _in_process(tmp_path / "out", model_path, max_steps=1)
    trainer.export = True
    with pytest.raises(Interrupted) as caught:
        trainer.train()
    out = tmp_path / "out"
    assert str(caught.value) == (f"{line} while exporting checkpoint-1 to {out / 'final'}; the newest complete "
                                 f"checkpoint is {out / 'checkpoint-1'} (the same command continues from it)")


# -- two torchrun ranks ----------------------------------------------------------------------------------------------
def _two_ranks(root: Path, model_path: Path, **training) -> Path:
    cfg = tiny_config(root / "out", model_path, training={"max_steps": 4, "rank_timeout": 3, **training},
                      checkpointing={"resume": "auto"}, model={"token_audit": False})
    return write_config(root / "run.yaml", cfg)


def test_nonfinite_steps_are_skipped_on_every_rank_and_stop_the_run(tmp_path, model_path):
    config = _two_ranks(tmp_path, model_path, learning_rate=1e8, max_nonfinite_steps=2)
    code, stderr = _finish(_start(config, "checkpointing.save_steps=1", nproc=2))
    assert code != 0 and "exitcode  : 3" in stderr, stderr[-3000:]
    out = tmp_path / "out"
    errors = _errors(stderr)
    assert len(errors) == 2 and errors[0] == errors[1]  # both ranks, the same line
    assert re.fullmatch(
        r"error: step 3: loss nan, grad norm nan: not finite in 2 step\(s\) in a row \(training.max_nonfinite_steps = "
        r"2\); steps 2-3 not applied, the weights are those of step 1; samples with a non-finite loss: (.*train\.jsonl:"
        r"line \d+(, )?){1,2}; nothing saved or exported after it .*", errors[0]), errors[0]
    # step 2 was not applied on either rank: its checkpoint holds step 1's weights and AdamW state, bit for bit
    after_one, after_two = _shards(out / "checkpoint-1"), _shards(out / "checkpoint-2")
    assert len(after_one) == 2 and after_one == after_two
    assert not (out / "checkpoint-3").exists() and not (out / "final").exists()
    report = json.loads((out / "data_report.json").read_text())
    assert (report["nonfinite_steps"], report["nonfinite_first_steps"], report["step"]) == (2, [2, 3], 3)
    # each step's record, the stopping step's too, then the closing record
    assert logged(out, "nonfinite_steps") == [0, 1, 2, 2] and logged(out, "step") == [1, 2, 3, 3]
    assert logged(out, "loss")[1:] == ["NaN", "NaN"]  # a skipped step's loss, as a string: strict JSON


def test_sigterm_to_one_rank_stops_every_rank_at_a_saved_step(tmp_path, model_path):
    """SIGTERM to every process of rank 1 (its DataLoader worker too, as a scheduler signals them all) and to no
    other (not torchrun, which would forward it to both ranks)."""
    config = _two_ranks(tmp_path, model_path)
    launch = _start(config, "dataloader_num_workers=1", nproc=2)
    rank1 = _rank_pid(launch, 1)
    worker = _stop_handlers_installed(launch, rank1)
    deadline = time.monotonic() + 300
    while not any(_handles(pid, signal.SIGTERM, "SigIgn") for pid in descendants(worker)):
        assert launch.poll() is None and time.monotonic() < deadline, launch.stderr.read()[-3000:]
        time.sleep(0.02)  # its DataLoader worker starts with the first batch and then ignores the stop signals
    for pid in [*descendants(worker), rank1]:
        warmstart.kill(pid, signal.SIGTERM)  # a warm client: its program first
    code, stderr = _finish(launch)
    assert code != 0 and "exitcode  : 4" in stderr, stderr[-3000:]
    out = tmp_path / "out"
    errors = set(_errors(stderr))
    assert len(errors) == 1, errors
    step = int(re.fullmatch(r"error: stopped by SIGTERM \(received by 1 of 2 processes\) at step (\d) of 4: saved "
                            rf"{re.escape(str(out))}/checkpoint-\1; the same command continues from it", errors.pop())[1])
    assert problem(out / f"checkpoint-{step}") is None  # complete: both ranks' shards and states
    assert json.loads((out / "data_report.json").read_text())["step"] == step
    assert logged(out, "step")[-1] == step and not (out / "final").exists()


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_lost_rank_is_named_and_the_others_exit_within_seconds(tmp_path, model_path, how):
    config = _two_ranks(tmp_path, model_path)
    launch = _start(config, nproc=2)
    rank1 = _rank_pid(launch, 1)
    _wait_for_step(tmp_path / "out", 1, launch)
    worker = _program(rank1)
    hit = time.monotonic()
    if how == "SIGKILL":
        warmstart.kill(rank1, signal.SIGKILL)  # the worker and its warm-start client, as a crash ends a process
    else:
        os.kill(worker, signal.SIGSTOP)  # the worker alone: its client stays to report it to torchrun
    rank0 = _program(_rank_pid(launch, 0))
    while Path(f"/proc/{rank0}").exists() and time.monotonic() - hit < 60:
        time.sleep(0.05)
    took = time.monotonic() - hit
    if how == "SIGSTOP":
        warmstart.kill(worker, signal.SIGKILL)  # torchrun would wait 30 s for the stopped rank
    code, stderr = _finish(launch)
    assert code != 0 and took < 15, (took, stderr[-3000:])
    assert "exitcode  : 5" in stderr, stderr[-3000:]
    if how == "SIGKILL":  # rank 0's collective failed at once; the heartbeats name the rank
        [line] = _errors(stderr)
        assert re.fullmatch(r"error: rank 1 stopped responding in step [12] \(no heartbeat for \d s\): rank 0 stops in "
                            r"step [12] \(its collective failed: .*\); there is no complete checkpoint yet \(the same "
                            r"command starts over\)", line), line
    else:  # rank 0 waits in a collective; its heartbeat thread ends it after training.rank_timeout
        assert re.search(r"\[rank 0\] ERROR   rank 1 stopped responding in step [12] \(no heartbeat for 3 s\), "
                         r"training.rank_timeout = 3 s: rank 0 stops in step [12]; there is no complete checkpoint yet",
                         stderr), stderr[-3000:]
    assert "stopped by SIGTERM" not in stderr  # torchrun's SIGTERM to the survivor is not read as a preemption
