"""The step policies in one process: the step guard (a non-finite step or a skipped loss spike leaves weights and
AdamW's state bit-identical; too many in a row stop the run), stop signals, the sweep of unfinished checkpoints and
how a failed write is named. The same policies through the real CLI: test_trainer_longruns.py."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from trainkit import free_port, train_env

import warmstart
from vlforge.config.schema import TrainingConfig
from vlforge.dist import init_distributed
from vlforge.errors import ExitCode
from vlforge.outputs import make_staging, write_failure
from vlforge.train import preemption
from vlforge.train.checkpoint import clear_unfinished
from vlforge.train.guards import DivergenceError, StepGuard
from vlforge.train.preemption import StopSignals


def _model(fused: bool) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.1, fused=fused, foreach=not fused)
    return layer, optimizer


def _step(layer, optimizer, guard, step: int, *, poison: float = 0.0, loss_value: float | None = None) -> None:
    """One step of ``layer`` on a fixed input plus ``poison`` (NaN or inf make the gradient non-finite); the guard
    sees ``loss_value`` as the step's loss when given (a loss decoupled from the gradient)."""
    optimizer.zero_grad(set_to_none=True)
    x = torch.tensor([[1.0, 2.0, 3.0]]) * step + poison
    loss = layer(x).pow(2).mean()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), float("inf"))
    seen = loss.detach() if loss_value is None else torch.tensor(loss_value)
    guard.apply(optimizer, [seen], torch.tensor(1.0), norm, step=step, names=[[f"d.jsonl:line {step}"]])


def _state(layer, optimizer) -> dict:
    return {"weights": {k: v.clone() for k, v in layer.state_dict().items()},
            "optim": copy.deepcopy(optimizer.state_dict()["state"])}


def _same(a: dict, b: dict) -> bool:
    flat = [(a["weights"][k], b["weights"][k]) for k in a["weights"]]
    flat += [(a["optim"][i][k], b["optim"][i][k]) for i in a["optim"] for k in a["optim"][i]]
    return a["optim"].keys() == b["optim"].keys() and all(torch.equal(x, y) for x, y in flat)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_nonfinite_steps_are_not_applied_and_stop_the_run_after_the_limit(fused):
    layer, optimizer = _model(fused)
    guard = StepGuard(TrainingConfig(max_nonfinite_steps=2), init_distributed(), optimizer)
    _step(layer, optimizer, guard, 1)
    applied = _state(layer, optimizer)
    _step(layer, optimizer, guard, 2, poison=math.nan)  # a NaN gradient
    assert _same(applied, _state(layer, optimizer))  # weights, both moments and the step count: bit-identical
    assert guard.settle() is None and guard.streak == 1
    _step(layer, optimizer, guard, 3, loss_value=math.inf)  # a finite gradient with an infinite loss
    assert _same(applied, _state(layer, optimizer))
    error = guard.settle()
    assert isinstance(error, DivergenceError) and error.exit_code == ExitCode.FAILED == 3
    assert str(error).startswith("step 3: loss inf, grad norm ")
    assert "in 2 step(s) in a row (training.max_nonfinite_steps = 2); steps 2-3 not applied, the weights are " \
           "those of step 1; samples with a non-finite loss: d.jsonl:line 3;" in str(error)
    assert guard.report() == {"nonfinite_steps": 2, "nonfinite_first_steps": [2, 3]}
    _step(layer, optimizer, guard, 4)  # a finite step is applied again and ends the streak
    assert not _same(applied, _state(layer, optimizer))
    assert guard.settle() is None and guard.streak == 0 and guard.last_applied == 4


def test_max_nonfinite_steps_1_stops_at_the_first_and_a_gradient_overflow_names_every_sample():
    layer, optimizer = _model(True)
    guard = StepGuard(TrainingConfig(max_nonfinite_steps=1), init_distributed(), optimizer)
    _step(layer, optimizer, guard, 1, poison=math.inf)  # an infinite input: loss and gradient not finite
    error = guard.settle()
    assert error is not None and str(error).startswith("step 1: ")
    layer, optimizer = _model(True)
    guard = StepGuard(TrainingConfig(max_nonfinite_steps=1), init_distributed(), optimizer)
    with torch.no_grad():
        layer.weight.fill_(1e30)  # finite loss per sample, an overflowing gradient norm
    guard.apply(optimizer, [torch.tensor(1.0), torch.tensor(2.0)], torch.tensor(1.0), torch.tensor(math.inf),
                step=7, names=[["a.jsonl:line 1"], ["a.jsonl:line 2", "b.jsonl:line 9"]])
    message = str(guard.settle(force=True))
    assert "step 7: loss 3, grad norm inf" in message
    assert "the step's samples: a.jsonl:line 1, a.jsonl:line 2, b.jsonl:line 9;" in message


@pytest.mark.parametrize("action", ["log", "skip"])
def test_loss_spikes_are_logged_with_their_samples_and_skipped_when_asked(action, caplog):
    layer, optimizer = _model(True)
    cfg = TrainingConfig(loss_spike_factor=1.5, loss_spike_window=2, loss_spike_action=action)
    guard = StepGuard(cfg, init_distributed(), optimizer)
    for step, value in enumerate([1.0, 1.2, 1.0], start=1):  # the first 2 fill the window; 1.0 < 1.5 x 1.1
        _step(layer, optimizer, guard, step, loss_value=value)
    before = _state(layer, optimizer)
    with caplog.at_level(logging.WARNING, logger="vlforge.train.guards"):
        _step(layer, optimizer, guard, 4, loss_value=3.0)  # 3.0 > 1.5 x mean(1.2, 1.0)
        assert guard.settle() is None
    assert f"step 4: loss spike: 3 > 1.5 x 1.1 (mean of the last 2 applied steps){': not applied' * (action == 'skip')}" \
           "; samples: d.jsonl:line 4" in caplog.text
    assert _same(before, _state(layer, optimizer)) is (action == "skip")
    assert guard.report() == {"nonfinite_steps": 0, "nonfinite_first_steps": [], "loss_spikes": 1,
                              "loss_spike_first_steps": [4]}
    _step(layer, optimizer, guard, 5, loss_value=1.7)  # skip: still > 1.5 x mean(1.2, 1.0); log: < 1.5 x 2
    assert guard.settle() is None and guard.spikes_total == (2 if action == "skip" else 1)
    resumed = StepGuard(cfg, init_distributed(), _model(True)[1])
    resumed.load_state_dict(guard.state_dict())
    assert torch.equal(resumed.history, guard.history) and int(resumed.applied) == int(guard.applied)


def test_stop_signals_mark_one_request_and_restore_the_handlers():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set from the main thread only")
    previous = signal.getsignal(signal.SIGUSR1)
    with StopSignals(["SIGTERM", "SIGUSR1"], grace=60) as stops:
        assert stops.requests() == [0, 0]
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGUSR1)  # within the repeat window: the same request (and no exit)
        deadline = time.monotonic() + 10
        while stops.requests() != [0, 1]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGUSR1) is previous


def test_ctrl_c_while_the_stop_signals_are_being_set_leaves_the_old_handlers(monkeypatch):
    """A KeyboardInterrupt part-way through ``install`` (here: starting the watcher thread) undoes what was set."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set from the main thread only")

    class Interrupted(threading.Thread):
        def start(self):
            raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    fds = sorted(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(preemption.threading, "Thread", Interrupted)
    stops = StopSignals(["SIGTERM", "SIGUSR1"], grace=60)
    with pytest.raises(KeyboardInterrupt):
        stops.install()
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == previous
    assert signal.set_wakeup_fd(-1) == -1 and stops not in preemption._installed and stops._wakeup is None
    assert sorted(os.listdir("/proc/self/fd")) == fds  # its wake-up pipe closed


def test_a_second_stop_signal_exits_at_once_with_128_plus_its_number(tmp_path):
    script = textwrap.dedent("""
        import logging, os, signal, sys, time
        from vlforge.train import preemption
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        preemption.REPEAT_WINDOW = 0.1
        with preemption.StopSignals(["SIGTERM"], grace=60, newest=lambda: "checkpoint-3 is kept") as stops:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        print("not stopped")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "not stopped" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == \
        "ERROR a second SIGTERM: exiting at once without saving; checkpoint-3 is kept"


def test_a_stop_signal_during_the_final_export_says_the_checkpoint_is_complete(tmp_path):
    """The run has finished when it exports: the grace period's end there names the export, not a checkpoint."""
    script = textwrap.dedent("""
        import logging, os, signal, time
        from vlforge.train import preemption
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        with preemption.StopSignals(["SIGTERM"], grace=0.3, newest=lambda: "unused") as stops:
            stops.exporting = "out/checkpoint-3 is complete (vlforge export out/checkpoint-3 out/final makes the export)"
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        print("not stopped")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM and "not stopped" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "ERROR the stop grace period (training.stop_grace_period = 0.3 s) ended while the finished run exported: "
        "exiting at once, the export unfinished; out/checkpoint-3 is complete (vlforge export out/checkpoint-3 "
        "out/final makes the export)")


def test_unfinished_checkpoints_are_swept_and_foreign_directories_kept(tmp_path):
    stage = make_staging(tmp_path / "checkpoint-7", writer="train")
    (stage / "weights").mkdir()
    (stage / "weights" / "__0_0.distcp").write_bytes(b"half")
    foreign = tmp_path / ".tmp-checkpoint-8"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("a user's")
    clear_unfinished(tmp_path)
    assert not stage.exists() and (foreign / "mine.txt").read_text() == "a user's"


def test_a_failed_write_is_named_by_its_os_error():
    try:
        try:
            raise OSError(27, "File too large")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598") from None
    except RuntimeError as error:
        chained = error
    chained.__context__ = OSError(27, "File too large")  # what torch's serializer leaves behind
    assert write_failure(chained) == "[Errno 27] File too large"
    assert write_failure(RuntimeError("unexpected pos 704 vs 598")).startswith("a short write (")
    assert write_failure(ValueError("not a write")) is None
    assert write_failure(FileNotFoundError(2, "No such file or directory"), no_room_only=True) is None
    assert write_failure(OSError(28, "No space left on device"), no_room_only=True) == \
        "[Errno 28] No space left on device"


def test_stop_signal_keys_are_validated():
    assert TrainingConfig(stop_signals=None).stop_signals == []
    assert TrainingConfig(stop_signals="SIGUSR1").stop_signals == ["SIGUSR1"]
    with pytest.raises(ValueError, match="SIGKILL"):
        TrainingConfig(stop_signals=["SIGKILL"])


SPREAD = """
import json, math, os, sys
import torch, torch.distributed as dist
sys.path[:0] = [{tests!r}, {tests!r} + "/.."]  # this module and what it imports (trainkit, warmstart)
from test_trainer_guards import _model, _same, _state
from vlforge.config.schema import TrainingConfig
from vlforge.dist import init_distributed
from vlforge.train.guards import StepGuard

ctx = init_distributed()
rank = ctx.rank
layer, optimizer = _model(True)
guard = StepGuard(TrainingConfig(max_nonfinite_steps=1), ctx, optimizer)
for step in (1, 2):  # step 1 finite everywhere, step 2 infinite on rank 1 only (with a finite gradient)
    optimizer.zero_grad(set_to_none=True)
    before = _state(layer, optimizer)
    loss = layer(torch.ones(1, 3)).sum() + (math.inf if rank == 1 and step == 2 else 0.0)
    objective = loss * guard.objective_scale(loss.detach())  # the trainer's last micro-batch
    objective.backward()
    for param in layer.parameters():  # the trainer's replicated path: gradients summed over ranks
        dist.all_reduce(param.grad)
    norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), float("inf"))
    guard.apply(optimizer, [loss.detach()], torch.tensor(2.0), norm, step=step, names=[[f"rank{{rank}}.jsonl:line {{step}}"]])
    error = guard.settle()
with open(os.path.join({out!r}, f"rank-{{rank}}.json"), "w") as handle:
    json.dump([_same(before, _state(layer, optimizer)), str(error)], handle)
ctx.close()
"""


@pytest.mark.slow
def test_a_loss_that_is_not_finite_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    """Without the guard's scale, rank 0 would apply the step and rank 1 skip it: the replicas would differ."""
    script = tmp_path / "spread.py"
    script.write_text(SPREAD.format(tests=str(Path(__file__).parent), out=str(tmp_path)))
    proc = subprocess.run([warmstart.python(), "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(script)], env=train_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert results[0][0] and results[1][0]  # neither rank applied it: the weights stay equal everywhere
    assert results[0][1] == results[1][1]  # the same line on both ranks, naming rank 1's sample
    assert results[0][1].startswith("step 2: loss inf, grad norm nan: not finite in 1 step(s) in a row")
    assert "the weights are those of step 1; samples with a non-finite loss: rank1.jsonl:line 2;" in results[0][1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available())")
def test_on_cuda_the_fused_step_is_skipped_on_the_device_and_read_at_the_next_sync():
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2).cuda()
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.1, fused=True)
    guard = StepGuard(TrainingConfig(max_nonfinite_steps=2), init_distributed(device=torch.device("cuda")), optimizer)
    assert not guard.every_step  # one process on an accelerator: no host read per step
    for step, poison in ((1, 0.0), (2, math.nan), (3, math.nan)):
        if step == 2:
            applied = _state(layer, optimizer)
        optimizer.zero_grad(set_to_none=True)
        loss = layer(torch.full((1, 3), 1.0 + poison, device="cuda")).pow(2).mean()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), float("inf"))
        guard.apply(optimizer, [loss.detach()], torch.tensor(1.0, device="cuda"), norm, step=step, names=[[]])
        assert guard.settle() is None  # not read yet
    assert _same(applied, _state(layer, optimizer))
    assert str(guard.settle(force=True)).startswith("step 3: loss nan, grad norm nan: not finite in 2 step(s)")
