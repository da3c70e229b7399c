"""Feature extraction into a resumable, sharded cache (``vlforge extract``) and reading it back.

Example (CPU, seconds):
    >>> from vlforge.extract import open_cache, run_extract
    >>> run_extract(model="tiny:qwen3_vl", data="examples/data/dataset.yaml", out="/tmp/feats")  # doctest: +SKIP
    >>> cache = open_cache("/tmp/feats"); cache[0]["vision_pooled"].shape  # doctest: +SKIP
    torch.Size([1, 64])
"""

from vlforge.extract.manifest import CacheError
from vlforge.extract.options import FEATURES, ExtractOptions
from vlforge.extract.reader import FeatureCache, open_cache
from vlforge.extract.runner import ExtractSummary, run_extract

__all__ = ["FEATURES", "CacheError", "ExtractOptions", "ExtractSummary", "FeatureCache", "open_cache",
           "run_extract"]
