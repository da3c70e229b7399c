"""The automatic reference set (tokenizer side) and the cuts derived from a score distribution."""

from __future__ import annotations

import math

import pytest
import torch

from vlforge.vocab.detect import score_cuts
from vlforge.vocab.reference import unreachable_ids, unused_special_ids
from vlforge.vocab.thresholds import THRESHOLDS
from vlforge.vocab.tokenizer import byte_invalid_ids, is_byte_level


def test_unused_specials_of_the_real_qwen3_tokenizer(qwen3_tok):
    unused = unused_special_ids(qwen3_tok)
    pieces = qwen3_tok.convert_ids_to_tokens(unused)
    assert "<|box_start|>" in pieces and "<|image_pad|>" in pieces
    # named by the special-token map or the chat template, or not special at all: never candidates
    for kept in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "<tool_call>"):
        assert kept not in pieces
    # a template that names a special token makes it used
    assert 151648 not in unused_special_ids(qwen3_tok, template="{{ '<|box_start|>' }}")


def test_unreachable_ids_do_not_encode_back_and_the_others_do(qwen3_tok):
    unreachable = unreachable_ids(qwen3_tok)
    assert 1000 < len(unreachable) < 5000  # 1,909 in Qwen3's byte-level BPE
    for i in unreachable[::97]:
        assert qwen3_tok.encode(qwen3_tok.decode([i]), add_special_tokens=False) != [i]
    gone = set(unreachable)
    reachable = [i for i in range(0, 151643, 1013) if i not in gone and "\ufffd" not in qwen3_tok.decode([i])]
    assert len(reachable) > 100
    for i in reachable:
        assert qwen3_tok.encode(qwen3_tok.decode([i]), add_special_tokens=False) == [i]


def _wordpiece(tmp_path):
    """A real BERT-style tokenizer (uncased normaliser, punctuation split, WordPiece) saved and reloaded."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[", "]", "unused", "##0", ")", "hello",
             "walk", "##ing", "##)", "##é", "##É", "õ", "e", "##e"]
    backend = Tokenizer(models.WordPiece({p: i for i, p in enumerate(vocab)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=False)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                  cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tok.save_pretrained(tmp_path)
    from vlforge.vocab.tokenizer import load_tokenizer

    return load_tokenizer(tmp_path), vocab


def test_wordpiece_rules(tmp_path):
    tok, vocab = _wordpiece(tmp_path)
    pieces = {vocab[i] for i in unreachable_ids(tok)}
    assert "[unused0]" in pieces  # splits into '[' 'unused' '##0' ']'
    assert "##)" in pieces  # punctuation is split off the word
    assert "##É" in pieces  # the uncased normaliser never leaves a capital
    assert not pieces & {"hello", "walk", "##ing", "##é", "##e", "õ"}
    # 'õ' is a letter here, not the GPT-2 alphabet's stand-in for the byte 0xF5
    assert not is_byte_level(tok) and byte_invalid_ids(tok) == []


def test_cuts_from_a_score_distribution():
    gen = torch.Generator().manual_seed(0)
    bulk = 0.1 + 0.1 * torch.randn(20000, generator=gen)
    hidden = 0.9 + 0.02 * torch.randn(300, generator=gen)  # never-trained ids outside the reference set
    reference = 0.95 + 0.01 * torch.randn(500, generator=gen)
    typical = torch.cat([bulk, hidden])
    med = float(typical.median())
    mad = float(1.4826 * (typical - med).abs().median())
    untrained, weak = score_cuts(typical, reference, med, mad, THRESHOLDS)
    assert float(bulk.max()) < untrained < float(hidden.min())  # the gap between the two
    assert med < weak < untrained
    assert weak == pytest.approx(med + THRESHOLDS["weak_fraction"] * (untrained - med))
    # a reference set inside the bulk: no cut at all
    assert score_cuts(bulk, bulk[:500], med, mad, THRESHOLDS) == (math.inf, math.inf)
    # the floor: a reference set barely above the bulk cannot pull the cut into it
    untrained, _ = score_cuts(bulk, 0.1 + 0.2 * torch.ones(50), med, mad, {**THRESHOLDS, "min_z": 3.0})
    assert math.isinf(untrained) or untrained >= med + 3.0 * mad
