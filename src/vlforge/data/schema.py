"""A raw record in any accepted layout -> a :class:`Conversation` (turns of text and media parts).

Records are read in their file's layout (:mod:`vlforge.data.layouts`: ``{role, content}`` messages or
``{from, value}`` conversations, keys and roles renamed by the dataset entry). A turn's content is a string or
a list of parts as transformers' and OpenAI's chat formats write them: ``{"type": "text", "text": ...}``;
``{"type": "image", "image"|"url"|"path"|"base64": REF}``; ``{"type": "image_url", "image_url": REF or
{"url": REF}}``; the same for ``video`` / ``video_url`` (with per-video options ``fps``, ...; a video's REF may be a
list of frame images, with ``sample_fps``). ``<image>`` /
``<video>`` placeholders in text, and media parts without a reference (``{"type": "image"}``), take the
record's top-level images / videos (``images`` or ``image``: a path, bytes, an ``{"bytes", "path"}`` struct
or a list) in order (in the ``messages`` layout, ``<image>`` is a placeholder only in a record that has such a
media list: otherwise it is text, as transformers' chat templates leave it); a record with media but no placeholder at all gets them at the start of its first user
turn; any other count mismatch is an error. The turns may be a JSON string (common in parquet files).

Example:
    >>> conv = parse_conversation({"messages": [
    ...     {"role": "user", "content": "<image>What is it?"},
    ...     {"role": "assistant", "content": "A cat."}], "images": ["cat.png"]}, "d.jsonl", "line 1")
    >>> [type(p).__name__ for p in conv.messages[0].parts]
    ['MediaPart', 'TextPart']
    >>> llava = parse_conversation({"image": "cat.png", "conversations": [
    ...     {"from": "human", "value": "What is it?"}, {"from": "gpt", "value": "A cat."}]}, "l.json", "item 1")
    >>> [(m.role, [type(p).__name__ for p in m.parts]) for m in llava.messages]
    [('user', ['MediaPart', 'TextPart']), ('assistant', ['TextPart'])]
"""

from __future__ import annotations

import logging
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any

from vlforge.data.errors import SampleError
from vlforge.data.layouts import PROMPT_COMPLETION, RecordFormat, absent, audio_key, detect, pool, turns_of

VIDEO_OPTION_KEYS = ("fps", "frame_num", "video_max_frames", "video_max_pixels", "video_min_pixels")
IMAGE_OPTION_KEYS = ("min_pixels", "max_pixels")
"""A content part's own image settings (qwen-vl-utils' names, the processor's too)."""
QWEN_VIDEO_KEYS = {"nframes": "frame_num", "min_frames": "video_min_frames", "max_frames": "video_max_frames",
                   "min_pixels": "video_min_pixels", "max_pixels": "video_max_pixels",
                   "total_pixels": "video_total_pixels"}
"""qwen-vl-utils' names of a video part's options, and the setting each one is."""
QWEN_UNREAD_KEYS = ("resized_height", "resized_width", "video_start", "video_end", "min_frames_ratio")
"""qwen-vl-utils options vlforge does not apply: refused in one line, never ignored."""
FRAME_LIST_FPS = 2.0
"""The rate a video given as a list of frame images was sampled at, unless it says (qwen-vl-utils' default)."""
FRAME_LIST_KEYS = ("sample_fps",)
"""Options only a video given as frames takes (qwen-vl-utils' name of the rate its frames were sampled at)."""
CLIP_ONLY_KEYS = ("fps", "frame_num", "video_min_frames")
"""Options that sample a clip: a video given as frames is used whole (capped by ``video_max_frames``)."""
_PLACEHOLDER = re.compile(r"<(image|video)>")
_TOOL_ROLES = frozenset({"function_call", "observation", "tool", "function", "ipython", "tool_call", "tool_response"})
"""Role names of tool-call turns (LLaMA-Factory's, OpenAI's, Llama's): refused with that reason."""
_MEDIA_LIKE = re.compile(r"image|img|video|picture|photo|frame", re.IGNORECASE)
"""A record key that looks like media the placeholders were meant to take (``image_path``)."""
_PLACEHOLDER_LAYOUTS = ("sharegpt", "alpaca", "messages", "prompt_completion")
"""Layouts whose ``<image>`` / ``<video>`` in text are placeholders when the record has media (not The Cauldron's)."""
_MEDIA_FILE = re.compile(r"^(data:(image|video)/|.*\.(png|jpe?g|webp|gif|bmp|tiff?|mp4|avi|mov|mkv|webm|flv)$)",
                         re.IGNORECASE)
"""A string that names an image or video file (by its suffix) or holds one (a ``data:`` URL)."""
_GROUNDING_TAGS = re.compile(r"<(ref-object|bbox)>")
"""ms-swift's grounding placeholders, filled from a record's ``objects``."""
_TEXT_TAGS_WARNED: set[str] = set()
"""Sources already warned that their media-less records read ``<image>`` / ``<video>`` as text."""
_STRAY_WARNED: set[str] = set()
"""Sources already warned that their media-less records hold a media file under a key vlforge does not read."""
_OPENING_WARNED: set[str] = set()
"""Sources already warned that a record's first turn is a reply (kept as context)."""
logger = logging.getLogger(__name__)
_IN_TEXT = "<placeholder>"
"""Option key marking a media part cut from text (``<image>``), dropped when the part is filled."""


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
    trained: bool = True
    """False for an assistant turn given as context only (OpenAI's ``"weight": 0``)."""


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


def _reference(raw: dict[str, Any], kind: str) -> Any:
    """A media part's reference: its ``kind`` / base kind key, else transformers' ``url``, ``path``, ``base64`` (a
    bare base64 payload becomes a ``data:`` URL), else Anthropic's ``source`` (base64 data or a URL); None when it has
    none (a placeholder)."""
    base = kind.removesuffix("_url")
    for key in (kind, base, "url", "path", "base64"):
        value = raw.get(key)
        if value is None or value == "":
            continue
        value = _url(value)
        if key == "base64" and isinstance(value, str) and not value.startswith("data:"):
            value = "data:;base64," + value
        return value
    source = raw.get("source")  # Anthropic's block: {"type": "base64", "media_type", "data"} or {"type": "url", "url"}
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or ''};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    return None


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
        if unread := next((key for key in QWEN_UNREAD_KEYS if key in raw), None):
            fail(f"{base} option {unread!r} of qwen-vl-utils is not read by vlforge (give min_pixels / max_pixels"
                 + (", fps or nframes" if base == "video" else "") + ")")
        if base == "video":
            options = {QWEN_VIDEO_KEYS.get(k, k): raw[k]
                       for k in (*VIDEO_OPTION_KEYS, *QWEN_VIDEO_KEYS, *FRAME_LIST_KEYS) if k in raw}
            if "fps" in options and "frame_num" in options:  # qwen-vl-utils asserts one or the other
                fail(f"video options fps and {video_option_name('frame_num')} both given: give one (a rate or a "
                     "count of frames)")
        else:
            options = {k: raw[k] for k in IMAGE_OPTION_KEYS if k in raw}
        part = MediaPart(base, _reference(raw, kind), options)
        if part.ref is None and isinstance(raw.get("index"), int):
            part.options["index"] = raw["index"]  # TRL's parts name the image they take: checked when filled
        return part
    fail(f"unknown content type {kind!r} (expected text, image, image_url, video, video_url)")
    raise AssertionError  # unreachable: fail raises


def _strings(value: Any):
    """Every string inside ``value`` (nested lists and dicts; bytes and other values skipped)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _split_placeholders(text: str) -> list[TextPart | MediaPart]:
    """``text`` cut at its ``<image>`` / ``<video>`` placeholders, each one a media part without a reference."""
    parts: list[TextPart | MediaPart] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(text):
        if match.start() > pos:
            parts.append(TextPart(text[pos : match.start()]))
        parts.append(MediaPart(match.group(1), None, {_IN_TEXT: True}))
        pos = match.end()
    if pos < len(text):
        parts.append(TextPart(text[pos:]))
    return parts


def _content(content: Any, i: int, fail, *, placeholders: bool) -> list[TextPart | MediaPart]:
    """A turn's parts; with ``placeholders``, ``<image>`` / ``<video>`` in its text are cut out as media parts."""
    if isinstance(content, str):
        return _split_placeholders(content) if placeholders else [TextPart(content)]
    if not isinstance(content, list):
        fail(f"message {i} content must be a string or a list of parts, got {type(content).__name__}")
    parts: list[TextPart | MediaPart] = []
    for item in content:
        part = _part(item, fail)
        parts.extend(_split_placeholders(part.text) if placeholders and isinstance(part, TextPart) else [part])
    return parts


def _fill(messages: list[Message], pools: dict[str, tuple[str, list[Any]]], fail) -> None:
    """Give every media part without a reference the next item of its kind's pool; a record without any such
    part of a kind gets that kind's pool at the start of the first user turn (images before videos); other count
    mismatches fail. A record with videos and no image whose text holds ``<image>`` placeholders, one per video and
    no ``<video>``, reads them as ``<video>`` (LLaVA-NeXT's video data)."""
    def slots_of(kind: str) -> list[MediaPart]:
        return [p for m in messages for p in m.parts if isinstance(p, MediaPart) and p.kind == kind and p.ref is None]

    images, videos = pools["image"][1], pools["video"][1]
    stand_ins = slots_of("image")
    if stand_ins and not images and len(stand_ins) == len(videos) and not slots_of("video") and \
            all(slot.options.get(_IN_TEXT) for slot in stand_ins):
        for slot in stand_ins:  # LLaVA-NeXT's video records write <image> for their video
            slot.kind = "video"
    front: list[MediaPart] = []
    for kind, (key, items) in pools.items():
        slots = slots_of(kind)
        if not slots and items:
            if not any(m.role == "user" for m in messages):
                fail(f"{len(items)} {kind}(s) in {key!r} but no user turn to put them in", "placeholder_mismatch")
            named = sum(isinstance(p, MediaPart) and p.kind == kind for m in messages for p in m.parts)
            if named:  # the same picture twice, or two sets of media: which the record means is not written
                fail(f"{len(items)} {kind}(s) in {key!r} and {named} {kind} part(s) that name their own file, but "
                     f"no placeholder for those in {key!r}", "placeholder_mismatch")
            front += [MediaPart(kind, _url(item)) for item in items]
            continue
        in_text = sum(bool(slot.options.pop(_IN_TEXT, False)) for slot in slots)
        if len(slots) != len(items):
            what = (f"<{kind}> placeholder(s) in the text" if in_text == len(slots) else
                    f"{kind} part(s) without a reference" if not in_text else
                    f"<{kind}> placeholder(s) and {kind} part(s) without a reference")
            fail(f"{len(slots)} {what} but {len(items)} item(s) in {key!r}", "placeholder_mismatch")
        for n, (slot, item) in enumerate(zip(slots, items, strict=True)):
            index = slot.options.pop("index", n)
            if index != n:
                fail(f"{kind} part {n} names {kind} {index}: parts must take the {kind}s in order", "schema")
            if item is None:
                fail(f"item {n} of {key!r} is null", "schema")
            slot.ref = _url(item)
    if front:
        next(m for m in messages if m.role == "user").parts[:0] = front


def video_option_name(option: str) -> str:
    """A video setting as a record may name it: qwen-vl-utils' name, then vlforge's.

    Example:
        >>> video_option_name("video_max_frames"), video_option_name("fps")
        ('max_frames / video_max_frames', 'fps')
    """
    return " / ".join([qwen for qwen, ours in QWEN_VIDEO_KEYS.items() if ours == option] + [option])


def _check_frames(part: MediaPart, fail) -> None:
    """A list reference is a video's frame images (qwen-vl-utils, LLaMA-Factory): not an image, not empty, not
    nested; its options are the frame-list ones, a video file's are the clip ones."""
    frames = isinstance(part.ref, (list, tuple))
    if frames and part.kind == "image":
        fail(f"a list of {len(part.ref)} references as one image: only a video may be a list (of its frames)")
    if frames and not part.ref:
        fail("a video given as an empty list of frames")
    if frames and (inner := next((r for r in part.ref if isinstance(r, (list, tuple)) or r is None), False)) \
            is not False:
        fail(f"a video's frame list holds {'null' if inner is None else 'a list'}: give one image per frame")
    if frames and (clip := next((k for k in CLIP_ONLY_KEYS if k in part.options), None)):
        fail(f"video option {video_option_name(clip)} samples a clip; a video given as {len(part.ref)} frames is "
             "used whole (capped by max_frames / video_max_frames; sample_fps gives the rate its frames were taken at)")
    if not frames and part.kind == "video" and (only := next((k for k in FRAME_LIST_KEYS if k in part.options),
                                                             None)):
        fail(f"video option {only!r} is the rate of a video given as a list of frames; a video file has its own "
             "(use fps to choose how many frames are sampled)")
    if frames:
        rate = part.options.get("sample_fps", FRAME_LIST_FPS)
        try:
            value = float(rate) if isinstance(rate, numbers.Real) and not isinstance(rate, bool) else math.nan
        except OverflowError:
            value = math.inf
        if not 0 < value < math.inf:
            fail(f"video option sample_fps: must be a number > 0, got {rate!r}")
        part.options["sample_fps"] = value


def _alpaca_turns(record: dict[str, Any], fmt: RecordFormat, fail) -> list[dict[str, str]]:
    """An ``alpaca`` record as ``{role, content}`` turns: each ``[instruction, reply]`` of its history, then the
    instruction and the input joined by a newline (either may be empty, null or absent, as LLaMA-Factory joins
    them) and the output (a string)."""
    keys = fmt.alpaca
    assert keys is not None

    def text(key: str, *, required: bool) -> str:
        value = record.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str):
            kind = type(value).__name__
            got = "no" if value is None else f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} as its"
            fail(f"record has {got} {key!r} text; expected {fmt.expected()}")
        return value

    turns: list[dict[str, str]] = []
    history = turns_of(record.get(keys.history))
    if history not in (None, "", []):
        if not isinstance(history, list):
            fail(f"{keys.history!r} must be a list of [instruction, reply] pairs, got {type(history).__name__}")
        for i, pair in enumerate(history):
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
                fail(f"{keys.history!r} item {i} must be an [instruction, reply] pair of strings")
            turns += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    query = "\n".join(part for part in (text(keys.prompt, required=False), text(keys.query, required=False)) if part)
    return [*turns, {"role": "user", "content": query}, {"role": "assistant", "content": text(keys.response,
                                                                                             required=True)}]


def _trained(turn: dict[str, Any], i: int, fail) -> bool:
    """Whether an assistant turn is trained: OpenAI's ``"weight": 0`` and ms-swift's ``"loss": false`` keep it as
    context only; ``1`` / ``true`` / absent or null (parquet fills absent keys with null) train it."""
    weight, loss = turn.get("weight"), turn.get("loss")
    if weight is not None and (isinstance(weight, bool) or weight not in (0, 1)):
        fail(f"message {i} has weight {weight!r}; expected 0 or 1 (OpenAI's: 0 shows the reply, not trained on)")
    if loss is not None and not isinstance(loss, bool):
        fail(f"message {i} has loss {loss!r}; expected true, false or null (ms-swift's: false shows the reply, not "
             "trained on)")
    if weight is not None and loss is not None and (weight == 1) != loss:
        fail(f"message {i} has weight {weight!r} and loss {loss!r}, which disagree")
    return weight != 0 and loss is not False


def _pair_placeholders(record: dict[str, Any], fmt: RecordFormat, turns: Any) -> bool:
    """In layout ``pairs`` (The Cauldron: plain text, its images first) ``<image>`` / ``<video>`` are placeholders
    only where their counts in the questions are the record's media counts (ms-swift's ``{human, assistant}``
    exchanges)."""
    if fmt.layout != "pairs":
        return False
    asked = [turn.get(fmt.role_tag) for turn in turns if isinstance(turn, dict)]  # the user side of each exchange
    found = [m.group(1) for text in _strings(asked) for m in _PLACEHOLDER.finditer(text)]
    return bool(found) and all(found.count(kind) == len(pool(record, keys)[1])
                               for kind, keys in (("image", fmt.images), ("video", fmt.videos)))


def _warn_once(warned: set[str], source: str, message: str, *args: Any) -> None:
    """Log ``message`` the first time for ``source`` (a data file) of the ``warned`` kind."""
    if source not in warned:
        warned.add(source)
        logger.warning(message, *args)


def _media_value(value: Any) -> bool:
    """``value`` is media as a record holds it: a media file name or ``data:`` URL, an ``{bytes, path}`` struct, or
    a non-empty list of those."""
    if isinstance(value, str):  # a remote URL is no media vlforge could read (metadata: a source link)
        return bool(_MEDIA_FILE.match(value.strip())) and ("://" not in value or value.lower().startswith("file://"))
    if isinstance(value, dict):
        return value.get("bytes") is not None or (isinstance(value.get("path"), str) and _media_value(value["path"]))
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_media_value(item) for item in value)
    return False


def _stray_media(record: dict[str, Any], fmt: RecordFormat) -> str | None:
    """A record key named like media (``image_path``, ``img``) that holds media, other than the keys ``fmt`` reads:
    its images would be dropped without a word."""
    read = {fmt.messages, *fmt.images, *fmt.videos}
    return next((key for key, value in record.items()
                 if key not in read and _MEDIA_LIKE.search(str(key)) and _media_value(value)), None)


def _prompt_completion_turns(record: dict[str, Any], fmt: RecordFormat, fail) -> tuple[list[dict[str, Any]], int]:
    """A ``prompt_completion`` record as turns, and how many are the prompt's: its turns (a string is one user turn;
    an assistant turn in it is context, never trained, as TRL trains the completion only), then the completion's (a
    string is one assistant turn; every turn of it must be the assistant's)."""
    names = {role: next(name for name, r in fmt.roles.items() if r == role) for role in ("user", "assistant")}

    def side(key: str, role: str) -> list[dict[str, Any]]:
        raw = record.get(key)
        value = turns_of(raw)
        if isinstance(raw, str) and not isinstance(value, list):
            return [{fmt.role_tag: names[role], fmt.content_tag: raw}]
        if not isinstance(value, list) or not value or not all(isinstance(t, dict) for t in value):
            fail(f"{key!r} must be a string or a non-empty list of turns (objects); expected {fmt.expected()}")
        return value

    prompt = side(PROMPT_COMPLETION[0], "user")
    completion = side(PROMPT_COMPLETION[1], "assistant")
    for i, turn in enumerate(completion):
        name = turn.get(fmt.role_tag)
        if fmt.roles.get(name) != "assistant":
            fail(f"completion turn {i} has {fmt.role_tag} {name!r}: a completion holds the assistant's reply")
    return prompt + completion, len(prompt)


def parse_conversation(record: dict[str, Any], source: str, location: str,
                       fmt: RecordFormat | None = None) -> Conversation:
    """Validate ``record`` read in ``fmt`` (None: the layout this record itself shows); raise :class:`SampleError`
    (reason ``schema`` / ``placeholder_mismatch`` / ``no_labels`` / ``malformed_json``)."""

    def fail(detail: str, reason: str = "schema"):
        raise SampleError(reason, source, location, detail)

    if fmt is None:
        fmt = detect(record, None, source, location)
    context = 0  # the first turns, whose replies are context only (a prompt_completion record's prompt)
    if fmt.alpaca is not None:
        turns = _alpaca_turns(record, fmt, fail)
    elif fmt.layout == "prompt_completion":
        turns, context = _prompt_completion_turns(record, fmt, fail)
    else:
        raw_turns = record.get(fmt.messages)
        turns = turns_of(raw_turns)
        if isinstance(raw_turns, str) and isinstance(turns, str):
            fail(f"{fmt.messages!r} is a string that is not valid JSON", "malformed_json")
        if not isinstance(turns, list) or not turns:
            fail(f"record needs {fmt.expected()}")
    if (audio := audio_key(record)) is not None:
        fail(f"{audio!r}: audio is not supported (vlforge trains vision-language chats)")
    if record.get("objects") is not None and any(_GROUNDING_TAGS.search(text) for text in _strings(turns)):
        fail("ms-swift grounding record: vlforge does not fill <ref-object> / <bbox> from 'objects' (write the "
             "references and boxes into the text)")
    # ``<image>`` / ``<video>`` in text are placeholders when the record has a media key (LLaVA's loader, LLaMA-Factory):
    # without one they are text (LLaVA's text-only rows, transformers' messages that name media in parts); The
    # Cauldron's exchanges are text (its readers put the images first whatever the text says)
    has_media = any(not absent(record.get(k)) for k in (*fmt.images, *fmt.videos))
    placeholders = has_media and (fmt.layout in _PLACEHOLDER_LAYOUTS or _pair_placeholders(record, fmt, turns))
    tagged = not has_media and fmt.layout in _PLACEHOLDER_LAYOUTS and \
        any(_PLACEHOLDER.search(text) for text in _strings(turns))
    if tagged and (named := next((k for k in record if k != fmt.messages and _MEDIA_LIKE.search(str(k))), None)):
        fail(f"<image> / <video> in the text and no {'/'.join((*fmt.images, *fmt.videos))} key, but a {named!r} "
             "key: name it with columns.images (or columns.videos) of the dataset entry", "placeholder_mismatch")
    if tagged and fmt.layout != "messages":
        _warn_once(_TEXT_TAGS_WARNED, source, "%s: records without an %s key read <image> / <video> in their text as "
                   "text (LLaVA's rule; first: %s)", source, "/".join((*fmt.images, *fmt.videos)), location)
    out: list[Message] = []
    for i, raw in enumerate(turns):
        if not isinstance(raw, dict):
            fail(f"message {i} must be an object, got {type(raw).__name__}")
        if fmt.layout == "pairs":  # one exchange: the user turn and its reply, both text
            for key, role in ((fmt.role_tag, "user"), (fmt.content_tag, "assistant")):
                if not isinstance(raw.get(key), str):
                    got = "no" if raw.get(key) is None else f"a {type(raw[key]).__name__} as its"
                    fail(f"exchange {i} has {got} {key!r} text; expected {fmt.expected()}")
                out.append(Message(role, _content(raw[key], i, fail, placeholders=placeholders and role == "user")))
            continue
        if fmt.alpaca is not None:  # built above as {role, content} turns
            out.append(Message(raw["role"], _content(raw["content"], i, fail, placeholders=placeholders)))
            continue
        name = raw.get(fmt.role_tag)
        role = fmt.roles.get(name) if isinstance(name, str) else None
        if role is None:
            if fmt.role_tag not in raw:
                fail(f"message {i} has no {fmt.role_tag!r} key; expected {fmt.expected()}")
            tool = " (tool-call turns are not trained by vlforge)" if name in _TOOL_ROLES else ""
            fail(f"message {i} has {fmt.role_tag} {name!r}; expected one of {', '.join(fmt.roles)}{tool}")
        if fmt.content_tag not in raw:
            fail(f"message {i} has no {fmt.content_tag!r} key; expected {fmt.expected()}")
        out.append(Message(role, _content(raw[fmt.content_tag], i, fail, placeholders=placeholders),
                           trained=role != "assistant" or (i >= context and _trained(raw, i, fail))))
    system = record.get(fmt.system) if fmt.system else None
    if system and out[0].role != "system":
        if not isinstance(system, str):
            fail(f"system prompt {fmt.system!r} must be a string, got {type(system).__name__}")
        out.insert(0, Message("system", [TextPart(system)]))
    pools = {kind: pool(record, keys) for kind, keys in (("image", fmt.images), ("video", fmt.videos))}
    _fill(out, pools, fail)
    for i, message in enumerate(out):
        if message.role != "user" and any(isinstance(p, MediaPart) for p in message.parts):
            fail(f"message {i} ({message.role}) carries media; only user messages may")
        for part in message.parts:
            if isinstance(part, MediaPart):
                _check_frames(part, fail)
    opening = next((m for m in out if m.role != "system"), None)
    if opening is not None and opening.role == "assistant" and opening.trained and fmt.layout != "prompt_completion":
        opening.trained = False  # a reply to nothing: LLaVA drops it, LLaMA-Factory skips the record
        _warn_once(_OPENING_WARNED, source, "%s: replies before any user turn are kept as context, not trained "
                   "(LLaVA drops them; first: %s)", source, location)
    if not any(isinstance(p, MediaPart) for m in out for p in m.parts) and (stray := _stray_media(record, fmt)):
        _warn_once(_STRAY_WARNED, source, "%s: records without media hold a file under %r, a key vlforge does not "
                   "read (it reads %s; first: %s): if those are their images or videos, name the key with "
                   "columns.images / columns.videos of the dataset entry, else they train on their text alone",
                   source, stray, "/".join((*fmt.images, *fmt.videos)), location)
    if not any(m.role == "assistant" and m.trained for m in out):
        fail("no assistant message to train on: nothing to learn from", "no_labels")
    return Conversation(out, source, location)
