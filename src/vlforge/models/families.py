"""Every fact vlforge knows about a model family, one record each; code that differs by family reads these.

A family is a transformers ``model_type`` (``config.model_type`` of a checkpoint). Its record names the
Hugging Face classes (config, model, the inner ``*Model`` that owns ``get_rope_index``, processor, PIL image
processor, the torchvision video processor that vlforge's frames processor stands in for), the module classes
that shard or checkpoint as units, where the vision tower lives, the released preprocessor settings, the chat
template style, the vision special tokens, and what vlforge supports for it (packing, sequence parallelism,
LMMS Engine's label masking, deepstack features). Importing this module loads neither torch nor transformers.

Adding a family: its record here, its tiny spec in :mod:`vlforge.models.tiny`, its tests (docs/ARCHITECTURE.md,
"Adding a family").

Example:
    >>> family("qwen3_vl").vision_tower, family("qwen3_vl").deepstack
    ('model.visual', True)
    >>> [f.name for f in FAMILIES.values() if f.sequence_parallel][:2]
    ['qwen2_vl', 'qwen2_5_vl']
    >>> family("qwen3-vl")
    Traceback (most recent call last):
    ...
    vlforge.errors.ConfigError: unknown model family 'qwen3-vl'; did you mean 'qwen3_vl'? (known: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_vl_moe, qwen3_5, qwen3_5_moe, glm4v, glm4v_moe)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vlforge.errors import ConfigError, did_you_mean
from vlforge.versions import require_transformers

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


@dataclass(frozen=True)
class MediaTokens:
    """The special tokens that carry images and videos in a family's prompts."""

    style: Literal["qwen", "glm"]
    """How media are written into the prompt: Qwen's ``<|vision_start|>`` blocks or GLM's image/video blocks."""
    image: str
    """Placeholder repeated once per merged image patch."""
    video: str
    """Placeholder repeated once per merged video patch (GLM-4V reuses the image placeholder)."""
    required: tuple[str, ...]
    """Tokens the tokenizer must know for the family's template and media (checked at processor set-up)."""
    video_start: str | None = None
    video_end: str | None = None

    @property
    def shared_placeholder(self) -> bool:
        """Images and videos use one placeholder token (GLM-4V): only the video markers tell them apart."""
        return self.image == self.video


QWEN_MEDIA = MediaTokens(
    style="qwen", image="<|image_pad|>", video="<|video_pad|>",
    required=("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"),
)
GLM_MEDIA = MediaTokens(
    style="glm", image="<|image|>", video="<|image|>", video_start="<|begin_of_video|>", video_end="<|end_of_video|>",
    required=("[gMASK]", "<sop>", "<|user|>", "<|assistant|>", "<|system|>", "<|begin_of_image|>",
              "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>", "<|endoftext|>"),
)


@dataclass(frozen=True)
class LigerTargets:
    """What ``use_liger_kernel: true`` puts Liger's kernels on in a family: names in its transformers modeling module.
    Each is checked against the installed transformers and probed for the maths Liger's kernel computes before it
    is replaced (:mod:`vlforge.train.liger`); one that is missing or computes something else is named in a warning."""

    rms_norms: tuple[str, ...] = ()
    """RMSNorm classes (text and vision) whose modules get Liger's RMSNorm (its offset and casting from the probe)."""
    swiglu: tuple[str, ...] = ()
    """MLP classes computing ``down(silu(gate(x)) * up(x))`` (separate or fused ``gate_up_proj``): Liger's SiLU-mul."""
    rope: str | None = "apply_rotary_pos_emb"
    """The text attention's rope function, replaced by Liger's rope where it rotates whole heads as Liger does."""
    not_covered: tuple[str, ...] = ()
    """Classes of the family that Liger has no kernel for (named in the warning, left as they are)."""


@dataclass(frozen=True)
class Family:
    """One model family (see the module docstring)."""

    name: str
    """``config.model_type``, e.g. ``qwen3_vl``."""
    title: str
    """How people write it: ``Qwen3-VL``."""
    modeling_module: str
    """transformers module of the model classes."""
    config_class: str
    model_class: str
    """The ``*ForConditionalGeneration`` class (what ``AutoModelForImageTextToText`` builds)."""
    inner_model_class: str
    """The ``*Model`` class whose ``get_rope_index`` gives the mrope positions."""
    text_layer_class: str
    """Decoder layer of the text model (an FSDP2 unit, a checkpointed block)."""
    vision_block_class: str
    """Block of the vision tower."""
    processor_class: str
    image_processor_class: str
    """transformers' PIL-backed image processor (no torchvision)."""
    image_resize_rule: Literal["image", "video"]
    """How that image processor resizes: bounds on ``h * w`` (``image``) or over 2 frames x h x w (``video``,
    GLM-4V's 3-D smart-resize)."""
    stock_video_processor: str
    """transformers' (torchvision) video processor class named in checkpoints; vlforge's frames processor stands
    in for it when torchvision is missing (:mod:`vlforge.models.frames_video`)."""
    video_resize_rule: Literal["per_frame", "video"]
    """``per_frame``: pixel bounds per frame (Qwen2-VL, Qwen2.5-VL); ``video``: over frames x height x width."""
    template: str
    """Chat template style of :mod:`vlforge.models.templates`."""
    image_processor: dict[str, Any]
    """Released image preprocessor settings (written into tiny and real-size preset files)."""
    video_processor: dict[str, Any]
    """Released video processor settings (the same)."""
    vision_defaults: dict[str, Any]
    """The data pipeline's vision settings when no processor is given (:class:`vlforge.data.VisionSettings`)."""
    media: MediaTokens = QWEN_MEDIA
    default_system_prompt: bool = False
    """The chat template inserts a default system prompt when a chat has none (Qwen2-VL, Qwen2.5-VL)."""
    video_timestamps: bool = False
    """Video frames carry ``<t seconds>`` text timestamps (Qwen3-VL)."""
    rope_uses_seconds_per_grid: bool = False
    """``get_rope_index`` takes ``second_per_grid_ts`` (Qwen2.5-VL's absolute time positions)."""
    deepstack: bool = False
    """The vision tower feeds intermediate features into early decoder layers (Qwen3-VL deepstack)."""
    vision_tower: str = "model.visual"
    """Path of the vision tower module in the ``*ForConditionalGeneration`` model."""
    sequence_parallel: bool = True
    """Ulysses sequence parallelism is implemented (``sp_ulysses_degree`` > 1)."""
    lmms_labels: bool = False
    """``data.label_mode: lmms`` reproduces LMMS Engine 0.1.4's template and masking for it."""
    added_tokens: tuple[str, ...] = ()
    """Special tokens the family's tokenizer has beyond Qwen3's (tiny presets append them)."""
    token_ids: dict[str, str] = field(default_factory=dict)
    """Top-level config key -> the token whose id it holds."""
    eos_tokens: tuple[str, ...] = ("<|im_end|>", "<|endoftext|>")
    tokenizer: Literal["qwen3", "qwen3.5"] = "qwen3"
    """The real vocabulary tiny presets use (:data:`vlforge.models.tokenizer.TOKENIZERS`)."""
    linear_attention: bool = False
    """Text layers mix Gated DeltaNet linear attention with full attention (``layer_types``): packed rows need the
    boundary-aware forward of :mod:`vlforge.models.linear_attention`."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """The text layers' linear modules a LoRA suggestion adapts (the attention and MLP projections)."""
    liger: LigerTargets = LigerTargets()
    """Where ``use_liger_kernel`` applies Liger's kernels (the fused linear cross-entropy is every family's)."""
    transformers_min: str = ""
    """The oldest transformers vlforge runs this family with, where newer than :data:`vlforge.versions.
    TRANSFORMERS_MIN` (empty: that one); loading a model of it on an older one is one line naming both."""

    @property
    def video_standin(self) -> str:
        """Name of vlforge's frames video processor class for this family."""
        return self.stock_video_processor.replace("VideoProcessor", "FramesVideoProcessor")


_QWEN2_IMAGE = {  # released Qwen2-VL / Qwen2.5-VL preprocessor: 56*56 .. 28*28*16384 pixels
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 3136, "longest_edge": 12845056},
    "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
}
_QWEN2_VIDEO = {  # 128*28*28 .. 768*28*28 pixels per frame, 2 fps
    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 100352, "longest_edge": 602112}, "fps": 2.0, "min_frames": 4,
    "max_frames": 768, "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD),
}
_QWEN3_IMAGE = {  # released Qwen3-VL preprocessor: 256*256 .. 4096*4096 pixels, mean/std 0.5
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": list(HALF), "image_std": list(HALF),
}
_QWEN3_VIDEO = {  # released Qwen3-VL video processor: pixel budget over frames*h*w, 2 fps, 4..768 frames
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 2.0, "min_frames": 4,
    "max_frames": 768, "image_mean": list(HALF), "image_std": list(HALF),
}
# The data pipeline's defaults (released preprocessor configs; Qwen2-VL / Qwen2.5-VL: 14 px patches, CLIP stats).
_QWEN2_VISION = dict(patch_size=14, min_pixels=56 * 56, max_pixels=28 * 28 * 1280, image_mean=CLIP_MEAN,
                     image_std=CLIP_STD, video_min_pixels=128 * 28 * 28, video_max_pixels=768 * 28 * 28)
_QWEN3_VISION = dict(patch_size=16, min_pixels=64 * 64 * 16, max_pixels=16 * 1024 * 1024, image_mean=HALF,
                     image_std=HALF, video_min_pixels=128 * 32 * 32, video_max_pixels=768 * 32 * 32)

_GLM_TOKENS = (  # GLM-4.1V's own special tokens (tiny presets append them to the Qwen3 vocabulary in this order)
    "[gMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|image|>", "<|video|>",
)

_QWEN3_VL = Family(
    name="qwen3_vl", title="Qwen3-VL", modeling_module="transformers.models.qwen3_vl.modeling_qwen3_vl",
    config_class="Qwen3VLConfig", model_class="Qwen3VLForConditionalGeneration",
    inner_model_class="Qwen3VLModel", text_layer_class="Qwen3VLTextDecoderLayer",
    vision_block_class="Qwen3VLVisionBlock", processor_class="Qwen3VLProcessor",
    image_processor_class="Qwen2VLImageProcessorPil", image_resize_rule="image",
    stock_video_processor="Qwen3VLVideoProcessor",
    video_resize_rule="video", template="qwen3_chatml", image_processor=_QWEN3_IMAGE,
    video_processor=_QWEN3_VIDEO, vision_defaults=_QWEN3_VISION, video_timestamps=True, deepstack=True,
    lmms_labels=True, liger=LigerTargets(rms_norms=("Qwen3VLTextRMSNorm",), swiglu=("Qwen3VLTextMLP",)),
)
# Qwen3.5: Qwen3-VL's vision tower without deepstack, a 3 Gated DeltaNet : 1 gated attention text stack, its own
# 248k vocabulary; the processor and video processor are Qwen3-VL's (transformers' auto mappings).
_QWEN3_5 = replace(
    _QWEN3_VL, name="qwen3_5", title="Qwen3.5", modeling_module="transformers.models.qwen3_5.modeling_qwen3_5",
    config_class="Qwen3_5Config", model_class="Qwen3_5ForConditionalGeneration", inner_model_class="Qwen3_5Model",
    text_layer_class="Qwen3_5DecoderLayer", vision_block_class="Qwen3_5VisionBlock", deepstack=False,
    lmms_labels=False, tokenizer="qwen3.5", linear_attention=True,
    liger=LigerTargets(rms_norms=("Qwen3_5RMSNorm",), swiglu=("Qwen3_5MLP",), not_covered=("Qwen3_5RMSNormGated",)),
    lora_targets=(*_QWEN3_VL.lora_targets, "in_proj_qkv", "in_proj_z", "out_proj"),  # + the Gated DeltaNet's
    # vlforge's packed Gated DeltaNet forward (models/linear_attention.py) follows the layer of transformers 5.23+,
    # whose delta rule takes grouped query/key heads (5.22 and older repeat them in the layer); 5.24 is the tested one
    transformers_min="5.24",
)

_RECORDS = (
    Family(
        name="qwen2_vl", title="Qwen2-VL", modeling_module="transformers.models.qwen2_vl.modeling_qwen2_vl",
        config_class="Qwen2VLConfig", model_class="Qwen2VLForConditionalGeneration",
        inner_model_class="Qwen2VLModel", text_layer_class="Qwen2VLDecoderLayer",
        vision_block_class="Qwen2VLVisionBlock", processor_class="Qwen2VLProcessor",
        image_processor_class="Qwen2VLImageProcessorPil", image_resize_rule="image",
        stock_video_processor="Qwen2VLVideoProcessor",
        video_resize_rule="per_frame", template="qwen2_chatml", image_processor=_QWEN2_IMAGE,
        video_processor=_QWEN2_VIDEO, vision_defaults=_QWEN2_VISION, default_system_prompt=True,
        liger=LigerTargets(rms_norms=("Qwen2VLRMSNorm",), swiglu=("Qwen2MLP",)),
    ),
    Family(
        name="qwen2_5_vl", title="Qwen2.5-VL", modeling_module="transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        config_class="Qwen2_5_VLConfig", model_class="Qwen2_5_VLForConditionalGeneration",
        inner_model_class="Qwen2_5_VLModel", text_layer_class="Qwen2_5_VLDecoderLayer",
        vision_block_class="Qwen2_5_VLVisionBlock", processor_class="Qwen2_5_VLProcessor",
        image_processor_class="Qwen2VLImageProcessorPil", image_resize_rule="image",
        stock_video_processor="Qwen2VLVideoProcessor",
        video_resize_rule="per_frame", template="qwen2_chatml", image_processor=_QWEN2_IMAGE,
        video_processor=_QWEN2_VIDEO, vision_defaults=_QWEN2_VISION, default_system_prompt=True,
        rope_uses_seconds_per_grid=True, lmms_labels=True,
        liger=LigerTargets(rms_norms=("Qwen2_5_VLRMSNorm",), swiglu=("Qwen2MLP", "Qwen2_5_VLMLP")),
    ),
    _QWEN3_VL,
    # Qwen3-VL-MoE: the same with sparse MoE text layers.
    replace(_QWEN3_VL, name="qwen3_vl_moe", title="Qwen3-VL-MoE",
            modeling_module="transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe", config_class="Qwen3VLMoeConfig",
            model_class="Qwen3VLMoeForConditionalGeneration", inner_model_class="Qwen3VLMoeModel",
            text_layer_class="Qwen3VLMoeTextDecoderLayer", vision_block_class="Qwen3VLMoeVisionBlock",
            lora_targets=("q_proj", "k_proj", "v_proj", "o_proj"),  # its experts are fused parameters, not Linears
            liger=LigerTargets(rms_norms=("Qwen3VLMoeTextRMSNorm",), not_covered=("Qwen3VLMoeTextExperts",))),
    _QWEN3_5,
    # Qwen3.5-MoE: the same stack with a sparse MoE block (routed experts plus a gated shared expert) in every layer.
    replace(_QWEN3_5, name="qwen3_5_moe", title="Qwen3.5-MoE",
            modeling_module="transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", config_class="Qwen3_5MoeConfig",
            model_class="Qwen3_5MoeForConditionalGeneration", inner_model_class="Qwen3_5MoeModel",
            text_layer_class="Qwen3_5MoeDecoderLayer", vision_block_class="Qwen3_5MoeVisionBlock",
            liger=LigerTargets(rms_norms=("Qwen3_5MoeRMSNorm",), swiglu=("Qwen3_5MoeMLP",),
                               not_covered=("Qwen3_5MoeRMSNormGated", "Qwen3_5MoeExperts"))),
    Family(
        name="glm4v", title="GLM-4.1V", modeling_module="transformers.models.glm4v.modeling_glm4v",
        config_class="Glm4vConfig", model_class="Glm4vForConditionalGeneration",
        inner_model_class="Glm4vModel", text_layer_class="Glm4vTextDecoderLayer",
        vision_block_class="Glm4vVisionBlock", processor_class="Glm4vProcessor",
        image_processor_class="Glm4vImageProcessorPil", image_resize_rule="video",
        stock_video_processor="Glm4vVideoProcessor",
        video_resize_rule="video", template="glm_chat",
        image_processor={"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                         "size": {"shortest_edge": 12544, "longest_edge": 9633792},
                         "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD)},
        # Video pixel budget as in GLM-4.1V (the stock class has no min/max_frames; vlforge.data samples).
        video_processor={"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                         "size": {"shortest_edge": 12544, "longest_edge": 47040000}, "fps": 2.0,
                         "image_mean": list(CLIP_MEAN), "image_std": list(CLIP_STD)},
        # GLM-4.1V: 14 px patches, CLIP stats, its own image processor (3-D smart-resize over a 2-frame patch).
        vision_defaults=dict(patch_size=14, min_pixels=112 * 112, max_pixels=28 * 28 * 15000, image_mean=CLIP_MEAN,
                             image_std=CLIP_STD, video_min_pixels=128 * 28 * 28, video_max_pixels=768 * 28 * 28),
        media=GLM_MEDIA, added_tokens=_GLM_TOKENS,
        token_ids={"image_token_id": "<|image|>", "video_token_id": "<|video|>",
                   "image_start_token_id": "<|begin_of_image|>", "image_end_token_id": "<|end_of_image|>",
                   "video_start_token_id": "<|begin_of_video|>", "video_end_token_id": "<|end_of_video|>"},
        eos_tokens=("<|endoftext|>", "<|user|>", "<|observation|>"),
        liger=LigerTargets(rms_norms=("Glm4vRMSNorm",), swiglu=("Glm4vTextMLP", "Glm4VisionMlp")),
        # the text MLP fuses gate and up (gate_proj / up_proj name only the vision tower's)
        lora_targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"),
    ),
)
# GLM-4.5V: GLM-4.1V's vision tower, processor and prompt layout over a sparse MoE text stack (dense first layers,
# sigmoid-scored routed experts with a correction bias, one shared expert).
_GLM4V_MOE = replace(
    _RECORDS[-1], name="glm4v_moe", title="GLM-4.5V", modeling_module="transformers.models.glm4v_moe.modeling_glm4v_moe",
    config_class="Glm4vMoeConfig", model_class="Glm4vMoeForConditionalGeneration", inner_model_class="Glm4vMoeModel",
    text_layer_class="Glm4vMoeTextDecoderLayer", vision_block_class="Glm4vMoeVisionBlock",
    lora_targets=Family.lora_targets,  # the dense first layers and the shared expert: gate / up / down projections
    liger=LigerTargets(rms_norms=("Glm4vMoeTextRMSNorm", "Glm4vMoeRMSNorm"),
                       swiglu=("Glm4vMoeTextMLP", "Glm4vMoeisionMlp"),  # sic: transformers' class name
                       not_covered=("Glm4vMoeTextExperts",)),
)
_RECORDS = (*_RECORDS, _GLM4V_MOE)

FAMILIES: dict[str, Family] = {record.name: record for record in _RECORDS}
"""Every family vlforge supports, by ``model_type``."""


def family(name: str) -> Family:
    """The record of ``name`` (a ``model_type``); an unknown name is one :class:`ConfigError` line."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown model family {name!r}{did_you_mean(name, FAMILIES)} "
                          f"(known: {', '.join(FAMILIES)})") from None


def supports(name: str, flag: str) -> bool:
    """The boolean ``flag`` of ``name``'s record (``supports("qwen3_vl", "deepstack")``); False for a family
    vlforge has no record of."""
    record = FAMILIES.get(name)
    return bool(record is not None and getattr(record, flag))


def check_transformers(name: str) -> None:
    """One :class:`~vlforge.versions.VersionError` line when the installed transformers is older than family
    ``name`` needs (its ``transformers_min``); nothing for a family vlforge has no record of."""
    record = FAMILIES.get(name)
    if record is not None:
        require_transformers(f"{record.title} ({record.name})", record.transformers_min)


def names(**wanted: bool) -> tuple[str, ...]:
    """Family names whose flags equal ``wanted``, e.g. ``names(sequence_parallel=True)``."""
    return tuple(f.name for f in _RECORDS if all(getattr(f, key) == value for key, value in wanted.items()))


def by_config_class(config_class: str) -> Family | None:
    """The family whose transformers config class is ``config_class`` (None when vlforge has none)."""
    return next((f for f in _RECORDS if f.config_class == config_class), None)


def uses_image_processor(class_name: str) -> Family | None:
    """The first family whose image processor is ``class_name`` or its torchvision / fast variant."""
    stem = class_name.removesuffix("Fast").removesuffix("Pil")
    return next((f for f in _RECORDS if f.image_processor_class.removesuffix("Pil") == stem), None)
