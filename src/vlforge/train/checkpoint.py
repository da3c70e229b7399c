"""Training checkpoints with ``torch.distributed.checkpoint`` (DCP): atomic, pruned, resumable on any world size.

Layout of ``OUTPUT_DIR/checkpoint-STEP/``:

- ``weights/``: DCP of ``{"model", "optim"}`` from ``get_state_dict`` (sharded on save, resharded on load,
  so N ranks can resume onto M);
- ``rank-R.pt``: that rank's RNG states and data-pipeline state (plain data, read with ``weights_only=True``);
- ``trainer_state.json``: step, scheduler state, world size, model source (written last).

A checkpoint is written under ``.tmp-checkpoint-STEP``, sealed with a ledger of its files
(:mod:`vlforge.outputs`) and renamed when complete, so a killed run never leaves a partial
``checkpoint-*``. Replacing or pruning a checkpoint removes only the files its ledger lists.

Example:
    >>> import pathlib, tempfile
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> for step in (2, 10):
    ...     (out / f"checkpoint-{step}").mkdir(); _ = (out / f"checkpoint-{step}" / STATE_FILE).write_text("{}")
    >>> latest_checkpoint(out).name
    'checkpoint-10'
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: caught by name

from vlforge import outputs
from vlforge.dist import DistContext
from vlforge.errors import ConfigError, WriteError
from vlforge.train.optim import follow_schedule

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
WEIGHTS_DIR = "weights"
_NAME = re.compile(r"^checkpoint-(\d+)$")


@contextlib.contextmanager
def quiet_single_process():
    """Silence DCP's "assuming the intent is to save/load in a single process" (that is the intent)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def checkpoints(output_dir: Path) -> list[Path]:
    """Directories named ``checkpoint-STEP`` that hold a state file, oldest first (see :func:`problem` for
    whether one can be resumed from)."""
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir()
             if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    found = checkpoints(output_dir)
    return found[-1] if found else None


def problem(path: Path) -> str | None:
    """What keeps ``path`` from being resumed, in a few words, or None for a complete vlforge checkpoint: its
    state file parses and holds a step, world size and scheduler state; vlforge sealed it (the ledger of written
    files); every file the ledger lists is there at its size; every rank's state file and the weights' metadata
    are there. Nothing is read beyond the ledger, the state file and file sizes."""
    state_file = path / STATE_FILE
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"no {STATE_FILE}"
    except (OSError, UnicodeDecodeError) as error:
        return f"{STATE_FILE} cannot be read ({error})"
    except json.JSONDecodeError as error:
        return f"{STATE_FILE} is not JSON ({'empty file' if not state_file.stat().st_size else error})"
    if not isinstance(state, dict):
        return f"{STATE_FILE} is not a JSON object"
    for key, kind in (("step", int), ("world_size", int), ("scheduler", dict)):
        if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
            return f"{STATE_FILE} has no {kind.__name__} {key!r}"
    ledger = outputs.read_ledger(path)
    if ledger is None or not ledger.get("sealed"):
        return "not written by vlforge (no sealed ledger of its files)"
    for name, entry in sorted(ledger["entries"].items()):
        file = path / name
        if not file.is_file():
            return f"incomplete: {name} is missing"
        if entry.get("size") is not None and file.stat().st_size != entry["size"]:
            return f"incomplete: {name} has {file.stat().st_size} bytes, {entry['size']} when written"
    needed = [f"rank-{r}.pt" for r in range(state["world_size"])] + [f"{WEIGHTS_DIR}/.metadata"]
    missing = [name for name in needed if not (path / name).is_file()]
    if missing:
        return f"incomplete: {missing[0]} is missing"
    return None


def resume_target(resume: str, output_dir: Path, *, warn: bool = True) -> Path | None:
    """The checkpoint ``checkpointing.resume`` points at (``auto``, ``none`` or a directory).

    ``auto`` takes the newest checkpoint without a :func:`problem`, skipping each damaged or foreign one with a
    warning (``warn``: this process says so; one rank of a run is enough) - nothing is deleted; a named directory
    with a problem is a :class:`ConfigError` naming it."""
    if resume == "none":
        return None
    if resume == "auto":
        for path in reversed(checkpoints(output_dir)):
            found = problem(path)
            if found is None:
                return path
            if warn:
                logger.warning("resume auto: skipping %s: %s (left in place)", path, found)
        return None
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise ConfigError(f"checkpointing.resume: {path} is not a vlforge checkpoint (no {STATE_FILE})")
    found = problem(path)
    if found is not None:
        raise ConfigError(f"checkpointing.resume: {path}: {found}")
    return path


def data_change(path: Path, files: list[dict[str, Any]]) -> str | None:
    """The one line refusing to resume ``path`` on ``files`` when it was saved reading other data files
    (:func:`vlforge.data.identity.first_change`); None when they are the same, or the checkpoint records none."""
    from vlforge.data.identity import first_change, recorded

    saved = recorded(read_state(path).get("data_files"))
    change = first_change(saved, files) if saved is not None else None
    if change is None:
        return None
    return (f"checkpointing.resume: {path} was saved reading other data: {change}; resuming where it left the data "
            "needs the same files: restore them, or set checkpointing.ignore_data_skip: true to resume the weights "
            "and read the data from its start")


def check_same_model(path: Path, model_state: dict[str, Any], *, key: str = "checkpointing.resume",
                     advice: str = "resume from a checkpoint of this model, or set checkpointing.resume: none with a "
                                   "new output_dir") -> None:
    """Raise a :class:`ConfigError` (``key``: what the line names first; ``advice``: what to do) when the
    checkpoint's weights are not this model's (names and shapes from the DCP metadata against ``model_state``),
    instead of DCP's traceback half-way through loading."""
    from torch.distributed.checkpoint import FileSystemReader

    try:
        saved = FileSystemReader(str(path / WEIGHTS_DIR)).read_metadata().state_dict_metadata
    except Exception as error:  # a damaged metadata file
        raise ConfigError(f"{key}: {path / WEIGHTS_DIR / '.metadata'} cannot be read "
                          f"({type(error).__name__}: {error})") from None
    shapes = {key[len("model."):]: tuple(getattr(meta, "size", ())) for key, meta in saved.items()
              if key.startswith("model.")}
    wanted = {key: tuple(value.shape) for key, value in model_state.items() if isinstance(value, torch.Tensor)}
    missing = sorted(wanted.keys() - shapes.keys())
    unexpected = sorted(shapes.keys() - wanted.keys())
    resized = sorted(k for k in wanted.keys() & shapes.keys() if wanted[k] != shapes[k])
    if missing or unexpected or resized:
        detail = "; ".join(part for part in (
            f"{len(missing)} of this model's tensors missing (e.g. {missing[0]})" if missing else "",
            f"{len(unexpected)} not in this model (e.g. {unexpected[0]})" if unexpected else "",
            f"{len(resized)} of another shape (e.g. {resized[0]}: {shapes[resized[0]]} saved, "
            f"{wanted[resized[0]]} here)" if resized else "") if part)
        raise ConfigError(f"{key}: {path} holds another model's weights ({detail}); {advice}")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class CheckpointWriteError(WriteError):
    """A checkpoint could not be written (a full disk, any OSError); its unfinished directory is removed."""


def save_checkpoint(output_dir: Path, step: int, ctx: DistContext, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scheduler: Any, data_state: dict[str, Any],
                    meta: dict[str, Any], keep: int | None = None) -> Path:
    """Write ``checkpoint-STEP`` atomically (collective: every rank calls it); prune to ``keep``.

    A write that fails on any rank (``OSError``: a full disk, a file-size limit) fails on every rank alike: the
    staging directory is removed and :class:`CheckpointWriteError` names the path and the error; the earlier
    checkpoints are untouched.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = output_dir / f"checkpoint-{step}"
    tmp = outputs.staging_path(final)

    def stage() -> None:
        if ctx.is_main:
            outputs.make_staging(final, writer="train")

    def shards() -> None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        with quiet_single_process():
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp / WEIGHTS_DIR,
                     no_dist=not ctx.distributed)
        buffer = io.BytesIO()
        torch.save({"rank": ctx.rank, "world_size": ctx.world_size, "rng": rng_state(), "data": data_state}, buffer)
        outputs.atomic_write_bytes(tmp / f"rank-{ctx.rank}.pt", buffer.getvalue())

    def publish() -> None:
        if not ctx.is_main:
            return
        state = {"step": step, "world_size": ctx.world_size, "scheduler": scheduler.state_dict(), **meta}
        outputs.atomic_write_text(tmp / STATE_FILE, json.dumps(state, indent=2, default=str))
        outputs.publish(tmp, final, writer="train")
        if keep is not None:
            for old in checkpoints(output_dir)[:-keep]:
                if not outputs.owned(old):
                    logger.warning("not pruning %s (save_total_limit=%d): it has no vlforge ledger", old.name, keep)
                    continue
                outputs.remove_owned(old)
                logger.info("removed old checkpoint %s (save_total_limit=%d)", old.name, keep)
        logger.info("saved %s", final)

    for part, where in ((stage, tmp), (shards, tmp / WEIGHTS_DIR), (publish, tmp)):
        _agreed(ctx, part, where, final)
    return final


def _agreed(ctx: DistContext, part: Any, where: Path, final: Path) -> None:
    """Run ``part`` of a checkpoint write on every rank, then agree (a collective, in place of a barrier): when a
    write failed on any rank, rank 0 removes the staging directory and every rank raises the same error."""
    failure = None
    try:
        part()
    except (Exception, CheckpointException) as error:
        found = outputs.write_failure(error)
        if found is None:
            raise
        if found.startswith("a short write"):
            found += f"; {outputs.write_room(where)}"
        failure = f"writing {where} failed: {found}" + (f" (rank {ctx.rank})" if ctx.distributed else "")
    failures = [f for f in ctx.all_gather_object(failure) if f]
    if not failures:
        return
    stage = outputs.staging_path(final)
    if ctx.is_main and stage.is_dir():
        shutil.rmtree(stage, ignore_errors=True)
    ctx.barrier()
    newest = latest_complete(final.parent)
    raise CheckpointWriteError(
        f"{final.name}: {failures[0]}; removed the unfinished {stage}; the newest complete checkpoint is "
        f"{newest.name if newest else 'none'} (checkpointing.resume: auto continues from it once there is room)")


def latest_complete(output_dir: Path) -> Path | None:
    """The newest checkpoint in ``output_dir`` that :func:`problem` finds nothing wrong with."""
    return next((path for path in reversed(checkpoints(output_dir)) if problem(path) is None), None)


def clear_unfinished(output_dir: Path) -> None:
    """Remove the unfinished checkpoints (``.tmp-checkpoint-*`` with a partial vlforge ledger, or empty: killed
    before its ledger was written) a killed run left."""
    if not output_dir.is_dir():
        return
    for stage in sorted(output_dir.glob(f"{outputs.STAGING_PREFIX}checkpoint-*")):
        if not outputs.is_partial(stage):
            continue
        ledger = outputs.read_ledger(stage)
        if ledger is None or ledger.get("writer") == "train":  # empty, or training's own partial ledger
            logger.info("removing %s, a checkpoint left unfinished by an earlier run", stage)
            shutil.rmtree(stage, ignore_errors=True)


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text(encoding="utf-8"))


def load_checkpoint(path: Path, ctx: DistContext, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Restore model, optimizer, scheduler and RNG; returns (trainer state, data states of the saving ranks).

    The data states list has one entry per rank of the run that saved (index = its rank).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    state = read_state(path)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    check_same_model(path, model_sd)
    holder = {"model": model_sd, "optim": optim_sd}
    with quiet_single_process():
        dcp.load(holder, checkpoint_id=path / WEIGHTS_DIR, no_dist=not ctx.distributed)
    set_state_dict(model, optimizer, model_state_dict=holder["model"], optim_state_dict=holder["optim"])
    scheduler.load_state_dict(state["scheduler"])
    follow_schedule(optimizer, scheduler)  # this run's schedule (another max_steps or warmup) from the next step
    saved_world = int(state["world_size"])
    ranks = [torch.load(path / f"rank-{r}.pt", weights_only=True) for r in range(saved_world)]
    if saved_world == ctx.world_size:
        set_rng_state(ranks[ctx.rank]["rng"])
    else:
        set_rng_state(ranks[0]["rng"])
        logger.warning("resuming a %d-process checkpoint on %d processes: weights and optimizer state are "
                       "resharded exactly; RNG state is taken from rank 0", saved_world, ctx.world_size)
    logger.info("resumed from %s (step %d)", path, state["step"])
    return state, [r["data"] for r in ranks]


def remap_data_state(states: list[dict[str, Any]], rank: int, world_size: int) -> dict[str, Any]:
    """A data-stream state for shard ``rank`` of ``world_size`` from the shard states of a run with other shards.

    The stream restarts at the smallest draw index any old shard had reached, and skips (``done``) the
    indices at or after it that their old owner shard had already drawn, so no record is repeated or
    left out. The samples that were buffered (packer bins, grouper, ready batches) in any old shard are
    queued again, dealt round-robin to the new shards.
    """
    start = min(states, key=lambda s: s["draws"])
    groups: list[list[dict[str, Any]]] = []
    for old in states:
        groups.extend(old["ready"])
        buffer = old["buffer"]
        groups.extend(b for b in buffer.get("bins", []) if b)
        items = [ref for ref, _ in buffer.get("items", [])]
        if items:
            groups.append(items)
    restart = start["draws"]
    done = {i for s in states for i in range(restart, s["draws"]) if i % s["num_shards"] == s["shard_id"]}
    done.update(i for s in states for i in s.get("done", ()) if i >= restart)
    if done and rank == 0:
        logger.info("data: resuming at draw %d; %d later draw(s) already used are skipped", restart, len(done))
    new = copy.deepcopy({k: v for k, v in start.items() if k not in ("ready", "buffer")})
    new.update(shard_id=rank, num_shards=world_size, done=sorted(done),
               ready=[copy.deepcopy(g) for i, g in enumerate(groups) if i % world_size == rank])
    new["buffer"] = {"bins": [], "loads": []} if "bins" in start["buffer"] else {"items": []}
    return new
