"""Which H.264 samples FFmpeg's demuxer flags as keyframes, read from the first bytes of each sample.

The mov demuxer runs FFmpeg's h264 parser on every packet (``need_parsing = AVSTREAM_PARSE_HEADERS``), and
the parser's decision replaces the ``stss`` flag (libavcodec/h264_parser.c ``parse_nal_units``). A packet is
a keyframe when its first slice is an IDR slice, when a recovery-point SEI comes before that slice, or -
FFmpeg's "non marked keyframes" heuristic - when that slice is an I slice whose PPS has one default list-0
reference and whose SPS at most one reference frame. This module reproduces that from the ``avcC`` parameter
sets and the length-prefixed NAL units of each sample up to its first slice: vectorised while a sample
starts with a slice (after at most a few access unit delimiters), in Python for the samples with other NAL
units first (SEI, parameter sets). What it does not reproduce makes :func:`parser_keyframes` give None, and
the caller demuxes: a recovery-point SEI, in-band parameter sets that differ from the ``avcC`` ones,
multiview/SVC NAL units, FMO, a start code inside a NAL unit, malformed headers.
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass

import numpy as np

SLICE, IDR_SLICE, SEI, SPS, PPS, ACCESS_UNIT_DELIMITER = 1, 5, 6, 7, 8, 9
UNHANDLED_NAL_TYPES = frozenset({15, 19, 20, 21, 22, 23})
"""Subset SPS and extension slices (MVC/SVC): newer FFmpeg parsers treat them as SPS/slices."""
RECOVERY_POINT = 6
"""SEI payload type of a recovery point."""
I_SLICE = 2
"""``slice_type % 5`` of an I slice."""
HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135, 144})
"""Profiles whose SPS carries chroma format, bit depths and scaling matrices (``ff_h264_decode_seq_parameter_set``)."""
VECTOR_STEPS = 3
"""NAL units looked at per sample before a sample goes to the Python walk."""
_ESCAPE = re.compile(rb"\x00\x00\x03")


class _Uncertain(Exception):
    """The parser's decision for a sample is not reproduced here."""


@dataclass(frozen=True)
class _ParameterSets:
    """The ``avcC`` box: NAL length size, its SPS/PPS NAL units, and the PPS ids whose I slices the
    parser's heuristic calls keyframes (one list-0 reference, an SPS with at most one reference frame)."""

    length_size: int
    nal_units: frozenset[bytes]
    single_reference: frozenset[int]


def parser_keyframes(data: bytes | mmap.mmap, offsets: np.ndarray, sizes: np.ndarray, avcc: bytes
                     ) -> tuple[np.ndarray | None, str]:
    """Per sample (``offsets``/``sizes`` into ``data``, a buffer holding the whole file): FFmpeg's packet
    keyframe flag; or None and why it is not certain. ``avcc`` is the ``avcC`` box payload."""
    try:
        sets = _parameter_sets(avcc)
        buffer = np.frombuffer(data, np.uint8)
        offsets, sizes = offsets.astype(np.int64), sizes.astype(np.int64)
        keyframe, first_slice, pending = _leading_slices(buffer, offsets, sizes, sets.length_size)
        if sets.single_reference:
            heuristic, undecided = _single_reference_i_slices(buffer, first_slice, sets.single_reference,
                                                               len(offsets))
            keyframe |= heuristic
            pending = np.union1d(pending, undecided)
        if len(pending) > max(256, len(offsets) // 4):
            return None, f"{len(pending)} samples need a NAL walk in Python (demuxing is as fast)"
        for sample in pending.tolist():
            keyframe[sample] = _walk(data, int(offsets[sample]), int(sizes[sample]), sets)
    except _Uncertain as exc:
        return None, str(exc)
    return keyframe, ""


def _leading_slices(buffer: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, length_size: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For the samples whose first NAL unit after any 2-byte access unit delimiters is a slice: whether it is
    an IDR slice, and (as ``(sample, header offset, NAL size)`` rows) where its non-IDR slices start; last,
    the indices of the other samples (for :func:`_walk`)."""
    keyframe = np.zeros(len(offsets), bool)
    pending = np.arange(len(offsets))
    position = np.zeros(len(offsets), np.int64)
    unresolved, non_idr = [], []
    for _ in range(VECTOR_STEPS):
        fits = position[pending] + length_size < sizes[pending]
        unresolved.append(pending[~fits])
        pending = pending[fits]
        start = offsets[pending] + position[pending]
        nal_size = np.zeros(len(pending), np.int64)
        for byte in range(length_size):
            nal_size = (nal_size << 8) | buffer[start + byte]
        kind = buffer[start + length_size] & 0x1F
        valid = (nal_size >= 1) & (nal_size <= sizes[pending] - position[pending] - length_size)
        keyframe[pending[valid & (kind == IDR_SLICE)]] = True
        plain = valid & (kind == SLICE)
        non_idr.append(np.stack([pending[plain], start[plain] + length_size, nal_size[plain]], axis=1))
        delimiter = valid & (kind == ACCESS_UNIT_DELIMITER) & (nal_size <= 2)
        unresolved.append(pending[~plain & ~delimiter & ~(valid & (kind == IDR_SLICE))])
        position[pending[delimiter]] += length_size + nal_size[delimiter]
        pending = pending[delimiter]
    unresolved.append(pending)
    return keyframe, np.concatenate(non_idr), np.sort(np.concatenate(unresolved))


def _single_reference_i_slices(buffer: np.ndarray, slices: np.ndarray, single_reference: frozenset[int],
                               count: int) -> tuple[np.ndarray, np.ndarray]:
    """Keyframes by the parser's heuristic among the non-IDR first slices (``(sample, header offset, NAL
    size)`` rows), decoding ``first_mb_in_slice``, ``slice_type`` and ``pic_parameter_set_id`` from the 4
    bytes after the NAL header; and the samples whose header does not decode there (for :func:`_walk`)."""
    sample, header, nal_size = slices[:, 0], slices[:, 1], slices[:, 2]
    enough = nal_size >= 5
    head = [buffer[header[enough] + 1 + k].astype(np.int64) for k in range(4)]
    word = (head[0] << 24) | (head[1] << 16) | (head[2] << 8) | head[3]
    escapable = np.zeros(len(word), bool)  # two zero bytes: an emulation prevention byte may follow
    for k in range(3):
        escapable |= (head[k] == 0) & (head[k + 1] == 0)
    used = np.zeros(len(word), np.int64)
    decoded = ~escapable
    values = []
    for _ in range(3):  # first_mb_in_slice, slice_type, pic_parameter_set_id
        value, used, ok = _exp_golomb(word, used)
        decoded &= ok
        values.append(value)
    slice_type, pps_id = values[1], values[2]
    known = decoded & (slice_type <= 9) & np.isin(pps_id, np.fromiter(single_reference, np.int64))
    picked = sample[enough]
    keyframe = np.zeros(count, bool)
    keyframe[picked[known & (slice_type % 5 == I_SLICE)]] = True
    return keyframe, np.concatenate([sample[~enough], picked[~decoded | (slice_type > 9)]])


def _exp_golomb(word: np.ndarray, used: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decode one ue(v) per 32-bit ``word`` after its first ``used`` bits: value, bits used, and whether the
    code fits in the word."""
    rest = (word << used) & 0xFFFFFFFF
    _, bit_length = np.frexp(rest.astype(np.float64))
    zeros = 32 - bit_length.astype(np.int64)
    length = 2 * zeros + 1
    ok = (rest > 0) & (used + length <= 32)
    shift = np.clip(32 - length, 0, 32)
    value = np.where(ok, (rest >> shift) - 1, 0)
    return value, np.where(ok, used + length, 32), ok


def _walk(data: bytes | mmap.mmap, start: int, size: int, sets: _ParameterSets) -> bool:
    """The parser's flag for one sample, NAL unit by NAL unit (a NAL size it rejects ends the walk: no
    slice, no keyframe)."""
    position, length_size = 0, sets.length_size
    while position < size - length_size:
        nal_size = int.from_bytes(data[start + position:start + position + length_size], "big")
        position += length_size
        if not 1 <= nal_size <= size - position:
            return False
        kind = data[start + position] & 0x1F
        if kind == IDR_SLICE:
            return True
        nal = bytes(data[start + position:start + position + (min(nal_size, 1000) if kind == SLICE else nal_size)])
        if b"\x00\x00\x01" in nal or b"\x00\x00\x02" in nal:
            raise _Uncertain("start code inside a NAL unit")
        if kind == SLICE:
            return _heuristic_keyframe(_rbsp(nal[1:17]), sets.single_reference)
        if kind in UNHANDLED_NAL_TYPES:
            raise _Uncertain(f"NAL unit type {kind} (multiview/SVC)")
        if kind in (SPS, PPS) and nal not in sets.nal_units:
            raise _Uncertain("in-band parameter sets that differ from avcC")
        if kind == SEI and RECOVERY_POINT in _sei_payload_types(nal):
            raise _Uncertain("recovery-point SEI (the parser flags such frames as keyframes)")
        position += nal_size
    return False


def _heuristic_keyframe(rbsp: bytes, single_reference: frozenset[int]) -> bool:
    """Whether a non-IDR first slice is an I slice whose PPS makes the parser call it a keyframe."""
    if not single_reference:
        return False
    bits = _Bits(rbsp)
    bits.ue()  # first_mb_in_slice
    slice_type, pps_id = bits.ue(), bits.ue()
    if slice_type > 9:
        raise _Uncertain(f"slice type {slice_type}")
    return slice_type % 5 == I_SLICE and pps_id in single_reference


def _parameter_sets(avcc: bytes) -> _ParameterSets:
    """Parse ``avcC``: NAL length size, SPS and PPS units, and the PPS ids the keyframe heuristic applies to."""
    if len(avcc) < 7 or avcc[0] != 1:
        raise _Uncertain("no avcC configuration")
    length_size = (avcc[4] & 3) + 1
    if length_size == 3:
        raise _Uncertain("NAL length size 3")
    units, position = [], 5
    for count_mask in (0x1F, 0xFF):  # the SPS count (low 5 bits), its units, then the PPS count and units
        if position >= len(avcc):
            raise _Uncertain("avcC cut short")
        count, position = avcc[position] & count_mask, position + 1
        for _ in range(count):
            size = int.from_bytes(avcc[position:position + 2], "big")
            unit = avcc[position + 2:position + 2 + size]
            if len(unit) != size or not size:
                raise _Uncertain("avcC cut short")
            units.append(unit)
            position += 2 + size
    reference_frames = dict(_sps_reference_frames(_rbsp(u[1:])) for u in units if u[0] & 0x1F == SPS)
    pictures = {pps_id: (sps_id, list0) for pps_id, sps_id, list0 in
                (_pps_references(_rbsp(u[1:])) for u in units if u[0] & 0x1F == PPS)}
    single = frozenset(pps_id for pps_id, (sps_id, list0) in pictures.items()
                       if list0 <= 1 and reference_frames.get(sps_id, 2) <= 1)
    return _ParameterSets(length_size, frozenset(units), single)


def _sps_reference_frames(rbsp: bytes) -> tuple[int, int]:
    """``seq_parameter_set_id`` and ``max_num_ref_frames`` of an SPS (without its NAL header byte)."""
    bits = _Bits(rbsp)
    profile = bits.u(8)
    bits.u(16)  # constraint flags, level
    sps_id = bits.ue()
    if profile in HIGH_PROFILES:
        chroma_format = bits.ue()
        if chroma_format == 3:
            bits.u(1)
        bits.ue()  # bit_depth_luma_minus8
        bits.ue()  # bit_depth_chroma_minus8
        bits.u(1)  # qpprime_y_zero_transform_bypass_flag
        if bits.u(1):  # seq_scaling_matrix_present_flag
            for i in range(12 if chroma_format == 3 else 8):
                if bits.u(1):
                    bits.skip_scaling_list(16 if i < 6 else 64)
    bits.ue()  # log2_max_frame_num_minus4
    order_type = bits.ue()
    if order_type == 0:
        bits.ue()
    elif order_type == 1:
        bits.u(1)  # delta_pic_order_always_zero_flag
        bits.se()  # offset_for_non_ref_pic
        bits.se()  # offset_for_top_to_bottom_field
        cycle = bits.ue()
        if cycle > 255:
            raise _Uncertain("SPS with a long picture order cycle")
        for _ in range(cycle):
            bits.se()
    elif order_type != 2:
        raise _Uncertain(f"SPS with picture order count type {order_type}")
    return sps_id, bits.ue()


def _pps_references(rbsp: bytes) -> tuple[int, int, int]:
    """``pic_parameter_set_id``, its SPS id and its default number of list-0 references."""
    bits = _Bits(rbsp)
    pps_id, sps_id = bits.ue(), bits.ue()
    bits.u(2)  # entropy_coding_mode_flag, bottom_field_pic_order_in_frame_present_flag
    if bits.ue():
        raise _Uncertain("PPS with slice groups (FMO)")
    return pps_id, sps_id, bits.ue() + 1


def _rbsp(raw: bytes) -> bytes:
    """Raw NAL payload without its emulation prevention bytes."""
    return _ESCAPE.sub(b"\x00\x00", raw)


class _Bits:
    """Big-endian bit reader for exp-Golomb parameter-set and slice-header fields."""

    def __init__(self, data: bytes) -> None:
        self.value, self.left = int.from_bytes(data, "big"), 8 * len(data)

    def u(self, count: int) -> int:
        if count > self.left:
            raise _Uncertain("header cut short")
        self.left -= count
        return (self.value >> self.left) & ((1 << count) - 1)

    def ue(self) -> int:
        zeros = 0
        while not self.u(1):
            zeros += 1
            if zeros > 31:
                raise _Uncertain("exp-Golomb code over 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        code = self.ue()
        return (code + 1) // 2 if code % 2 else -(code // 2)

    def skip_scaling_list(self, size: int) -> None:
        last = following = 8
        for _ in range(size):
            if following:
                delta = self.se()
                if not -128 <= delta <= 127:
                    raise _Uncertain("scaling list delta out of range")
                following = (last + delta) & 0xFF
            last = following or last


def _sei_payload_types(nal: bytes) -> list[int]:
    """The payload types of an SEI NAL unit's messages, framed as ``ff_h264_sei_decode`` frames them."""
    rbsp = _rbsp(nal[1:])
    types, position = [], 0
    while len(rbsp) - position > 2 and rbsp[position] != 0x80:
        kind, position = _ff_coded(rbsp, position)
        size, position = _ff_coded(rbsp, position)
        if size > len(rbsp) - position:
            raise _Uncertain("truncated SEI message")
        types.append(kind)
        position += size
    return types


def _ff_coded(rbsp: bytes, position: int) -> tuple[int, int]:
    """An SEI type or size: bytes summed while they are 255."""
    value = 0
    while True:
        if position >= len(rbsp):
            raise _Uncertain("truncated SEI header")
        byte = rbsp[position]
        value, position = value + byte, position + 1
        if byte != 255:
            return value, position
