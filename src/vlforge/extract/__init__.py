"""Feature extraction into a resumable, sharded cache (``vlforge extract``) and reading it back.

Example (CPU, seconds):
    >>> from vlforge.extract import open_cache, run_extract
    >>> run_extract(model="tiny:qwen3_vl", data="examples/data/dataset.yaml", out="/tmp/feats")  # doctest: +SKIP
    >>> cache = open_cache("/tmp/feats"); cache[0]["vision_pooled"].shape  # doctest: +SKIP
    torch.Size([1, 64])
"""

from vlforge.lazy import lazy_exports

# Public names, imported from their module on first use (see vlforge.lazy): importing one light
# submodule of this package never loads the heavy ones.
_EXPORTS = {
    "CacheError": "vlforge.extract.manifest",
    "FEATURES": "vlforge.extract.options",
    "ExtractOptions": "vlforge.extract.options",
    "FeatureCache": "vlforge.extract.reader",
    "open_cache": "vlforge.extract.reader",
    "ExtractSummary": "vlforge.extract.runner",
    "run_extract": "vlforge.extract.runner",
}
lazy_exports(__name__, _EXPORTS)

__all__ = ["FEATURES", "CacheError", "ExtractOptions", "ExtractSummary", "FeatureCache", "open_cache",
           "run_extract"]
