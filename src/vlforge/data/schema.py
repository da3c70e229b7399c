"""The chat "messages" format: validate a raw record into a :class:`Conversation`.

Accepted content parts (OpenAI chat style, as the LMMS Engine guide describes):
``{"type": "text", "text": ...}``, ``{"type": "image", "image": REF}``,
``{"type": "image_url", "image_url": {"url": REF}}``, ``{"type": "video", "video": REF, "fps": 2}``,
``{"type": "video_url", "video_url": {"url": REF}}``. A message's ``content`` may also be a string with
``<image>`` / ``<video>`` placeholders filled, in order, from the record's top-level ``images`` / ``videos``
lists; the placeholder count must match. ``messages`` may be a JSON string (common in parquet files).

Example:
    >>> conv = parse_conversation({"messages": [
    ...     {"role": "user", "content": "<image>What is it?"},
    ...     {"role": "assistant", "content": "A cat."}], "images": ["cat.png"]}, "d.jsonl", "line 1")
    >>> [type(p).__name__ for p in conv.messages[0].parts]
    ['MediaPart', 'TextPart']
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from vlforge.data.errors import SampleError

ROLES = ("system", "user", "assistant")
VIDEO_OPTION_KEYS = ("fps", "frame_num", "video_max_frames", "video_max_pixels", "video_min_pixels")
_PLACEHOLDER = re.compile(r"<(image|video)>")


@dataclass
class TextPart:
    text: str


@dataclass
class MediaPart:
    """An image or video reference (path, ``file://`` or ``data:`` URL, raw bytes) plus per-item options."""

    kind: str  # "image" | "video"
    ref: Any
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Message:
    role: str
    parts: list[TextPart | MediaPart]


@dataclass
class Conversation:
    messages: list[Message]
    source: str
    location: str

    @property
    def media(self) -> list[MediaPart]:
        return [p for m in self.messages for p in m.parts if isinstance(p, MediaPart)]


def _url(value: Any) -> Any:
    return value.get("url") if isinstance(value, dict) and "url" in value else value


def _part(raw: Any, fail) -> TextPart | MediaPart:
    if isinstance(raw, str):
        return TextPart(raw)
    if not isinstance(raw, dict):
        fail(f"content part must be an object, got {type(raw).__name__}")
    raw = {k: v for k, v in raw.items() if v is not None}  # parquet structs fill absent keys with null
    kind = raw.get("type")
    if kind == "text":
        if not isinstance(raw.get("text"), str):
            fail("text part needs a string 'text'")
        return TextPart(raw["text"])
    if kind in ("image", "image_url", "video", "video_url"):
        base = kind.removesuffix("_url")
        ref = _url(raw.get(kind, raw.get(base)))
        if ref is None or ref == "":
            fail(f"{kind} part has no {kind!r} value")
        options = {k: raw[k] for k in VIDEO_OPTION_KEYS if k in raw} if base == "video" else {}
        return MediaPart(base, ref, options)
    fail(f"unknown content type {kind!r} (expected text, image, image_url, video, video_url)")
    raise AssertionError  # unreachable: fail raises


def _split_placeholders(text: str, pools: dict[str, list[Any]], used: dict[str, int]) -> list[TextPart | MediaPart]:
    parts: list[TextPart | MediaPart] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > pos:
            parts.append(TextPart(text[pos : match.start()]))
        kind = match.group(1)
        idx = used[kind]
        used[kind] += 1
        pool = pools[kind]
        parts.append(MediaPart(kind, _url(pool[idx]) if idx < len(pool) else None))
        pos = match.end()
    if pos < len(text):
        parts.append(TextPart(text[pos:]))
    return parts


def parse_conversation(record: dict[str, Any], source: str, location: str) -> Conversation:
    """Validate ``record``; raise :class:`SampleError` (reason ``schema`` / ``placeholder_mismatch``)."""

    def fail(detail: str, reason: str = "schema"):
        raise SampleError(reason, source, location, detail)

    messages = record.get("messages", record.get("conversations"))
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as exc:
            fail(f"'messages' is a string that is not valid JSON: {exc}", "malformed_json")
    if not isinstance(messages, list) or not messages:
        fail("record needs a non-empty 'messages' list")
    pools = {"image": record.get("images") or [], "video": record.get("videos") or []}
    for kind, pool in pools.items():
        if not isinstance(pool, list):
            fail(f"top-level '{kind}s' must be a list")
    used = {"image": 0, "video": 0}
    out: list[Message] = []
    for i, raw in enumerate(messages):
        if not isinstance(raw, dict):
            fail(f"message {i} must be an object")
        role = raw.get("role")
        if role not in ROLES:
            fail(f"message {i} has role {role!r}; expected one of {ROLES}")
        content = raw.get("content")
        if isinstance(content, str):
            parts = _split_placeholders(content, pools, used)
        elif isinstance(content, list):
            parts = []
            for item in content:
                part = _part(item, fail)
                if isinstance(part, TextPart) and _PLACEHOLDER.search(part.text):
                    parts.extend(_split_placeholders(part.text, pools, used))
                else:
                    parts.append(part)
        else:
            fail(f"message {i} content must be a string or a list of parts")
        if role != "user" and any(isinstance(p, MediaPart) for p in parts):
            fail(f"message {i} ({role}) carries media; only user messages may")
        out.append(Message(role, parts))
    for kind, pool in pools.items():
        if used[kind] != len(pool):
            fail(f"{used[kind]} <{kind}> placeholder(s) in the text but {len(pool)} item(s) in '{kind}s'",
                 "placeholder_mismatch")
    if not any(m.role == "assistant" for m in out):
        fail("no assistant message: nothing to learn from", "no_labels")
    return Conversation(out, source, location)
