"""Tokenizer audit on the real Qwen3 tokenizer and on the Qwen2.5-style variant derived from it."""

from __future__ import annotations

from vlforge.vocab.tokenizer import (
    INVALID_UTF8_BYTES,
    _unicode_to_byte,
    byte_invalid_ids,
    encode_tag,
    load_tokenizer,
    plain_pieces,
)


def test_qwen3_think_is_one_added_token(qwen3_tok):
    tok = qwen3_tok
    assert len(tok) == 151669
    think, close = encode_tag(tok, "<think>"), encode_tag(tok, "</think>")
    assert think.ids == [151667] and close.ids == [151668]
    assert think.added == [True] and think.special == [False]
    assert not think.stripped_by_skip_special  # not special: decoding keeps it
    thinking = encode_tag(tok, "<thinking>")
    assert thinking.ids == [13708, 15736, 29]
    assert thinking.pieces == ["<th", "inking", ">"] and thinking.added == [False, False, False]
    end = encode_tag(tok, "<|im_end|>")
    assert end.ids == [151645] and end.special == [True] and end.stripped_by_skip_special


def test_qwen25_variant_splits_think(qwen3_tok, qwen25_dir):
    tok = load_tokenizer(qwen25_dir)
    assert len(tok) == 151665
    think = encode_tag(tok, "<think>")
    assert think.ids == [13708, 766, 29] and think.added == [False] * 3
    assert encode_tag(tok, "<thinking>").ids == [13708, 15736, 29]
    assert encode_tag(tok, "<tool_call>").ids == [151657]  # below 151665: still an added token
    # the plain pieces of Qwen3's <think> are what the variant produces
    assert plain_pieces(qwen3_tok, "<think>") == think.ids


def test_invalid_utf8_byte_tokens(qwen3_tok):
    tok = qwen3_tok
    ids = byte_invalid_ids(tok)
    assert len(ids) == len(INVALID_UTF8_BYTES) == 13
    table = _unicode_to_byte()
    for piece in tok.convert_ids_to_tokens(ids):
        assert len(piece) == 1 and table[piece] in INVALID_UTF8_BYTES
    # the byte alphabet maps 256 distinct characters onto the 256 bytes
    assert sorted(table.values()) == list(range(256))
