"""LMMS Engine 0.1.4's sample layout and label masking, for runs that must match runs made with it.

``data.label_mode: lmms`` selects this instead of vlforge's default (assistant replies and their
``<|im_end|>``). It reproduces what LMMS Engine's ``qwen2_5_vl`` / ``qwen3_vl`` data processors do
(``BaseQwen2_5_DataProcessor.get_qwen_template_labels``, ``Qwen3_VLDataProcessor``):

- a system turn ``You are a helpful assistant`` (no full stop) when the chat has none, for both families;
- every message tokenised on its own with LMMS's template: a newline after each image's and video's
  ``<|vision_end|>``; Qwen3-VL videos as ``<t seconds><|vision_start|>pads<|vision_end|>`` per temporal
  patch without the outer ``<|vision_start|>``/``<|vision_end|>`` pair, each timestamp tokenised alone;
  no removal of earlier turns' ``<think>`` reasoning;
- labels: an assistant message's tokens after its first three (``<|im_start|>``, ``assistant``, ``\\n``),
  so its reply, ``<|im_end|>`` *and the newline after it*; then every special token anywhere
  (``tokenizer.all_special_tokens`` plus ``<|im_start|>`` / ``<|im_end|>``: the system and user turns'
  ``<|im_start|>``, ``<|im_end|>``, ``<|vision_start|>``, ``<|vision_end|>``) except ``<|image_pad|>``
  and ``<|video_pad|>``.

Example:
    >>> from vlforge.data.schema import parse_conversation
    >>> conv = parse_conversation({"messages": [
    ...     {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}, "d.jsonl", "line 1")
    >>> ids, labels = encode_lmms(tokenizer, conv, [], [], timestamps=False)  # doctest: +SKIP
    >>> tokenizer.decode(labels[labels != -100])  # doctest: +SKIP
    '<|im_start|><|im_end|><|im_start|><|im_end|><|im_start|>Hello<|im_end|>\\n'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vlforge.data.schema import Conversation, TextPart

IGNORE_INDEX = -100
LMMS_SYSTEM = "You are a helpful assistant"
HEADER_TOKENS = 3  # <|im_start|> role \n: never a label of an assistant message


@dataclass(frozen=True)
class VideoLayout:
    """What a Qwen3-VL video placeholder needs: the seconds of each temporal patch, tokens per patch."""

    timestamps: list[float]
    tokens_per_patch: int


def _message_pieces(role: str, parts: list[Any], media_texts: Any, layouts: Any,
                    timestamps: bool) -> list[str]:
    """One message as text pieces; each piece is tokenised alone (LMMS encodes a timestamp on its own)."""
    pieces = [f"<|im_start|>{role}\n"]
    for part in parts:
        if isinstance(part, TextPart):
            pieces[-1] += part.text
            continue
        text, layout = next(media_texts), next(layouts)
        if layout is None or not timestamps:  # image, or Qwen2.5-VL video: the placeholder, then a newline
            pieces[-1] += text + "\n"
            continue
        for seconds in layout.timestamps:  # Qwen3-VL: no outer vision_start/vision_end pair
            pieces += [f"<{seconds:.1f} seconds>", "<|vision_start|>" + "<|video_pad|>" * layout.tokens_per_patch
                       + "<|vision_end|>"]
        pieces[-1] += "\n"
    pieces[-1] += "<|im_end|>\n"
    return pieces


def _tokenize(tokenizer: Any, pieces: list[str]) -> list[int]:
    ids: list[int] = []
    for piece in pieces:
        ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return ids


def encode_lmms(tokenizer: Any, conv: Conversation, media_texts: list[str], layouts: list[VideoLayout | None],
                timestamps: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and labels of ``conv`` as LMMS Engine 0.1.4 builds them (see the module doc).

    ``media_texts`` are the processor's placeholder texts in order, ``layouts`` each item's
    :class:`VideoLayout` (None for an image); ``timestamps`` is true for Qwen3-VL.
    """
    media_iter, layout_iter = iter(media_texts), iter(layouts)
    input_ids: list[int] = []
    labels: list[int] = []
    if not conv.messages or conv.messages[0].role != "system":
        ids = _tokenize(tokenizer, [f"<|im_start|>system\n{LMMS_SYSTEM}<|im_end|>\n"])
        input_ids += ids
        labels += [IGNORE_INDEX] * len(ids)
    for message in conv.messages:
        ids = _tokenize(tokenizer, _message_pieces(message.role, message.parts, media_iter, layout_iter, timestamps))
        input_ids += ids
        if message.role == "assistant" and message.trained:
            labels += [IGNORE_INDEX] * min(HEADER_TOKENS, len(ids)) + ids[HEADER_TOKENS:]
        else:
            labels += [IGNORE_INDEX] * len(ids)
    special = {tokenizer.convert_tokens_to_ids(t) for t in [*tokenizer.all_special_tokens, "<|im_start|>",
                                                             "<|im_end|>"]}
    masked = {tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>", "<|video_pad|>")}
    ids_t = torch.tensor(input_ids, dtype=torch.long)
    labels_t = torch.tensor(labels, dtype=torch.long)
    is_special = torch.tensor([i in special for i in input_ids], dtype=torch.bool)
    labels_t[is_special] = ids_t[is_special]
    labels_t[torch.tensor([i in masked for i in input_ids], dtype=torch.bool)] = IGNORE_INDEX
    return ids_t, labels_t
