"""vlforge: fast and correct Qwen-VL-family vision-language models.

Example:
    >>> import torch, vlforge
    >>> model = torch.nn.Sequential(torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4)))
    >>> report = vlforge.patch(model)
    >>> [entry.name for entry in report.patched]
    ['0']
    >>> vlforge.unpatch(model)
    1
"""

from __future__ import annotations

import logging

from vlforge.patches.registry import PatchReport, patch, patch_transformers, unpatch

__all__ = ["PatchReport", "__version__", "patch", "patch_transformers", "unpatch"]
__version__ = "0.1.0"

logging.getLogger(__name__).addHandler(logging.NullHandler())
