"""Every check of ``vlforge train`` that needs no torch and no model, run before either is imported.

The config (with its data files, as ``vlforge validate`` checks it), the model reference, the output
directory and the settings that depend on the model family only. A mistake costs one line and exit 2
in well under a second, not a model load.

Example:
    >>> from vlforge.config.schema import TrainConfig
    >>> cfg = TrainConfig(data={"dataset_path": "d.jsonl", "label_mode": "lmms"},
    ...                   model={"load_from_pretrained_path": "tiny:qwen2_vl"})
    >>> check_model(cfg)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    vlforge.errors.ConfigError: data.label_mode: 'lmms' reproduces LMMS Engine's processors of ...
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from vlforge.config.schema import TrainConfig
from vlforge.errors import ConfigError, OutputError
from vlforge.models.adapters import PEFT_MISSING
from vlforge.outputs import check_output_dir, owned

FINAL_DIR = "final"
METRICS_FILE = "metrics.jsonl"
DATA_REPORT = "data_report.json"
WRITTEN_FILES = (METRICS_FILE, DATA_REPORT)
"""Files a run writes straight into ``output_dir`` (a checkpoint or the export is a directory of its own)."""


def check_outputs(cfg: TrainConfig, *, export: bool = True) -> None:
    """``output_dir`` can take this run, and nothing in it that vlforge did not write would be replaced."""
    output_dir = Path(cfg.checkpointing.output_dir)
    check_output_dir(output_dir, flag="output_dir", mode="into")
    if export:
        check_output_dir(output_dir / FINAL_DIR, flag="output_dir", mode="replace")
    for written in (output_dir / name for name in WRITTEN_FILES):
        if (written.exists() or written.is_symlink()) and not owned(written):
            raise OutputError(f"output_dir: {written} exists and was not written by vlforge; move it away or "
                              "choose another output_dir")


def check_model(cfg: TrainConfig) -> None:
    """The model reference resolves (without loading), and family-bound settings suit its family."""
    from vlforge.models.families import family as family_record
    from vlforge.models.families import names
    from vlforge.models.refs import check_model_ref, model_family

    check_model_ref(cfg.model.load_from_pretrained_path)
    family = cfg.processor.processor_type or model_family(cfg.model.load_from_pretrained_path)
    if cfg.data.label_mode == "lmms" and family is not None and not family_record(family).lmms_labels:
        raise ConfigError(f"data.label_mode: 'lmms' reproduces LMMS Engine's processors of "
                          f"{', '.join(names(lmms_labels=True))}; {family} has none (use label_mode: assistant)")


def run_family(cfg: TrainConfig) -> str | None:
    """The model family ``cfg`` trains, read without loading (``processor.processor_type``, else the model
    reference's ``model_type``); None when neither names a family vlforge has, or the reference is bad (the model
    check names that in its turn)."""
    from vlforge.errors import ModelLoadError
    from vlforge.models.families import names
    from vlforge.models.refs import model_family

    try:
        found = cfg.processor.processor_type or model_family(cfg.model.load_from_pretrained_path)
    except (ConfigError, ModelLoadError):
        return None
    return found if found in names() else None


def check_supported(cfg: TrainConfig) -> None:
    """Refuse settings this trainer cannot honour (one line each)."""
    from vlforge.models.families import family as family_record

    family = run_family(cfg)
    patch = family_record(family).image_processor.get("temporal_patch_size") if family is not None else None
    if patch and cfg.video.video_max_frames is not None and cfg.video.video_max_frames < patch:
        raise ConfigError(f"video.video_max_frames: {cfg.video.video_max_frames} is less than the {patch} frames of "
                          f"one temporal patch of {family}")
    if cfg.training.fp16:
        raise ConfigError("training.fp16: float16 training (loss scaling) is not available in vlforge's trainer; "
                          "use training.bf16: true")
    if cfg.model.lora is not None and importlib.util.find_spec("peft") is None:
        raise ConfigError(PEFT_MISSING)
