"""The training loop: one process or torchrun's N, FSDP2, token-mean loss, DCP checkpoints, HF export.

One optimiser step takes ``gradient_accumulation_steps`` micro-batches per rank (for packed data,
``per_device_train_batch_size`` packed rows per micro-batch). Their predicted label tokens are
counted first and summed over ranks, and each micro-batch backpropagates
``sum of its token losses / that global count``: the step's gradient is the gradient of the mean
loss over every label token of the global batch, whatever the split into ranks and micro-batches.
Loss, token counts and gradient norms stay on the device between ``logging_steps``.

Skipped samples (``data.on_error: skip``, ``filter_overlong``) are never silent: a warning per reason
the first time it occurs (with the sample's file and line), then a running count at most once a
minute; the samples seen and skipped, summed over ranks, ride on each step's label-count all-reduce
and go into every metrics record. ``data_report.json`` in ``output_dir`` holds the counts per reason and
the first examples. When the skipped share exceeds ``data.max_skip_fraction`` every rank stops with the
same one-line :class:`~vlforge.data.errors.SkipLimitError`: during the run once it is clearly over
(:func:`vlforge.data.errors.over_limit`), and at the end on the exact share (after the last checkpoint,
before the export).

The policies around a step are components the loop calls: :mod:`vlforge.train.guards` (non-finite steps and loss
spikes are not applied; too many in a row stop the run), :mod:`vlforge.train.preemption` (a stop signal ends the
run at a step boundary with a checkpoint), :mod:`vlforge.train.watchdog` (a rank that dies or stalls is named and
ends the others), the checkpointer (:mod:`vlforge.train.checkpoint`: a failed write removes its unfinished
directory) and the metrics (:mod:`vlforge.train.metrics`).

Example (CPU, about a minute):
    >>> from vlforge.train.trainer import run
    >>> result = run("examples/qwen3_vl_tiny.yaml", ["training.max_steps=10"])  # doctest: +SKIP
    >>> result.losses[0] > result.losses[-1]  # doctest: +SKIP
    True
    or: ``vlforge train examples/qwen3_vl_tiny.yaml training.max_steps=10``
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch

from vlforge.config import preflight
from vlforge.config.data import data_config
from vlforge.config.load import load_config
from vlforge.config.preflight import DATA_REPORT, FINAL_DIR
from vlforge.config.schema import TrainConfig
from vlforge.data.config import resolve_entries
from vlforge.data.errors import SkipLedger, SkipWarnings, limit_error, over_limit
from vlforge.data.identity import data_files
from vlforge.dist import DistContext, init_distributed
from vlforge.errors import ConfigError, DataError, VlforgeError, WriteError
from vlforge.models.blocks import CompileWatch
from vlforge.models.families import supports
from vlforge.outputs import atomic_write_json, write_failure
from vlforge.terminate import TerminateSignal
from vlforge.train import checkpoint as ckpt
from vlforge.train.data_setup import RankData, open_stream, processor_for
from vlforge.train.guards import StepGuard
from vlforge.train.loss import LossTerms, forward_loss, label_count, router_aux_coef, to_device
from vlforge.train.metrics import CLOSING_KEY, MetricsLogger
from vlforge.train.model_setup import TrainModel, fill_missing_grads, prepare_model
from vlforge.train.optim import build_optimizer, build_scheduler
from vlforge.train.preemption import (
    PreemptedError,
    StopSignals,
    interruption,
    stopped_by,
    worker_init,
)
from vlforge.train.sp import (
    SequenceParallel,
    setup_sequence_parallel,
    shard_label_count,
    sp_token_loss_sum,
)
from vlforge.train.sp_linear import split_linear_attention
from vlforge.train.watchdog import Heartbeats, RankLostError, in_step

logger = logging.getLogger(__name__)

SKIP_KEY = "data.max_skip_fraction"


@dataclass
class RunResult:
    """What a finished run produced (on every rank; files are written by rank 0)."""

    output_dir: Path
    steps: int
    losses: list[float] = field(default_factory=list)
    """Logged mean loss of every logging interval."""
    eval_losses: list[float] = field(default_factory=list)
    checkpoint: Path | None = None
    export_dir: Path | None = None
    resumed_from: Path | None = None
    start_step: int = 0
    """The step the run started from (that of ``resumed_from``, else 0)."""
    data_report: dict[str, Any] = field(default_factory=dict)
    """Samples seen / used / skipped (per reason, first examples) and packing stats, summed over ranks."""
    model: torch.nn.Module | None = None
    """The trained model (sharded with FSDP when distributed)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def micro_batches(cfg: TrainConfig) -> int:
    """Batches drawn from the stream per optimiser step and rank."""
    per_micro = cfg.training.per_device_train_batch_size if cfg.packing.packing else 1
    return cfg.training.gradient_accumulation_steps * per_micro


EXACT_COUNT_RECORDS = 256
"""Up to this many records (over all epochs) the schedule comes from a real counting pass: as cheap as sampling."""


def count_steps(cfg: TrainConfig, data_cfg: Any, processor: Any, ctx: DistContext, base_dir: str) -> int:
    """Optimiser steps of ``num_train_epochs``, the same on every rank (min over ranks).

    Record counts come from file metadata; a small dataset is counted exactly by one pass over this rank's
    real stream, a larger one is estimated from the counts and the lengths of a fixed sample of records
    (:mod:`vlforge.data.estimate`): start-up does not grow with the dataset. With DataLoader workers each
    worker packs (and flushes) its own share, and the count follows that. A fractional epoch count takes
    that share of the steps.
    """
    from vlforge.data.config import resolve_entries
    from vlforge.data.estimate import estimate_batches, record_counts

    workers = max(cfg.dataloader_num_workers, 1)
    shards = [ctx.data_rank * workers + role for role in range(workers)]
    num_shards = ctx.data_world * workers
    records = sum(record_counts(resolve_entries(data_cfg, base_dir)))
    skipped: Counter = Counter()
    if records * data_cfg.epochs <= EXACT_COUNT_RECORDS:
        logger.info("schedule: counting the batches of %d record(s) (set training.max_steps to skip it)", records)
        batches = 0
        for shard in shards:  # with DataLoader workers each one packs (and flushes) its own share
            stream = open_stream(data_cfg, processor, rank=shard, world_size=num_shards, base_dir=base_dir)
            batches += sum(1 for _ in stream)
            skipped.update(stream.report()["skipped"])
            stream.close()
        how = "counted"
    else:
        logger.info("schedule: estimating the batches of %d records from a sample of their lengths", records)
        est = estimate_batches(data_cfg, processor, base_dir=base_dir, shards=shards, num_shards=num_shards)
        batches = sum(est.batches)
        skipped.update(est.skipped)
        how = (f"estimated from {records} records and {est.sampled} sampled lengths "
               f"({'cached' if est.cached else 'measured'}, {est.admitted_fraction:.0%} usable)")
    if ctx.all_reduce_min(batches) == 0:  # every rank stops together
        counts = ", ".join(f"{k}={v}" for k, v in sorted(skipped.items())) or "none"
        where = f"rank {ctx.rank} has {batches} batch(es)" if ctx.distributed else "no usable sample"
        raise DataError(f"data: {where} in {data_cfg.epochs} epoch(s) (skipped here: {counts}); check "
                        "packing.max_length / packing_length, filter_overlong and the dataset")
    available = ctx.all_reduce_min(batches // micro_batches(cfg))
    epochs = cfg.training.num_train_epochs
    passes = data_cfg.epochs or math.ceil(epochs)
    total = min(available, math.ceil(epochs / passes * available))
    if total < 1:
        raise ConfigError(f"data: {passes} epoch(s) give {batches} batch(es) on rank {ctx.rank}, fewer than the "
                          f"{micro_batches(cfg)} one optimiser step needs; lower gradient_accumulation_steps")
    logger.info("schedule: %d optimiser steps (%g epoch(s)), %s", total, epochs, how)
    return total


@dataclass(frozen=True)
class StepTotals:
    """What every rank knows at the start of a step, after its one all-reduce."""

    count: torch.Tensor | None
    """Label tokens of the step summed over ranks; None on every rank when any rank ran out of data."""
    skips: tuple[int, int]
    """Samples seen and skipped so far, summed over the data ranks."""
    requests: tuple[int, ...] = ()
    """Per stop signal: the ranks that received it (:class:`~vlforge.train.preemption.StopSignals`)."""


def sync_step(ctx: DistContext, batches: list[dict[str, Any]] | None, count: Any = label_count,
              skips: tuple[int, int] = (0, 0), requests: list[int] | tuple[int, ...] = ()) -> StepTotals:
    """The step's :class:`StepTotals`: label tokens, ``skips`` (this rank's samples seen, skipped) and stop-signal
    ``requests`` (this rank's, one 0/1 per signal) summed over ranks.

    ``batches`` is None on a rank whose stream ended. The has-data flag, the skip counts and the stop requests ride
    on the label-count all-reduce (float64: exact counts), so all ranks stop together and take the same
    skip-limit and stop decisions (no rank is left waiting in a collective). Sequence-parallel ranks share a data
    shard: only the first of each group contributes its skips.
    """
    local = torch.stack([count(b) for b in batches]).sum().float() if batches else torch.zeros(())
    if not ctx.distributed:
        return StepTotals(None if batches is None else to_device(local, ctx.device), skips, tuple(requests))
    mine = skips if ctx.rank % ctx.sp_degree == 0 else (0, 0)
    values = torch.tensor([0.0, 1.0 if batches is not None else 0.0, *mine, *requests], dtype=torch.float64)
    values[0] = local.cpu().double()
    summed = ctx.all_reduce_sum(values.to(ctx.device))
    host = summed.tolist()  # the one host sync of a step, needed to decide to go on
    totals, asked = (int(host[2]), int(host[3])), tuple(int(v) for v in host[4:])
    if int(host[1]) < ctx.world_size:
        return StepTotals(None, totals, asked)
    return StepTotals(summed[0].float(), totals, asked)


def step_totals(ctx: DistContext, batches: list[dict[str, Any]] | None, count: Any = label_count,
                skips: tuple[int, int] = (0, 0)) -> tuple[torch.Tensor | None, tuple[int, int]]:
    """(label tokens, skips) of :func:`sync_step`."""
    totals = sync_step(ctx, batches, count, skips)
    return totals.count, totals.skips


def global_label_count(ctx: DistContext, batches: list[dict[str, Any]] | None,
                       count: Any = label_count) -> torch.Tensor | None:
    """Label tokens of this step summed over ranks, or None on every rank when any rank ran out of data."""
    return step_totals(ctx, batches, count)[0]


class Trainer:
    """Runs one training config; see the module docstring. Use :func:`run`."""

    def __init__(self, cfg: TrainConfig, *, progress: bool = True, export: bool = True, base_dir: str = ".",
                 ctx: DistContext | None = None) -> None:
        self.cfg, self.progress, self.export, self.base_dir = cfg, progress, export, base_dir
        self.ctx = ctx or init_distributed(device=torch.device("cpu") if cfg.training.use_cpu else None,
                                           timeout=datetime.timedelta(seconds=cfg.training.ddp_timeout))
        self.output_dir = Path(cfg.checkpointing.output_dir)
        self._exporting: str | None = None  # while the finished run exports: where an interrupt stops it
        # Set by setup(): the model, its data, the optimiser and where the run resumes from.
        self.ready = False
        self.tm: TrainModel | None = None
        self.model: torch.nn.Module | None = None
        self.sp: SequenceParallel | None = None
        self.data_cfg: Any = None
        self.processor: Any = None
        self.total = 0
        self.epoch_steps: int | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.stream: RankData | None = None
        self.step = 0
        self.skips = (0, 0)  # samples seen, skipped: summed over data ranks as of the last step
        self.interval = _Interval(self.ctx.device)  # the steps since the last metrics record
        self.skip_warnings = SkipWarnings("data")
        self.resumed_from: Path | None = None
        self.router_coef = 0.0  # router_aux_loss_coef of a MoE model whose config turns the router loss on
        self.step_router_aux = torch.zeros(())  # this rank's mean router loss over the last step's micro-batches
        self.step_losses: list[torch.Tensor] = []  # this rank's token-loss sum of each micro-batch of the last step
        self.guard: StepGuard | None = None
        self.sources: list[str] = []  # the dataset file of each data entry, to name a batch's samples
        self.data_files: list[dict[str, Any]] = []  # their identities, saved with each checkpoint (resume checks)
        self.keep_gathered: bool | None = None  # the start-up plan's answer for fsdp.reshard_after_forward (auto)

    # -- set-up -----------------------------------------------------------------------------------
    def check_outputs(self) -> None:
        """Output paths checked before the model loads: one-line errors, nothing of the user's touched."""
        preflight.check_outputs(self.cfg, export=self.export)

    def setup(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.check_outputs()
        seed_everything(cfg.training.seed)
        self.check_layout()
        self.data_cfg = data_config(cfg)
        entries = resolve_entries(self.data_cfg, self.base_dir)
        self.sources = [str(entry.path) for entry in entries]
        self.data_files = data_files(entry.path for entry in entries)
        self.resumed_from = ckpt.resume_target(cfg.checkpointing.resume, self.output_dir, warn=ctx.is_main)
        finished = self.resumed_from is not None and cfg.training.max_steps is not None and \
            int(ckpt.read_state(self.resumed_from).get("step", 0)) >= cfg.training.max_steps  # reads no more data
        if self.resumed_from is not None and not cfg.checkpointing.ignore_data_skip and not finished:
            change = ckpt.data_change(self.resumed_from, self.data_files)  # each rank its own files (local copies)
            found = next((c for c in (ctx.all_gather_object(change) if ctx.distributed else [change]) if c), None)
            if found is not None:  # every rank stops with the same line
                raise ConfigError(found)
        self.plan_verdict()
        self.tm = prepare_model(cfg, ctx, keep_gathered=self.keep_gathered)
        self.model = self.tm.model
        self.router_coef = router_aux_coef(self.model)
        if self.router_coef:
            logger.info("router loss: %g x load-balancing loss added to the objective (output_router_logits), logged "
                        "as aux_loss", self.router_coef)
        # --- sequence parallelism (vlforge.train.sp): sp ranks of a group share the data shard ---
        if cfg.sp_ulysses_degree > 1:
            self.sp = setup_sequence_parallel(self.model, cfg.sp_ulysses_degree, ctx)
            if supports(self.tm.loaded.family, "linear_attention"):
                split_linear_attention(self.model, self.sp)  # Gated DeltaNet layers by heads too
            ctx.sp_degree = cfg.sp_ulysses_degree
        self.processor = processor_for(cfg, self.tm.loaded, self.data_cfg)
        self.total = cfg.training.max_steps or count_steps(cfg, self.data_cfg, self.processor, ctx, self.base_dir)
        self.epoch_steps = self._epoch_steps() if cfg.checkpointing.save_strategy == "epoch" else None
        self.optimizer = build_optimizer(self.model.parameters(), cfg.training, ctx.device)
        self.scheduler = build_scheduler(self.optimizer, cfg.training, self.total)
        self.guard = StepGuard(cfg.training, ctx, self.optimizer)
        self.stream = RankData(self.data_cfg, self.processor, rank=ctx.data_rank, world_size=ctx.data_world,
                               workers=cfg.dataloader_num_workers, base_dir=self.base_dir,
                               worker_init=worker_init(cfg.training.stop_signals))
        if ctx.is_main:
            ckpt.clear_unfinished(self.output_dir)
        if self.resumed_from is not None:
            state, data_states = ckpt.load_checkpoint(self.resumed_from, ctx, self.model, self.optimizer,
                                                      self.scheduler)
            self.step = int(state["step"])
            if "guard" in state:
                self.guard.load_state_dict(state["guard"])
            if "metrics_interval" in state:  # the steps after the last record before it: the next record has them
                self.interval.load_state_dict(state["metrics_interval"], ctx)
            saved_sp = int(state.get("config", {}).get("sp_ulysses_degree", 1))
            if cfg.checkpointing.ignore_data_skip:
                if ctx.is_main:
                    logger.info("checkpointing.ignore_data_skip: %s resumes at step %d with its weights, optimiser "
                                "and schedule; the data is read from its start", self.resumed_from.name, self.step)
            else:
                self.stream.load_state_dict(data_states[::saved_sp])  # one state per data shard
        self.ready = True

    def check_layout(self) -> None:
        """The parallel layout against the model's config and this run's processes, before any weight loads."""
        degree = self.cfg.sp_ulysses_degree
        if degree > 1:
            from vlforge.config.parallel import check_sequence_parallel, sequence_parallel_heads
            from vlforge.models.load import load_model_config

            model_config = load_model_config(self.cfg.model.load_from_pretrained_path)
            check_sequence_parallel(degree, family=model_config.model_type, world=self.ctx.world_size,
                                    **sequence_parallel_heads(model_config))

    def plan_verdict(self) -> None:
        """Log the memory plan's one-line verdict (a warning when the estimate exceeds the free memory here)."""
        if not self.ctx.is_main or not self.cfg.model.memory_plan:
            return
        from vlforge.memory.verdict import startup_verdict

        cuda = [self.ctx.device] if self.ctx.device.type == "cuda" else []
        try:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            with torch.random.fork_rng(devices=cuda):  # only rank 0 plans: the ranks' RNG streams must not diverge
                facts: dict[str, Any] = {}
                line, over = startup_verdict(self.cfg, world=self.ctx.world_size, device=self.ctx.device, facts=facts,
                                             local_processes=local)
        except Exception as error:  # an estimate must never stop a run
            logger.debug("plan: no estimate (%s: %s)", type(error).__name__, error)
            return
        self.keep_gathered = facts.get("keep_gathered")
        (logger.warning if over else logger.info)(line)

    # -- one step ---------------------------------------------------------------------------------
    def _draw(self) -> list[dict[str, Any]] | None:
        wanted = micro_batches(self.cfg)
        batches = []
        for batch in self.stream:
            batches.append(pin_batch(batch) if self.pin else batch)
            if len(batches) == wanted:
                return batches
        return None

    @property
    def pin(self) -> bool:
        """``dataloader_pin_memory`` on a CUDA device: batches go through pinned host memory."""
        return self.cfg.dataloader_pin_memory and self.ctx.device.type == "cuda"

    def _epoch_steps(self) -> int:
        """Optimiser steps of one pass over the data (``save_strategy: epoch``)."""
        cfg = self.cfg
        if cfg.training.max_steps is None:  # the counting pass already ran: its steps over the epochs
            return max(1, round(self.total / cfg.training.num_train_epochs))
        one = cfg.model_copy(update={"training": cfg.training.model_copy(update={"max_steps": None,
                                                                                  "num_train_epochs": 1.0})})
        return count_steps(one, self.data_cfg.model_copy(update={"epochs": 1}), self.processor, self.ctx,
                           self.base_dir)

    def _save_due(self) -> bool:
        """A checkpoint at this step: every ``save_steps`` / epoch (``save_strategy``), and always at the end."""
        strategy = self.cfg.checkpointing.save_strategy
        if self.step == self.total:
            return True
        if strategy == "steps":
            return self.step % self.cfg.checkpointing.save_steps == 0
        return strategy == "epoch" and self.step % self.epoch_steps == 0

    def _step_totals(self, batches: list[dict[str, Any]] | None, stops: StopSignals) -> StepTotals:
        """The step's totals over ranks (``count`` None: data ran out); updates ``self.skips``, warns of new skips."""
        ledger = SkipLedger.from_dict(self.stream.report())
        self.skip_warnings.update(ledger)
        totals = sync_step(self.ctx, batches, self._label_count, (ledger.seen, ledger.total), stops.requests())
        self.skips = totals.skips
        return totals

    def _names(self, batch: dict[str, Any]) -> list[str]:
        """The samples of ``batch`` as ``file:line N`` (as the skip report names them)."""
        return [f"{self.sources[entry]}:{location}" for entry, location in batch.get("sample_ids", ())]

    def _forward(self, batch: dict[str, Any]) -> LossTerms:
        float_dtype = torch.bfloat16 if self.cfg.training.bf16 else None
        with self.tm.autocast_context(self.ctx.device):
            router_aux = bool(self.router_coef) and self.model.training
            if self.sp is not None:
                return sp_token_loss_sum(self.model, batch, self.ctx.device, float_dtype, self.sp,
                                         router_aux=router_aux)
            return forward_loss(self.model, batch, self.ctx.device, float_dtype, router_aux=router_aux)

    def _label_count(self, batch: dict[str, Any]) -> torch.Tensor:
        """Predicted label tokens of ``batch`` on this rank (its sequence shard under sequence parallelism)."""
        return label_count(batch) if self.sp is None else shard_label_count(batch, self.sp)

    def accumulate(self, batches: list[dict[str, Any]],
                   count: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward of one step's micro-batches: gradients of the global token-mean loss.

        ``count``: the global label tokens (:func:`global_label_count`), computed here when omitted.
        Returns (global label tokens, this rank's loss sum) as device tensors; no optimiser step. A MoE model with
        the router loss on adds ``router_coef x`` the mean router loss over micro-batches and ranks (what
        transformers adds per forward), and leaves this rank's mean in ``step_router_aux``.
        """
        ctx = self.ctx
        if count is None:
            count = global_label_count(ctx, batches, self._label_count)
        # FSDP averages gradients over ranks; the loss already divides by the global count.
        scale = ctx.world_size if self.tm.sharded else 1
        denominator = count.clamp(min=1.0)
        loss_sum = torch.zeros((), device=ctx.device)
        aux_sum = torch.zeros((), device=ctx.device)
        self.step_losses = []
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            if self.tm.sharded:  # reduce-scatter once per step, after the last micro-batch
                self.model.set_requires_gradient_sync(last)
            terms = self._forward(batch)
            objective = terms.token_sum * scale / denominator
            if terms.router_aux is not None:
                # the mean over the data shards: the ranks' gradients are averaged (FSDP) or summed (scale); the sp
                # ranks of a group share one loss and their gradients add up to it (vlforge.train.sp_router)
                objective = objective + self.router_coef * terms.router_aux * scale / (len(batches) * ctx.data_world)
                aux_sum += terms.router_aux.detach()
            if last and self.guard is not None:  # a non-finite loss here makes every rank's gradient non-finite
                spread = self.guard.objective_scale(loss_sum + terms.token_sum.detach() + aux_sum)
                objective = objective if spread is None else objective * spread
            objective.backward()
            loss_sum += terms.token_sum.detach()
            self.step_losses.append(terms.token_sum.detach())
        self.step_router_aux = aux_sum / len(batches)
        if not self.tm.sharded:
            fill_missing_grads(self.model)
            if ctx.distributed:
                self._all_reduce_grads()
        return count, loss_sum

    def train_step(self, batches: list[dict[str, Any]],
                   count: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimiser step (not applied when the step guard finds it non-finite); returns (global label tokens,
        local loss sum, grad norm) as device tensors."""
        count, loss_sum = self.accumulate(batches, count)
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.training.max_grad_norm or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.guard.apply(self.optimizer, self.step_losses, count, norm, step=self.step + 1,
                         names=[self._names(batch) for batch in batches])
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return count, loss_sum, norm.detach().float()

    def _all_reduce_grads(self) -> None:
        import torch.distributed as dist

        dtype = getattr(torch, self.cfg.fsdp.reduce_dtype) if self.cfg.fsdp.reduce_dtype else None
        for param in self.model.parameters():
            if param.grad is None:
                continue
            if dtype is None or dtype == param.grad.dtype:
                dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            else:  # fsdp.reduce_dtype: the sum travels in that dtype, as FSDP2's reduce_dtype
                grad = param.grad.to(dtype)
                dist.all_reduce(grad, op=dist.ReduceOp.SUM)
                param.grad.copy_(grad)

    # -- eval -------------------------------------------------------------------------------------
    def evaluate(self) -> float:
        """Mean token loss over the eval set (all ranks; every rank runs the same number of forwards)."""
        ctx = self.ctx
        eval_cfg = data_config(self.cfg, eval_set=True).model_copy(update={"packing": self.data_cfg.packing})
        stream = open_stream(eval_cfg, self.processor, rank=ctx.data_rank, world_size=ctx.data_world,
                             base_dir=self.base_dir)
        batches = list(stream)
        stream.close()
        if stream.ledger.total:
            logger.warning("eval data: skipped %d of %d samples: %s", stream.ledger.total, stream.ledger.seen,
                           stream.ledger.top(len(stream.ledger.counts)))
        # every rank decides together, before any forward: a lone raise would leave the others in FSDP
        if ctx.all_reduce_min(len(batches)) == 0:
            raise ConfigError(f"data.eval_dataset_path: the eval set gives no batch on at least one of the "
                              f"{ctx.data_world} data rank(s); use a larger eval set or fewer processes")
        rounds = -ctx.all_reduce_min(-len(batches))  # max over ranks: FSDP needs matching forwards
        totals = torch.zeros(2, device=ctx.device)
        self.model.eval()
        with torch.no_grad():
            for i in range(rounds):
                real = i < len(batches)
                batch = batches[i] if real else batches[0]
                part = self._forward(batch).token_sum
                if real:
                    totals += torch.stack([part.float(), self._label_count(batch).to(ctx.device).float()])
        self.model.train()
        ctx.all_reduce_sum(totals)
        return float(totals[0] / totals[1].clamp(min=1))

    # -- the loop ---------------------------------------------------------------------------------
    def _meta(self) -> dict[str, Any]:
        loaded = self.tm.loaded
        return {"model_source": loaded.source, "model_path": str(loaded.path), "family": loaded.family,
                "config": self.cfg.model_dump(mode="json"), "data_files": self.data_files}

    def _save(self, log: MetricsLogger | None = None, result: RunResult | None = None) -> Path:
        """A checkpoint of this step (a collective; the caller settles the step guard's verdicts first). Weights that
        are not finite are never written (during the run, ``log`` / ``result``: the data report first)."""
        diverged = self.guard.check_weights(self.model, self.step)
        if diverged is not None:
            if log is not None and result is not None:
                self._stop(log, result, diverged)
            raise diverged
        return ckpt.save_checkpoint(self.output_dir, self.step, self.ctx, self.model, self.optimizer,
                                    self.scheduler, self.stream.state_dict(),
                                    {**self._meta(), "guard": self.guard.state_dict(),
                                     "metrics_interval": self.interval.state_dict(self.ctx)},
                                    keep=self.cfg.checkpointing.save_total_limit)

    def _newest(self) -> str:
        """Where a rerun continues from, for the line of a stop."""
        newest = ckpt.latest_complete(self.output_dir)
        if newest is None:
            return "there is no complete checkpoint yet (the same command starts over)"
        how = "the same command" if self.cfg.checkpointing.resume == "auto" else "checkpointing.resume=auto"
        return f"the newest complete checkpoint is {newest} ({how} continues from it)"

    def train(self) -> RunResult:
        """Train to the end, or to a stop that leaves a known state: a stop signal (a checkpoint, exit 4), too many
        non-finite steps (exit 3), a failed write or another rank lost (exit 5), each one line."""
        training = self.cfg.training
        stops = StopSignals(training.stop_signals, training.stop_grace_period, newest=self._newest)
        where = in_step(0)  # of a Ctrl-C while the handlers are set, or restored (after the loop)
        try:
            with stops, Heartbeats(self.ctx, training.rank_timeout, newest=self._newest) as beats:
                try:
                    return self._train(stops, beats)
                except VlforgeError:
                    raise
                except (KeyboardInterrupt, TerminateSignal) as caught:
                    raise stopped_by(caught, self._exporting or in_step(beats.step), self._newest()) from None
                except (Exception, ckpt.CheckpointException) as error:
                    raise self._explained(error, beats) from error
                finally:
                    where = f"after step {self.step}"
        except (KeyboardInterrupt, TerminateSignal) as caught:
            raise stopped_by(caught, where, self._newest()) from None

    def _explained(self, error: BaseException, beats: Heartbeats) -> BaseException:
        """A failed collective whose cause is another rank, or a failed write, as one line; else ``error`` itself."""
        cause = interruption(error)  # Ctrl-C or SIGTERM inside a save: torch reports a short write, not the disk
        if cause is not None:
            return stopped_by(cause, in_step(beats.step), self._newest())
        lost = beats.lost() if self.ctx.distributed else None
        if lost is not None:
            return RankLostError(f"{lost}: rank {self.ctx.rank} stops {in_step(beats.step)} (its collective "
                                 f"failed: {_collective_line(error)}); {self._newest()}")
        found = write_failure(error, no_room_only=True)
        if found is not None:
            where = f" {error.filename}" if isinstance(error, OSError) and error.filename else ""
            return WriteError(f"writing{where} failed {in_step(beats.step)}: {found}; {self._newest()}")
        return error

    def _train(self, stops: StopSignals, beats: Heartbeats) -> RunResult:
        cfg, ctx = self.cfg, self.ctx
        if not self.ready:
            self.setup()
        beats.step = self.step + 1
        result = RunResult(self.output_dir, self.step, resumed_from=self.resumed_from, start_step=self.step)
        log_every = cfg.logging.logging_steps
        eval_every = cfg.training.eval_steps if cfg.training.eval_strategy == "steps" else None
        self.interval.start()
        last_saved = None
        watch = CompileWatch(self.step + 1) if cfg.model.compile else None
        with MetricsLogger(self.output_dir, main=ctx.is_main, report_to=cfg.logging.report_to,
                           run_name=cfg.logging.run_name or self.output_dir.name, total_steps=self.total,
                           progress=self.progress, start_step=self.step, carried_steps=self.interval.steps,
                           config=cfg.model_dump(mode="json")) as log:
            while self.step < self.total:
                beats.step = self.step + 1
                batches = self._draw()
                totals = self._step_totals(batches, stops)
                if totals.count is None:  # some rank ran out: every rank stops here
                    logger.warning("data ran out after %d optimiser steps (of %d)", self.step, self.total)
                    break
                self._stop_if_over(log, result)  # the same totals and verdicts on every rank
                lr = self.scheduler.get_last_lr()[0]
                if watch is not None:
                    watch.begin()
                count, loss_sum, norm = self.train_step(batches, totals.count)
                self.step += 1
                if watch is not None:  # model.compile: the steps that compiled, with their time
                    watch.end(self.step)
                self.interval.add(torch.stack([loss_sum, count / ctx.world_size, norm,
                                               self.step_router_aux.to(ctx.device)]),
                                  sum(_tokens(b) for b in batches), lr)
                log.advance(self.step)
                first = self.step == 1 and cfg.logging.logging_first_step
                if self.step % log_every == 0 or self.step == self.total or first:
                    self._stop_if_over(log, result, settle=True)
                    self._log_interval(log, result)
                if eval_every and self.step % eval_every == 0:
                    value = self.evaluate()
                    result.eval_losses.append(value)
                    log.log({"step": self.step, "eval_loss": value})
                if self._save_due():
                    self._stop_if_over(log, result, settle=True)
                    log.flush()  # every sink holds the steps up to this checkpoint before it exists
                    last_saved = self._save(log, result)
                asked = totals.requests if ctx.distributed else tuple(stops.requests())  # one process: no one to ask
                if any(asked) and self.step < self.total:
                    self._preempted(log, result, asked, stops.names(), last_saved)
            self._stop_if_over(log, result, settle=True)
            self._log_interval(log, result)  # the data ran out between two logs
            ledger = self._finish_data(log, result)
        if last_saved is None and self.resumed_from is not None and result.steps == self.step:
            last_saved = self.resumed_from  # nothing left to train: the checkpoint is the result
        if last_saved is None or ckpt.read_state(last_saved)["step"] != self.step:
            last_saved = self._save() if self.step > 0 else None
        result.steps, result.checkpoint, result.model = self.step, last_saved, self.model
        self.stream.close()
        if over_limit(ledger.seen, ledger.total, cfg.data.max_skip_fraction, final=True):
            raise self._limit_error(ledger)  # after the last checkpoint (resume to export), before the export
        if self.export and last_saved is not None:
            target = self.output_dir / FINAL_DIR
            stops.exporting = f"{last_saved} is complete (vlforge export {last_saved} {target} makes the export)"
            self._exporting = f"while exporting {last_saved.name} to {target}"  # where a Ctrl-C or SIGTERM stops
            if ctx.is_main:
                self._export(last_saved)
            ctx.barrier()
            result.export_dir = target
            if stops.first is not None:
                logger.warning("%s arrived while the finished run exported: the run and its export are complete",
                               signal.Signals(stops.first[0]).name)
        return result

    def _stop_if_over(self, log: MetricsLogger, result: RunResult, *, settle: bool = False) -> None:
        """Stop every rank alike (same totals, same verdicts) when the skipped share is clearly over its limit or
        too many steps in a row were not applied; ``settle``: read the step guard's verdicts now (a log,
        checkpoint or the end). The data report is written first."""
        diverged = self.guard.settle(force=settle)
        if diverged is None and not over_limit(*self.skips, self.cfg.data.max_skip_fraction, final=False):
            return
        self._stop(log, result, diverged)

    def _stop(self, log: MetricsLogger, result: RunResult, error: Exception | None) -> NoReturn:
        """Stop the run with ``error`` (None: the skip limit's): the steps that led to it get their record, then
        the data report is written."""
        self._log_interval(log, result)
        ledger = self._finish_data(log, result)
        self.stream.close()
        raise error or self._limit_error(ledger)

    def _preempted(self, log: MetricsLogger, result: RunResult, requests: tuple[int, ...], names: list[str],
                   last_saved: Path | None) -> None:
        """Every rank learnt of a stop signal at this step: checkpoint it, write the reports, stop with exit 4."""
        self._stop_if_over(log, result, settle=True)
        if last_saved is None or last_saved.name != f"checkpoint-{self.step}":
            self._log_interval(log, result)  # the steps since the last record; the checkpoint then carries none
            log.flush()
            last_saved = self._save(log, result)
        self._finish_data(log, result)
        self.stream.close()
        self.ctx.barrier()
        got = " and ".join(name + (f" (received by {count} of {self.ctx.world_size} processes)"
                                   if self.ctx.distributed else "") for name, count in zip(names, requests, strict=True)
                           if count)
        how = ("the same command continues from it" if self.cfg.checkpointing.resume == "auto" else
               "to continue from it, run with checkpointing.resume=auto")
        raise PreemptedError(f"stopped by {got} at step {self.step} of {self.total}: saved {last_saved}; {how}")

    def _export(self, checkpoint: Path) -> None:
        """``final/`` from ``checkpoint`` (rank 0); a failed write leaves the previous ``final/`` as it was."""
        from vlforge.train.export import export_checkpoint

        target = self.output_dir / FINAL_DIR
        logger.info("exporting %s to %s", checkpoint.name, target)
        try:
            export_checkpoint(checkpoint, target, replace=True)
        except Exception as error:
            found = write_failure(error)
            if found is None:
                raise
            raise WriteError(f"exporting {checkpoint.name} to {target} failed: {found}; {target} is as it was and "
                             f"{checkpoint} is complete (vlforge export {checkpoint} {target} retries)") from error

    def _finish_data(self, log: MetricsLogger, result: RunResult) -> SkipLedger:
        """Every data shard's report summed (a collective), written to ``data_report.json`` and logged by rank 0.

        Sets ``result.data_report`` and returns the summed ledger (the same on every rank).
        """
        from vlforge.data.packing import PackingStats

        ctx = self.ctx
        reports = ctx.all_gather_object(self.stream.report())[::ctx.sp_degree]  # one per data shard
        ledger = SkipLedger.merged([SkipLedger.from_dict(r) for r in reports])
        packing = PackingStats(*(sum(r["packing"][k] for r in reports) for k in
                                 ("batches", "samples", "real_tokens", "computed_tokens", "budget_tokens")))
        limit = self.cfg.data.max_skip_fraction
        over = over_limit(ledger.seen, ledger.total, limit, final=True)
        result.data_report = {**ledger.to_dict(), "max_skip_fraction": limit, "over_limit": over,
                              "step": self.step, "data_shards": len(reports), "packing": packing.to_dict(),
                              **self.guard.report()}
        if ctx.is_main:
            path = atomic_write_json(self.output_dir / DATA_REPORT, result.data_report, writer="train")
            if ledger.total:
                logger.warning("data: %d of %d samples skipped (%.1f%%, limit %.1f%%): %s; report: %s", ledger.total,
                               ledger.seen, 100 * ledger.share, 100 * limit, ledger.top(len(ledger.counts)), path)
            else:
                logger.info("data: %d samples seen, none skipped; report: %s", ledger.seen, path)
        log.log({"step": self.step, **self._progress(), "samples_seen": ledger.seen, "samples_used": ledger.seen - ledger.total,
                 "skipped": ledger.total, "skipped_share": round(ledger.share, 6),
                 "skipped_by_reason": dict(sorted(ledger.counts.items())), CLOSING_KEY: DATA_REPORT,
                 **self.guard.report()})
        return ledger

    def _limit_error(self, ledger: SkipLedger) -> Exception:
        return limit_error(ledger, self.cfg.data.max_skip_fraction, what="data", key=SKIP_KEY,
                           report=self.output_dir / DATA_REPORT)

    def _log_interval(self, log: MetricsLogger, result: RunResult) -> None:
        """The record of the steps since the last one (none: nothing); at a log, a stop or the data's end."""
        interval = self.interval
        if interval.steps == 0:
            return
        record = self._record(interval)
        result.losses.append(record["loss"])
        log.log(record)
        interval.reset()

    def _record(self, interval: _Interval) -> dict[str, Any]:
        """The metrics of the last interval: the one host sync (and all-reduce) per ``logging_steps``."""
        ctx, steps, seconds = self.ctx, interval.steps, time.perf_counter() - interval.since
        loss_sum, count, norm_sum, aux_sum, tokens = interval.totals(ctx)
        router = {"aux_loss": aux_sum / (steps * ctx.world_size)} if self.router_coef else {}
        return {"step": self.step, "loss": loss_sum / max(count, 1.0), **router, "lr": interval.lr,
                "grad_norm": norm_sum / steps, "label_tokens": int(count),
                "tokens_per_s": tokens / ctx.sp_degree / max(seconds, 1e-9),
                **self._progress(), "samples_seen": self.skips[0], "skipped": self.skips[1],
                **{k: v for k, v in self.guard.report().items() if isinstance(v, int)}}

    def _progress(self) -> dict[str, float]:
        """``epoch_progress``: the share of the run's steps done; ``epoch`` (training by epochs): the epochs done,
        as HF Trainer logs it (each epoch is its own pass: no packed row holds two)."""
        share = self.step / self.total if self.total else 0.0
        if self.cfg.training.max_steps is not None:
            return {"epoch_progress": round(share, 4)}
        return {"epoch_progress": round(share, 4), "epoch": round(share * self.cfg.training.num_train_epochs, 4)}


class _Interval:
    """The steps since the last metrics record. Sums stay on the device: loss, label tokens (per rank), grad norm
    and router loss; the host reads them only when the record is made. A checkpoint holds them (summed over ranks),
    so the record after a resume covers the same steps as in a run never stopped."""

    def __init__(self, device: torch.device) -> None:
        self.acc = torch.zeros(4, device=device)
        self.elapsed = 0.0  # seconds of a resumed interval before this process
        self.reset()

    def reset(self) -> None:
        self.acc.zero_()
        self.tokens, self.steps, self.lr, self.since = 0, 0, 0.0, time.perf_counter()

    def start(self) -> None:
        """The clock starts (a resumed interval: where it stopped)."""
        self.since, self.elapsed = time.perf_counter() - self.elapsed, 0.0

    def totals(self, ctx: DistContext) -> tuple[float, float, float, float, float]:
        """(loss sum, label tokens, grad norm sum, router loss sum, input tokens): summed over ranks but the grad
        norm (every rank's is the global one); a collective and a host read."""
        sums = self.acc.clone()
        sums[[0, 1, 3]] = ctx.all_reduce_sum(sums[[0, 1, 3]].contiguous())
        tokens = ctx.all_reduce_sum(torch.tensor([float(self.tokens)], device=ctx.device))
        return (*sums.tolist(), float(tokens.item()))

    def state_dict(self, ctx: DistContext) -> dict[str, Any]:
        """The interval summed over ranks, per data shard and step (a collective), as a checkpoint keeps it."""
        loss, count, norm, router, tokens = self.totals(ctx)
        return {"steps": self.steps, "loss_sum": loss, "label_tokens": count, "grad_norm_sum": norm,
                "router_aux_mean_sum": router / ctx.world_size, "tokens": tokens / ctx.sp_degree,
                "lr": self.lr, "seconds": time.perf_counter() - self.since}

    def load_state_dict(self, state: dict[str, Any], ctx: DistContext) -> None:
        """Rank 0 holds the sums (the record all-reduces them), every rank the step count and the grad norm sum
        (not reduced); the layout of ranks may differ from the saving run's."""
        main = ctx.rank == 0
        self.acc = torch.tensor([state["loss_sum"] if main else 0.0, state["label_tokens"] if main else 0.0,
                                 state["grad_norm_sum"],
                                 state["router_aux_mean_sum"] * ctx.world_size if main else 0.0],
                                device=self.acc.device)
        self.tokens = round(state["tokens"] * ctx.sp_degree) if main else 0
        self.steps, self.lr, self.elapsed = int(state["steps"]), float(state["lr"]), float(state["seconds"])

    def add(self, sums: torch.Tensor, tokens: int, lr: float) -> None:
        """One optimiser step: its device sums, its input tokens and its learning rate (the record's lr is the last)."""
        self.acc += sums
        self.tokens, self.steps, self.lr = self.tokens + tokens, self.steps + 1, lr


def pin_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with every CPU tensor in pinned (page-locked) memory, so the copy to CUDA can be non-blocking."""
    return {k: v.pin_memory() if isinstance(v, torch.Tensor) and v.device.type == "cpu" else v
            for k, v in batch.items()}


def _tokens(batch: dict[str, Any]) -> int:
    if "cu_seqlens" in batch:
        return int(batch["input_ids"].shape[1])
    return int(batch["attention_mask"].sum())


def _collective_line(error: BaseException) -> str:
    """A collective's error in a few words: its first sentence, without the source location gloo puts first."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ")[0][:200]


def run(config: TrainConfig | str | Path, overrides: Iterable[str] = (), *, progress: bool = True,
        export: bool = True, base_dir: str = ".") -> RunResult:
    """Train with ``config`` (a path or a :class:`TrainConfig`) and ``key=value`` overrides."""
    cfg = config if isinstance(config, TrainConfig) else load_config(config, list(overrides))
    if isinstance(config, TrainConfig) and list(overrides):
        raise ConfigError("overrides need a config path; apply them with load_config() first")
    trainer = Trainer(cfg, progress=progress, export=export, base_dir=base_dir)
    try:
        return trainer.train()
    finally:
        trainer.ctx.close()

