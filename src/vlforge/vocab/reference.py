"""Ids a tokenizer (almost) never emits: the candidate part of the weights audit's reference set.

- ``unreachable``: ordinary vocabulary ids whose own decoded text does not encode back to them (a
  longer merge always wins, a normaliser rewrites the text, a pre-tokenizer splits it). WordPiece
  continuations (``##x``) are tested after a letter; byte tokens are left to the invalid-UTF-8 rule.
- ``unused_special``: special added tokens that neither the special-token map (bos, eos, pad, unk,
  cls, sep, mask) nor the chat template names (``<unused17>``, ``[unused5]``-style added tokens,
  reserved control tokens).

Example:
    >>> from vlforge.vocab.reference import reference_candidates
    >>> found = reference_candidates(tok)                   # doctest: +SKIP
    >>> sorted(found), len(found["unused_special"])          # doctest: +SKIP
    (['unreachable', 'unused_special'], 6244)
"""

from __future__ import annotations

import re

from vlforge.vocab.tokenizer import added_tokens

_SP_BYTE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
BATCH = 8192


def _continuation_prefix(tok) -> str | None:
    backend = getattr(tok, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    if model is not None and type(model).__name__ == "WordPiece":
        return getattr(model, "continuing_subword_prefix", None) or None
    return None


def unreachable_ids(tok) -> list[int]:
    """Ordinary ids that the tokenizer cannot produce from their own decoded text."""
    added = added_tokens(tok)
    vocab = tok.get_vocab()
    prefix = _continuation_prefix(tok)
    backend = getattr(tok, "backend_tokenizer", None)
    normalizer = getattr(backend, "normalizer", None)
    pre = getattr(backend, "pre_tokenizer", None)
    out: list[int] = []
    plain: list[int] = []
    for piece, idx in vocab.items():
        if idx in added or _SP_BYTE.match(piece):
            continue
        if prefix and piece.startswith(prefix) and len(piece) > len(prefix):
            text = "a" + piece[len(prefix):]
            normal = normalizer.normalize_str(text) if normalizer is not None else text
            words = pre.pre_tokenize_str(normal) if pre is not None else [(normal, None)]
            if normal != text or len(words) != 1:
                out.append(idx)
            continue
        plain.append(idx)
    plain.sort()
    for start in range(0, len(plain), BATCH):
        ids = plain[start:start + BATCH]
        if backend is not None:  # the Rust batch calls: ~5x faster than the Python wrapper, same texts and ids
            texts = backend.decode_batch([[i] for i in ids], skip_special_tokens=False)
            encoded = [[i for i, keep in zip(e.ids, e.attention_mask, strict=True) if keep]  # padding set on
                       for e in backend.encode_batch(texts, add_special_tokens=False)]  # the backend is masked
        else:
            texts = tok.batch_decode([[i] for i in ids], skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False)
            encoded = tok(texts, add_special_tokens=False)["input_ids"]
        for idx, text, enc in zip(ids, texts, encoded, strict=True):
            if "\ufffd" in text:  # a lone byte of a multi-byte character: reachable through its neighbours
                continue
            if list(enc) != [idx]:
                out.append(idx)
    return sorted(out)


def special_map_ids(tok) -> set[int]:
    """Ids of the tokenizer's named special tokens (bos, eos, pad, unk, cls, sep, mask)."""
    out = set()
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "cls_token_id",
                 "sep_token_id", "mask_token_id"):
        value = getattr(tok, name, None)
        if isinstance(value, int):
            out.add(value)
        elif isinstance(value, list):
            out.update(v for v in value if isinstance(v, int))
    return out


def unused_special_ids(tok, template: str | None = None) -> list[int]:
    """Special added tokens named neither by the special-token map nor by the chat template."""
    if template is None:
        template = tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else ""
    named = special_map_ids(tok)
    return sorted(i for i, (content, special) in added_tokens(tok).items()
                  if special and i not in named and content not in template)


def reference_candidates(tok, template: str | None = None) -> dict[str, list[int]]:
    """``{"unreachable": [...], "unused_special": [...]}`` (see the module docstring)."""
    return {"unreachable": unreachable_ids(tok), "unused_special": unused_special_ids(tok, template)}


_RECENT: dict = {}
_RECENT_MAX = 8
"""The last scores of this process, keyed by the weight files (path, size, mtime), the tokenizer and the options:
one process that audits the same checkpoint again (``vlforge rl check`` of a rewritten reward) reuses them."""


def _key(tok, emb, *parts) -> tuple | None:
    try:
        files = tuple(sorted({(str(m.file), m.file.stat().st_size, m.file.stat().st_mtime_ns)
                              for m in (emb.input, emb.output)}))
    except (AttributeError, OSError):
        return None
    added = tuple(sorted((int(i), t.content, bool(t.special)) for i, t in tok.added_tokens_decoder.items()))
    return (files, str(getattr(tok, "name_or_path", "")), len(tok), added, repr(parts))


def detect_for(tok, emb, *, user_reference_ids: list[int] | None = None, thresholds: dict | None = None,
               chunk_rows: int | None = None, template: str | None = None):
    """:func:`vlforge.vocab.detect.detect` with the reference rules of this tokenizer."""
    key = _key(tok, emb, user_reference_ids, sorted((thresholds or {}).items()), chunk_rows, template)
    if key is not None and key in _RECENT:
        return _RECENT[key]
    stats = _detect_for(tok, emb, user_reference_ids=user_reference_ids, thresholds=thresholds,
                        chunk_rows=chunk_rows, template=template)
    if key is not None:
        while len(_RECENT) >= _RECENT_MAX:  # a few entries: the weights' scores hold arrays over every row
            _RECENT.pop(next(iter(_RECENT)))
        _RECENT[key] = stats
    return stats


def _detect_for(tok, emb, *, user_reference_ids, thresholds, chunk_rows, template):
    from vlforge.vocab.detect import DEFAULT_CHUNK_ROWS, detect
    from vlforge.vocab.tokenizer import byte_invalid_ids

    return detect(emb, tokenizer_len=len(tok), byte_invalid_ids=byte_invalid_ids(tok),
                  user_reference_ids=user_reference_ids, candidate_ids=reference_candidates(tok, template),
                  chunk_rows=chunk_rows or DEFAULT_CHUNK_ROWS, thresholds=thresholds)
