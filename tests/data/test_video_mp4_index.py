"""The MP4/MOV sample tables give exactly the demuxer's packets, so the fast frame index is the demux one.

Every clip is checked twice: :func:`mp4_index.read_video_samples` against all packets ``container.demux``
yields (pts, dts, keyframe, discard, size; no safety net involved), and ``decode._probe`` with and without
the sample tables (total, rate, presentation-ordered pts, keyframes). Clips the tables cannot prove equal must
fall back to demuxing, with the reason; damaged files must fall back or raise what the demux path raises.
"""

from __future__ import annotations

import io
import logging
import random
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from test_video_seek import _write

from vlforge.data.media import Media
from vlforge.media import decode, h264_keyframes, mp4_index

SIZE = 32
SINGLE_REFERENCE = "ref=1:keyint=250:min-keyint=250:scenecut=40"
"""x264 with one reference frame and scene cuts coded as I frames that are not IDR frames."""


@pytest.fixture(autouse=True)
def _tables_for_short_clips(monkeypatch):
    """The clips here are short; ``_probe`` would demux them (:data:`decode.TABLES_MIN_FRAMES`)."""
    monkeypatch.setattr(decode, "TABLES_MIN_FRAMES", 0)


def _clip(path: Path, *, codec: str = "libx264", bframes: int = 3, gop: int = 12, frames: int = 60,
          rate: int | Fraction = 30, muxer: dict | None = None, x264_params: str = "", audio_first: bool = False
          ) -> Path:
    """A tiny clip (a moving bar, a cut every 17 frames); ``muxer`` holds the mp4/mov muxer's options."""
    if codec not in av.codecs_available:
        pytest.skip(f"{codec} not in this PyAV build")
    options = {"g": str(gop), "bf": str(bframes)}
    if codec == "libx264":
        options.update(preset="veryfast", **({"x264-params": x264_params} if x264_params else {}))
    elif codec == "libx265":
        options = {"x265-params": f"bframes={bframes}:keyint={gop}:log-level=none"}
    rng = np.random.default_rng(0)
    with av.open(str(path), "w", options=muxer or {}) as out:
        audio = out.add_stream("aac", rate=16000) if audio_first else None
        video = out.add_stream(codec, rate=rate, options=options)
        video.width, video.height, video.pix_fmt = SIZE, SIZE, "yuv420p"
        for i in range(frames):
            pixels = rng.integers(0, 256, (SIZE, SIZE, 3), np.uint8) if i % 17 == 0 else np.zeros((SIZE, SIZE, 3),
                                                                                                  np.uint8)
            pixels[:, i % SIZE] = 255
            out.mux(video.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
            if audio is not None:
                sound = av.AudioFrame.from_ndarray(np.zeros((1, 533), np.float32), format="fltp", layout="mono")
                sound.sample_rate, sound.pts = 16000, i * 533
                out.mux(audio.encode(sound))
        out.mux(video.encode())
        if audio is not None:
            out.mux(audio.encode())
    return path


def _demuxed_packets(source: Path | bytes) -> list[tuple]:
    """(pts, dts, keyframe, discard, size) of every video packet with data, as the demuxer yields them."""
    with av.open(str(source) if isinstance(source, Path) else io.BytesIO(source)) as container:
        stream = container.streams.video[0]
        return [(p.pts, p.dts, p.is_keyframe, p.is_discard, p.size) for p in container.demux(stream) if p.size]


def _table_packets(samples: mp4_index.VideoSamples) -> list[tuple]:
    data = samples.size > 0
    return list(zip(samples.pts[data].tolist(), samples.dts[data].tolist(), samples.keyframe[data].tolist(),
                    [False] * int(data.sum()), samples.size[data].tolist(), strict=True))


def _outcome(source, sample_tables: bool):
    """``_probe``'s result in comparable form, or the type of what it raised."""
    try:
        total, rate, index, why = decode._probe(source, True, sample_tables=sample_tables)
    except Exception as exc:  # the type is what is compared
        return type(exc)
    return total, rate, None if index is None else (index.pts.tolist(), index.keyframes), why


def _fast_path(source) -> tuple[bool, str]:
    """Whether ``_probe`` takes the sample tables for ``source``, and the reason when it does not."""
    with decode._open(source) as container:
        stream = container.streams.video[0]
        demux = container.demux(stream)
        packets, why, _ = decode._packets_from_tables(source, container, stream, demux)
        demux.close()
    return packets is not None, why


def _assert_exact(source) -> None:
    """The sample tables give every packet and the same probe as demuxing, through the fast path."""
    samples, why = mp4_index.read_video_samples(source)
    assert samples is not None, why
    assert _table_packets(samples) == _demuxed_packets(source)
    fast, why = _fast_path(source)
    assert fast, why
    assert _outcome(source, True) == _outcome(source, False)


@pytest.mark.parametrize(("name", "kwargs"), [
    ("x264_bf0_gop12.mp4", dict(bframes=0)),
    ("x264_bf3_gop12.mp4", dict()),
    ("x264_bf3_gop1.mp4", dict(gop=1)),
    ("x264_bf3_one_gop.mp4", dict(gop=250)),
    ("x264_long.mp4", dict(frames=300)),  # longer than the checked head: the tables alone give the rest
    ("x264_ntsc.mp4", dict(rate=Fraction(24000, 1001))),
    ("x264_faststart.mp4", dict(muxer={"movflags": "faststart"})),  # moov before mdat
    ("x264.mov", dict()),
    ("x264_negative_cts.mp4", dict(muxer={"movflags": "negative_cts_offsets"})),  # ctts v1, dts_shift
    ("x264_no_edit_list.mp4", dict(muxer={"use_editlist": "0"})),
    ("x264_no_edit_negative_cts.mp4", dict(muxer={"use_editlist": "0", "movflags": "negative_cts_offsets"})),
    ("x264_90k.mp4", dict(muxer={"video_track_timescale": "90000"})),
    ("x264_aud_and_headers.mp4", dict(x264_params="aud=1:repeat-headers=1")),  # NAL units before slices
    ("x264_single_reference.mp4", dict(bframes=0, gop=250, frames=120, x264_params=SINGLE_REFERENCE)),
    ("x264_audio_first.mp4", dict(audio_first=True)),  # the video is the second track
    ("mpeg4_bf2.mp4", dict(codec="mpeg4", bframes=2)),
    ("mpeg4_bf0.mov", dict(codec="mpeg4", bframes=0)),
    ("hevc.mp4", dict(codec="libx265")),
])
def test_sample_tables_equal_the_demuxer(tmp_path, name, kwargs):
    _assert_exact(_clip(tmp_path / name, **kwargs))


@pytest.mark.parametrize("codec", ["libx264", "mpeg4"])
def test_variable_frame_rate_from_the_tables(tmp_path, codec):
    path = _write(tmp_path / f"vfr_{codec}.mp4", codec=codec, rate=30, gop=10, frames=140,
                  gaps=[33, 33, 100, 5, 40, 250, 17])
    _assert_exact(path)


def test_bytes_and_opener_sources_read_like_paths(tmp_path):
    path = _clip(tmp_path / "v.mp4", frames=100)
    by_path = _outcome(path, True)
    in_memory = Media(None, path.read_bytes(), "v.mp4")
    for source in (path.read_bytes(), Media(path, None, "v.mp4").open, in_memory.open):
        assert _fast_path(source)[0]
        assert _outcome(source, True) == by_path == _outcome(source, False)


@pytest.mark.parametrize(("make", "reason"), [
    (lambda p: _clip(p / "frag.mp4", muxer={"movflags": "frag_keyframe+empty_moov"}), "fragmented"),
    (lambda p: _clip(p / "v.mkv"), "not an MP4/MOV container"),
    (lambda p: _write(p / "offset.mp4", gaps=[33], first_pts=500), "2 edits"),  # an empty edit first
    (lambda p: _write(p / "vfr_offset.mp4", gaps=[33, 100, 5], first_pts=500), "2 edits"),
    (lambda p: _clip(p / "open_gop.mp4", x264_params="open-gop=1"), "recovery-point SEI"),
    (lambda p: _clip(p / "intra_refresh.mp4", bframes=0, x264_params="intra-refresh=1"), "recovery-point SEI"),
], ids=["fragmented", "mkv", "start_offset", "vfr_start_offset", "open_gop", "intra_refresh"])
def test_what_the_tables_cannot_prove_is_demuxed(tmp_path, make, reason):
    path = make(tmp_path)
    fast, why = _fast_path(path)
    assert not fast and reason in why
    assert _outcome(path, True) == _outcome(path, False)


def test_read_video_through_the_tables_gives_the_sequential_frames(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "TABLES_MIN_FRAMES", 300)
    path = _clip(tmp_path / "v.mp4", frames=360, gop=30)
    assert _fast_path(path)[0]

    def pick(total, rate):
        return [0, 1, 2, 45, 46, 131, 200, 299, 300, total - 1]

    seek, sequential = decode.read_video(path, pick, method="seek"), decode.read_video(path, pick, method="sequential")
    assert (seek.indices, seek.total_frames, seek.video_fps) == (sequential.indices, 360, sequential.video_fps)
    assert all(np.array_equal(a, b) for a, b in zip(seek.frames, sequential.frames, strict=True))


def test_short_streams_are_demuxed(tmp_path, monkeypatch):
    monkeypatch.setattr(decode, "TABLES_MIN_FRAMES", 300)
    path = _clip(tmp_path / "v.mp4")
    fast, why = _fast_path(path)
    assert not fast and why == "60 frames (demuxing so few is as fast)"


def test_the_fallback_reason_is_logged(tmp_path, caplog):
    path = _clip(tmp_path / "frag.mp4", muxer={"movflags": "frag_keyframe+empty_moov"})
    with caplog.at_level(logging.DEBUG, logger="vlforge.media.decode"):
        decode.read_video(path, lambda total, rate: [0, total - 1])
    assert "frame index by demuxing (fragmented" in caplog.text


def _patch_elst(data: bytes, **fields: int) -> bytes:
    """The clip with its (single, version 0) edit's ``duration``, ``media_time`` or ``rate`` replaced."""
    at = data.index(b"elst") + 12
    values = dict(zip(("duration", "media_time", "rate"), struct.unpack_from(">IiI", data, at), strict=True))
    values.update(fields)
    return data[:at] + struct.pack(">IiI", *values.values()) + data[at + 12:]


@pytest.mark.parametrize(("change", "reason"), [
    (lambda edit: dict(media_time=edit["media_time"] + 1024), "discard"),  # the first frames are cut
    (lambda edit: dict(duration=edit["duration"] // 2), "discard"),  # the last frames are cut
    (lambda edit: dict(rate=2 << 16), "rate 2.0"),
])
def test_an_edit_that_cuts_frames_or_changes_speed_is_demuxed(tmp_path, change, reason):
    data = _clip(tmp_path / "v.mp4").read_bytes()
    at = data.index(b"elst") + 12
    edit = dict(zip(("duration", "media_time", "rate"), struct.unpack_from(">IiI", data, at), strict=True))
    patched = tmp_path / "patched.mp4"
    patched.write_bytes(_patch_elst(data, **change(edit)))
    fast, why = _fast_path(patched)
    assert not fast and reason in why
    assert _outcome(patched, True) == _outcome(patched, False)
    if reason == "discard":
        assert any(packet[3] for packet in _demuxed_packets(patched))  # FFmpeg does mark packets discard


def test_a_file_cut_inside_its_samples_is_demuxed(tmp_path):
    """moov first, then a truncated mdat: the demuxer stops early, so the tables must not be used."""
    data = _clip(tmp_path / "v.mp4", frames=100, muxer={"movflags": "faststart"}).read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])
    fast, why = _fast_path(cut)
    assert not fast and "beyond the end of the file" in why
    assert _outcome(cut, True) == _outcome(cut, False)


@pytest.mark.parametrize("layout", ["moov_last", "faststart"])
def test_damaged_moov_falls_back_or_raises_as_before(tmp_path, layout):
    """Truncated or byte-damaged sample tables: the same result or the same exception type as demuxing."""
    muxer = {"movflags": "faststart"} if layout == "faststart" else None
    data = _clip(tmp_path / "v.mp4", frames=100, muxer=muxer).read_bytes()
    start = data.index(b"moov") - 4
    end = start + struct.unpack_from(">I", data, start)[0]
    damaged = [data[:(start + end) // 2], data[:start + 8]]  # moov cut in the middle / right after its header
    rng = random.Random(7)
    for _ in range(40):
        copy = bytearray(data)
        for _ in range(rng.choice([1, 2, 3])):
            copy[rng.randrange(start + 8, end)] = rng.choice([0, 1, 255, rng.randrange(256)])
        damaged.append(bytes(copy))
    for broken in damaged:
        got, want = _outcome(broken, True), _outcome(broken, False)
        assert got == want
        if isinstance(got, type):
            assert issubclass(got, decode.DECODE_ERRORS)


def test_ignoring_ctts_would_be_caught(tmp_path, monkeypatch):
    """Negative control: with B-frames, sample tables read without composition offsets give other pts than
    the demuxer - the comparison used above sees it, and the safety net in ``_probe`` falls back on it. (No
    edit list here: with one, the edit check already refuses such pts.)"""
    path = _clip(tmp_path / "v.mp4", frames=100, muxer={"use_editlist": "0"})
    honest, _ = mp4_index.read_video_samples(path)
    monkeypatch.setattr(mp4_index, "_composition_offsets", lambda track, n: (np.zeros(n, np.int64), 0))
    blind, why = mp4_index.read_video_samples(path)
    assert blind is not None, why
    assert _table_packets(honest) == _demuxed_packets(path) != _table_packets(blind)
    fast, why = _fast_path(path)
    assert not fast and why.startswith("packet 0 is")
    assert _outcome(path, True) == _outcome(path, False)


def test_h264_keyframes_are_the_parsers_not_stss(tmp_path):
    """FFmpeg's h264 parser decides the packet keyframe flags, whatever ``stss`` says: a clip remuxed with a
    B-frame marked sync and an IDR frame not marked still reads exactly."""
    source = _clip(tmp_path / "v.mp4", frames=60)
    remuxed = tmp_path / "remuxed.mp4"
    with av.open(str(source)) as src, av.open(str(remuxed), "w") as out:
        stream = out.add_stream_from_template(src.streams.video[0])
        for i, packet in enumerate(p for p in src.demux(src.streams.video[0]) if p.dts is not None):
            if i in (5, 12):
                packet.is_keyframe = not packet.is_keyframe
            packet.stream = stream
            out.mux(packet)
    samples, why = mp4_index.read_video_samples(remuxed)
    assert samples is not None, why
    assert not np.array_equal(samples.sync, samples.keyframe)
    _assert_exact(remuxed)


def test_single_reference_i_frames_are_keyframes_to_the_parser(tmp_path, monkeypatch):
    """FFmpeg's heuristic: an I slice is a keyframe when its PPS and SPS allow one reference frame. Here the
    scene cuts are such I frames (not IDR, not in ``stss``); without the heuristic the tables would differ."""
    path = _clip(tmp_path / "v.mp4", bframes=0, gop=250, frames=120, x264_params=SINGLE_REFERENCE)
    samples, _ = mp4_index.read_video_samples(path)
    assert samples.keyframe.sum() > samples.sync.sum() == 1
    monkeypatch.setattr(h264_keyframes, "_heuristic_keyframe", lambda rbsp, single_reference: False)
    monkeypatch.setattr(h264_keyframes, "_single_reference_i_slices",
                        lambda buffer, slices, single, count: (np.zeros(count, bool), slices[:0, 0]))
    blind, _ = mp4_index.read_video_samples(path)
    assert _table_packets(samples) == _demuxed_packets(path) != _table_packets(blind)
