"""``vlforge verify``: proof, on the user's own model and inputs, that the fast path computes the same model.

Example (CPU, seconds):
    >>> from rich.console import Console
    >>> from vlforge.verify import VerifyOptions, render, run_verify
    >>> report = run_verify(VerifyOptions(model="tiny:qwen3_vl", synthetic="2x64x64"))  # doctest: +SKIP
    >>> render(report, Console())  # doctest: +SKIP
"""

from vlforge.verify.report import Check, VerifyReport, render
from vlforge.verify.runner import (
    BF16_LAYER_MIN_COSINE,
    FP32_LAYER_MAX_DIFF,
    TOWER_MIN_COSINE,
    VerifyOptions,
    check_layer,
    run_verify,
)

__all__ = [
    "BF16_LAYER_MIN_COSINE",
    "FP32_LAYER_MAX_DIFF",
    "TOWER_MIN_COSINE",
    "Check",
    "VerifyOptions",
    "VerifyReport",
    "check_layer",
    "render",
    "run_verify",
]
