"""Real-size presets (``real:NAME``): the published dimensions of Qwen-VL checkpoints, written here as facts.

Each preset copies the size-defining fields of the ``config.json`` of ``Qwen/<name>-Instruct`` on the Hugging
Face Hub; the comment above it names the copies it was read from and cross-checked against. Weights are
random (vlforge never downloads them for a preset) and the tokenizer is the real Qwen3 one, as for ``tiny:``.

- :func:`preset_config` returns the transformers config of any ``tiny:`` or ``real:`` preset.
- :func:`meta_model` builds the model on the ``meta`` device (shapes only, no memory), e.g. for ``vlforge plan``.
- :func:`vlforge.models.load` builds a ``real:`` model with random weights after checking that it fits.

Example (CPU, a few seconds):
    >>> from vlforge.models.presets import preset_config, param_count
    >>> preset_config("real:qwen3_vl_8b").text_config.hidden_size     # doctest: +SKIP
    4096
    >>> round(param_count("real:qwen3_vl_8b") / 1e9, 2)                # doctest: +SKIP
    8.77
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from vlforge.errors import ConfigError
from vlforge.models.families import FAMILIES, family

PRESET_PREFIX = "tiny:"
REAL_PREFIX = "real:"
_PRESET = re.compile(r"^tiny:(?P<family>[a-z0-9_]+)(?P<untied>\+untied)?(?:@(?P<seed>-?\d+))?$")
_REAL = re.compile(r"^real:(?P<name>[a-z0-9_]+)(?:@(?P<seed>-?\d+))?$")


class Preset(NamedTuple):
    """A ``tiny:`` preset's parts."""

    family: str
    seed: int
    tied: bool


def parse_preset(preset: str) -> Preset:
    """``tiny:FAMILY[+untied][@SEED]`` -> its parts; an unknown family or a malformed preset is a ConfigError."""
    match = _PRESET.match(preset.strip())
    if match is None:
        raise ConfigError(f"bad preset {preset!r}; expected tiny:FAMILY[+untied][@SEED] with FAMILY one of "
                          + ", ".join(FAMILIES))
    family(match["family"])  # unknown family: one line with "did you mean" and the known ones
    return Preset(match["family"], int(match["seed"] or 0), match["untied"] is None)


class RealPreset(NamedTuple):
    """One real-size preset: the family's config class plus the published text and vision fields."""

    family: str
    """``model_type`` / :mod:`vlforge.models.tiny` family whose tokenizer, processor and template it uses."""
    checkpoint: str
    """The Hub checkpoint whose config.json the numbers come from."""
    published_params: float | None
    """Parameter count shown for the checkpoint (safetensors total), for tests and docs; None where no source gave
    the multimodal total (the count on the meta device is then the only figure)."""
    text: dict[str, Any]
    vision: dict[str, Any]
    tie_word_embeddings: bool


_QWEN25_ROPE = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]}
_QWEN3_ROPE = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [24, 20, 20], "mrope_interleaved": True}
_QWEN25_VISION = {  # identical in Qwen2.5-VL-3B and -7B; out_hidden_size = the text width
    "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "hidden_act": "silu",
    "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
}
_QWEN3_VISION_SMALL = {  # Qwen3-VL-2B and -4B
    "depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
    "hidden_act": "gelu_pytorch_tanh", "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17],
}
_QWEN3_VISION_LARGE = {  # Qwen3-VL-8B (and the MoE sizes)
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
    "hidden_act": "gelu_pytorch_tanh", "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24],
}

_QWEN3_5_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                 "mrope_section": [11, 11, 10], "mrope_interleaved": True}
_QWEN3_5_LINEAR = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                   "linear_num_key_heads": 16}
_QWEN3_5_VISION = {  # the one published Qwen3.5 vision config found (27B's), equal to transformers' defaults
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "patch_size": 16,
    "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304,
}

REAL_PRESETS: dict[str, RealPreset] = {
    # Qwen/Qwen2.5-VL-3B-Instruct config.json. Read from sophgo/LLM-TPU models/Qwen2_5_VL/config/config.json
    # (commit 5e1c5982; only max_position_embeddings edited there) and cross-checked against a verbatim
    # "model config" dump of Qwen/Qwen2.5-VL-3B-Instruct found by the code search (its repository was not named
    # by the search tool). Both agree on every field below.
    "qwen2_5_vl_3b": RealPreset(
        family="qwen2_5_vl", checkpoint="Qwen/Qwen2.5-VL-3B-Instruct", published_params=3.75e9,
        text={"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
              "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 128000,
              "rms_norm_eps": 1e-6, "rope_parameters": _QWEN25_ROPE},
        vision={**_QWEN25_VISION, "out_hidden_size": 2048},
        tie_word_embeddings=True,
    ),
    # Qwen/Qwen2.5-VL-7B-Instruct config.json (the text encoder of Qwen-Image and HunyuanImage-2.1 is this
    # checkpoint). Read from kohya-ss/musubi-tuner src/musubi_tuner/qwen_image/qwen_image_utils.py (commit
    # 30c658c4) and cross-checked against kohya-ss/sd-scripts library/hunyuan_image_text_encoder.py (commit
    # 48d368fa); widths also match NVIDIA-NeMo/Megatron-Bridge's 2-layer toy copy
    # (tests/functional_tests/test_groups/models/qwen_vl/test_qwen25_vl_conversion.py).
    "qwen2_5_vl_7b": RealPreset(
        family="qwen2_5_vl", checkpoint="Qwen/Qwen2.5-VL-7B-Instruct", published_params=8.29e9,
        text={"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 128000,
              "rms_norm_eps": 1e-6, "rope_parameters": _QWEN25_ROPE},
        vision={**_QWEN25_VISION, "out_hidden_size": 3584},
        tie_word_embeddings=False,
    ),
    # Qwen/Qwen3-VL-2B-Instruct. Read from pytorch/torchtitan torchtitan/experiments/qwen3_vl/__init__.py
    # flavour "2B" (commit 0375bb67; weight tying on) and cross-checked against two copies found by the code
    # search without a repository name (an sgl_jax Qwen3VLVisionConfig with these vision defaults, and a full
    # 2B config dict: tied, vision 24 x 1024 / 4096, out 2048, deepstack (5, 11, 17)).
    "qwen3_vl_2b": RealPreset(
        family="qwen3_vl", checkpoint="Qwen/Qwen3-VL-2B-Instruct", published_params=2.13e9,
        text={"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
              "rms_norm_eps": 1e-6, "rope_parameters": _QWEN3_ROPE},
        vision={**_QWEN3_VISION_SMALL, "out_hidden_size": 2048},
        tie_word_embeddings=True,
    ),
    # Qwen/Qwen3-VL-4B-Instruct config.json. Read from kohya-ss/musubi-tuner src/musubi_tuner/krea2/
    # krea2_encoder.py (vendored verbatim, commit 30c658c4) and cross-checked against a second vendored copy
    # (QWEN3_VL_4B_INSTRUCT_CONFIG in a kohya-style library/ module) and a test fixture of the 4B shapes, both
    # found by the code search without a repository name.
    "qwen3_vl_4b": RealPreset(
        family="qwen3_vl", checkpoint="Qwen/Qwen3-VL-4B-Instruct", published_params=4.44e9,
        text={"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
              "rms_norm_eps": 1e-6, "rope_parameters": _QWEN3_ROPE},
        vision={**_QWEN3_VISION_SMALL, "out_hidden_size": 2560},
        tie_word_embeddings=True,
    ),
    # Qwen/Qwen3-VL-8B-Instruct config.json. Read from kohya-ss/musubi-tuner src/musubi_tuner/ideogram4/
    # ideogram4_utils.py (vendored verbatim, commit 30c658c4) and cross-checked against pytorch/torchtitan
    # torchtitan/experiments/qwen3_vl/__init__.py flavour "8B" (commit 0375bb67; no weight tying).
    "qwen3_vl_8b": RealPreset(
        family="qwen3_vl", checkpoint="Qwen/Qwen3-VL-8B-Instruct", published_params=8.77e9,
        text={"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 262144,
              "rms_norm_eps": 1e-6, "rope_parameters": _QWEN3_ROPE},
        vision={**_QWEN3_VISION_LARGE, "out_hidden_size": 4096},
        tie_word_embeddings=False,
    ),
    # Qwen/Qwen3-VL-30B-A3B-Instruct: 48 layers of width 2048, every one a MoE of 128 experts top-8 of width 768 (no
    # shared expert, softmax routing), 32 Q / 4 KV heads of 128, vocab 151936, untied, rope theta 5e6; vision as the
    # 8B's (27 x 1152, deepstack 8/16/24), output 2048. Read from pytorch/torchtitan
    # torchtitan/experiments/qwen3_vl/__init__.py flavour "30B-A3B" (commit 0375bb67) and cross-checked against
    # THUDM/slime scripts/models/qwen3-vl-30b-a3b.sh (commit dfdf8e3d: the text side, untied, dense FFN 6144 kept in
    # the config as intermediate_size). No source gave the multimodal parameter total.
    "qwen3_vl_30b_a3b": RealPreset(
        family="qwen3_vl_moe", checkpoint="Qwen/Qwen3-VL-30B-A3B-Instruct", published_params=None,
        text={"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
              "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
              "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "vocab_size": 151936, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
              "rope_parameters": _QWEN3_ROPE},
        vision={**_QWEN3_VISION_LARGE, "out_hidden_size": 2048},
        tie_word_embeddings=False,
    ),
    # Qwen/Qwen3.5-9B: 32 layers as 8 x (3 Gated DeltaNet + 1 gated attention), hidden 4096, FFN 12288, attention
    # 16 Q / 4 KV heads of 256 with 64 rotary dims, DeltaNet 16 QK / 32 V heads of 128, vocab 248320 (padded),
    # untied. The model card as quoted by awesomeagents.ai/models/qwen-3-5-9b and apxml.com/models/qwen35-9b; the
    # same values are transformers 5.24's Qwen3_5TextConfig defaults. Vision: the 27B's (no 9B copy was found),
    # its output width the text width. No source gave the multimodal parameter total.
    "qwen3_5_9b": RealPreset(
        family="qwen3_5", checkpoint="Qwen/Qwen3.5-9B", published_params=None,
        text={"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32, "num_attention_heads": 16,
              "num_key_value_heads": 4, "head_dim": 256, "linear_num_value_heads": 32, **_QWEN3_5_LINEAR,
              "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
              "rope_parameters": _QWEN3_5_ROPE},
        vision={**_QWEN3_5_VISION, "out_hidden_size": 4096},
        tie_word_embeddings=False,
    ),
    # Qwen/Qwen3.5-27B: 64 layers, hidden 5120, FFN 17408, 24 Q / 4 KV heads of 256, untied: THUDM/slime
    # scripts/models/qwen3.5-27B.sh. DeltaNet 16 QK / 48 V heads of 128 and the vision tower (27 x 1152, output
    # 5120): a full Qwen3_5Config of the 27B found by the code search without a repository name.
    "qwen3_5_27b": RealPreset(
        family="qwen3_5", checkpoint="Qwen/Qwen3.5-27B", published_params=None,
        text={"hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 64, "num_attention_heads": 24,
              "num_key_value_heads": 4, "head_dim": 256, "linear_num_value_heads": 48, **_QWEN3_5_LINEAR,
              "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
              "rope_parameters": _QWEN3_5_ROPE},
        vision={**_QWEN3_5_VISION, "out_hidden_size": 5120},
        tie_word_embeddings=False,
    ),
    # Qwen/Qwen3.5-35B-A3B: 40 layers of the same 3:1 mix, hidden 2048, 16 Q / 2 KV heads of 256, 256 experts
    # top-8 of width 512 plus a gated shared expert of 512 in every layer, DeltaNet 16 QK / 32 V heads of 128,
    # untied: THUDM/slime scripts/models/qwen3.5-35B-A3B.sh (commit 58d8ff75), equal to transformers 5.24's
    # Qwen3_5MoeTextConfig defaults. Vision as for the 9B, output 2048.
    "qwen3_5_35b_a3b": RealPreset(
        family="qwen3_5_moe", checkpoint="Qwen/Qwen3.5-35B-A3B", published_params=None,
        text={"hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
              "head_dim": 256, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
              "shared_expert_intermediate_size": 512, "linear_num_value_heads": 32, **_QWEN3_5_LINEAR,
              "vocab_size": 248320, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
              "rope_parameters": _QWEN3_5_ROPE},
        vision={**_QWEN3_5_VISION, "out_hidden_size": 2048},
        tie_word_embeddings=False,
    ),
    # zai-org/GLM-4.5V: 46 layers of width 4096 (96 Q / 8 KV heads of 128, attention bias, half-rotary mrope
    # (8, 12, 12)), the first dense (10944), then 128 sigmoid-routed experts top-8 of width 1408 and one shared
    # expert; vocab 151552, untied; vision 24 blocks x 1536 (12 heads), merger width 10944, output 4096. Read from a
    # verbatim dump of the loaded checkpoint found by the code search (its repository was not named by the search
    # tool): its Glm4vMoeConfig, its module tree and its weights table, 107,710,933,120 parameters in 46 safetensors
    # files; the text fields equal transformers 5.24's Glm4vMoeTextConfig defaults but the vocabulary (151424 there).
    "glm4_5v_106b_a12b": RealPreset(
        family="glm4v_moe", checkpoint="zai-org/GLM-4.5V", published_params=107.71e9,
        text={"hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46, "num_attention_heads": 96,
              "num_key_value_heads": 8, "head_dim": 128, "attention_bias": True, "first_k_dense_replace": 1,
              "n_routed_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
              "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
              "routed_scaling_factor": 1.0, "vocab_size": 151552, "max_position_embeddings": 65536,
              "rms_norm_eps": 1e-5, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                        "mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5}},
        vision={"depth": 24, "hidden_size": 1536, "intermediate_size": 10944, "num_heads": 12, "out_hidden_size": 4096,
                "image_size": 336, "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2,
                "hidden_act": "silu", "rms_norm_eps": 1e-5},
        tie_word_embeddings=False,
    ),
}


def real_names() -> list[str]:
    """Names accepted after ``real:``."""
    return list(REAL_PRESETS)


def parse_real(ref: str) -> tuple[str, RealPreset, int]:
    """``real:NAME[@SEED]`` -> (name, preset, seed); anything else is one ConfigError listing the known names."""
    match = _REAL.match(ref.strip())
    known = ", ".join(f"real:{name}" for name in REAL_PRESETS)
    if match is None:
        raise ConfigError(f"bad preset {ref!r}; expected real:NAME[@SEED] with NAME one of {known}")
    if match["name"] not in REAL_PRESETS:
        raise ConfigError(f"unknown real-size preset {ref!r}; known: {known}")
    return match["name"], REAL_PRESETS[match["name"]], int(match["seed"] or 0)


def real_config(name: str, tokenizer: Any) -> Any:
    """The transformers config of a real-size preset, with the token ids of ``tokenizer`` (the real Qwen3 one)."""
    import transformers

    from vlforge.models import tiny

    spec = REAL_PRESETS[name]
    record = family(spec.family)
    eos = tokenizer.convert_tokens_to_ids(record.eos_tokens[0])
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    # the vocabulary covers the tokenizer the preset trains with (GLM-4.5V's 151552 rows are fewer than the Qwen3
    # vocabulary plus GLM's tokens that tiny and real GLM presets use: +192 rows, 0.002% of its parameters)
    vocab = max(spec.text["vocab_size"], tiny._round_up(len(tokenizer), tiny.VOCAB_MULTIPLE))
    text = {**spec.text, "vocab_size": vocab, "tie_word_embeddings": spec.tie_word_embeddings, "bos_token_id": pad,
            "eos_token_id": eos, "pad_token_id": pad}
    config = getattr(transformers, record.config_class)(
        text_config=text, vision_config=dict(spec.vision), tie_word_embeddings=spec.tie_word_embeddings,
    )
    config.architectures = None
    return config


def preset_config(ref: str) -> Any:
    """The transformers config of a ``tiny:`` or ``real:`` preset (no weights, nothing written)."""
    from vlforge.models import tiny

    if ref.startswith(REAL_PREFIX):
        name, spec, _seed = parse_real(ref)
        return real_config(name, tiny._shared_tokenizer(spec.family))
    if not ref.startswith(PRESET_PREFIX):
        raise ConfigError(f"{ref!r} is not a preset; use tiny:FAMILY or real:NAME")
    family, _seed, tied = parse_preset(ref)
    return tiny.build_config(family, tiny._shared_tokenizer(family), tie_word_embeddings=tied)[0]


def meta_model(ref: str) -> Any:
    """The preset's model built on the ``meta`` device: every shape, no memory."""
    import torch
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(preset_config(ref))


def param_count(ref: str) -> int:
    """Number of distinct parameters (tied embeddings once) of a preset, counted on the meta device."""
    model = meta_model(ref)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
