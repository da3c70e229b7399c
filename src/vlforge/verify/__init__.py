"""``vlforge verify``: proof, on the user's own model and inputs, that the fast path computes the same model.

Example (CPU, seconds):
    >>> from rich.console import Console
    >>> from vlforge.verify import VerifyOptions, render, run_verify
    >>> report = run_verify(VerifyOptions(model="tiny:qwen3_vl", synthetic="2x64x64"))  # doctest: +SKIP
    >>> render(report, Console())  # doctest: +SKIP
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "Check": "vlforge.verify.report",
    "VerifyReport": "vlforge.verify.report",
    "render": "vlforge.verify.report",
    "BF16_LAYER_MIN_COSINE": "vlforge.verify.options",
    "FP32_LAYER_MAX_DIFF": "vlforge.verify.options",
    "TOWER_MIN_COSINE": "vlforge.verify.options",
    "VerifyOptions": "vlforge.verify.options",
    "check_layer": "vlforge.verify.runner",
    "run_verify": "vlforge.verify.runner",
}
lazy_exports(__name__, _EXPORTS)

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
