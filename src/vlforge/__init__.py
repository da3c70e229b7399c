"""vlforge: fast and correct Qwen-VL-family vision-language models.

``import vlforge`` is light (neither torch nor transformers is imported) and is all a script needs
for ``AutoProcessor.from_pretrained`` of every supported family without torchvision: it installs an
import hook that registers vlforge's torchvision-free video processors the moment transformers'
processor machinery is imported (see :mod:`vlforge.models.compat`). The public names below import
their module on first use.

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

from vlforge.lazy import lazy_exports
from vlforge.models.compat import install_import_hook

__all__ = ["PatchReport", "__version__", "patch", "patch_transformers", "unpatch"]
__version__ = "0.1.0"

lazy_exports(__name__, {name: "vlforge.patches.registry" for name in __all__ if name != "__version__"})
logging.getLogger(__name__).addHandler(logging.NullHandler())
install_import_hook()
