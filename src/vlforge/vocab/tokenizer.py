"""How strings encode: ids, pieces, added/special flags, and tokens that valid UTF-8 can never produce.

Example:
    >>> from vlforge.vocab.tokenizer import load_tokenizer, encode_tag
    >>> tok = load_tokenizer("/path/to/qwen3")                      # doctest: +SKIP
    >>> encode_tag(tok, "<think>").ids, encode_tag(tok, "<thinking>").ids  # doctest: +SKIP
    ([151667], [13708, 15736, 29])
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from vlforge.errors import ModelLoadError, first_line

log = logging.getLogger(__name__)

# bytes that never occur in well-formed UTF-8
INVALID_UTF8_BYTES = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])


@dataclass(frozen=True)
class TagEncoding:
    """How one string encodes on its own (no special tokens added around it)."""

    text: str
    ids: list[int]
    pieces: list[str]
    added: list[bool]
    special: list[bool]
    stripped_by_skip_special: bool

    def as_dict(self) -> dict:
        return {
            "ids": self.ids, "pieces": self.pieces, "added": self.added, "special": self.special,
            "stripped_by_skip_special": self.stripped_by_skip_special,
        }


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt", "*.model",
                   "*.tiktoken")
"""Patterns of which a tokenizer directory holds at least one file (fast, slow BPE, WordPiece, sentencepiece
models such as ``tokenizer.model`` or ``spiece.model``, tiktoken)."""


def load_tokenizer(path: str | Path):
    """``AutoTokenizer.from_pretrained(path)`` with a one-line error naming the directory."""
    from vlforge.models.readers import read_tokenizer

    folder = Path(path)
    if folder.is_dir() and not any(f.is_file() for pattern in TOKENIZER_FILES for f in folder.glob(pattern)):
        raise ModelLoadError(f"{path}: no tokenizer files in it (none of {', '.join(TOKENIZER_FILES)})")
    try:
        return read_tokenizer(str(path))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise ModelLoadError(f"{path}: cannot load a tokenizer ({type(error).__name__}: {first_line(error)})") \
            from error


def added_tokens(tok) -> dict[int, tuple[str, bool]]:
    """``{id: (content, special)}`` of the tokenizer's added tokens."""
    return {int(i): (t.content, bool(t.special)) for i, t in tok.added_tokens_decoder.items()}


def encode_tag(tok, text: str) -> TagEncoding:
    """Encode ``text`` alone and say whether ``decode(..., skip_special_tokens=True)`` would drop it."""
    ids = list(tok.encode(text, add_special_tokens=False))
    added = added_tokens(tok)
    pieces = [str(p) for p in tok.convert_ids_to_tokens(ids)]
    kept = tok.decode(ids, skip_special_tokens=True)
    return TagEncoding(
        text=text, ids=ids, pieces=pieces,
        added=[i in added for i in ids], special=[added.get(i, ("", False))[1] for i in ids],
        stripped_by_skip_special=kept != tok.decode(ids, skip_special_tokens=False),
    )


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet (printable stand-ins for the 256 byte values)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codes = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes, strict=True)}


_SP_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def byte_invalid_ids(tok) -> list[int]:
    """Ids of vocabulary tokens containing a byte that well-formed UTF-8 never has (never seen in text).

    Works for byte-level BPE (GPT-2 alphabet, Qwen) and for SentencePiece byte fallback (``<0xF5>``);
    the GPT-2 alphabet rule applies to byte-level tokenizers only (:func:`is_byte_level`).
    """
    table = _unicode_to_byte()
    added = added_tokens(tok)
    byte_level = is_byte_level(tok)
    # the stand-ins of the invalid bytes: most pieces hold none, and the regex skips them in C
    invalid = re.compile("[" + "".join(re.escape(ch) for ch, b in table.items() if b in INVALID_UTF8_BYTES) + "]")
    out = []
    for piece, idx in tok.get_vocab().items():
        if idx in added:
            continue
        match = _SP_BYTE.match(piece)
        if match:
            if int(match.group(1), 16) in INVALID_UTF8_BYTES:
                out.append(idx)
            continue
        if byte_level and invalid.search(piece) and all(ch in table for ch in piece):
            out.append(idx)
    return sorted(out)


def is_byte_level(tok) -> bool:
    """Whether the pieces are spelt in the GPT-2 byte alphabet (a ByteLevel pre-tokenizer or decoder).

    Only then does a piece such as ``'õ'`` stand for the byte 0xF5; in a SentencePiece or WordPiece
    vocabulary it is the letter itself.
    """
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return True  # slow GPT-2 style tokenizers
    # each component's own JSON (nested sequences included), not the whole tokenizer's (tens of MB)
    parts = [part.__getstate__() for part in (backend.pre_tokenizer, backend.decoder) if part is not None]
    return any(b'"ByteLevel"' in part for part in parts)


def plain_pieces(tok, text: str) -> list[int]:
    """Ids of ``text`` when the added tokens occurring in it are ignored (ordinary vocabulary only).

    This is how a tokenizer without those added tokens (e.g. Qwen2.5's for ``<think>``) encodes it.
    """
    from tokenizers import Tokenizer

    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ModelLoadError("plain-text pieces need a fast (tokenizers) tokenizer")
    data = json.loads(backend.to_str())
    data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["content"] not in text]
    plain = Tokenizer.from_str(json.dumps(data))
    return list(plain.encode(text, add_special_tokens=False).ids)
