"""``vlforge verify``'s options and default tolerances, validated before torch or the model is touched.

Example:
    >>> VerifyOptions(model="tiny:qwen3_vl", dtype="bf16").dtype
    'bfloat16'
"""

from __future__ import annotations

from pydantic import Field, field_validator

from vlforge.models.input_checks import InputSource
from vlforge.models.refs import dtype_name

FP32_LAYER_MAX_DIFF = 1e-5
BF16_LAYER_MIN_COSINE = 0.999
TOWER_MIN_COSINE = 0.99


class VerifyOptions(InputSource):
    """What ``vlforge verify`` compares; every CLI flag maps to one field."""

    batch_size: int = Field(1, ge=1)
    dtype: str = "bfloat16"
    """Dtype of the tower and end-to-end comparison (the layer checks always run fp32 and bf16)."""
    device: str = "auto"
    attn: str = "sdpa"
    precision: str = "native"
    """Precision of the patched path under test: ``native`` or ``fp32``."""
    generate_tokens: int = Field(8, ge=0)
    tower_reference: bool = True
    """Also measure the tower's error against an fp64 (CPU) / fp32 (GPU) copy of the tower."""
    max_fp32_layer_diff: float = Field(FP32_LAYER_MAX_DIFF, gt=0)
    min_bf16_layer_cosine: float = Field(BF16_LAYER_MIN_COSINE, le=1)
    min_tower_cosine: float = Field(TOWER_MIN_COSINE, le=1)
    max_kl: float | None = Field(None, ge=0)
    min_top1: float | None = Field(None, ge=0, le=1)
    require_identical_generation: bool = False

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, value: str) -> str:
        value = dtype_name(value)
        if value not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype {value!r} is not one of float32, bfloat16, float16")
        return value

    @field_validator("precision")
    @classmethod
    def _precision(cls, value: str) -> str:
        if value not in ("native", "fp32"):
            raise ValueError(f"precision {value!r} is not one of native, fp32")
        return value
