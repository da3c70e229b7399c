"""Processor files that name only stock transformers classes, for directories vlforge copies.

vlforge's torchvision-free video processors save themselves under the stock class they stand in for
(see :mod:`vlforge.models.frames_video`). Checkpoints written by vlforge before that change, and
directories copied from them (``vlforge export``, ``vlforge tokens fix``), still name
``Qwen2VLFramesVideoProcessor`` & co., classes that exist only while vlforge is imported.
:func:`make_portable` rewrites such files in place: the stock class name, and only the keys the stock
class understands. Files naming anything else are left untouched.

Example:
    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> video = {"video_processor_type": "Qwen3VLFramesVideoProcessor", "resize_rule": "video", "fps": 2.0}
    >>> _ = (folder / "processor_config.json").write_text(json.dumps({"video_processor": video}))
    >>> make_portable(folder)
    ['processor_config.json']
    >>> json.loads((folder / "processor_config.json").read_text())["video_processor"]
    {'fps': 2.0, 'video_processor_type': 'Qwen3VLVideoProcessor'}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vlforge.outputs import atomic_write_json

#: Files holding a video processor's settings: file name -> key of the settings (None: the whole file).
VIDEO_SETTINGS_FILES = {"processor_config.json": "video_processor", "video_preprocessor_config.json": None}


def portable_video_settings(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The stock-named equivalent of saved video processor settings, or None when they need no change."""
    from vlforge.models.frames_video import STOCK_STANDINS

    ours = {cls.__name__: cls for cls in STOCK_STANDINS.values()}
    cls = ours.get(str(settings.get("video_processor_type")))
    if cls is None:
        return None
    rule = settings.get("resize_rule", cls.resize_rule)
    if rule != cls.resize_rule:
        raise ValueError(f"{cls.__name__} with resize_rule {rule!r} has no stock equivalent")
    out = {key: value for key, value in settings.items() if key not in cls.vlforge_only_keys}
    out["video_processor_type"] = cls.stock_name
    return out


def make_portable(directory: str | os.PathLike[str]) -> list[str]:
    """Rewrite the processor files of ``directory`` that name vlforge classes; returns their names."""
    rewritten = []
    for name, key in VIDEO_SETTINGS_FILES.items():
        path = Path(directory) / name
        if not path.is_file():
            continue
        payload = json.loads(path.read_text())
        settings = payload.get(key) if key is not None else payload
        if not isinstance(settings, dict):
            continue
        portable = portable_video_settings(settings)
        if portable is None:
            continue
        if key is None:
            payload = portable
        else:
            payload[key] = portable
        atomic_write_json(path, payload)
        rewritten.append(name)
    return rewritten
