"""``vlforge profile``'s options: every flag, validated before torch or the model is touched.

Example:
    >>> ProfileOptions(model="tiny:qwen3_vl", compare=["stock", "patched"]).batch_sizes
    [1]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from vlforge.errors import ConfigError
from vlforge.flags import NO_FLAG, Flag
from vlforge.models.input_checks import InputSource
from vlforge.models.refs import dtype_name
from vlforge.outputs import check_output_dir, check_output_file
from vlforge.profile.report import ANOMALY_MIN_SHARE, ANOMALY_RATIO

VARIANTS = ("stock", "patched", "patched-fp32")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
DTYPES = ("float32", "bfloat16", "float16")
PLOT_FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf", ".jpg": "jpg", ".jpeg": "jpg"}
"""The plot's file format, by its suffix (what matplotlib writes)."""


def check_plot_format(path: Path) -> None:
    """The plot's suffix names a format :func:`~vlforge.profile.render.plot` writes (after the path's own checks)."""
    if path.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(f"--plot {path}: a plot is written as {', '.join(sorted(PLOT_FORMATS))} (from the name's "
                          f"suffix); got {path.suffix or 'no suffix'}")


class ProfileOptions(InputSource):
    """What ``vlforge profile`` measures; every CLI flag maps to one field."""

    batch_sizes: Annotated[list[int], Flag(split=int)] = Field(default_factory=lambda: [1])
    """Comma-separated batch sizes, e.g. 1,4,8."""
    dtype: str = "float32"
    """float32, bfloat16 or float16."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:1, ..."""
    attn: Annotated[list[str], Flag(split=str)] = Field(default_factory=lambda: ["sdpa"])
    """Comma-separated: sdpa,eager,flash_attention_2 (unavailable ones are skipped with a warning)."""
    warmup: int = Field(1, ge=0)
    """Untimed forwards per configuration (the first counts FLOPs)."""
    repeats: int = Field(3, ge=1)
    """Timed iterations per configuration."""
    compare: Annotated[list[str], Flag(split=str)] = Field(default_factory=lambda: ["stock"])
    """Variants run in one process on the same weights: stock, patched, patched-fp32; e.g. stock,patched prints
    per-component ratios (of the first to each other)."""
    trace_dir: Annotated[Path | None, Flag("--trace")] = None
    """Write a torch.profiler Chrome trace per run into DIR."""
    plot: Path | None = None
    """Write a bar chart: .png, .svg, .pdf or .jpg, by the name's suffix (needs vlforge[plot])."""
    per_block: Annotated[bool, Flag("--per-block/--summary")] = True
    """One row per block and layer (else a summary per component kind)."""
    anomaly_ratio: Annotated[float, NO_FLAG] = Field(ANOMALY_RATIO, gt=0)
    anomaly_min_share: Annotated[float, NO_FLAG] = Field(ANOMALY_MIN_SHARE, ge=0)

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if not value or any(b < 1 for b in value):
            raise ValueError(f"batch sizes must be positive integers, got {value}")
        return value

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        value = dtype_name(value)
        if value not in DTYPES:
            raise ValueError(f"dtype {value!r} is not one of {', '.join(DTYPES)}")
        return value

    @field_validator("attn")
    @classmethod
    def _attn(cls, value: list[str]) -> list[str]:
        unknown = [a for a in value if a not in ATTN_IMPLEMENTATIONS]
        if not value or unknown:
            raise ValueError(f"attention implementation(s) {unknown} not among {', '.join(ATTN_IMPLEMENTATIONS)}")
        return value

    @field_validator("compare")
    @classmethod
    def _variants(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in VARIANTS]
        if not value or unknown or len(set(value)) != len(value):
            raise ValueError(f"variants {value} must be distinct names among {', '.join(VARIANTS)}")
        return value


def trace_name(variant: str, attn: str, batch_size: int) -> str:
    return f"profile_{variant}_{attn}_b{batch_size}.json"


def check_trace_dir(options: ProfileOptions) -> None:
    """``--trace DIR`` can take every trace this run writes, none of them replacing a file of the user's."""
    if options.trace_dir is None:
        return
    check_output_dir(options.trace_dir, flag="--trace", mode="into")
    for variant in options.compare:
        for attn in options.attn:
            for batch_size in options.batch_sizes:
                check_output_file(options.trace_dir / trace_name(variant, attn, batch_size), flag="--trace")
