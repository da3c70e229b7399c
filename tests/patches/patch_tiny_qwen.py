"""A tiny random Qwen3-VL built straight from transformers' config classes, plus one image batch.

Used by the patch tests that need a whole model (save/load round trip, ``patch_transformers``) or a
real vision tower (gradients, compile, FSDP2). Sizes are the real ones' shapes scaled down; the patch
conv keeps Qwen3-VL's real kernel (3 x 2 x 16 x 16).

Example:
    >>> from patch_tiny_qwen import tiny_qwen3_vl_config, image_batch
    >>> from transformers import Qwen3VLForConditionalGeneration
    >>> model = Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config()).eval()
    >>> out = model(**image_batch(model.config))
    >>> tuple(out.logits.shape)
    (1, 15, 512)
"""

from __future__ import annotations

import torch
from transformers import Qwen3VLConfig
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

VOCAB = 512
IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 500, 501, 502, 503


def tiny_vision_config(depth: int = 1) -> Qwen3VLVisionConfig:
    """Qwen3-VL vision tower: real patch kernel (2 x 16 x 16, 3 channels), width 32 (real: 1152)."""
    return Qwen3VLVisionConfig(
        depth=depth,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0],
    )


def tiny_qwen3_vl_config() -> Qwen3VLConfig:
    """Whole Qwen3-VL, text width 64 (real: 4096), 2 layers, vocab 512 with the vision tokens at 500-503."""
    text = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    }
    vision = tiny_vision_config().to_dict()
    return Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )


def vision_inputs(config: Qwen3VLVisionConfig, grid: list[list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    """``hidden_states`` rows (one flattened 3 x 2 x 16 x 16 window each) and ``grid_thw`` for a tower."""
    grid_thw = torch.tensor(grid)
    rows = int(grid_thw.prod(dim=1).sum())
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(rows, width, generator=generator), "grid_thw": grid_thw}


def image_batch(config: Qwen3VLConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """One prompt with one 4 x 4-patch image (4 merged tokens) between text tokens."""
    grid = [[1, 4, 4]]
    vision = vision_inputs(config.vision_config, grid, seed)
    merged = 16 // config.vision_config.spatial_merge_size**2
    ids = [1, 2, 3, VISION_START, *([IMAGE_TOKEN] * merged), VISION_END, 4, 5, 6, 7, 8, 9]
    return {
        "input_ids": torch.tensor([ids]),
        "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
        "mm_token_type_ids": torch.tensor([[int(i == IMAGE_TOKEN) for i in ids]]),
        "pixel_values": vision["hidden_states"],
        "image_grid_thw": vision["grid_thw"],
    }
