"""GLM-4V's shared image/video placeholder: vlforge's span-aware mask against the stock one on real tiny models."""

from __future__ import annotations

import pytest
import torch

from vlforge.models import load
from vlforge.models.families import FAMILIES
from vlforge.models.media_mask import restore, separate_video_placeholders, video_spans


@pytest.fixture(scope="module")
def glm(tiny_checkpoint):
    return load(str(tiny_checkpoint("glm4v")), processor=False, tokenizer=False).model


def _row(config, images: int, video_frames: int, width: int = 2) -> torch.Tensor:
    """Token ids: ``images`` image blocks, a video of ``video_frames`` frames, one more image block if ``images``."""
    image, start, end = config.image_token_id, config.video_start_token_id, config.video_end_token_id
    begin_image, end_image = config.image_start_token_id, config.image_end_token_id
    block = [begin_image, *[image] * width, end_image]
    ids = [5] + block * images
    if video_frames:
        ids += [start, *[*block, 7] * video_frames, end]
    return torch.tensor([ids + [9] + block * bool(images)])


def test_the_families_that_share_a_placeholder_are_glm_s():
    assert sorted(n for n, f in FAMILIES.items() if f.media.shared_placeholder) == ["glm4v", "glm4v_moe"]


def test_video_spans_cover_what_lies_between_the_markers():
    ids = torch.tensor([[1, 8, 2, 2, 9, 2, 8, 2, 9]])
    assert video_spans(ids, 8, 9).tolist() == [[False, True, True, True, False, False, True, True, False]]



def test_a_stray_marker_in_one_packed_sample_does_not_shift_the_next_samples_video():
    """A literal end marker in one sample's text (with no start before it) leaves a later video's frames in its
    span; a stray start marker opens a span only up to the next marker."""
    stray_end = torch.tensor([[1, 9, 2, 8, 2, 2, 9, 2]])
    assert video_spans(stray_end, 8, 9).tolist() == [[False, False, False, True, True, True, False, False]]
    stray_start = torch.tensor([[8, 2, 8, 2, 9, 2]])
    assert video_spans(stray_start, 8, 9).tolist() == [[True, True, True, True, False, False]]


def test_single_kind_rows_get_the_stock_masks_and_mixed_rows_their_own(glm):
    inner, width = glm.model, glm.config.text_config.hidden_size
    stock = inner.get_placeholder_mask
    images_only, video_only, mixed = (_row(glm.config, 2, 0), _row(glm.config, 0, 2), _row(glm.config, 1, 2))
    embeds = {name: torch.zeros(*ids.shape, width) for name, ids in
              (("images", images_only), ("video", video_only), ("mixed", mixed))}
    assert separate_video_placeholders(glm) == "Glm4vModel"
    assert separate_video_placeholders(glm) == "Glm4vModel"  # idempotent
    try:
        for ids, kind, used, count in ((images_only, "images", 0, 6), (video_only, "video", 1, 4)):
            ours, theirs = inner.get_placeholder_mask(ids, embeds[kind]), stock(ids, embeds[kind])
            assert torch.equal(ours[used], theirs[used]) and int(ours[used].sum()) == count  # the mask it uses
        n_image, n_video = 4, 4  # 2 image blocks of 2 outside the video, 2 frames of 2 inside it
        image_mask, video_mask = inner.get_placeholder_mask(mixed, embeds["mixed"],
                                                            image_features=torch.zeros(n_image, width),
                                                            video_features=torch.zeros(n_video, width))
        assert int(image_mask.sum()) == n_image and int(video_mask.sum()) == n_video
        assert not bool((image_mask & video_mask).any())
        with pytest.raises(ValueError, match="Image features and image tokens do not match, tokens: 4, features: 8"):
            inner.get_placeholder_mask(mixed, embeds["mixed"], image_features=torch.zeros(8, width))
        with pytest.raises(ValueError, match="Image features and image tokens do not match"):
            stock(mixed, embeds["mixed"], image_features=torch.zeros(n_image, width))  # what transformers does
    finally:
        assert restore(glm)
    assert not restore(glm) and "get_placeholder_mask" not in vars(inner)


def test_a_model_without_the_method_or_the_markers_is_refused():
    with pytest.raises(ValueError, match="has no get_placeholder_mask"):
        separate_video_placeholders(torch.nn.Linear(2, 2))
