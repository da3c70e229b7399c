"""Export a training checkpoint as a Hugging Face directory that stock transformers loads.

The source model (recorded in the checkpoint's ``trainer_state.json``) is loaded on CPU in fp32,
the checkpoint's DCP model weights are read into it (resharded from any number of ranks), and
``save_pretrained`` writes ``config.json`` + ``model.safetensors``; the tokenizer, chat template and
processor files are copied from the source checkpoint (processor files naming vlforge's own video
processor classes, as checkpoints of older vlforge versions do, are rewritten to the stock class names:
see :mod:`vlforge.models.portable`). The directory is built next to ``out`` and renamed into place.

A LoRA run (``model.lora`` in the checkpoint's config) is exported merged: the source model gets the
same peft adapters, the checkpoint (base + adapter weights) is read into it, and ``merge_and_unload``
folds ``W + (alpha / r) * B @ A`` into each target weight. The result is a plain model of the
source's architecture with the source's parameter names; its outputs equal the trained adapter
model's up to fp32 rounding (the product is summed in a different order).

Example (CPU, seconds):
    >>> export_checkpoint("output/run/checkpoint-40", "output/run/final")  # doctest: +SKIP
    or: ``vlforge export output/run/checkpoint-40 output/run/final``
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Annotated, Any, ClassVar

from vlforge.command import Cli, Job, always_ok
from vlforge.errors import ConfigError
from vlforge.flags import Arg
from vlforge.outputs import check_output_dir, staged_dir
from vlforge.strict import StrictModel
from vlforge.train.checkpoint import (
    STATE_FILE,
    WEIGHTS_DIR,
    check_same_model,
    problem,
    quiet_single_process,
    read_state,
)

logger = logging.getLogger(__name__)

#: Files of the source checkpoint that are never copied (weights, or written by save_pretrained).
_SKIP_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json", ".lock")
_SKIP_NAMES = {"config.json", "generation_config.json", "vlforge_tiny.json"}


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, source: str | None = None,
                      replace: bool = False) -> Path:
    """Write the model of ``checkpoint`` as a Hugging Face directory ``out``; returns ``out``.

    ``out`` must be new or empty; with ``replace`` it may also be an earlier vlforge export holding
    nothing else (the training run's ``final/``). Nothing vlforge did not write is ever removed.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    from vlforge.models import load
    from vlforge.models.portable import make_portable

    checkpoint, out = Path(checkpoint), Path(out)
    check_checkpoint(checkpoint)
    out = check_output_dir(out, flag="export directory", mode="replace" if replace else "new",
                           required_bytes=_weights_bytes(checkpoint))
    state = read_state(checkpoint)
    key = f"--source {source}" if source else f"the run's model ({STATE_FILE})"
    source = source or state.get("model_path") or state.get("model_source")
    if not source:
        raise ConfigError(f"{checkpoint / STATE_FILE} names no source model; pass the source explicitly")
    loaded = load(source, dtype="float32", processor=False, tokenizer=False)
    model = loaded.model
    lora = (state.get("config") or {}).get("model", {}).get("lora")
    if lora is not None:
        from vlforge.config.schema import LoraConfig
        from vlforge.models.adapters import apply_lora

        model = apply_lora(model, LoraConfig.model_validate(lora))
    weights = get_model_state_dict(model)
    check_same_model(checkpoint, weights, key=key,
                     advice="export it with the --source model it was trained from")
    try:
        with quiet_single_process():
            dcp.load({"model": weights}, checkpoint_id=checkpoint / WEIGHTS_DIR, no_dist=True)  # rank 0 alone
    except Exception as error:  # bytes changed in place: the ledger's sizes hold, the contents do not
        raise ConfigError(f"{checkpoint / WEIGHTS_DIR}: cannot be read ({_innermost_line(error)})") from None
    set_model_state_dict(model, weights)
    overrides = (state.get("config") or {}).get("model", {}).get("overwrite_config")
    if overrides:  # the trained model's config (LMMS Engine's overwrite_config), as training set it
        from vlforge.train.model_setup import overwrite_config

        overwrite_config(model, overrides)
    if lora is not None:
        model = model.merge_and_unload()
        logger.info("merged the LoRA adapters into the base weights")
    out.parent.mkdir(parents=True, exist_ok=True)
    with staged_dir(out, writer="export") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        written = {p.name for p in tmp.iterdir()}
        for item in Path(loaded.path).iterdir():
            if (item.is_file() and item.name not in written and item.name not in _SKIP_NAMES
                    and not item.name.startswith(".") and not item.name.endswith(_SKIP_SUFFIXES)):
                shutil.copy2(item, tmp / item.name)
        for name in make_portable(tmp):
            logger.info("%s names vlforge's video processor class; exported with the stock class name", name)
    logger.info("exported %s -> %s", checkpoint, out)
    return out


def check_checkpoint(checkpoint: Path) -> None:
    """A :class:`ConfigError` naming ``checkpoint`` unless it is a complete vlforge checkpoint (:func:`problem`)."""
    if not checkpoint.exists():
        raise ConfigError(f"{checkpoint}: not found")
    if not checkpoint.is_dir():
        raise ConfigError(f"{checkpoint}: not a directory (a checkpoint is OUTPUT_DIR/checkpoint-STEP)")
    found = problem(checkpoint)
    if found is not None:
        raise ConfigError(f"{checkpoint}: not a complete vlforge checkpoint: {found}")


def _innermost_line(error: BaseException) -> str:
    """The last line of DCP's error: the cause it wraps (its first line names only the ranks)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:300]


def _weights_bytes(checkpoint: Path) -> int:
    """About the export's size: a third of the checkpoint's DCP bytes (fp32 weights + AdamW's two moments)."""
    weights = checkpoint / WEIGHTS_DIR
    return sum(f.stat().st_size for f in weights.rglob("*") if f.is_file()) // 3 if weights.is_dir() else 0


class ExportRequest(StrictModel):
    """``vlforge export CHECKPOINT OUT [--source MODEL]``."""

    unknown_label: ClassVar[str] = "option"
    checkpoint: Annotated[Path, Arg()]
    """A checkpoint directory (OUTPUT_DIR/checkpoint-STEP)."""
    out: Annotated[Path, Arg()]
    """New Hugging Face directory to write."""
    source: str | None = None
    """Source model (default: the one the run trained)."""


def _check_request(request: ExportRequest) -> None:
    check_output_dir(Path(request.out), flag="export directory", mode="new")
    check_checkpoint(Path(request.checkpoint))


def _print_export(request: ExportRequest, path: Path, console: Any) -> None:
    console.print(f"exported {request.checkpoint} -> {path}", highlight=False, soft_wrap=True)


JOB: Job[ExportRequest, Path] = Job(
    check=_check_request, run=lambda request: export_checkpoint(request.checkpoint, request.out, source=request.source),
    render=_print_export, to_json=lambda path: json.dumps({"export_dir": str(path)}), exit_code=always_ok,
)
CLI = Cli(flags=ExportRequest, job=JOB, json=False)
