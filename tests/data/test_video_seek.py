"""Seeking decode == sequential decode, frame by frame, on generated videos (GOP, fps, VFR, containers, codecs).

The seek path also drops non-reference frames it does not need (``skip_frame = "NONREF"``); the same
comparisons cover it. Every frame carries its own index as a 16-bit pattern of black/white blocks, so a test also checks the
frames are the right ones, not only that both paths agree.
"""

from __future__ import annotations

import logging
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from vlforge.data import VisionSettings
from vlforge.data.errors import SampleError
from vlforge.data.media import Media
from vlforge.data.video import decode_video, sample_frame_indices
from vlforge.media import decode
from vlforge.media.decode import read_video

W, H = 64, 48


def _pattern(i: int) -> np.ndarray:
    """Frame ``i``: bits 0-7 in the top half, 8-15 in the bottom half, one 8-px column per bit."""
    img = np.zeros((H, W, 3), np.uint8)
    for bit in range(16):
        if i >> bit & 1:
            row, col = divmod(bit, 8)
            img[row * 24:(row + 1) * 24, col * 8:(col + 1) * 8] = 255
    return img


def _index_of(frame: np.ndarray) -> int:
    value = 0
    for bit in range(16):
        row, col = divmod(bit, 8)
        if frame[row * 24 + 6:(row + 1) * 24 - 6, col * 8 + 2:(col + 1) * 8 - 2].mean() > 128:
            value |= 1 << bit
    return value


def _write(path: Path, *, codec: str = "libx264", rate: Fraction | int = 30, gop: int = 12, frames: int = 120,
           gaps: list[int] | None = None, first_pts: int = 0) -> Path:
    """A tiny clip; ``gaps`` (ms between frames) makes it variable-frame-rate with hand-set pts."""
    if codec not in av.codecs_available:
        pytest.skip(f"{codec} not in this PyAV build")
    options = {"g": str(gop)}
    if codec == "libx264":
        options.update(preset="veryfast", bf="3")  # B-frames: decode order != presentation order
    elif codec == "mpeg4":
        options.update(bf="2", qscale="2")
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate, options=options)
        stream.width, stream.height, stream.pix_fmt = W, H, "yuv420p"
        if gaps is not None:
            stream.codec_context.time_base = Fraction(1, 1000)
        pts = first_pts
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(_pattern(i), format="rgb24")
            if gaps is not None:
                frame.pts, frame.time_base = pts, Fraction(1, 1000)
                pts += gaps[i % len(gaps)]
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def _samplers(total_hint: int) -> list:
    def by_fps(fps: float):
        return lambda total, rate: sample_frame_indices(total, rate, fps=fps, max_frames=4096)

    def scattered(total: int, rate: float) -> list[int]:
        rng = np.random.default_rng(total_hint)
        return sorted(rng.choice(total, size=min(total, 25), replace=False).tolist())

    picks = [by_fps(0.5), by_fps(2), by_fps(7),
             lambda total, rate: sample_frame_indices(total, rate, frame_num=16),
             scattered,
             lambda total, rate: [total - 1, 0, 3, 3, total // 2]]  # unsorted with a repeat
    return picks


def _every_frame(path: Path) -> list[np.ndarray]:
    """The pre-seeking reader: decode everything from the start, ``to_ndarray`` per frame."""
    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(container.streams.video[0])]


def _assert_same(path: Path, expect_method: str = "seek") -> None:
    every = _every_frame(path)
    for pick in _samplers(7):
        seq = read_video(path, pick, method="sequential")
        got = read_video(path, pick)
        assert got.method == expect_method
        assert (got.indices, got.total_frames, got.video_fps) == (seq.indices, seq.total_frames, seq.video_fps)
        assert len(got.frames) == len(seq.indices)
        for i, a, b in zip(got.indices, got.frames, seq.frames, strict=True):
            assert np.array_equal(a, b) and np.array_equal(a, every[i]), f"frame {i} differs"
            assert _index_of(a) == i, f"frame {i} decodes as {_index_of(a)}"


@pytest.mark.parametrize(("codec", "rate", "gop", "ext"), [
    ("libx264", Fraction(24000, 1001), 12, "mp4"),
    ("libx264", 25, 1, "mp4"),
    ("libx264", 30, 250, "mp4"),
    ("libx264", 60, 12, "mkv"),  # matroska: 1 ms time base, stream.frames == 0
    ("libx264", Fraction(24000, 1001), 24, "ts"),  # start_time != 0
    ("mpeg4", 25, 12, "mp4"),
    ("mpeg4", 30, 250, "mkv"),
    ("libvpx-vp9", 30, 12, "webm"),
    ("mpeg4", 25, 12, "avi"),  # AVI flags every packet as a keyframe: seeks must check decoded key frames
])
def test_seek_equals_sequential_frame_by_frame(tmp_path, codec, rate, gop, ext):
    path = _write(tmp_path / f"v.{ext}", codec=codec, rate=rate, gop=gop, frames=150)
    _assert_same(path)


@pytest.mark.parametrize(("codec", "ext"), [("libx264", "mp4"), ("libx264", "mkv"), ("mpeg4", "mkv")])
def test_variable_frame_rate_uses_pts_order_not_time_times_fps(tmp_path, codec, ext):
    gaps = [33, 33, 100, 5, 40, 250, 17]  # irregular: index != round(t * fps)
    path = _write(tmp_path / f"vfr.{ext}", codec=codec, rate=30, gop=10, frames=140, gaps=gaps, first_pts=500)
    _assert_same(path)


def test_seeking_decodes_fewer_frames_than_the_clip(tmp_path):
    """A sparse pick over a short-GOP clip must not decode every frame (the point of seeking)."""
    path = _write(tmp_path / "long.mp4", codec="libx264", rate=30, gop=10, frames=300)
    video = read_video(path, lambda total, rate: [5, 150, 299], method="seek")
    assert [_index_of(f) for f in video.frames] == [5, 150, 299]
    assert video.frames_decoded <= 3 * (10 + 4), video.frames_decoded  # a GOP (+ B-frame delay) per frame
    assert read_video(path, lambda total, rate: [5, 150, 299], method="sequential").frames_decoded == 300


@pytest.mark.parametrize(("codec", "ext"), [("libx264", "mp4"), ("libx264", "ts"), ("mpeg4", "mkv")])
def test_skipping_non_reference_frames_decodes_fewer_with_the_same_frames(tmp_path, codec, ext):
    """B-frames nothing refers to are dropped on the way to a wanted frame; wanted B-frames are kept."""
    path = _write(tmp_path / f"v.{ext}", codec=codec, rate=25, gop=250, frames=150)
    every = _every_frame(path)
    wanted = [1, 2, 3, 40, 41, 77, 100, 149]  # next to the keyframe: B-frames among them
    skip = read_video(path, lambda total, rate: wanted, method="seek")
    full = read_video(path, lambda total, rate: wanted, method="seek", skip_nonref=False)
    assert skip.frames_decoded < full.frames_decoded * 0.8, (skip.frames_decoded, full.frames_decoded)
    for i, a, b in zip(wanted, skip.frames, full.frames, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, every[i]) and _index_of(a) == i


def test_a_wanted_frame_dropped_by_skipping_turns_skipping_off(tmp_path, monkeypatch):
    """If the decoder drops a wanted frame anyway, the seek is retried without skipping: same frames."""
    path = _write(tmp_path / "v.mp4", codec="libx264", rate=25, gop=30, frames=150)
    every = _every_frame(path)
    blind = decode._Cursor

    class Blind(blind):  # forgets which packets are wanted: wanted B-frames get dropped too
        def __init__(self, container, stream, index, wanted_pts, skip):
            super().__init__(container, stream, index, set(), skip)

    monkeypatch.setattr(decode, "_Cursor", Blind)
    wanted = list(range(0, 150, 7))
    video = read_video(path, lambda total, rate: wanted, method="seek")
    assert [_index_of(f) for f in video.frames] == wanted
    assert all(np.array_equal(f, every[i]) for i, f in zip(wanted, video.frames, strict=True))


def test_sequential_fallback_without_pts_is_logged(tmp_path, caplog):
    """Raw H.264 (Annex B) has no container timestamps: the reader falls back and says why at debug."""
    path = _write(tmp_path / "raw.h264", codec="libx264", rate=25, gop=12, frames=40)
    with caplog.at_level(logging.DEBUG, logger="vlforge.media.decode"):
        video = read_video(path, lambda total, rate: [0, 17, 39])
    assert video.method == "sequential"
    assert [_index_of(f) for f in video.frames] == [0, 17, 39]
    assert "sequential decode (" in caplog.text
    with pytest.raises(ValueError, match="cannot seek"):
        read_video(path, lambda total, rate: [0], method="seek")


def test_metadata_frame_count_too_high_resamples_like_before(tmp_path):
    """mp4 truncated mid-stream keeps its frame count in the header: both paths resample on the decoded count."""
    path = _write(tmp_path / "v.mp4", codec="libx264", rate=25, gop=12, frames=120)
    fast = tmp_path / "fast.mp4"
    with av.open(str(path)) as src, av.open(str(fast), "w", options={"movflags": "faststart"}) as out:
        stream = out.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(src.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                out.mux(packet)
    data = fast.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])

    def pick(total, rate):
        return sample_frame_indices(total, rate, fps=5)

    seq = read_video(cut, pick, method="sequential")
    got = read_video(cut, pick)
    assert seq.total_frames < 120 and got.total_frames == seq.total_frames
    assert got.indices == seq.indices
    assert all(np.array_equal(a, b) for a, b in zip(got.frames, seq.frames, strict=True))


def _settings() -> VisionSettings:
    return VisionSettings.for_family("qwen3_vl", min_pixels=32 * 32, max_pixels=64 * 64, video_min_pixels=16 * 16,
                                     video_max_pixels=64 * 64)


@pytest.mark.parametrize("damage", ["truncated_moov", "garbage", "empty", "zeroed_middle"])
def test_corrupt_or_unseekable_video_is_a_sample_error_or_the_sequential_result(tmp_path, damage):
    path = _write(tmp_path / "v.mp4", codec="libx264", rate=25, gop=12, frames=100)
    data = bytearray(path.read_bytes())
    bad = tmp_path / "bad.mp4"
    if damage == "truncated_moov":  # moov at the end: cutting the file loses the index entirely
        bad.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "garbage":
        bad.write_bytes(b"not a video at all" * 50)
    elif damage == "empty":
        bad.write_bytes(b"")
    else:  # packets in the middle overwritten: the index stays, the payload is broken
        middle = len(data) // 2
        data[middle - 2000:middle + 2000] = bytes(4000)
        bad.write_bytes(bytes(data))
    media = Media(bad, None, "bad.mp4")
    try:
        video = decode_video(media, _settings(), source="d.jsonl", location="line 7")
    except SampleError as err:
        assert err.reason == "corrupt_video"
        assert str(err).startswith("d.jsonl:line 7: corrupt_video: cannot decode video bad.mp4")
        if damage == "zeroed_middle":  # then the sequential reader must fail too
            with pytest.raises(ValueError):
                read_video(bad, lambda total, rate: list(range(total)), method="sequential")
        return
    assert damage == "zeroed_middle", f"{damage}: expected a SampleError"
    seq = read_video(bad, lambda total, rate: video.indices, method="sequential")
    assert all(np.array_equal(a, b) for a, b in zip(video.frames, seq.frames, strict=True))


def test_bytes_and_file_objects_read_like_paths(tmp_path):
    path = _write(tmp_path / "v.mp4", codec="libx264", rate=25, gop=12, frames=60)
    by_path = read_video(path, lambda total, rate: [3, 40])
    by_bytes = read_video(path.read_bytes(), lambda total, rate: [3, 40])
    by_file = read_video(Media(path, None, "v.mp4").open, lambda total, rate: [3, 40])
    assert by_bytes.method == by_file.method == "seek"
    for other in (by_bytes, by_file):
        assert all(np.array_equal(a, b) for a, b in zip(by_path.frames, other.frames, strict=True))


def test_a_read_leaves_no_decoder_threads_behind(tmp_path):
    """The frame generator holds the codec context in a cycle with the cursor: unless the read closes it, PyAV's
    frame threads outlive the read until a garbage collection, and a DataLoader worker forked meanwhile can
    inherit one mid-lock and hang (seen in the suite)."""
    import gc

    from datakit import write_video

    from vlforge.media.decode import read_video

    def av_threads() -> int:
        return sum(1 for t in Path("/proc/self/task").iterdir() if (t / "comm").read_text().startswith("av:"))

    if not Path("/proc/self/task").is_dir():
        pytest.skip("needs /proc (Linux)")
    clip = write_video(tmp_path / "v.mp4", frames=120, codec="mpeg4")
    gc.collect()
    before = av_threads()
    gc.disable()
    try:
        for _ in range(3):
            out = read_video(clip, lambda total, fps: [5, 60, 110], method="seek")
        assert out.indices == [5, 60, 110]
        assert av_threads() == before
    finally:
        gc.enable()
