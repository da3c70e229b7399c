"""The video track's packets as FFmpeg's mov demuxer yields them, read from an MP4/MOV file's ``moov`` box.

:func:`read_video_samples` walks the top-level boxes to ``moov`` (seeking over ``mdat``), takes the first
track whose handler is ``vide`` and turns its sample tables (``stts``, ``ctts``, ``stss``, ``stsz``,
``stsc``/``stco``, ``elst``) into per-sample dts, pts, keyframe flags and sizes with numpy - the values
``container.demux(stream)`` gives, following libavformat/mov.c (``mov_build_index``, ``mov_fix_index``,
``mov_read_packet``): the dts are shifted by the largest negative composition offset (``dts_shift``) and,
with an edit list, both timestamps by the smallest composition time so the first pts is 0. H.264 packet
keyframe flags are FFmpeg's h264 parser's, not ``stss``'s: :mod:`vlforge.media.h264_keyframes` reads them
from the ``avcC`` box and the first bytes of each sample.

Only what is proven equal is returned: fragmented files, more than one (or an empty) edit, a rate other than
1, an edit that would mark packets discard or cut the index, several sample descriptions, data outside the
file, other codecs, and anything malformed give ``None`` and a short reason (the caller demuxes instead).
"""

from __future__ import annotations

import io
import mmap
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vlforge.media import h264_keyframes

Source = str | Path | bytes | Callable[[], BinaryIO]
"""A file path, the file's bytes, or a function opening a binary file object (``Media.open``)."""

CODECS = {b"avc1": "h264", b"avc3": "h264", b"hvc1": "hevc", b"hev1": "hevc", b"mp4v": "mpeg4"}
"""Sample entries read here and FFmpeg's codec names for them. FFmpeg parses only H.264 packets of these
(``need_parsing``), which :mod:`~vlforge.media.h264_keyframes` reproduces; the others keep ``stss``'s flags."""
MAX_MOOV_BYTES = 1 << 28
MAX_SAMPLES = 1 << 26
"""More samples than this (620 hours at 30 fps) are left to the demuxer rather than allocated here."""
_UNIT_RATE = 0x10000  # edit-list media rate 1.0 (16.16 fixed point)
_TABLES = (b"stsd", b"stts", b"ctts", b"stss", b"stsz", b"stz2", b"stsc", b"stco", b"co64", b"stps")


class Unusable(Exception):
    """The tables cannot be shown to give FFmpeg's packets; the message says why."""


@dataclass(frozen=True)
class VideoSamples:
    """One entry per sample in decode order: FFmpeg's packet dts and pts (no discarded packets), its packet
    keyframe flag, its index-entry (``stss``) keyframe flag and its size; and the track's place in the file."""

    dts: np.ndarray
    pts: np.ndarray
    keyframe: np.ndarray
    sync: np.ndarray
    size: np.ndarray
    timescale: int
    codec: str
    track_id: int
    track_index: int
    track_count: int


@dataclass(frozen=True)
class _Track:
    """The boxes of one ``trak`` that matter here (payloads, without headers)."""

    track_id: int
    timescale: int
    handler: bytes
    tables: dict[bytes, memoryview]
    edits: memoryview | None
    groups: list[memoryview]
    dref: memoryview | None


def read_video_samples(source: Source) -> tuple[VideoSamples | None, str]:
    """The first video track's packets from the sample tables, or None and why they might differ from
    FFmpeg's. Never raises for a bad file (the demux path then reports it as before)."""
    try:
        with open_binary(source) as fh:
            moov, file_size = _read_moov(fh)
            samples = _video_samples(moov, file_size, fh)
    except Unusable as exc:
        return None, str(exc)
    except (OSError, ValueError, IndexError, OverflowError, struct.error) as exc:
        return None, f"unreadable sample tables ({type(exc).__name__}: {exc})"
    return samples, ""


@contextmanager
def open_binary(source: Source) -> Iterator[BinaryIO]:
    """A seekable binary file object for any :data:`Source`."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as fh:
            yield fh
    elif isinstance(source, (bytes, bytearray, memoryview)):
        yield io.BytesIO(source)
    else:
        with source() as fh:
            yield fh


def _read_moov(fh: BinaryIO) -> tuple[memoryview, int]:
    """The first top-level ``moov`` payload and the file size; the boxes before it are skipped by seeking."""
    file_size = fh.seek(0, io.SEEK_END)
    position = 0
    while position + 8 <= file_size:
        fh.seek(position)
        kind, start, end = _box_header(fh.read(16), position, file_size)
        if kind == b"moov":
            if end - start > MAX_MOOV_BYTES:
                raise Unusable(f"moov box of {end - start} bytes")
            fh.seek(start)
            data = fh.read(end - start)
            if len(data) != end - start:
                raise Unusable("moov box cut short")
            return memoryview(data), file_size
        if kind == b"moof":
            raise Unusable("fragmented file (moof before moov)")
        position = end
    raise Unusable("no moov box")


def _box_header(data: bytes | memoryview, position: int, limit: int) -> tuple[bytes, int, int]:
    """A box's type and absolute payload range, from its header at ``position`` (``data`` starts there)."""
    if len(data) < 8:
        raise Unusable(f"box header cut short at {position}")
    size, kind = struct.unpack_from(">I4s", data)
    header = 8
    if size == 1:
        if len(data) < 16:
            raise Unusable(f"box header cut short at {position}")
        size, header = struct.unpack_from(">Q", data, 8)[0], 16
    elif size == 0:
        size = limit - position
    if size < header or position + size > limit:
        raise Unusable(f"box {kind!r} at {position} has size {size} beyond its parent")
    return bytes(kind), position + header, position + size


def _children(data: memoryview) -> list[tuple[bytes, memoryview]]:
    """The boxes tiling a container payload (FFmpeg skips a tail shorter than a box header)."""
    boxes, position = [], 0
    while len(data) - position >= 8:
        size = struct.unpack_from(">I", data, position)[0]
        if size == 0:
            raise Unusable("box of size 0 inside moov")
        kind, start, end = _box_header(data[position:position + 16], position, len(data))
        boxes.append((kind, data[start:end]))
        position = end
    return boxes


def _only(boxes: list[tuple[bytes, memoryview]], kind: bytes, where: str) -> memoryview | None:
    found = [payload for name, payload in boxes if name == kind]
    if len(found) > 1:
        raise Unusable(f"{len(found)} {kind.decode()} boxes in {where}")
    return found[0] if found else None


def _need(boxes: list[tuple[bytes, memoryview]], kind: bytes, where: str) -> memoryview:
    payload = _only(boxes, kind, where)
    if payload is None:
        raise Unusable(f"no {kind.decode()} box in {where}")
    return payload


def _u32(data: memoryview, offset: int) -> int:
    return struct.unpack_from(">I", data, offset)[0]


def _full_box_field(data: memoryview, offset_v0: int, offset_v1: int) -> int:
    """A 32-bit field of a version 0/1 full box whose offset depends on the version (``tkhd``, ``mdhd``)."""
    return _u32(data, offset_v1 if data[0] == 1 else offset_v0)


def _video_samples(moov: memoryview, file_size: int, fh: BinaryIO) -> VideoSamples:
    boxes = _children(moov)
    if any(kind in (b"mvex", b"cmov") for kind, _ in boxes):
        raise Unusable("fragmented or compressed moov")
    kinds = [kind for kind, _ in boxes]
    if b"mvhd" not in kinds or b"trak" not in kinds or kinds.index(b"mvhd") > kinds.index(b"trak"):
        raise Unusable("mvhd missing or after the first track")
    movie_timescale = _full_box_field(_need(boxes, b"mvhd", "moov"), 12, 20)
    tracks = [_track(payload) for kind, payload in boxes if kind == b"trak"]
    video = next((i for i, track in enumerate(tracks) if track.handler == b"vide"), None)
    if video is None:
        raise Unusable("no video track")
    if any(_stts_entries(track) == 0 for track in tracks[:video + 1]):
        raise Unusable("a track without stts entries (FFmpeg then turns its edit-list handling off)")
    return _samples(tracks[video], movie_timescale, file_size, fh, video, len(tracks))


def _track(trak: memoryview) -> _Track:
    boxes = _children(trak)
    mdia = _children(_need(boxes, b"mdia", "trak"))
    minf = _children(_need(mdia, b"minf", "mdia"))
    stbl = _children(_need(minf, b"stbl", "minf"))
    tables = {kind: payload for kind in _TABLES if (payload := _only(stbl, kind, "stbl")) is not None}
    edts = _only(boxes, b"edts", "trak")
    dinf = _only(minf, b"dinf", "minf")
    return _Track(track_id=_full_box_field(_need(boxes, b"tkhd", "trak"), 12, 20),
                  timescale=_full_box_field(_need(mdia, b"mdhd", "mdia"), 12, 20),
                  handler=bytes(_need(mdia, b"hdlr", "mdia")[8:12]), tables=tables,
                  edits=_only(_children(edts), b"elst", "edts") if edts is not None else None,
                  groups=[payload for kind, payload in stbl if kind == b"sbgp"],
                  dref=_only(_children(dinf), b"dref", "dinf") if dinf is not None else None)


def _stts_entries(track: _Track) -> int:
    stts = track.tables.get(b"stts")
    return 0 if stts is None else _u32(stts, 4)


def _entries(payload: memoryview | None, kind: str, fields: int, header: int = 8, dtype: str = ">u4") -> np.ndarray:
    """A table's entries as an ``(n, fields)`` array; the count is the 32-bit field before ``header``."""
    if payload is None:
        raise Unusable(f"no {kind} box")
    count = _u32(payload, header - 4)
    width = np.dtype(dtype).itemsize * fields
    if header + count * width > len(payload):
        raise Unusable(f"{kind} box shorter than its {count} entries")
    return np.frombuffer(payload, dtype=dtype, count=count * fields, offset=header).reshape(count, fields)


def _samples(track: _Track, movie_timescale: int, file_size: int, fh: BinaryIO, index: int, count: int
             ) -> VideoSamples:
    codec = _codec(track)
    if not track.timescale:
        raise Unusable("no media timescale")
    _check_groups_and_refs(track)
    sizes = _sample_sizes(track)
    n = len(sizes)
    offsets = _sample_offsets(track, sizes, file_size)
    deltas = _decode_deltas(track, n)
    dts = np.zeros(n, np.int64)
    np.cumsum(deltas[:-1], out=dts[1:])
    composition, dts_shift = _composition_offsets(track, n)
    cts = dts + composition
    sync = _sync_samples(track, n)
    shift = _edit_shift(track, movie_timescale, dts, deltas, cts, sync, _has_ctts(track))
    keyframe = sync if codec != "h264" else _h264_keyframes(track, fh, offsets, sizes)
    return VideoSamples(dts=dts - dts_shift - shift, pts=cts - shift, keyframe=keyframe, sync=sync,
                        size=sizes.astype(np.int64), timescale=track.timescale, codec=codec,
                        track_id=track.track_id, track_index=index, track_count=count)


def _codec(track: _Track) -> str:
    stsd = track.tables.get(b"stsd")
    if stsd is None or _u32(stsd, 4) != 1:
        raise Unusable("not exactly one sample description")
    fourcc = bytes(stsd[12:16])
    if fourcc not in CODECS:
        raise Unusable(f"sample entry {fourcc!r} not handled")
    return CODECS[fourcc]


def _check_groups_and_refs(track: _Track) -> None:
    """Sample groups FFmpeg turns into keyframes, partial sync samples and external data are not handled."""
    for group in track.groups:
        if bytes(group[4:8]) in (b"rap ", b"sync"):
            raise Unusable(f"{bytes(group[4:8])!r} sample group")
    stps = track.tables.get(b"stps")
    if stps is not None and _u32(stps, 4):
        raise Unusable("partial sync samples (stps)")
    if track.dref is not None:
        for kind, entry in _children(track.dref[8:]):
            if kind == b"alis" and len(entry) + 8 > 150:
                raise Unusable("data reference to another file")
    if b"stz2" in track.tables:
        raise Unusable("compact sample sizes (stz2)")


def _sample_sizes(track: _Track) -> np.ndarray:
    stsz = track.tables.get(b"stsz")
    if stsz is None:
        raise Unusable("no stsz box")
    constant, n = _u32(stsz, 4), _u32(stsz, 8)
    if not 0 < n <= MAX_SAMPLES:
        raise Unusable(f"{n} samples")
    sizes = np.full(n, constant, np.int64) if constant else _entries(stsz, "stsz", 1, header=12)[:, 0]
    if sizes.max() > 0x3FFFFFFF:
        raise Unusable("a sample over 1 GiB")
    return sizes.astype(np.int64)


def _sample_offsets(track: _Track, sizes: np.ndarray, file_size: int) -> np.ndarray:
    """Each sample's file offset (``stsc`` x ``stco``/``co64``); all data must lie inside the file, as a
    truncated file makes the demuxer stop early."""
    if (b"stco" in track.tables) == (b"co64" in track.tables):
        raise Unusable("not exactly one of stco and co64")
    chunks = (_entries(track.tables.get(b"stco"), "stco", 1) if b"stco" in track.tables
              else _entries(track.tables.get(b"co64"), "co64", 1, dtype=">u8"))[:, 0].astype(np.int64)
    table = _entries(track.tables.get(b"stsc"), "stsc", 3).astype(np.int64)
    first, per_chunk, description = table[:, 0], table[:, 1], table[:, 2]
    if (not len(table) or first[0] != 1 or np.any(np.diff(first) <= 0) or first[-1] > len(chunks)
            or np.any(per_chunk < 1) or np.any(per_chunk >= 1 << 31) or np.any(description != 1)):
        raise Unusable("irregular stsc")
    runs = np.diff(np.append(first, len(chunks) + 1))
    samples_per_chunk = np.repeat(per_chunk, runs)
    if samples_per_chunk.sum() != len(sizes):
        raise Unusable(f"stsc places {samples_per_chunk.sum()} samples, stsz has {len(sizes)}")
    chunk_of = np.repeat(np.arange(len(chunks)), samples_per_chunk)
    before = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=before[1:])
    chunk_start = np.zeros(len(chunks), np.int64)
    np.cumsum(samples_per_chunk[:-1], out=chunk_start[1:])
    offsets = chunks[chunk_of] + before[:-1] - before[chunk_start][chunk_of]
    if np.any(chunks < 0) or int((offsets + sizes).max()) > file_size:
        raise Unusable("sample data beyond the end of the file")
    return offsets


def _decode_deltas(track: _Track, n: int) -> np.ndarray:
    stts = _entries(track.tables.get(b"stts"), "stts", 2)
    counts, deltas = stts[:, 0], stts[:, 1]
    if np.any(counts == 0) or int(counts.sum(dtype=np.int64)) != n:
        raise Unusable(f"stts counts {int(counts.sum(dtype=np.int64))} samples for {n}")
    if np.any(deltas >= 1 << 31):
        raise Unusable("stts delta FFmpeg would clip")
    return np.repeat(deltas.astype(np.int64), counts.astype(np.int64))


def _composition_offsets(track: _Track, n: int) -> tuple[np.ndarray, int]:
    """Per-sample composition offsets and FFmpeg's ``dts_shift`` (the largest negative offset, the last two
    entries excepted, as ``mov_read_ctts`` does)."""
    if not _has_ctts(track):
        return np.zeros(n, np.int64), 0
    ctts = track.tables[b"ctts"]
    version = ctts[0]
    table = _entries(ctts, "ctts", 2)
    counts, offsets = table[:, 0].astype(np.int64), table[:, 1].astype(np.uint32).view(np.int32).astype(np.int64)
    if version > 1 or (version == 0 and np.any(offsets < 0)):
        raise Unusable(f"ctts version {version} with offsets over 2^31")
    if np.any(counts == 0) or np.any(counts >= 1 << 31) or int(counts.sum()) != n:
        raise Unusable(f"ctts counts {int(counts.sum())} samples for {n}")
    if np.any(np.abs(offsets) >= 1 << 28):
        raise Unusable("ctts offset FFmpeg rejects as invalid")
    counted = offsets[:-2]
    dts_shift = max(0, int(-counted.min())) if len(counted) else 0
    return np.repeat(offsets, counts), dts_shift


def _has_ctts(track: _Track) -> bool:
    """A ``ctts`` box with entries (FFmpeg ignores an empty one)."""
    ctts = track.tables.get(b"ctts")
    return ctts is not None and _u32(ctts, 4) > 0


def _sync_samples(track: _Track, n: int) -> np.ndarray:
    stss = track.tables.get(b"stss")
    if stss is None:
        return np.ones(n, bool)
    numbers = _entries(stss, "stss", 1)[:, 0].astype(np.int64)
    if not len(numbers):
        raise Unusable("empty stss (FFmpeg parses the keyframes)")
    if numbers[0] < 1 or numbers[-1] > n or np.any(np.diff(numbers) <= 0):
        raise Unusable("irregular stss")
    sync = np.zeros(n, bool)
    sync[numbers - 1] = True
    return sync


def _edit_shift(track: _Track, movie_timescale: int, dts: np.ndarray, deltas: np.ndarray, cts: np.ndarray,
                sync: np.ndarray, has_ctts: bool) -> int:
    """What FFmpeg subtracts from every timestamp for the track's edit list (``mov_fix_index``): with one
    edit keeping every sample, the smallest composition time, so that the first pts is 0."""
    edits = track.edits
    if edits is None or _u32(edits, 4) == 0:
        return 0
    version, count = edits[0], _u32(edits, 4)
    width = 20 if version == 1 else 12
    if count != 1 or len(edits) != 8 + width or version > 1:
        raise Unusable(f"{count} edits in elst")
    duration, media_time, rate = struct.unpack_from(">QqI" if version == 1 else ">IiI", edits, 8)
    if media_time < 0 or rate != _UNIT_RATE:
        raise Unusable(f"edit with media time {media_time}, rate {rate / _UNIT_RATE}")
    if movie_timescale <= 0 or duration >= 1 << 62:
        raise Unusable("edit duration out of range")
    end = media_time + (duration * track.timescale + movie_timescale // 2) // movie_timescale
    if cts.min() < media_time or cts.max() >= end:
        raise Unusable("the edit list would mark packets discard")
    later_start = (sync[1:] & (cts[1:] <= media_time)) if has_ctts else (dts[1:] <= media_time)
    if later_start.any():
        raise Unusable("the edit would start after the first sample")
    ends = (cts[:-1] + deltas[:-1] >= end) & sync[:-1]
    if ends.sum() > (1 if has_ctts else 0):
        raise Unusable("the edit would cut the index before the last sample")
    return max(int(cts.min()), 0)


def _h264_keyframes(track: _Track, fh: BinaryIO, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    avcc = _avcc(track.tables[b"stsd"])
    with _mapped(fh) as data:
        keyframe, why = h264_keyframes.parser_keyframes(data, offsets, sizes, avcc)
    if keyframe is None:
        raise Unusable(why)
    return keyframe


def _avcc(stsd: memoryview) -> bytes:
    """The ``avcC`` box payload of the (single) AVC sample entry: FFmpeg's extradata for the parser."""
    entry = stsd[8:8 + _u32(stsd, 8)]
    avcc = _only(_children(entry[86:]), b"avcC", "the AVC sample entry") if len(entry) > 86 else None
    if avcc is None:
        raise Unusable("no avcC box")
    return bytes(avcc)


@contextmanager
def _mapped(fh: BinaryIO) -> Iterator[bytes | mmap.mmap]:
    """The whole file as a buffer without reading it: a BytesIO's own bytes (no copy), else a memory map."""
    if isinstance(fh, io.BytesIO):
        yield fh.getvalue()
        return
    try:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, AttributeError, ValueError, io.UnsupportedOperation) as exc:
        raise Unusable("H.264 keyframes need the sample data, and the file object cannot be mapped") from exc
    try:
        yield mapped
    finally:
        with suppress(BufferError):  # a view still alive (an exception's traceback): closed when collected
            mapped.close()
