"""The model and input options of ``profile`` and ``verify``, checked before anything heavy is imported.

Every input file is opened here (a truncated image or a video without frames is one line and exit 2,
not a traceback after the model loaded); the synthetic shape is parsed; at most one source is given.

Example:
    >>> parse_synthetic("8x720x1280")
    (8, 720, 1280)
    >>> InputSource(model="tiny:qwen3_vl", synthetic="2x64x64").video_frames
    8
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import Field, model_validator

from vlforge.errors import DataError, VlforgeError
from vlforge.flags import Flag
from vlforge.strict import StrictModel, field_error


def parse_synthetic(text: str) -> tuple[int, int, int]:
    """``"8x720x1280"`` -> ``(8, 720, 1280)`` (frames, height, width)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or min(int(g) for g in match.groups()) < 1:
        raise VlforgeError(f"--synthetic {text!r} is not FRAMESxHEIGHTxWIDTH with positive integers, e.g. 8x720x1280")
    frames, height, width = (int(g) for g in match.groups())
    return frames, height, width


def check_image_file(path: Path) -> None:
    """A readable image at ``path`` (decoded once, so a truncated file fails here), else one-line DataError."""
    if not path.exists():
        raise DataError(f"--image {path}: image file not found")
    if not path.is_file():
        raise DataError(f"--image {path}: is a directory, not an image file")
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, Image.DecompressionBombError) as error:
        raise DataError(f"--image {path}: cannot read image: {error}") from error


def check_video_file(path: Path) -> None:
    """A video at ``path`` whose first frame PyAV decodes, else one-line DataError (later frames: when read)."""
    import av

    if not path.exists():
        raise DataError(f"--video {path}: video file not found")
    if not path.is_file():
        raise DataError(f"--video {path}: is a directory, not a video file")
    try:
        with av.open(str(path)) as container:
            next(container.decode(video=0))
    except StopIteration:
        raise DataError(f"--video {path}: no video frames") from None
    except (av.error.FFmpegError, IndexError) as error:
        raise DataError(f"--video {path}: cannot decode video: {error}") from error


def check_sources(synthetic: str | None, images: Sequence[Any] | None, video: Any | None) -> None:
    """Fail before loading anything: at most one source, a well-formed ``--synthetic``, readable files."""
    given = [name for name, value in (("--synthetic", synthetic), ("--image", images), ("--video", video)) if value]
    if len(given) > 1:
        raise VlforgeError(f"give one input source, not {' and '.join(given)}")
    if synthetic:
        parse_synthetic(synthetic)
    for image in images or []:
        check_image_file(Path(image))
    if video:
        check_video_file(Path(video))


class InputSource(StrictModel):
    """The model and input options shared by ``vlforge profile`` and ``vlforge verify``."""

    unknown_label: ClassVar[str] = "option"

    model: Annotated[str, Flag("--model", "-m")]
    """Checkpoint dir, preset (tiny:qwen3_vl, real:qwen3_vl_2b) or hub id."""
    synthetic: str | None = None
    """Random frames FRAMESxHxW (e.g. 8x720x1280) through the model's processor rules; default 1x224x224."""
    images: Annotated[list[Path], Flag("--image")] = Field(default_factory=list)
    """Image file(s), one prompt (repeatable)."""
    video: Path | None = None
    """Video file, decoded with PyAV, frames sampled uniformly."""
    video_frames: int = Field(8, ge=1)
    """Frames sampled from --video."""

    @model_validator(mode="after")
    def _one_source(self) -> InputSource:
        check_sources(self.synthetic, self.images, self.video)
        if self.video is None and self.video_frames != type(self).model_fields["video_frames"].default:
            raise field_error("video_frames", "samples frames from --video, which is not given")
        return self
