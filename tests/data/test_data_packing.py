"""Packing invariants, collates, and packed == unpacked model outputs on a real tiny Qwen3-VL."""

from __future__ import annotations

import torch
from datakit import chat
from hypothesis import given, settings
from hypothesis import strategies as st

from vlforge.data import (
    IGNORE_INDEX,
    Binner,
    LengthGrouper,
    collate_packed,
    collate_padded,
    parse_conversation,
)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), max_size=80), strategy=st.sampled_from(["first_fit", "best_fit"]),
       open_bins=st.integers(1, 6))
def test_binner_never_splits_and_emits_every_item_once(lengths, strategy, open_bins):
    binner = Binner(50, strategy, open_bins)
    bins = []
    for i, n in enumerate(lengths):
        bins += binner.add(i, n)
        assert len(binner.bins) <= open_bins
    bins += binner.flush()
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 50 for b in bins)
    assert all(b for b in bins)


def test_first_fit_and_best_fit_differ_as_defined():
    first, best = Binner(10, "first_fit", 4), Binner(10, "best_fit", 4)
    closed_first = [b for n in (5, 7, 3) for b in first.add(n, n)]
    closed_best = [b for n in (5, 7, 3) for b in best.add(n, n)]
    assert closed_first == [] and first.bins == [[5, 3], [7]]  # 3 goes to the first bin with room
    assert closed_best == [[7, 3]] and best.bins == [[5]]  # 3 goes where it leaves least room: 7+3 fills a bin


def test_best_fit_closes_a_full_bin_immediately():
    best = Binner(10, "best_fit", 4)
    assert best.add("a", 7) == [] and best.add("b", 5) == []
    assert best.add("c", 3) == [["a", "c"]]


def test_length_grouper_sorts_within_its_window():
    g = LengthGrouper(batch_size=2, window=6)
    out = []
    for i, n in enumerate([9, 1, 7, 3, 5, 2]):
        out += g.add(i, n)
    assert out == [[1, 5], [3, 4], [2, 0]]  # lengths (1, 2), (3, 5), (7, 9)


def _tiny_qwen3_vl():
    from transformers import Qwen3VLConfig, Qwen3VLModel

    config = Qwen3VLConfig(
        text_config=dict(vocab_size=151680, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                           deepstack_visual_indexes=[0]))
    config._attn_implementation = "sdpa"
    return Qwen3VLModel(config).eval()


def test_packed_row_gives_the_same_hidden_states_as_separate_samples(make_processor, media_dir):
    proc = make_processor("qwen3_vl")
    records = [chat([{"type": "image", "image": "img0.png"}, {"type": "text", "text": "What is it?"}]),
               chat("Just text, no media at all.", "Fine."),
               chat([{"type": "video", "video": "clip.mp4"}, {"type": "text", "text": "And this?"}], "Motion.")]
    samples = [proc.process(parse_conversation(r, "s", f"line {i}"), media_dir) for i, r in enumerate(records)]
    packed = collate_packed(samples, pad_token_id=151643, pad_to=sum(len(s) for s in samples) + 5)
    lengths = [len(s) for s in samples]
    assert packed["cu_seqlens"].tolist() == [0, lengths[0], sum(lengths[:2]), sum(lengths), sum(lengths) + 5]
    assert packed["position_ids"].shape == (4, 1, sum(lengths) + 5)
    assert packed["labels"][0, -5:].eq(IGNORE_INDEX).all()
    for k, s in enumerate(samples):  # first row restarts at 0 per sample; rows 1-3 are the sample's mrope
        a = packed["cu_seqlens"][k]
        assert torch.equal(packed["position_ids"][0, 0, a : a + len(s)], torch.arange(len(s)))
        assert torch.equal(packed["position_ids"][1:, 0, a : a + len(s)], s.position_ids)

    model = _tiny_qwen3_vl()
    keys = ("input_ids", "position_ids", "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")
    with torch.no_grad():
        # use_cache=False: with a cache transformers skips packed-sequence detection (no block mask)
        out = model(**{k: packed[k] for k in keys if k in packed}, use_cache=False).last_hidden_state[0]
        for k, s in enumerate(samples):
            single = collate_padded([s], pad_token_id=151643)
            ref = model(**{k2: single[k2] for k2 in (*keys, "attention_mask") if k2 in single}).last_hidden_state[0]
            a = int(packed["cu_seqlens"][k])
            torch.testing.assert_close(out[a : a + len(s)], ref, atol=2e-5, rtol=1e-4)


def test_padded_collate_masks_padding(make_processor, media_dir):
    proc = make_processor("qwen2_vl")
    a = proc.process(parse_conversation(chat("short", "x"), "s", "line 1"), media_dir)
    b = proc.process(parse_conversation(chat("a much longer question " * 4, "y"), "s", "line 2"), media_dir)
    batch = collate_padded([a, b], pad_token_id=151643)
    assert batch["input_ids"].shape == (2, len(b)) and batch["position_ids"].shape == (3, 2, len(b))
    assert batch["attention_mask"][0].sum() == len(a) and batch["attention_mask"][1].all()
    assert batch["labels"][0, len(a):].eq(IGNORE_INDEX).all()
    assert batch["input_ids"][0, len(a):].eq(151643).all()
