"""Make Qwen-VL-family processors constructible in transformers 5.23 when torchvision is missing.

Without torchvision, transformers 5.23 cannot build *any* Qwen2-VL / Qwen2.5-VL / Qwen3-VL / GLM-4V
processor, not even for images: ``ProcessorMixin.__init__`` checks the ``video_processor`` argument
against ``transformers.VideoProcessorMixin``, which is only exported when torchvision is importable,
and ``AutoVideoProcessor`` maps these families only to torchvision classes. :func:`ensure_processor_support`
(called when ``vlforge.models`` is imported) fixes both, and only when torchvision is absent:

1. it exposes ``VideoProcessorMixin`` on the ``transformers`` module (the real class, unchanged);
2. it registers the per-family subclasses of :class:`~vlforge.models.frames_video.FramesVideoProcessor`
   with ``AutoVideoProcessor`` for the five families, under their own names and as stand-ins for
   the stock names (``Qwen2VLVideoProcessor``, ``Qwen3VLVideoProcessor``, ``Glm4vVideoProcessor``),
   so tiny checkpoints and real ones (hub downloads) both get a working processor.

With torchvision installed it does nothing, and checkpoints written by ``vlforge tiny`` load the
stock torchvision video processors (an unknown ``video_processor_type`` falls back to the family's).

Example:
    >>> from vlforge.models.compat import ensure_processor_support
    >>> ensure_processor_support() in (True, False)
    True
"""

from __future__ import annotations

import logging
import sys

import transformers
from transformers.utils import is_torchvision_available

logger = logging.getLogger(__name__)

# config class -> (torchvision-free video processor, the stock torchvision class name it stands in for)
_VIDEO_PROCESSORS = {
    "Qwen2VLConfig": ("Qwen2VLFramesVideoProcessor", "Qwen2VLVideoProcessor"),
    "Qwen2_5_VLConfig": ("Qwen2VLFramesVideoProcessor", "Qwen2VLVideoProcessor"),
    "Qwen3VLConfig": ("Qwen3VLFramesVideoProcessor", "Qwen3VLVideoProcessor"),
    "Qwen3VLMoeConfig": ("Qwen3VLFramesVideoProcessor", "Qwen3VLVideoProcessor"),
    "Glm4vConfig": ("Glm4vFramesVideoProcessor", "Glm4vVideoProcessor"),
}
_done = False


def ensure_processor_support() -> bool:
    """Install the torchvision-free video path once; returns True when something was installed."""
    global _done
    if _done or is_torchvision_available():
        return False
    from transformers import processing_utils
    from transformers.models.auto.video_processing_auto import AutoVideoProcessor
    from transformers.video_processing_utils import VideoProcessorMixin

    from vlforge.models import frames_video

    # processing_utils holds its own handle on the lazy ``transformers`` module; patch every handle.
    handles = (transformers, processing_utils.transformers_module, sys.modules["transformers"])
    for module in {id(handle): handle for handle in handles}.values():
        if "VideoProcessorMixin" not in vars(module):
            module.VideoProcessorMixin = VideoProcessorMixin
    for config_name, (ours, stock) in _VIDEO_PROCESSORS.items():
        # The "alias" entry makes the stock name (as written in real checkpoints) resolve to our class.
        AutoVideoProcessor.register(
            getattr(transformers, config_name),
            video_processor_classes={"torchvision": getattr(frames_video, ours), "alias": stock},
            exist_ok=True,
        )
    _done = True
    logger.debug("torchvision missing: %s use vlforge's frame video processors", ", ".join(_VIDEO_PROCESSORS))
    return True
