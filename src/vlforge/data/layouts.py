"""Record layouts: which keys of a record hold its turns, their roles and contents, and its media.

Five layouts are read; a dataset entry names one (``layout:``) or leaves ``auto``, and may rename keys and roles
(``columns:``, ``tags:``, as LLaMA-Factory's ``dataset_info.json`` does):

* ``messages``: turns ``{"role", "content"}`` (OpenAI / transformers chat format, LMMS Engine, LLaMA-Factory's
  ``mllm_demo.json``), in a ``messages`` list;
* ``sharegpt``: turns ``{"from", "value"}`` (LLaVA-Instruct, ShareGPT4V, LLaVA-OneVision-Data), in a
  ``conversations`` list, roles ``human`` / ``gpt``;
* ``pairs``: exchanges ``{"user", "assistant"}``, each a user turn and its reply, in a ``texts`` list (The Cauldron,
  HuggingFaceM4/the_cauldron, with its ``images`` column);
* ``prompt_completion``: TRL's prompt-completion records, a ``prompt`` and its ``completion``, each a list of
  ``{role, content}`` turns (conversational) or a string; only the completion is trained (TRL's default);
* ``alpaca``: one exchange per record, ``instruction`` (+ ``input`` on a new line) and its ``output``, after the
  ``[instruction, reply]`` pairs of an optional ``history`` (LLaMA-Factory's default format, its ``images`` /
  ``videos`` columns, a ``system`` prompt).

``auto`` is decided once per file, from the first record that holds turns (:func:`file_format`, reading at most
:data:`DETECT_RECORDS` records from the start of the file, whatever order training reads it in); every record is
then read in that layout, and one that does not fit is a ``schema`` sample error saying what was expected.

Example:
    >>> fmt = detect({"image": "a.png", "conversations": [{"from": "human", "value": "<image>Hi"}]},
    ...              None, "llava.json", "item 1")
    >>> fmt.layout, fmt.messages, fmt.describe()
    ('sharegpt', 'conversations', 'sharegpt: conversations of {from, value} (detected from item 1)')
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from vlforge.data.config import RecordColumns, ResolvedEntry, RoleTags
from vlforge.data.errors import SampleError
from vlforge.errors import DataError

MESSAGE_KEYS = ("messages", "conversations", "conversation")
"""Keys that hold the turns when ``columns.messages`` is not given (the first present in the first chat record)."""
POOL_KEYS = {"image": ("images", "image"), "video": ("videos", "video")}
"""Keys of the media ``<image>`` / ``<video>`` placeholders take, per record (the first present and not null)."""
AUDIO_KEYS = ("audios", "audio")
TURN_KEYS = {"messages": ("role", "content"), "sharegpt": ("from", "value")}
PAIR_KEYS = ("texts",)
"""Keys that hold ``{user, assistant}`` exchanges (layout ``pairs``) when ``columns.messages`` is not given."""
PROMPT_COMPLETION = ("prompt", "completion")
"""The keys of a ``prompt_completion`` record (TRL's column names)."""
PAIR_TAGS = ("user", "assistant")
"""An exchange's keys in layout ``pairs`` (``tags.user_tag`` / ``tags.assistant_tag`` rename them)."""
ROLE_NAMES = {"user": ("user", "human"), "assistant": ("assistant", "gpt", "model"), "system": ("system", "developer")}
"""Role names accepted when ``tags`` does not name one (``tags.user_tag`` etc. replace a role's names)."""
ALPACA_DEFAULTS = {"prompt": "instruction", "query": "input", "response": "output", "history": "history"}
"""The keys of an ``alpaca`` record (``columns.prompt`` / ``query`` / ``response`` / ``history`` rename them)."""
SYSTEM_KEY = "system"
"""A record's system prompt key when ``columns.system`` is not given (read where present, in every layout)."""
DETECT_RECORDS = 100
"""Records read from the start of a file to find the first one that holds turns (``layout: auto``)."""


@dataclass(frozen=True)
class AlpacaKeys:
    """The keys of an ``alpaca`` record."""

    prompt: str
    query: str
    response: str
    history: str


@dataclass(frozen=True)
class RecordFormat:
    """How the records of one file are read: the key of the turns, the keys of a turn, the role names, the media keys."""

    layout: str  # "messages" | "sharegpt" | "pairs" | "prompt_completion" | "alpaca"
    messages: str
    role_tag: str
    content_tag: str
    roles: dict[str, str] = field(hash=False)  # role name in the data -> system | user | assistant
    images: tuple[str, ...] = POOL_KEYS["image"]
    videos: tuple[str, ...] = POOL_KEYS["video"]
    system: str = SYSTEM_KEY
    origin: str = "named in the dataset entry"
    alpaca: AlpacaKeys | None = None
    """The record keys of layout ``alpaca`` (None for the layouts of turns)."""

    def describe(self) -> str:
        """One line: ``sharegpt: conversations of {from, value} (detected from item 1)``."""
        extra = [f"{kind}s from {'/'.join(keys)}" for kind, keys in (("image", self.images), ("video", self.videos))
                 if keys != POOL_KEYS[kind]]
        if self.alpaca is not None:
            keys = self.alpaca
            tail = "".join(f", {item}" for item in extra)
            return (f"alpaca: {{{keys.prompt}, {keys.query}, {keys.response}}} records, earlier exchanges from "
                    f"{keys.history}, system prompt from {self.system}{tail} ({self.origin})")
        if self.system != SYSTEM_KEY:
            extra.append(f"system prompt from {self.system}")
        tail = f"; {', '.join(extra)}" if extra else ""
        if self.layout == "prompt_completion":
            return (f"prompt_completion: {' and '.join(PROMPT_COMPLETION)} as {{{self.role_tag}, {self.content_tag}}} "
                    f"turns or strings{tail} ({self.origin})")
        return f"{self.layout}: {self.messages} of {{{self.role_tag}, {self.content_tag}}}{tail} ({self.origin})"

    def expected(self) -> str:
        """What a record of this file must hold, for error messages."""
        if self.alpaca is not None:
            keys = self.alpaca
            return f"a string {keys.response!r} (and {keys.prompt!r} / {keys.query!r} strings) ({self.describe()})"
        if self.layout == "prompt_completion":
            return (f"{PROMPT_COMPLETION[0]!r} and {PROMPT_COMPLETION[1]!r}, each a string or a non-empty list of "
                    f"{{{self.role_tag}, {self.content_tag}}} turns ({self.describe()})")
        items = "exchanges" if self.layout == "pairs" else "turns"
        return f"a non-empty {self.messages!r} list of {{{self.role_tag}, {self.content_tag}}} {items} ({self.describe()})"

    def to_dict(self) -> dict[str, Any]:
        if self.alpaca is not None:  # no turns: its keys are the alpaca ones
            return {"layout": self.layout, "alpaca": dataclasses.asdict(self.alpaca), "images": list(self.images),
                    "videos": list(self.videos), "system": self.system, "origin": self.origin}
        return {"layout": self.layout, "messages": self.messages, "role_tag": self.role_tag,
                "content_tag": self.content_tag, "roles": dict(self.roles), "images": list(self.images),
                "videos": list(self.videos), "system": self.system, "origin": self.origin}


def _role_names(tags: RoleTags) -> dict[str, str]:
    names: dict[str, str] = {}
    for role, defaults in ROLE_NAMES.items():
        given = getattr(tags, f"{role}_tag")
        for name in (given,) if given is not None else defaults:
            names[name] = role
    return names


def turns_of(value: Any) -> Any:
    """The turns as stored: a list, or a JSON string of one (common in parquet files); anything else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def detect(record: dict[str, Any], entry: ResolvedEntry | None, source: str, location: str) -> RecordFormat:
    """The format of ``record`` under ``entry``'s ``layout`` / ``columns`` / ``tags`` (``None``: all automatic);
    a record that holds no turns in any accepted layout is a ``schema`` :class:`SampleError` saying what was expected."""
    layout = entry.layout if entry is not None else "auto"
    columns = entry.columns if entry is not None else RecordColumns()
    tags = entry.tags if entry is not None else RoleTags()

    def fail(detail: str):
        raise SampleError("schema", source, location, detail)

    alpaca = _alpaca_keys(columns)
    if layout == "alpaca" or (layout == "auto" and columns.alpaca_keys()):
        origin = "layout named in the dataset entry" if layout == "alpaca" else "alpaca keys named in the dataset entry"
        return _format(entry, "alpaca", alpaca.prompt, origin)
    if layout == "prompt_completion" or (layout == "auto" and not columns.messages and _prompt_completion(record)
                                         and not any(_given(record, k) for k in MESSAGE_KEYS + PAIR_KEYS)):
        if not _prompt_completion(record):
            fail(f"record needs {' and '.join(map(repr, PROMPT_COMPLETION))} (layout prompt_completion: TRL's "
                 "prompt-completion records)")
        origin = "layout named in the dataset entry" if layout == "prompt_completion" else f"detected from {location}"
        return _format(entry, "prompt_completion", PROMPT_COMPLETION[0], origin)
    keys = (columns.messages,) if columns.messages else {"auto": MESSAGE_KEYS + PAIR_KEYS,
                                                         "pairs": PAIR_KEYS}.get(layout, MESSAGE_KEYS)
    key = next((k for k in keys if _given(record, k)), None)
    if key is None and layout == "auto" and not columns.messages and alpaca.prompt in record and \
            alpaca.response in record:
        return _format(entry, "alpaca", alpaca.prompt, f"detected from {location}")
    if key is None:
        items = "exchanges" if layout == "pairs" else "turns"
        if columns.messages:
            fail(f"record has no {columns.messages!r} list of {items} (columns.messages of the dataset entry)")
        if layout == "pairs":
            fail("record needs a non-empty 'texts' list of {user, assistant} exchanges (layout pairs)")
        if layout == "auto":
            fail("record needs a non-empty 'messages' list of {role, content} turns, a 'conversations' list of "
                 "{from, value} turns (LLaVA / ShareGPT), a 'texts' list of {user, assistant} exchanges "
                 "(The Cauldron), 'prompt' and 'completion' (TRL) or 'instruction' and 'output' keys (alpaca)")
        fail(f"record needs a non-empty {', '.join(map(repr, MESSAGE_KEYS))} list of turns (layout {layout})")
    turns = turns_of(record[key])
    if isinstance(turns, str):
        raise SampleError("malformed_json", source, location, f"{key!r} is a string that is not valid JSON")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], dict):
        got = (type(turns).__name__ if not isinstance(turns, list) else "an empty list" if not turns else
               f"a list whose item 0 is {type(turns[0]).__name__}")
        fail(f"{key!r} must be a non-empty list of turns (objects), got {got}")
    name = layout
    if layout == "auto" and tags.role_tag is None:
        name = next((n for n, (role, _) in TURN_KEYS.items() if role in turns[0]), None)
        pair = (tags.user_tag or PAIR_TAGS[0], tags.assistant_tag or PAIR_TAGS[1])
        if name is None and all(k in turns[0] for k in pair):
            name = "pairs"
        if name is None:
            found = ", ".join(sorted(map(str, turns[0]))) or "none"
            fail(f"turn 0 of {key!r} has neither a 'role' (messages layout) nor a 'from' key (sharegpt layout) nor "
                 f"'user' and 'assistant' keys (pairs layout); its keys: {found} (name them with tags.role_tag and "
                 "tags.content_tag, or for exchanges layout: pairs with tags.user_tag and tags.assistant_tag)")
    origin = (f"layout named in the dataset entry, turns key from {location}" if layout != "auto" or tags.role_tag is not None
              else f"detected from {location}")
    return _format(entry, name, key, origin)


def _format(entry: ResolvedEntry | None, layout: str, key: str, origin: str) -> RecordFormat:
    """The format of ``layout`` (``auto``: messages, or sharegpt for renamed turn keys) with the turns under ``key``."""
    columns = entry.columns if entry is not None else RecordColumns()
    tags = entry.tags if entry is not None else RoleTags()
    if entry is not None and entry.layout != "auto" and columns.messages is not None:
        origin = "named in the dataset entry"
    images = (columns.images,) if columns.images else POOL_KEYS["image"]
    videos = (columns.videos,) if columns.videos else POOL_KEYS["video"]
    if layout == "alpaca":  # no turns: one exchange, its keys named by columns.prompt / query / response / history
        keys = _alpaca_keys(columns)
        return RecordFormat("alpaca", keys.prompt, keys.query, keys.response, {}, images, videos,
                            columns.system or SYSTEM_KEY, origin, alpaca=keys)
    if layout == "pairs":  # an exchange's two keys are the role names: tags.user_tag / tags.assistant_tag
        user, assistant = tags.user_tag or PAIR_TAGS[0], tags.assistant_tag or PAIR_TAGS[1]
        return RecordFormat("pairs", key, user, assistant, {user: "user", assistant: "assistant"}, images, videos,
                            columns.system or SYSTEM_KEY, origin)
    if layout == "prompt_completion":
        role_tag, content_tag = tags.role_tag or TURN_KEYS["messages"][0], tags.content_tag or TURN_KEYS["messages"][1]
        return RecordFormat(layout, key, role_tag, content_tag, _role_names(tags), images, videos,
                            columns.system or SYSTEM_KEY, origin)
    if tags.role_tag is not None:
        role_tag, content_tag = tags.role_tag, tags.content_tag
        if layout == "auto":
            layout = "messages" if (role_tag, content_tag) == TURN_KEYS["messages"] else "sharegpt"
    else:
        layout = "messages" if layout == "auto" else layout
        role_tag, content_tag = TURN_KEYS[layout]
    return RecordFormat(layout, key, role_tag, content_tag, _role_names(tags), images, videos,
                        columns.system or SYSTEM_KEY, origin)


def _given(record: dict[str, Any], key: str) -> bool:
    """The record holds ``key`` with a value: not absent, null, an empty string or an empty list."""
    return record.get(key) not in (None, "", [])


def _prompt_completion(record: dict[str, Any]) -> bool:
    """The record holds TRL's ``prompt`` and ``completion`` (neither null nor empty)."""
    return all(_given(record, key) for key in PROMPT_COMPLETION)


def _alpaca_keys(columns: RecordColumns) -> AlpacaKeys:
    return AlpacaKeys(**{name: getattr(columns, name) or default for name, default in ALPACA_DEFAULTS.items()})


EMPTY_FILE = "an empty file"
"""The ``origin`` of the format :func:`file_format` gives a file without any record."""


def file_format(entry: ResolvedEntry) -> RecordFormat:
    """The format of every record of ``entry``'s file: as the entry names it, or detected from the first record
    (of the first :data:`DETECT_RECORDS`) that holds turns; :class:`~vlforge.errors.DataError` when none does."""
    from vlforge.data.sources import open_source

    named = None
    if entry.layout != "auto" and entry.columns.messages is not None:
        named = _format(entry, entry.layout, entry.columns.messages, "named in the dataset entry")
    elif entry.layout == "alpaca" or (entry.layout == "auto" and entry.columns.alpaca_keys()):
        named = detect({}, entry, str(entry.path), "the dataset entry")
    source = open_source(entry.path, entry.data_type)
    if named is not None:  # nothing to detect; an empty file is still told apart
        try:
            empty = not any(True for _ in source.head(1))
        finally:
            source.close()
        return dataclasses.replace(named, origin=EMPTY_FILE) if empty else named
    first: SampleError | None = None
    read = 0
    try:
        for raw in source.head(DETECT_RECORDS):
            read += 1
            if raw.error is not None or raw.record is None:
                first = first or raw.error
                continue
            try:
                return detect(raw.record, entry, raw.source, raw.location)
            except SampleError as error:
                first = first or error
    finally:
        source.close()
    if first is None:  # an empty file: no record to read, none to detect from
        default = PAIR_KEYS[0] if entry.layout == "pairs" else MESSAGE_KEYS[0]
        return _format(entry, entry.layout, entry.columns.messages or default, EMPTY_FILE)
    raise DataError(f"{first.source}:{first.location}: no chat record in the first {read} record(s) of the file "
                    f"(first: {first.reason}: {first.detail})")


def entry_formats(entries: list[ResolvedEntry]) -> list[RecordFormat]:
    """:func:`file_format` of each entry."""
    return [file_format(entry) for entry in entries]


def pool(record: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, list[Any]]:
    """``(key, items)``: the media a record's placeholders take, from the first of ``keys`` present and not null.

    A single path, bytes or ``{"bytes", "path"}`` struct is one item; a list is its items; absent is none.
    """
    for key in keys:
        value = record.get(key)
        if absent(value) or (isinstance(value, (list, tuple)) and not value):
            continue
        return key, list(value) if isinstance(value, (list, tuple)) else [value]
    return keys[0], []


def absent(value: Any) -> bool:
    """No media: None, or a struct whose fields are all null (a parquet ``Image`` column's text-only row)."""
    return value is None or (isinstance(value, dict) and bool(value) and all(v is None for v in value.values()))


def audio_key(record: dict[str, Any]) -> str | None:
    """The key of audio media the record carries (vlforge trains vision-language chats: an error), if any."""
    return next((k for k in AUDIO_KEYS if _given(record, k)), None)

