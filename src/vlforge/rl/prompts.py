"""The prompts of a GRPO run, read as its engine reads them: verl's parquet ``prompt`` column of chat messages,
EasyR1's ``problem`` / ``answer`` rows with its format prompt, TRL's ``prompt`` column (text or conversational),
OpenRLHF's input / label keys.

Example:
    >>> import json, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = path.write_text(json.dumps({"problem": "1+1?", "answer": "2"}) + "\\n")
    >>> rows = read_prompts(path, engine="easyr1", prompt_key="problem", answer_key="answer")
    >>> rows[0].messages, rows[0].answer
    ([{'role': 'user', 'content': '1+1?'}], '2')
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlforge.errors import DataError, first_line

SUFFIXES = (".parquet", ".jsonl", ".json")
PROMPT_KEYS = {"verl": "prompt", "easyr1": "prompt", "trl": "prompt", "openrlhf": "input"}
"""Each engine's default prompt column (verl data.prompt_key, EasyR1 data.prompt_key, TRL's dataset format,
OpenRLHF --data.input_key)."""
ANSWER_KEYS = {"easyr1": "answer", "openrlhf": "label", "trl": "solution"}


@dataclass
class PromptRow:
    """One prompt as the engine sees it."""

    index: int
    messages: list[dict]
    conversational: bool
    """The prompt column held chat messages (TRL passes messages, not text, to the reward then)."""
    answer: Any = None
    data_source: str | None = None
    extra_info: dict = field(default_factory=dict)
    columns: dict = field(default_factory=dict)
    """Every column but the prompt (TRL passes them to the reward as keyword arguments)."""
    images: list = field(default_factory=list)
    templated: bool = True
    """The engine renders the chat template around it (TRL tokenizes a text prompt as it is)."""


def _native(value: Any) -> Any:
    """numpy arrays and scalars from parquet as plain Python values."""
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _native(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_native(v) for v in value]
    return value


def check_prompts_file(path: Path, key: str) -> None:
    """The file exists, is a format vlforge reads, and has the prompt column (read before torch loads)."""
    if not path.exists():
        hub = "" if path.suffix or path.is_absolute() or len(path.parts) != 2 else (
            " (a hub dataset name? vlforge reads no network: pass --prompts with a local parquet or JSONL copy)")
        raise DataError(f"--prompts {path}: not found{hub}")
    if path.is_dir():
        raise DataError(f"--prompts {path}: is a directory (EasyR1 and TRL load one with the datasets library): pass "
                        "one of its data files")
    if path.suffix not in SUFFIXES:
        raise DataError(f"--prompts {path}: expected {', '.join(SUFFIXES)}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            names = pq.read_schema(path).names
        except Exception as error:  # pyarrow raises several types for a broken file
            raise DataError(f"--prompts {path}: not a parquet file ({error})") from None
    else:
        rows = _json_rows(path, limit=1)
        if not rows:
            raise DataError(f"--prompts {path}: no rows")
        names = list(rows[0])
    if key not in names:
        raise DataError(f"--prompts {path}: no {key!r} column (columns: {', '.join(map(str, names))}); "
                        "pass --prompt-key")


def _json_rows(path: Path, limit: int | None) -> list[dict]:
    from vlforge.data.config import (
        infer_data_type,  # JSON Lines named .json, an array named .jsonl: by content
    )

    rows: list[dict] = []
    if infer_data_type(path) == "jsonl":
        with path.open() as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as error:
                    raise DataError(f"{path}:{number}: invalid JSON ({error})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{number}: expected an object per line")
                rows.append(row)
                if limit is not None and len(rows) >= limit:
                    break
        return rows
    try:
        data = json.loads(path.read_text())
    except ValueError as error:
        raise DataError(f"{path}: invalid JSON ({error})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise DataError(f"{path}: expected a list of objects")
    return data[:limit] if limit is not None else data


def _parquet_rows(path: Path, limit: int | None) -> list[dict]:
    """The first ``limit`` rows, reading only the record batches that hold them (a train file's images are inside)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
        if limit is None:
            table = handle.read()
        else:
            batches = []
            for batch in handle.iter_batches(batch_size=max(1, min(limit, 1024))):
                batches.append(batch)
                if sum(b.num_rows for b in batches) >= limit:
                    break
            table = pa.Table.from_batches(batches, schema=handle.schema_arrow).slice(0, limit)
    except (pa.ArrowException, OSError) as error:
        raise DataError(f"{path}: cannot read it as parquet ({first_line(error)})") from None
    return [_native(r) for r in table.to_pylist()]


def _load_rows(path: Path, limit: int | None) -> list[dict]:
    return _parquet_rows(path, limit) if path.suffix == ".parquet" else _json_rows(path, limit)


def _messages(value: Any, path: Path, index: int, key: str) -> tuple[list[dict], bool]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}], False
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return [dict(m) for m in value], True
    raise DataError(f"{path}: row {index}: {key!r} is neither text nor a list of chat messages")


def _with_media_parts(messages: list[dict], tag: str) -> list[dict]:
    """verl and EasyR1 split a text at ``<image>`` into content parts (their datasets' ``_build_messages``)."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and tag in content:
            parts: list[dict] = []
            for i, text in enumerate(content.split(tag)):
                if i:
                    parts.append({"type": "image"})
                if text:
                    parts.append({"type": "text", "text": text})
            message = {**message, "content": parts}
        out.append(message)
    return out


def _trl_images(raw: dict) -> list:
    """TRL's image column: ``images`` (a list) or ``image`` (one)."""
    if raw.get("images") is not None:
        return list(raw["images"])
    return [raw["image"]] if raw.get("image") is not None else []


def _with_image_parts(messages: list[dict], count: int) -> list[dict]:
    """Chat messages whose parts already place the images, or ``count`` image parts put before the first user
    turn's text (TRL's ``prepare_multimodal_messages`` when the prompt names none)."""
    placed = sum(1 for m in messages if isinstance(m.get("content"), list)
                 for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")
    if placed:
        return messages
    out, done = [], False
    for message in messages:
        if not done and message.get("role") == "user":
            content = message.get("content")
            text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            message, done = {**message, "content": [*({"type": "image"} for _ in range(count)), *text]}, True
        out.append(message)
    return out


def read_prompts(path: Path, *, engine: str, prompt_key: str | None = None, answer_key: str | None = None,
                 image_key: str | None = None, format_prompt: str | None = None, image_dir: Path | None = None,
                 limit: int | None = None) -> list[PromptRow]:
    """The first ``limit`` rows of ``path`` as :class:`PromptRow` s, built the way ``engine`` builds them."""
    key = prompt_key or PROMPT_KEYS[engine]
    answer_key = answer_key or ANSWER_KEYS.get(engine)
    image_key = image_key or "images"
    template = None
    if format_prompt is not None:
        from jinja2 import (
            Template,  # EasyR1 renders its format prompt with jinja2's Template(...).render(content=)
        )

        template = Template(format_prompt.strip())
    rows = []
    for index, raw in enumerate(_load_rows(path, limit)):
        if key not in raw:
            raise DataError(f"{path}: row {index} has no {key!r} column")
        value = raw[key]
        if template is not None:
            if not isinstance(value, str):
                raise DataError(f"{path}: row {index}: a format prompt needs {key!r} as text")
            value = template.render(content=value)
        messages, conversational = _messages(value, path, index, key)
        if engine == "trl":  # TRL's VLM rows: an `image` or `images` column beside chat messages with image parts
            images = _trl_images(raw) if conversational else []
            if images:
                messages = _with_image_parts(messages, len(images))
        else:
            images = list(raw.get(image_key) or []) if engine in ("verl", "easyr1") else []
            if images and image_dir is not None:  # EasyR1's data.image_dir: the root of relative image paths
                images = [str(Path(image_dir) / image) if isinstance(image, str) else image for image in images]
            if images:
                messages = _with_media_parts(messages, "<image>")
                placed = sum(isinstance(m["content"], list) and sum(p.get("type") == "image" for p in m["content"])
                             for m in messages)
                if placed != len(images):
                    raise DataError(f"{path}: row {index}: {len(images)} image(s) but {placed} <image> placeholder(s) "
                                    f"in its prompt ({engine} puts each image at an <image> of the text)")
        reward_model = raw.get("reward_model")
        answer = (reward_model.get("ground_truth") if engine == "verl" and isinstance(reward_model, dict)
                  else raw.get(answer_key) if answer_key else None)
        rows.append(PromptRow(
            index=index, messages=messages, conversational=conversational, answer=answer,
            data_source=raw.get("data_source"), extra_info=dict(raw.get("extra_info") or {}),
            columns={k: v for k, v in raw.items() if k != key}, images=images,
            templated=conversational or engine != "trl"))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows
