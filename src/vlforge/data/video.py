"""Qwen's frame-sampling rules, the data pipeline's video decode (:mod:`vlforge.media.decode`, seeking; a video
given as frame images), Qwen3-VL frame timestamps.

Example:
    >>> sample_frame_indices(total_frames=30, video_fps=10.0, fps=2.0, min_frames=4, max_frames=768,
    ...                      temporal_patch_size=2)
    [0, 6, 12, 17, 23, 29]
    >>> frame_timestamps([0, 6, 12, 17, 23, 29], video_fps=10.0, temporal_patch_size=2)
    [0.3, 1.45, 2.6]
"""

from __future__ import annotations

import math

import numpy as np

from vlforge.data.errors import SampleError
from vlforge.data.media import FrameFiles, Media
from vlforge.data.schema import video_option_name
from vlforge.data.vision_settings import VisionSettings
from vlforge.media.decode import DECODE_ERRORS, DecodedVideo, read_video

__all__ = ["DecodedVideo", "decode_video", "frame_timestamps", "read_frame_files", "sample_frame_indices"]


def _floor_to(n: float, k: int) -> int:
    return math.floor(n / k) * k


def _round_to(n: float, k: int) -> int:
    return round(n / k) * k


def sample_frame_indices(total_frames: int, video_fps: float, *, fps: float | None = None,
                         frame_num: int | None = None, min_frames: int = 4, max_frames: int = 768,
                         temporal_patch_size: int = 2) -> list[int]:
    """Indices of the frames to decode, evenly spaced over the clip (first and last frame included).

    By ``fps``: ``total / video_fps * fps`` frames, clamped to ``[min_frames, min(max_frames, total)]``
    and floored to a multiple of ``temporal_patch_size``. By ``frame_num``: that count rounded to a
    multiple of ``temporal_patch_size`` and capped by ``max_frames``. Never fewer than
    ``temporal_patch_size`` frames: a clip shorter than that repeats its frames.
    """
    if total_frames <= 0:
        raise ValueError("video has no frames")
    tp = temporal_patch_size
    cap = max(tp, _floor_to(max_frames, tp))
    if frame_num is not None:
        n = min(max(tp, _round_to(frame_num, tp)), cap)
    else:
        assert fps is not None, "give fps or frame_num"
        lo = math.ceil(min_frames / tp) * tp
        hi = _floor_to(min(max_frames, total_frames), tp)
        n = min(max(total_frames / video_fps * fps, lo), hi, total_frames)
        n = max(tp, _floor_to(n, tp))
    return np.linspace(0, total_frames - 1, n).round().astype(int).tolist()


def frame_timestamps(indices: list[int], video_fps: float, temporal_patch_size: int = 2) -> list[float]:
    """Seconds per temporal patch: the mean time of its first and last frame (Qwen3-VL prompt text)."""
    idx = list(indices)
    if pad := -len(idx) % temporal_patch_size:
        idx += [idx[-1]] * pad
    return [(idx[i] + idx[i + temporal_patch_size - 1]) / 2 / video_fps
            for i in range(0, len(idx), temporal_patch_size)]


def read_frame_files(files: FrameFiles, settings: VisionSettings, *, source: str, location: str) -> DecodedVideo:
    """A video given as frame images, as qwen-vl-utils reads one: every frame, the last repeated up to a multiple
    of ``temporal_patch_size``, frame ``i`` at ``i / rate`` seconds. More frames than ``video_max_frames`` are
    sampled evenly down to it (only those are read). Frames of different sizes are a ``corrupt_video``
    :class:`SampleError`."""
    tp, count = settings.temporal_patch_size, len(files)
    cap = max(tp, settings.video_max_frames // tp * tp)
    if count > cap:
        indices = sample_frame_indices(count, files.rate, frame_num=cap, max_frames=cap, temporal_patch_size=tp)
        taken, total = indices, count
    else:
        total = count + -count % tp
        indices, taken = list(range(total)), [min(i, count - 1) for i in range(total)]
    decoded = {i: np.asarray(files.image(i)) for i in sorted(set(taken))}
    first, reference = next(iter(decoded.items()))
    for i, image in decoded.items():
        if image.shape != reference.shape:
            size = "{1}x{0}".format
            raise SampleError("corrupt_video", source, location,
                              f"frame {i + 1} of {count} is {size(*image.shape)}, frame {first + 1} is "
                              f"{size(*reference.shape)}: the frames of one video must share a size")
    return DecodedVideo([decoded[i] for i in taken], indices, files.rate, total, "frames", len(decoded))


def decode_video(media: Media | FrameFiles, settings: VisionSettings, *, source: str, location: str,
                 item_frames: int | None = None) -> DecodedVideo:
    """Sample and decode frames (seeking, see :mod:`vlforge.media.decode`); undecodable input is a
    ``corrupt_video`` :class:`SampleError`. Frame images (:class:`FrameFiles`) are read by
    :func:`read_frame_files`. ``item_frames``: the frame count the video's own part asks for (qwen-vl-utils'
    ``nframes``); more than the clip holds is a ``schema`` error, as qwen-vl-utils refuses it (the config's
    ``frame_num`` repeats frames, as LMMS Engine does)."""
    if isinstance(media, FrameFiles):
        return read_frame_files(media, settings, source=source, location=location)
    by_num = settings.video_sampling_strategy == "frame_num"

    def pick(total: int, rate: float) -> list[int]:
        tp = settings.temporal_patch_size
        if item_frames is not None and max(tp, _round_to(item_frames, tp)) > total:
            raise SampleError("schema", source, location, f"video option {video_option_name('frame_num')}: "
                              f"{item_frames} frames of a clip of {total} (a video's own count must be at most its "
                              "frames)")
        return sample_frame_indices(
            total, rate, fps=None if by_num else settings.fps, frame_num=settings.frame_num if by_num else None,
            min_frames=settings.video_min_frames, max_frames=settings.video_max_frames, temporal_patch_size=tp)

    try:
        return read_video(media.path if media.path is not None else media.open, pick, label=media.label)
    except DECODE_ERRORS as exc:
        raise SampleError("corrupt_video", source, location, f"cannot decode video {media.label}: {exc}") from exc
