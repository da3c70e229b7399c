"""Video decoding with PyAV and Qwen's frame-sampling rules; Qwen3-VL frame timestamps.

Example:
    >>> sample_frame_indices(total_frames=30, video_fps=10.0, fps=2.0, min_frames=4, max_frames=768,
    ...                      temporal_patch_size=2)
    [0, 6, 12, 17, 23, 29]
    >>> frame_timestamps([0, 6, 12, 17, 23, 29], video_fps=10.0, temporal_patch_size=2)
    [0.3, 1.45, 2.6]
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import av
import numpy as np

from vlforge.data.errors import SampleError
from vlforge.data.media import Media
from vlforge.data.vision import VisionSettings

logger = logging.getLogger(__name__)


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


@dataclass
class DecodedVideo:
    """Sampled RGB frames (HWC uint8) with where they came from."""

    frames: list[np.ndarray]
    indices: list[int]
    video_fps: float
    total_frames: int

    @property
    def sample_fps(self) -> float:
        """Sampled frames per second of video (Qwen2.5-VL's ``second_per_grid_ts`` = tp / this)."""
        return len(self.indices) / max(self.total_frames, 1) * self.video_fps


def _decode(media: Media, wanted: set[int] | None) -> tuple[dict[int, np.ndarray], int, float]:
    with media.open() as fh, av.open(fh) as container:
        if not container.streams.video:
            raise av.error.InvalidDataError(0, "no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        rate = stream.average_rate or stream.guessed_rate or 24
        kept: dict[int, np.ndarray] = {}
        count = 0
        for frame in container.decode(stream):
            if wanted is None or count in wanted:
                kept[count] = frame.to_ndarray(format="rgb24")
            count += 1
            if wanted is not None and len(kept) == len(wanted):
                break
        return kept, count, float(rate)


def _probe(media: Media) -> tuple[int, float]:
    with media.open() as fh, av.open(fh) as container:
        if not container.streams.video:
            raise av.error.InvalidDataError(0, "no video stream")
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate or 24)
        total = stream.frames
        if not total:  # container without a frame count: count packets
            total = sum(1 for p in container.demux(stream) if p.size)
        return int(total), rate


def decode_video(media: Media, settings: VisionSettings, *, source: str, location: str,
                 fps: float | None = None, frame_num: int | None = None, max_frames: int | None = None
                 ) -> DecodedVideo:
    """Sample and decode frames; undecodable input is a ``corrupt_video`` :class:`SampleError`."""
    by_num = settings.video_sampling_strategy == "frame_num" or frame_num is not None
    try:
        total, rate = _probe(media)
        if total <= 0:
            raise ValueError("video has no frames")
        for _attempt in range(2):
            indices = sample_frame_indices(
                total, rate, fps=None if by_num else (fps or settings.fps),
                frame_num=(frame_num or settings.frame_num) if by_num else None,
                min_frames=settings.video_min_frames, max_frames=max_frames or settings.video_max_frames,
                temporal_patch_size=settings.temporal_patch_size)
            kept, count, rate = _decode(media, set(indices))
            if len(kept) == len(set(indices)):
                break
            logger.debug("%s: frame count %d in metadata, %d decoded; resampling", media.label, total, count)
            total = count
            if total <= 0:
                raise ValueError("video has no decodable frames")
        else:
            raise ValueError(f"frames {sorted(set(indices) - set(kept))} could not be decoded")
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        raise SampleError("corrupt_video", source, location, f"cannot decode video {media.label}: {exc}") from exc
    return DecodedVideo([kept[i] for i in indices], indices, rate, total)
