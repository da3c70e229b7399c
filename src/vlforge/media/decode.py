"""The one video decoder (PyAV): decode only the chosen frames, seeking to the keyframe before each.

A frame's *index* is its position in presentation order: the n-th frame the decoder returns when the
stream is read from the start. :func:`read_video` returns exactly the frames the sequential read gives
for those indices, without decoding the whole clip:

1. Every frame's pts, from its packet; sorted, they are the presentation order, so index <-> pts needs no
   frame rate (variable frame rate, ``start_time != 0`` and B-frame reordering included). Keyframe packets
   give the seek points. For MP4/MOV streams of at least ``TABLES_MIN_FRAMES`` frames the packets' pts and
   keyframe flags come from the container's sample tables (:mod:`vlforge.media.mp4_index`; 4-14x faster
   than demuxing 9,000-36,000 packets), checked against the open container: stream, time base and frame
   count, 32 of FFmpeg's index entries, and the first two GOPs (at least 64 packets) demuxed. Otherwise -
   other containers, fragmented files, edit lists other than one plain edit, H.264 with recovery-point SEI
   or changing parameter sets, any disagreement - a demux pass over the packets (no decoding) gives them,
   with the reason logged at debug level. Both feed one function, so the frame index is the same either way.
2. For each wanted index (ascending), if a keyframe lies between the decoder's position and the target
   (and the target is more than ``near`` frames ahead), seek to that keyframe
   (``container.seek(pts, stream=..., backward=True, any_frame=False)``), else decode forward. Frames are
   recognised by pts; after a seek only frames from the first decoded keyframe on count. Packets are
   sent one by one: a packet whose pts is not wanted is decoded with ``skip_frame = "NONREF"``, so the
   decoder drops its frame when no other frame references it (H.264 non-reference B-frames, MPEG-4
   B-frames); a wanted packet uses ``DEFAULT``. Later frames are unchanged, as dropped frames are
   never predicted from. A wanted frame that still does not come out turns skipping off for the read.
3. The sequential read (today's path: decode from the start up to the last wanted frame) is used when
   the stream has no usable index (a packet without pts, duplicate pts, no packets), when the frame
   count in the metadata exceeds the packets (the sampler is re-run on the decoded count), or when a
   seek does not reach a wanted frame; the reason is logged at debug level.

The frame count given to ``pick`` is the container's ``stream.frames``, else the number of packets;
``pick(total, fps)`` returns the indices to keep (duplicates allowed).

Example:
    >>> import numpy as np, tempfile, pathlib, av
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "v.mp4"
    >>> with av.open(str(path), "w") as out:
    ...     s = out.add_stream("mpeg4", rate=10, options={"g": "5"}); s.width, s.height = 32, 32
    ...     for i in range(20):
    ...         f = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 12, np.uint8), format="rgb24")
    ...         _ = [out.mux(p) for p in s.encode(f)]
    ...     _ = [out.mux(p) for p in s.encode()]
    >>> video = read_video(path, lambda total, fps: [0, 9, 19])
    >>> video.total_frames, video.video_fps, video.method, [round(f.mean() / 12) for f in video.frames]
    (20, 10.0, 'seek', [0, 9, 19])
"""

from __future__ import annotations

import bisect
import io
import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from vlforge.media.mp4_index import Source, VideoSamples, read_video_samples

logger = logging.getLogger(__name__)

Pick = Callable[[int, float], list[int]]
"""``(total_frames, video_fps) -> indices`` of the frames to keep."""
Method = Literal["auto", "seek", "sequential"]

MOV_FORMAT = "mov,mp4,m4a,3gp,3g2,mj2"
"""FFmpeg's name of the demuxer whose files :mod:`vlforge.media.mp4_index` reads."""
TABLES_MIN_FRAMES = 300
"""Shorter MP4/MOV streams are demuxed: the tables' fixed cost (~1 ms) and check make them no faster."""
HEAD_PACKETS = 64
"""The fewest packets demuxed to check the sample tables against the demuxer."""
INDEX_CHECKS = 32
"""FFmpeg index entries compared with the sample tables (evenly spaced, the last included)."""

SEEK_THREAD_TYPE = "SLICE"
"""Threading of the seek path's decoder: slice threads only. Frame threading (PyAV's ``AUTO``) keeps a pipeline
of frames in flight that every seek flushes and refills; on reads that seek often it was slower at every size
tried (64x48 to 1280x720, GOP 30 and 250, 2 CPUs). The sequential read keeps ``AUTO``."""

DECODE_ERRORS: tuple[type[BaseException], ...] = (av.error.FFmpegError, ValueError, OSError)
"""What :func:`read_video` raises for an unreadable, corrupt or empty video."""


@dataclass
class DecodedVideo:
    """Sampled RGB frames (HWC uint8, in the order of ``indices``) with where they came from."""

    frames: list[np.ndarray]
    indices: list[int]
    video_fps: float
    total_frames: int
    method: str = "sequential"
    """``seek`` or ``sequential``: how the frames were reached (``frames``: a video given as frame images)."""
    frames_decoded: int = 0
    """Frames the decoder produced to get them (the cost; a sequential read decodes up to the last one)."""

    @property
    def sample_fps(self) -> float:
        """Sampled frames per second of video (Qwen2.5-VL's ``second_per_grid_ts`` = tp / this)."""
        return len(self.indices) / max(self.total_frames, 1) * self.video_fps


@dataclass(frozen=True)
class FrameIndex:
    """Presentation-ordered pts of every frame and the positions of the keyframes (0 always included)."""

    pts: np.ndarray
    keyframes: list[int]


class _Fallback(Exception):
    """The seek path cannot guarantee the sequential frames; the message says why."""


@contextmanager
def _open(source: Source) -> Iterator[Any]:
    if isinstance(source, (str, Path)):
        with av.open(str(source)) as container:
            yield container
    elif isinstance(source, (bytes, bytearray, memoryview)):
        with av.open(io.BytesIO(bytes(source))) as container:
            yield container
    else:
        with source() as fh, av.open(fh) as container:
            yield container


def _video_stream(container: Any) -> Any:
    if not container.streams.video:
        raise av.error.InvalidDataError(0, "no video stream")
    return container.streams.video[0]


def _rgb(frame: Any, reformatter: VideoReformatter) -> np.ndarray:
    """HWC uint8 RGB; one reformatter per read keeps its scaler (``frame.to_ndarray`` builds one per frame,
    about 1 ms each, with identical output)."""
    return reformatter.reformat(frame, format="rgb24").to_ndarray()


def _rate(stream: Any) -> float:
    return float(stream.average_rate or stream.guessed_rate or 24)


@dataclass(frozen=True)
class _Packets:
    """The video packets as the demux pass counts them: how many carry data, and the pts (None when one
    lacks it) and keyframe flags of those not marked discard, in decode order."""

    counted: int
    pts: np.ndarray | None
    keyframe: np.ndarray


def _probe(source: Source, want_index: bool, *, sample_tables: bool = True
           ) -> tuple[int, float, FrameIndex | None, str]:
    """Frame count, fps and (if asked) the frame index, from an MP4/MOV file's sample tables when they are
    shown to give the demuxer's packets (``sample_tables=False`` skips them), else from one demux pass; the
    last item says why there is no index."""
    with _open(source) as container:
        stream = _video_stream(container)
        rate = _rate(stream)
        if not want_index:
            total = stream.frames or sum(1 for p in container.demux(stream) if p.size)
            return int(total), rate, None, "sequential decode requested"
        demux = container.demux(stream)
        try:
            packets, why, head = (_packets_from_tables(source, container, stream, demux) if sample_tables
                                  else (None, "sample tables not asked for", []))
            if packets is None:
                logger.debug("frame index by demuxing (%s)", why)
                packets = _demuxed(chain(head, demux))
        finally:
            demux.close()  # the fast path leaves it part-read: end it while the container is open
        total = int(stream.frames or packets.counted)
    if packets.pts is None:
        return total, rate, None, "packets without pts"
    index, why = _frame_index(packets.pts, packets.keyframe)
    return total, rate, index, why


def _demuxed(packets: Iterable[Any]) -> _Packets:
    """Count the packets with data and keep the pts and keyframe flag of those not marked discard."""
    counted, pts, keys = 0, [], []
    for packet in packets:
        if not packet.size:
            continue
        counted += 1
        if not packet.is_discard:
            pts.append(packet.pts)
            keys.append(packet.is_keyframe)
    missing = any(p is None for p in pts)
    return _Packets(counted, None if missing else np.asarray(pts, dtype=np.int64), np.asarray(keys, dtype=bool))


def _frame_index(pts: np.ndarray, keyframe: np.ndarray) -> tuple[FrameIndex | None, str]:
    """Presentation order from the packets' pts (decode order) and the keyframes' positions in it."""
    if not len(pts):
        return None, "no packets"
    order = np.argsort(pts, kind="stable")
    ordered = pts[order]
    if np.any(np.diff(ordered) == 0):
        return None, "duplicate packet pts"
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    keyframes = sorted({0, *rank[keyframe].tolist()})
    return FrameIndex(ordered, keyframes), ""


def _packets_from_tables(source: Source, container: Any, stream: Any, demux: Iterator[Any]
                         ) -> tuple[_Packets | None, str, list[Any]]:
    """The packets from the MP4/MOV sample tables (:mod:`vlforge.media.mp4_index`) once cheap checks
    against the open container agree, else None and why; last, the packets read from ``demux`` meanwhile
    (the demux pass goes on from them)."""
    if container.format.name != MOV_FORMAT:
        return None, f"{container.format.name} is not an MP4/MOV container", []
    if 0 < stream.frames < TABLES_MIN_FRAMES:
        return None, f"{stream.frames} frames (demuxing so few is as fast)", []
    samples, why = read_video_samples(source)
    if samples is None:
        return None, why, []
    why = _stream_mismatch(samples, container, stream) or _index_entries_mismatch(samples, stream)
    if why:
        return None, why, []
    has_data = samples.size > 0  # an empty sample gives no packet or an empty one: neither is a frame
    pts, keyframe, size = samples.pts[has_data], samples.keyframe[has_data], samples.size[has_data]
    head = _read_head(demux, _head_length(keyframe))
    if _head_length(keyframe) == len(pts):
        head.extend(demux)  # the whole stream: nothing with data may follow
    why = _head_mismatch(head, pts, keyframe, size)
    if why:
        return None, why, head
    return _Packets(len(pts), pts, keyframe), "", head


def _stream_mismatch(samples: VideoSamples, container: Any, stream: Any) -> str:
    n = len(samples.pts)
    facts = {"time base": (stream.time_base, Fraction(1, samples.timescale)),
             "codec": (stream.codec_context.name, samples.codec),
             "stream index": (stream.index, samples.track_index), "track id": (stream.id, samples.track_id),
             "stream count": (len(container.streams), samples.track_count),
             "frame count": (stream.frames or n, n), "index entries": (len(stream.index_entries), n)}
    return next((f"{name} {got} != {want} of the sample tables" for name, (got, want) in facts.items()
                 if got != want), "")


def _index_entries_mismatch(samples: VideoSamples, stream: Any) -> str:
    """Spot-check FFmpeg's index (dts, keyframe, discard, size) at evenly spaced samples and the last."""
    entries = stream.index_entries
    for i in sorted({*np.linspace(0, len(samples.pts) - 1, INDEX_CHECKS).astype(int).tolist()}):
        entry = entries[i]
        got = (entry.timestamp, entry.is_keyframe, entry.is_discard, entry.size)
        want = (int(samples.dts[i]), bool(samples.sync[i]), False, int(samples.size[i]))
        if got != want:
            return f"index entry {i} is {got}, the sample tables give {want}"
    return ""


def _head_length(keyframe: np.ndarray) -> int:
    """Packets to compare: the first two GOPs (at most 1024 packets) or 64, whichever is more."""
    starts = np.flatnonzero(keyframe)
    two_gops = int(starts[2]) if len(starts) > 2 else len(keyframe)
    return min(len(keyframe), max(HEAD_PACKETS, min(two_gops, 1024)))


def _read_head(demux: Iterator[Any], count: int) -> list[Any]:
    """Packets from ``demux`` until ``count`` of them carry data."""
    head, with_data = [], 0
    for packet in demux:
        head.append(packet)
        with_data += bool(packet.size)
        if with_data == count:
            break
    return head


def _head_mismatch(head: list[Any], pts: np.ndarray, keyframe: np.ndarray, size: np.ndarray) -> str:
    """Compare the first demuxed packets with data (pts, keyframe, discard, size) with the sample tables'."""
    got = [(p.pts, p.is_keyframe, p.is_discard, p.size) for p in head if p.size]
    if len(got) != _head_length(keyframe):
        return f"the demuxer gave {len(got)} of the first {_head_length(keyframe)} packets of {len(pts)}"
    for i, packet in enumerate(got):
        want = (int(pts[i]), bool(keyframe[i]), False, int(size[i]))
        if packet != want:
            return f"packet {i} is {packet}, the sample tables give {want}"
    return ""


class _Cursor:
    """A decoder position in one open container; frames are identified by pts.

    With ``skip``, packets are sent one by one and every packet whose frame is not wanted is decoded with
    ``skip_frame = "NONREF"``: the decoder drops it only if no other frame references it (H.264
    ``nal_ref_idc == 0``, MPEG-4 B-frames, VP9 frames that refresh no reference), so every later frame is
    unchanged; wanted packets use ``DEFAULT``.
    """

    def __init__(self, container: Any, stream: Any, index: FrameIndex, wanted_pts: set[int], skip: bool) -> None:
        self.container, self.stream, self.index = container, stream, index
        self.position_of = {int(p): i for i, p in enumerate(index.pts)}
        self.wanted_pts, self.skip = wanted_pts, skip
        self.frames = self._decode()
        self.position = -1  # presentation index of the last decoded frame
        self.anchored = True  # decoding from the start: every frame counts
        self.decoded = 0
        self.jumped = False
        self.reformatter = VideoReformatter()

    def _decode(self) -> Iterator[Any]:
        context = self.stream.codec_context
        if not self.skip:
            context.skip_frame = "DEFAULT"
            yield from self.container.decode(self.stream)
            return
        wanted, mode = self.wanted_pts, context.skip_frame
        for packet in self.container.demux(self.stream):
            want = "DEFAULT" if packet.pts is None or packet.pts in wanted or not packet.size else "NONREF"
            if want != mode:
                context.skip_frame = mode = want
            yield from context.decode(packet)

    def close(self) -> None:
        """Finish the frame generator: it holds the codec context (and its decoding threads) in a reference
        cycle with this cursor, which would otherwise live until the next garbage collection - threads that a
        forked DataLoader worker would inherit mid-lock."""
        frames, self.frames = self.frames, iter(())
        frames.close()

    def seek(self, keyframe: int) -> None:
        self.container.seek(int(self.index.pts[keyframe]), stream=self.stream, backward=True, any_frame=False)
        self.frames = self._decode()
        self.position, self.anchored = -1, False

    def frame_at(self, target: int) -> np.ndarray | None:
        """Decode forward to ``target``; None when the decoder passes it or the stream ends (then
        ``jumped`` says whether it went past the target from before it, rather than landing after it)."""
        position_of, anchored = self.position_of, self.anchored
        self.jumped = True
        for frame in self.frames:
            self.decoded += 1
            position = position_of.get(frame.pts)
            if position is None:
                raise _Fallback(f"decoded frame pts {frame.pts} is not in the packet index")
            if not anchored:
                if not frame.key_frame:  # leading frames before the first keyframe after a seek
                    continue
                self.anchored = anchored = True
            previous, self.position = self.position, position
            if position == target:
                return _rgb(frame, self.reformatter)
            if position > target:
                self.jumped = previous >= 0
                return None
        return None


def _seek_decode(source: Source, index: FrameIndex, wanted: list[int], near: int, skip: bool = True
                 ) -> tuple[dict[int, np.ndarray], int]:
    kept: dict[int, np.ndarray] = {}
    keyframes = index.keyframes
    with _open(source) as container:
        stream = _video_stream(container)
        stream.thread_type = SEEK_THREAD_TYPE
        cursor = _Cursor(container, stream, index, {int(index.pts[i]) for i in wanted}, skip)
        try:
            return _seek_frames(cursor, keyframes, wanted, near, kept), cursor.decoded
        finally:
            cursor.close()  # the decoder's threads end with the read, not at the next garbage collection


def _seek_frames(cursor: _Cursor, keyframes: list[int], wanted: list[int], near: int,
                 kept: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    for target in wanted:
        at = bisect.bisect_right(keyframes, target) - 1
        seeked = keyframes[at] > cursor.position and target - cursor.position > near
        if seeked:
            cursor.seek(keyframes[at])
        tries = 0
        while (frame := cursor.frame_at(target)) is None:
            at -= seeked  # retry from the keyframe before the one that missed
            tries += 1
            if at < 0 or tries > 2:
                raise _Fallback(f"frame {target} not reached by seeking")
            if cursor.jumped:  # the target never came out (not a seek landing late): stop skipping
                cursor.skip = False
            cursor.seek(keyframes[at])
            seeked = True
        kept[target] = frame
    return kept


def _sequential(source: Source, wanted: set[int]) -> tuple[dict[int, np.ndarray], int]:
    """Decode from the start up to the last wanted frame; also the decoded count when it ends early."""
    with _open(source) as container:
        stream = _video_stream(container)
        stream.thread_type = "AUTO"
        kept: dict[int, np.ndarray] = {}
        count = 0
        reformatter = VideoReformatter()
        for frame in container.decode(stream):
            if count in wanted:
                kept[count] = _rgb(frame, reformatter)
            count += 1
            if len(kept) == len(wanted):
                break
        return kept, count


def read_video(source: Source, pick: Pick, *, method: Method = "auto", near: int = 8, skip_nonref: bool = True,
               label: str = "video") -> DecodedVideo:
    """The frames ``pick(total, fps)`` chooses, decoded by seeking (``auto``: sequential when the stream
    cannot be seeked exactly; ``seek``: raise instead; ``sequential``: always read from the start).
    ``skip_nonref`` lets the seek path drop unwanted frames no other frame references (same frames).

    Raises one of :data:`DECODE_ERRORS` for an unreadable or empty video.
    """
    if method not in ("auto", "seek", "sequential"):
        raise ValueError(f"method must be auto, seek or sequential, got {method!r}")
    total, rate, index, why = _probe(source, want_index=method != "sequential")
    if total <= 0:
        raise ValueError("video has no frames")
    indices = list(pick(total, rate))
    if index is not None and max(indices) < len(index.pts):
        try:
            kept, decoded = _seek_decode(source, index, sorted(set(indices)), near, skip_nonref)
            return DecodedVideo([kept[i] for i in indices], indices, rate, total, "seek", decoded)
        except _Fallback as exc:
            why = str(exc)
        except av.error.FFmpegError as exc:
            why = f"seek decode failed: {exc}"
    elif index is not None:
        why = f"metadata counts {total} frames, the stream has {len(index.pts)} packets"
    if method == "seek":
        raise ValueError(f"cannot seek in {label}: {why}")
    if method == "auto":
        logger.debug("%s: sequential decode (%s)", label, why)
    decoded = 0
    for attempt in range(2):
        if attempt:
            indices = list(pick(total, rate))
        kept, count = _sequential(source, set(indices))
        decoded += count
        if len(kept) == len(set(indices)):
            break
        logger.debug("%s: frame count %d in metadata, %d decoded; resampling", label, total, count)
        total = count
        if total <= 0:
            raise ValueError("video has no decodable frames")
    else:
        raise ValueError(f"frames {sorted(set(indices) - set(kept))} could not be decoded")
    return DecodedVideo([kept[i] for i in indices], indices, rate, total, "sequential", decoded)
