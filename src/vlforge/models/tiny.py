"""Tiny random-initialised checkpoints of each Qwen-VL family, deterministic per seed.

``write_tiny(family, out_dir, seed=0)`` writes a complete Hugging Face checkpoint directory:
``config.json``, ``generation_config.json``, ``model.safetensors`` (fp32), the real Qwen3 tokenizer
(``tokenizer.json``, ``tokenizer_config.json``; GLM-4V adds its own special tokens; Qwen3.5 has its own 248k
vocabulary, :mod:`vlforge.models.tokenizer`), ``chat_template.jinja``,
``processor_config.json`` (image processor = transformers' PIL class, video processor = a
:class:`~vlforge.models.frames_video.FramesVideoProcessor` subclass) and ``vlforge_tiny.json`` (what was written).

The files are portable: they name only classes stock transformers has (``Qwen2VLVideoProcessor``, not
vlforge's torchvision-free stand-in, which :mod:`vlforge.models.compat` picks at load time), so the
checkpoint loads with plain transformers, with or without torchvision.

Real patch geometry is kept (patch 14 or 16, temporal 2, merge 2) so the processors apply the real
resize rules; everything else is small: 2 vision blocks of width 32, 2 text layers of width 64
(4 heads of 16, 2 KV heads; Qwen3.5: one Gated DeltaNet and one full-attention layer), a 4-expert top-2 MoE for
``qwen3_vl_moe``, ``qwen3_5_moe`` and ``glm4v_moe`` (after one dense layer). The vocabulary is the
tokenizer length rounded up to a multiple of 64, so rows past the tokenizer exist (as in real Qwen).
Embeddings are tied unless ``tie_word_embeddings=False``. The same seed gives a byte-identical
``model.safetensors``.

Example (CPU, a few seconds):
    >>> from vlforge.models.tiny import write_tiny
    >>> path = write_tiny("qwen3_vl", "/tmp/tiny-qwen3-vl", seed=0)   # doctest: +SKIP
    or: ``vlforge tiny qwen3_vl /tmp/tiny-qwen3-vl --seed 0``
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import ConfigDict

from vlforge.command import Cli, Job, always_ok
from vlforge.errors import ConfigError, VlforgeError
from vlforge.flags import Arg, Flag
from vlforge.models.compat import ensure_processor_support
from vlforge.models.families import check_transformers, family
from vlforge.models.templates import template
from vlforge.models.tokenizer import TOKENIZERS
from vlforge.outputs import check_output_dir, staged_dir
from vlforge.strict import StrictModel

logger = logging.getLogger(__name__)

MARKER = "vlforge_tiny.json"
VOCAB_MULTIPLE = 64
FILES_VERSION = 2
"""Version of what :func:`write_tiny` writes; part of the preset cache key (2: stock class names only)."""


class TinySpec(StrictModel):
    """The tiny dimensions of one family (its other facts are its record in :mod:`vlforge.models.families`)."""

    model_config = ConfigDict(frozen=True)

    text: dict[str, Any]
    """``text_config`` fields: small widths, the family's real rope layout."""
    vision: dict[str, Any]
    """``vision_config`` fields: 2 small blocks with the real patch geometry."""


_TEXT = {  # shared tiny decoder: 2 layers, width 64, 4 query heads x 16, 2 KV heads
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}
_QWEN3_VISION = {  # real Qwen3-VL-2B: depth 24, hidden 1024, mlp 4096, 16 heads, deepstack (5, 11, 17)
    "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
    "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2,
    "num_position_embeddings": 2304, "deepstack_visual_indexes": [0, 1],
}
_QWEN3_ROPE = {"rope_type": "default", "rope_theta": 5e6, "mrope_section": [4, 2, 2], "mrope_interleaved": True}
_QWEN3_5_TEXT = {  # the hybrid stack: heads of 32 so that a quarter-rotary head still has 4 frequencies (2, 1, 1)
    "layer_types": ["linear_attention", "full_attention"], "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": True},
}
_QWEN3_5_VISION = {k: v for k, v in _QWEN3_VISION.items() if k != "deepstack_visual_indexes"}
_GLM_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}
_GLM_VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
               "image_size": 336, "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2}

SPECS: dict[str, TinySpec] = {
    # Qwen2-VL-2B: text 1536 wide x 28 layers (12 heads, 2 KV), vocab 151936, tied;
    # vision 32 blocks x 1280 (16 heads), patch 14, mrope sections (16, 24, 24).
    "qwen2_vl": TinySpec(
        text={**_TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
        vision={"depth": 2, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2, "num_heads": 2,
                "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2},
    ),
    # Qwen2.5-VL-3B: text 2048 x 36 layers (16 heads, 2 KV), vocab 151936, tied; vision 32 blocks x 1280,
    # window attention (112 px) with full attention at blocks (7, 15, 23, 31), patch 14.
    "qwen2_5_vl": TinySpec(
        text={**_TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}},
        vision={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
                "patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 112,
                "fullatt_block_indexes": [1], "tokens_per_second": 2},
    ),
    # Qwen3-VL-2B: text 2048 x 28 layers (16 heads x 128, 8 KV), vocab 151936, tied, interleaved
    # mrope (24, 20, 20); vision see _QWEN3_VISION, patch 16.
    "qwen3_vl": TinySpec(text={**_TEXT, "head_dim": 16, "rope_parameters": _QWEN3_ROPE}, vision=_QWEN3_VISION),
    # Qwen3-VL-30B-A3B: text 2048 x 48 layers (32 heads x 128, 4 KV), 128 experts top-8 of width 768,
    # vocab 151936, untied; vision 27 blocks x 1152, deepstack (8, 16, 24), patch 16.
    "qwen3_vl_moe": TinySpec(
        text={**_TEXT, "head_dim": 16, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
              "decoder_sparse_step": 1, "mlp_only_layers": [], "rope_parameters": _QWEN3_ROPE},
        vision=_QWEN3_VISION,
    ),
    # Qwen3.5-9B: text 4096 x 32 layers, 3 Gated DeltaNet (16 QK / 32 V heads x 128, conv 4) : 1 gated attention
    # (16 heads x 256, 4 KV), rotary over a quarter of each head, interleaved mrope (11, 11, 10), vocab 248320,
    # untied; vision 27 blocks x 1152, patch 16, no deepstack. Tiny: one linear and one full layer.
    "qwen3_5": TinySpec(text={**_TEXT, **_QWEN3_5_TEXT}, vision=_QWEN3_5_VISION),
    # Qwen3.5-35B-A3B: text 2048 x 40 layers of the same mix, 256 experts top-8 of width 512 plus a gated shared
    # expert of 512 in every layer. Tiny: 4 experts top-2 and a shared expert of width 32.
    "qwen3_5_moe": TinySpec(
        text={**{k: v for k, v in _TEXT.items() if k != "intermediate_size"}, **_QWEN3_5_TEXT,
              "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 32},
        vision=_QWEN3_5_VISION,
    ),
    # GLM-4.1V-9B: text 4096 x 40 layers (32 heads x 128, 2 KV), vocab 151552 (its own tokenizer),
    # half-rotary mrope (8, 12, 12); vision 24 blocks x 1536 (12 heads), image_size 336, patch 14.
    "glm4v": TinySpec(text={**_TEXT, "rope_parameters": _GLM_ROPE}, vision=_GLM_VISION),
    # GLM-4.5V: text 4096 x 46 layers (96 heads x 128, 8 KV, attention bias), the first layer dense (10944), then
    # 128 sigmoid-routed experts top-8 of width 1408 plus one shared expert, vocab 151424 (its own tokenizer),
    # untied, half-rotary mrope; vision as GLM-4.1V's. Tiny: a dense layer, then 4 experts top-2 and a shared one.
    "glm4v_moe": TinySpec(
        text={**_TEXT, "rope_parameters": _GLM_ROPE, "first_k_dense_replace": 1, "n_routed_experts": 4,
              "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1, "n_group": 1,
              "topk_group": 1},
        vision=_GLM_VISION,
    ),
}


def families() -> list[str]:
    """Names accepted by :func:`write_tiny` and by ``tiny:FAMILY`` presets (every family has a tiny spec)."""
    return list(SPECS)


def spec(name: str) -> TinySpec:
    """The :class:`TinySpec` of a family; unknown names raise :class:`ConfigError`."""
    family(name)  # an unknown name: one line with "did you mean" and the known families
    if name not in SPECS:
        raise ConfigError(f"model family {name!r} has no tiny spec in vlforge.models.tiny")
    return SPECS[name]


def fingerprint(name: str) -> dict[str, Any]:
    """Everything a tiny checkpoint of ``name`` is made from: its tiny spec and its family record."""
    return {"tiny": spec(name).model_dump(), "family": dataclasses.asdict(family(name))}


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _base_tokenizer(vocabulary: str, added_tokens: tuple[str, ...], eos_token: str):
    tokenizer = TOKENIZERS[vocabulary]()
    if added_tokens:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": list(added_tokens)}, replace_extra_special_tokens=False
        )
    tokenizer.eos_token = eos_token
    return tokenizer


def build_tokenizer(name: str):
    """A fresh Qwen3 tokenizer with the family's added special tokens, eos and chat template."""
    record = family(name)
    tokenizer = _base_tokenizer(record.tokenizer, record.added_tokens, record.eos_tokens[0])
    tokenizer.chat_template = template(record.template)
    return tokenizer


@functools.cache
def _shared_base(vocabulary: str, added_tokens: tuple[str, ...], eos_token: str):
    """Families with the same vocabulary share one instance per process (parsing takes ~2 s)."""
    return _base_tokenizer(vocabulary, added_tokens, eos_token)


def _shared_tokenizer(name: str):
    record = family(name)
    tokenizer = _shared_base(record.tokenizer, record.added_tokens, record.eos_tokens[0])
    tokenizer.chat_template = template(record.template)  # set before every use: instances are shared
    return tokenizer


def build_config(name: str, tokenizer, *, tie_word_embeddings: bool = True):
    """The transformers config of a family's tiny model for this tokenizer."""
    import transformers

    family_spec, record = spec(name), family(name)
    ids = {key: tokenizer.convert_tokens_to_ids(token) for key, token in record.token_ids.items()}
    eos = [tokenizer.convert_tokens_to_ids(token) for token in record.eos_tokens]
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text = {
        **family_spec.text,
        "vocab_size": _round_up(len(tokenizer), VOCAB_MULTIPLE),
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": pad,
        "eos_token_id": eos[0],
        "pad_token_id": pad,
    }
    config_class = getattr(transformers, record.config_class)
    config = config_class(
        text_config=text,
        vision_config=dict(family_spec.vision),
        tie_word_embeddings=tie_word_embeddings,
        **ids,
    )
    config.architectures = None
    return config, eos, pad


def build_processor(name: str, tokenizer):
    """The family's processor: PIL image processor, :class:`FramesVideoProcessor`, this tokenizer."""
    import transformers

    from vlforge.models.frames_video import STOCK_STANDINS

    ensure_processor_support()
    record = family(name)
    image_class = getattr(transformers, record.image_processor_class)
    processor_class = getattr(transformers, record.processor_class)
    return processor_class(
        image_processor=image_class(**record.image_processor),
        tokenizer=tokenizer,
        video_processor=STOCK_STANDINS[record.stock_video_processor](**record.video_processor),
        chat_template=template(record.template),
    )


def _check_target(out_dir: Path) -> None:
    check_output_dir(out_dir, flag="OUT_DIR", mode="replace")


def write_tiny(
    name: str,
    out_dir: str | os.PathLike[str],
    *,
    seed: int = 0,
    tie_word_embeddings: bool = True,
) -> Path:
    """Write the tiny checkpoint of family ``name`` into ``out_dir`` and return its path.

    ``out_dir`` may be new, empty, or a previous ``vlforge tiny`` output (replaced); any other
    non-empty directory is refused. The directory is built next to ``out_dir`` and renamed into
    place, so readers never see a half-written checkpoint.
    """
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    spec(name)
    check_transformers(name)
    out_dir = Path(out_dir).expanduser().absolute()
    _check_target(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = _shared_tokenizer(name)
    config, eos, pad = build_config(name, tokenizer, tie_word_embeddings=tie_word_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    processor = build_processor(name, tokenizer)

    with staged_dir(out_dir, writer="tiny") as staging:
        model.save_pretrained(staging)
        processor.save_pretrained(staging)
        marker = {
            "family": name,
            "seed": seed,
            "files_version": FILES_VERSION,
            "tie_word_embeddings": tie_word_embeddings,
            "vocab_size": config.text_config.vocab_size,
            "tokenizer_length": len(tokenizer),
            "added_tokens": {t: tokenizer.convert_tokens_to_ids(t) for t in family(name).added_tokens},
        }
        (staging / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    logger.info("wrote tiny %s (seed %d) to %s", name, seed, out_dir)
    return out_dir


class TinyRequest(StrictModel):
    """``vlforge tiny FAMILY OUT_DIR [--seed N] [--untied]`` or ``vlforge tiny --list``."""

    unknown_label: ClassVar[str] = "option"
    family: Annotated[str, Arg()] = ""
    """Model family, e.g. qwen3_vl (see `vlforge tiny --list`)."""
    out_dir: Annotated[Path | None, Arg()] = None
    """Directory to write the checkpoint into."""
    seed: int = 0
    """Seed of the random initialisation."""
    untied: bool = False
    """Separate lm_head instead of tied embeddings."""
    list_families: Annotated[bool, Flag("--list")] = False
    """List the families and exit."""


def _check_request(request: TinyRequest) -> None:
    if request.list_families:
        return
    if not request.family or request.out_dir is None:
        raise VlforgeError("usage: vlforge tiny FAMILY OUT_DIR [--seed N] [--untied] (families: "
                           + ", ".join(families()) + ")")
    spec(request.family)
    _check_target(Path(request.out_dir).expanduser().absolute())


def _run_request(request: TinyRequest) -> list[str]:
    if request.list_families:
        return families()
    return [str(write_tiny(request.family, request.out_dir, seed=request.seed,
                           tie_word_embeddings=not request.untied))]


def _print_lines(request: TinyRequest, lines: list[str], console: Any) -> None:
    for line in lines:
        console.file.write(line + "\n")


JOB: Job[TinyRequest, list[str]] = Job(check=_check_request, run=_run_request, render=_print_lines,
                                      to_json=lambda lines: json.dumps(lines), exit_code=always_ok)
CLI = Cli(flags=TinyRequest, job=JOB, json=False)
