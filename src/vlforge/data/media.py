"""Media references -> local files or bytes, with the ``data_folder`` escape check; image decoding.

A reference is a path (relative ones resolve against ``data_folder``), a ``file://`` URL (``file:///abs`` or
``file://relative``, as qwen-vl-utils reads them), a ``data:`` base64 URL, raw bytes, or a ``{"bytes": ...,
"path": ...}`` dict (HF ``datasets``' ``Image`` feature: the bytes when present, else the path). A video may be a
list of such references, its frames (:class:`FrameFiles`).
Any other ``scheme://`` (``http``, ``https``, ``s3``, ``gs``, in any case) is refused (``remote_url``): nothing is
downloaded while training.

Example:
    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> resolve_media("../etc/passwd", root, source="d.jsonl", location="line 1")
    Traceback (most recent call last):
    ...
    vlforge.data.errors.SampleError: d.jsonl:line 1: path_escape: media path '../etc/passwd' leaves data_folder ...
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from PIL import Image, UnidentifiedImageError

from vlforge.data.config import as_named
from vlforge.data.errors import SampleError
from vlforge.data.schema import FRAME_LIST_FPS

_OBJECT_REPR = re.compile(r"<_io\.\w+ object at 0x[0-9a-f]+>")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def image_error(error: BaseException) -> str:
    """Pillow's message for an image it cannot read, an in-memory file named ``(in memory)`` (not its object repr)."""
    return _OBJECT_REPR.sub("(in memory)", str(error))


@dataclass(frozen=True)
class Media:
    """A resolved reference: exactly one of ``path`` and ``data`` is set; ``label`` is for messages."""

    path: Path | None
    data: bytes | None
    label: str

    def open(self):
        """A binary file object for the media."""
        return open(self.path, "rb") if self.path is not None else io.BytesIO(self.data)


@dataclass(frozen=True)
class FrameFiles:
    """A video given as its frames' images, in order (qwen-vl-utils' and LLaMA-Factory's list of frame files); each
    frame is resolved and read when asked for, so a list longer than the frames kept costs only those."""

    refs: tuple[Any, ...]
    rate: float
    """Frames per second they were taken at (``sample_fps``)."""
    data_folder: Path
    source: str
    location: str
    allow_path_escape: bool = False

    def __len__(self) -> int:
        return len(self.refs)

    def frame(self, i: int) -> Media:
        """Frame ``i`` resolved as :func:`resolve_media` resolves a reference; an error names the frame."""
        with self._named(i):
            return resolve_media(self.refs[i], self.data_folder, source=self.source, location=self.location,
                                 allow_path_escape=self.allow_path_escape)

    def image(self, i: int) -> Image.Image:
        """Frame ``i`` decoded (RGB); an error names the frame."""
        media = self.frame(i)
        with self._named(i):
            return load_image(media, source=self.source, location=self.location)

    @contextmanager
    def _named(self, i: int) -> Iterator[None]:
        try:
            yield
        except SampleError as error:
            raise SampleError(error.reason, self.source, self.location,
                              f"frame {i + 1} of {len(self.refs)}: {error.detail}") from None


def resolve_item(kind: str, ref: Any, options: dict[str, Any], data_folder: str | Path, *, source: str,
                 location: str, allow_path_escape: bool = False) -> Media | FrameFiles:
    """One media part's reference: a video's list of frame references gives :class:`FrameFiles` (its frames are
    resolved when read), anything else :func:`resolve_media`."""
    if kind != "video" or not isinstance(ref, (list, tuple)):
        return resolve_media(ref, data_folder, source=source, location=location, allow_path_escape=allow_path_escape)
    return FrameFiles(tuple(ref), float(options.get("sample_fps", FRAME_LIST_FPS)), Path(data_folder), source,
                      location, allow_path_escape)


def resolve_media(ref: Any, data_folder: str | Path, *, source: str, location: str,
                  allow_path_escape: bool = False) -> Media:
    """Resolve ``ref``; raise :class:`SampleError` for remote URLs, escapes, bad base64, missing files."""

    def fail(reason: str, detail: str):
        raise SampleError(reason, source, location, detail)

    if isinstance(ref, dict):
        named = ref.get("path")  # a datasets Image struct keeps the file name its bytes came from
        if isinstance(ref.get("bytes"), (bytes, bytearray, memoryview)) and ref["bytes"] and isinstance(named, str) \
                and named:
            return Media(None, bytes(ref["bytes"]), f"{named!r} (inline bytes)")
        if ref.get("bytes"):
            ref = ref["bytes"]
        elif ref.get("path"):
            ref = ref["path"]
        else:
            fail("schema", "media dict needs 'bytes' or 'path'")
    if isinstance(ref, (bytes, bytearray, memoryview)):
        return Media(None, bytes(ref), "<inline bytes>")
    if isinstance(ref, (list, tuple)):
        fail("schema", f"a list of {len(ref)} references as one media item: only a video may be a list (of its "
                       "frames)")
    if not isinstance(ref, str):
        fail("schema", f"media reference must be a string, got {type(ref).__name__}")
    if not ref.strip():
        fail("schema", "an empty media reference")
    scheme = _SCHEME.match(ref)
    if scheme and scheme[1].lower() != "file":
        fail("remote_url", f"remote media {ref!r}: vlforge reads no network; download it and give "
                           "its local path (relative to data_folder)")
    if ref.startswith("data:"):
        header, _, payload = ref.partition(",")
        if ";base64" not in header:
            fail("schema", "data: URLs must be base64-encoded")
        try:
            return Media(None, base64.b64decode(payload, validate=True), f"{header},...")
        except (binascii.Error, ValueError) as exc:
            fail("schema", f"invalid base64 in data: URL: {exc}")
    # a file:// URL as qwen-vl-utils reads it: the rest is the path (file:///abs, file://relative)
    path = Path(unquote(ref[len("file://"):])) if scheme else Path(ref).expanduser()
    if not path.is_absolute():  # inside data_folder as written: its symlinks (LLaVA's, the hub cache's) are followed
        root = as_named(Path(data_folder))
        path = root / path
        if not allow_path_escape and not Path(os.path.normpath(path)).is_relative_to(os.path.normpath(root)):
            fail("path_escape", f"media path {ref!r} leaves data_folder {str(root)!r} "
                                "(set allow_path_escape to permit)")
    if path.is_dir():
        fail("schema", f"media {str(path)!r} is a directory: give a file, or a video as the list of its frame images")
    if not path.is_file():
        fail("missing_file", f"media file {str(path)!r} not found")
    return Media(path, None, str(path))


def load_image(media: Media, *, source: str, location: str) -> Image.Image:
    """Decode fully into RGB; a file Pillow cannot read is a ``corrupt_image`` :class:`SampleError`."""
    try:
        with media.open() as fh, Image.open(fh) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        why = image_error(exc)
        raise SampleError("corrupt_image", source, location, f"cannot decode image {media.label}: {why}") from exc
