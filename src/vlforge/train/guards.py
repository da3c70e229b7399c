"""The step guard: an optimiser step whose loss or gradient norm is NaN or infinite is never applied.

The verdict is taken on the device, from the step's gradient norm (global: FSDP and the replicated all-reduce give
every rank the same value) and its loss. Fused AdamW (``optim: adamw_torch_fused``, the default) reads it as its
``found_inf``, the flag ``torch.amp.GradScaler`` sets, and leaves weights, moments and step counts as they were:
no host sync. The foreach AdamW (``optim: adamw_torch``) has no such flag; it reads the verdict on the host once per
step. With several processes a rank whose own loss is not finite multiplies its last micro-batch's objective by
NaN, so the reduced gradients, and the norm every rank computes from them, are not finite on every rank: all ranks
skip the same steps without another collective. A skipped step still counts (its data is used up, the learning-rate
schedule moves on).

The host reads the verdicts right after the step's one host sync (several processes, or a CPU device) or at the
next log, checkpoint or end of the run (one process on an accelerator). After ``training.max_nonfinite_steps``
unapplied steps in a row the run stops with :class:`DivergenceError` (exit 3), naming the step, its loss and
gradient norm and the samples (``file:line N``) of the micro-batches whose loss was not finite (of all of the
step's micro-batches when only the gradient overflowed). Nothing is saved or exported after that.

Loss spikes (``training.loss_spike_factor``, off by default): a step whose loss exceeds the factor times the mean
loss of the last ``loss_spike_window`` applied steps is logged with its samples; with ``loss_spike_action: skip``
it is not applied either (the global loss needs one small all-reduce per step with several processes).

Example (a NaN gradient leaves the weights and AdamW's state bit-identical):
    >>> import torch
    >>> from vlforge.config.schema import TrainingConfig
    >>> from vlforge.dist import init_distributed
    >>> layer = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.AdamW(layer.parameters(), fused=True)
    >>> guard = StepGuard(TrainingConfig(max_nonfinite_steps=1), init_distributed(), optimizer)
    >>> loss = layer(torch.tensor([[float("nan"), 1.0]])).sum()
    >>> loss.backward()
    >>> before = layer.weight.detach().clone()
    >>> norm = torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
    >>> guard.apply(optimizer, [loss.detach()], torch.tensor(1.0), norm, step=1, names=[["a.jsonl:line 1"]])
    >>> torch.equal(layer.weight, before), float(optimizer.state[layer.weight]["step"])
    (True, 0.0)
    >>> print(guard.settle(force=True))  # doctest: +ELLIPSIS
    step 1: loss nan, grad norm nan: not finite in 1 step(s) in a row (training.max_nonfinite_steps = 1); ...
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from vlforge.config.schema import TrainingConfig
from vlforge.dist import DistContext
from vlforge.errors import ExitCode, VlforgeError

logger = logging.getLogger(__name__)

SHOWN_SAMPLES = 8
"""Samples a message names (then ``and N more``)."""
FIRST_STEPS = 20
"""Unapplied steps listed in ``data_report.json`` (each kind)."""


class DivergenceError(VlforgeError):
    """Training stopped: too many optimiser steps in a row were not finite (or were loss spikes) to apply."""

    exit_code = ExitCode.FAILED


@dataclass
class _Verdict:
    """One step's verdict, on the device until :meth:`StepGuard.settle` reads it."""

    step: int
    values: torch.Tensor
    """float64: non-finite, spike, skipped, global loss (spike policy; else NaN), reference, grad norm, local loss
    sum, global label tokens."""
    local: torch.Tensor
    """Per micro-batch of this rank: 1 where its loss is not finite."""
    names: list[list[str]]
    """Per micro-batch of this rank: its samples (``file:line N``)."""


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value)


class StepGuard:
    """Non-finite and loss-spike policy around each optimiser step; see the module docstring."""

    def __init__(self, cfg: TrainingConfig, ctx: DistContext, optimizer: torch.optim.Optimizer) -> None:
        self.ctx, self.limit = ctx, cfg.max_nonfinite_steps
        self.factor, self.window, self.skip_spikes = cfg.loss_spike_factor, cfg.loss_spike_window, \
            cfg.loss_spike_action == "skip"
        self.fused = bool(optimizer.param_groups and optimizer.param_groups[0].get("fused"))
        self.every_step = ctx.distributed or ctx.device.type == "cpu"
        """Read each verdict at the next step: free where the step already syncs (several ranks) or nothing runs
        ahead of the host (CPU); else at the next log, checkpoint or end."""
        self.pending: list[_Verdict] = []
        self.streak = 0  # unapplied steps in a row, as of the last settled verdict
        self.last_applied = 0  # the last settled step that was applied (the weights are its)
        self.nonfinite: list[int] = []  # first steps, for the report
        self.nonfinite_total = 0
        self.spikes: list[int] = []
        self.spikes_total = 0
        self.history = torch.zeros(self.window, dtype=torch.float64, device=ctx.device)
        self.applied = torch.zeros((), dtype=torch.long, device=ctx.device)  # applied steps seen by the spike check

    # -- on the device, every step ------------------------------------------------------------------------------
    def objective_scale(self, loss_sum: torch.Tensor) -> torch.Tensor | None:
        """The factor of this rank's last micro-batch objective: 1, or NaN when this rank's loss of the step
        (``loss_sum``, all micro-batches) is not finite, so every rank's reduced gradient is; None in one process."""
        if not self.ctx.distributed:
            return None
        return torch.where(torch.isfinite(loss_sum), 1.0, math.nan).to(loss_sum.dtype)

    def apply(self, optimizer: torch.optim.Optimizer, micro_losses: list[torch.Tensor], count: torch.Tensor,
              norm: torch.Tensor, *, step: int, names: list[list[str]]) -> None:
        """Step ``optimizer`` unless step ``step`` is not finite (or a spike to skip); keep the verdict."""
        local = torch.stack([loss.detach().double() for loss in micro_losses])
        loss_sum = local.sum()
        norm = norm.detach().double().to(loss_sum.device)
        bad = ~(torch.isfinite(norm) & torch.isfinite(loss_sum))
        count = count.detach().double().to(loss_sum.device)
        if self.factor is not None:
            loss, reference, spike = self._spike(loss_sum, count, bad)
        else:
            loss, reference, spike = torch.full_like(norm, math.nan), torch.full_like(norm, math.nan), \
                torch.zeros_like(bad)
        skip = bad | (spike & self.skip_spikes)
        if self.fused:
            optimizer.found_inf = skip.float()  # fused AdamW skips its whole update where this is 1 (GradScaler's flag)
            try:
                optimizer.step()
            finally:
                optimizer.found_inf = None
        elif not bool(skip):  # the foreach kernels have no such flag: the one host read of a step with adamw_torch
            optimizer.step()
        values = torch.stack([bad.double(), spike.double(), skip.double(), loss, reference, norm, loss_sum, count])
        self.pending.append(_Verdict(step, values, ~torch.isfinite(local), names))

    def _spike(self, loss_sum: torch.Tensor, count: torch.Tensor,
               bad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(global mean loss, reference, spike) of this step; the history takes the loss when the step is applied."""
        total = loss_sum.clone()
        if self.ctx.distributed:
            total = self.ctx.all_reduce_sum(total)
        loss = total / count.clamp(min=1.0)
        reference = self.history.sum() / self.window
        spike = (self.applied >= self.window) & (loss > self.factor * reference) & ~bad
        applied = ~bad & ~(spike & self.skip_spikes)
        slot = (self.applied % self.window).view(1)
        self.history.index_copy_(0, slot, torch.where(applied, loss, self.history.index_select(0, slot)[0]).view(1))
        self.applied += applied.long()
        return loss, reference, spike

    # -- on the host, when the verdicts are read -------------------------------------------------------------------
    def settle(self, *, force: bool = False) -> DivergenceError | None:
        """Read the kept verdicts (``force``: now; else only where that is free), log spikes, and return the error
        that stops the run when the unapplied steps in a row reach ``max_nonfinite_steps``. Every rank calls it at
        the same points and reads the same verdicts (a spike or the stop gathers the samples: a collective)."""
        if not self.pending or not (force or self.every_step):
            return None
        rows = torch.stack([verdict.values for verdict in self.pending]).tolist()
        pending, self.pending = self.pending, []
        stop: tuple[_Verdict, list[float], int] | None = None  # the verdict that reached the limit, its streak
        for verdict, row in zip(pending, rows, strict=True):
            bad, spike, skipped = bool(row[0]), bool(row[1]), bool(row[2])
            if bad:
                self.nonfinite_total += 1
                if len(self.nonfinite) < FIRST_STEPS:
                    self.nonfinite.append(verdict.step)
            if spike:
                self.spikes_total += 1
                if len(self.spikes) < FIRST_STEPS:
                    self.spikes.append(verdict.step)
                self._log_spike(verdict, row)
            if not skipped:
                self.streak, self.last_applied = 0, verdict.step
                continue
            self.streak += 1
            if bad and self.ctx.is_main:
                logger.warning("step %d: loss or grad norm not finite (grad norm %s): not applied (%d in a row, "
                               "training.max_nonfinite_steps = %d)", verdict.step, _number(row[5]), self.streak,
                               self.limit)
            if self.streak >= self.limit and stop is None:
                stop = (verdict, row, self.streak)  # later verdicts (read late: one process on a GPU) still count
        return None if stop is None else self._error(*stop)

    def _gathered(self, verdict: _Verdict) -> tuple[float, list[str], list[str]]:
        """(the step's global loss, the samples of non-finite micro-batches, all its samples) over every rank."""
        mine = (float(verdict.values[6]), verdict.local.tolist(), verdict.names)
        parts = self.ctx.all_gather_object(mine)[::self.ctx.sp_degree]  # sequence-parallel ranks share their samples
        loss = sum(part[0] for part in parts) / max(float(verdict.values[7]), 1.0)
        flagged = [name for _, flags, names in parts for flag, group in zip(flags, names, strict=True) if flag
                   for name in group]
        every = [name for _, _, names in parts for group in names for name in group]
        return loss, flagged, every

    def _error(self, verdict: _Verdict, row: list[float], streak: int) -> DivergenceError:
        loss, flagged, every = self._gathered(verdict)
        start = verdict.step - streak + 1
        what = "not finite" if row[0] else f"a loss spike (> {self.factor:g} x {_number(row[4])})"
        which = (f"samples with a non-finite loss: {_listed(flagged)}" if flagged else
                 f"the step's samples: {_listed(every)}")
        steps = f"steps {start}-{verdict.step}" if start < verdict.step else f"step {verdict.step}"
        return DivergenceError(
            f"step {verdict.step}: loss {_number(loss)}, grad norm {_number(row[5])}: {what} in {streak} "
            f"step(s) in a row (training.max_nonfinite_steps = {self.limit}); {steps} not applied, the weights are "
            f"those of step {self.last_applied}; {which}; nothing saved or exported after it (lower "
            "training.learning_rate, set training.max_grad_norm, or check these samples)")

    def _log_spike(self, verdict: _Verdict, row: list[float]) -> None:
        _, _, every = self._gathered(verdict)
        if self.ctx.is_main:
            logger.warning("step %d: loss spike: %s > %g x %s (mean of the last %d applied steps)%s; samples: %s",
                           verdict.step, _number(row[3]), self.factor, _number(row[4]), self.window,
                           ": not applied" if row[2] else "", _listed(every))

    def check_weights(self, model: torch.nn.Module, step: int) -> DivergenceError | None:
        """An error when a weight of ``model`` (this rank's shards, agreed over ranks: a collective) is not finite,
        so a checkpoint of it is never written."""
        bad = torch.zeros((), device=self.ctx.device)
        for param in model.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            bad += (~torch.isfinite(local.detach())).any().float()
        if self.ctx.all_reduce_sum(bad.view(1)).item() == 0:
            return None
        return DivergenceError(f"step {step}: the weights are not finite although every applied step was; "
                               "nothing saved or exported (lower training.learning_rate)")

    # -- what is reported and resumed --------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Counts for ``data_report.json`` and the metrics (as of the last settled verdict)."""
        found = {"nonfinite_steps": self.nonfinite_total, "nonfinite_first_steps": list(self.nonfinite)}
        if self.factor is not None:
            found.update(loss_spikes=self.spikes_total, loss_spike_first_steps=list(self.spikes))
        return found

    def state_dict(self) -> dict[str, Any]:
        assert not self.pending, "settle() before saving"
        return {"streak": self.streak, "last_applied": self.last_applied, "nonfinite": list(self.nonfinite),
                "nonfinite_total": self.nonfinite_total, "spikes": list(self.spikes), "spikes_total": self.spikes_total,
                "history": self.history.tolist(), "applied": int(self.applied)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.streak, self.last_applied = int(state["streak"]), int(state["last_applied"])
        self.nonfinite, self.nonfinite_total = list(state["nonfinite"]), int(state["nonfinite_total"])
        self.spikes, self.spikes_total = list(state["spikes"]), int(state["spikes_total"])
        history = torch.tensor(state["history"], dtype=torch.float64)
        if history.numel() == self.window:  # a changed window starts its history again
            self.history.copy_(history)
            self.applied.fill_(int(state["applied"]))


def _listed(names: list[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:SHOWN_SAMPLES])
    return shown + (f" and {len(names) - SHOWN_SAMPLES} more" if len(names) > SHOWN_SAMPLES else "")
