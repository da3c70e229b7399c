"""Module and class names from configs resolve against the real transformers 5 module trees (issue 17)."""

from __future__ import annotations

import logging
import os
import subprocess

import pytest
import torch
from cfgkit import HERE, REPO
from guidekit import write_parquet_dataset

import warmstart
from vlforge.config.schema import TrainConfig
from vlforge.dist import init_distributed
from vlforge.errors import ConfigError
from vlforge.models.adapters import apply_lora, freeze
from vlforge.models.load import load
from vlforge.models.module_names import ALIASES, resolve_layer_classes, resolve_lora_targets, resolve_module
from vlforge.train.model_setup import layer_classes, prepare_model

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "glm4v", "glm4v_moe")
#: What LMMS Engine users write -> where transformers 5 keeps it, in every supported family.
WRITTEN = {
    "visual": "model.visual", "merger": "model.visual.merger", "language_model": "model.language_model",
    "lm_head": "lm_head", "model.visual": "model.visual", "visual.merger": "model.visual.merger",
    "vision_tower": "model.visual", "vision_model": "model.visual", "multi_modal_projector": "model.visual.merger",
    "llm": "model.language_model", "model.vision_tower.blocks": "model.visual.blocks",
    "model.layers": "model.language_model.layers", "model.embed_tokens": "model.language_model.embed_tokens",
    "model.layers.1.mlp": "model.language_model.layers.1.mlp",
}


@pytest.fixture(scope="module")
def models():
    cache: dict[str, torch.nn.Module] = {}

    def get(family: str) -> torch.nn.Module:
        if family not in cache:
            cache[family] = load(f"tiny:{family}", device="cpu").model
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_lmms_names_resolve_in_every_family(models, family):
    model = models(family)
    modules = dict(model.named_modules())
    for written, path in WRITTEN.items():
        assert resolve_module(model, written).paths == (path,), written
        assert path in modules
    how = {name: resolve_module(model, name).how for name in ("model.visual", "visual", "model.layers", "llm")}
    assert how == {"model.visual": "exact", "visual": "suffix", "model.layers": "moved", "llm": "alias"}


def test_every_alias_of_a_concept_lands_on_one_module(models):
    model = models("qwen2_5_vl")
    for concept in ALIASES:
        targets = {resolve_module(model, name).paths for name in concept.names}
        assert len(targets) == 1, (concept.label, targets)


def test_freeze_visual_freezes_exactly_the_tower(caplog):
    model = load("tiny:qwen3_vl", device="cpu").model  # its own copy: freeze changes it
    with caplog.at_level(logging.INFO, logger="vlforge"):
        count = freeze(model, ["visual", "model.layers.0"])
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    under = ("model.visual.", "model.language_model.layers.0.")
    expected = {n for n, _ in model.named_parameters() if n.startswith(under)}
    assert frozen == expected and count == sum(p.numel() for n, p in model.named_parameters() if n in expected)
    assert any(n.startswith("model.language_model.layers.1.") for n, p in model.named_parameters() if p.requires_grad)
    logged = [r.getMessage() for r in caplog.records]
    assert "model.freeze_modules: 'visual' -> model.visual (suffix)" in logged
    assert "model.freeze_modules: 'model.layers.0' -> model.language_model.layers.0 (moved)" in logged


def test_freezing_a_tied_head_says_the_embedding_freezes_too(caplog):
    model = load("tiny:qwen3_vl", device="cpu").model  # tied word embeddings
    assert model.lm_head.weight is model.model.language_model.embed_tokens.weight
    with caplog.at_level(logging.WARNING, logger="vlforge.train"):
        freeze(model, ["lm_head"])
    assert not model.model.language_model.embed_tokens.weight.requires_grad
    assert ("model.freeze_modules: 'lm_head' shares weights with model.language_model.embed_tokens.weight (tied); "
            "they are frozen too") in [r.getMessage() for r in caplog.records]


def test_unknown_name_lists_close_matches_on_one_line(models):
    model = models("qwen2_5_vl")
    with pytest.raises(ConfigError) as info:
        resolve_module(model, "visiual")
    message = str(info.value)
    assert message.startswith("model.freeze_modules: 'visiual' matches no module of Qwen2_5_VLForConditionalGeneration")
    assert "close matches: visual (= model.visual)" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"'vison_tower' matches no module .*vision_tower \(= model\.visual\)"):
        resolve_module(model, "vison_tower")


def test_ambiguous_name_lists_every_match(models):
    model = models("qwen3_vl")
    with pytest.raises(ConfigError) as info:
        resolve_module(model, "norm")
    message = str(info.value)
    assert "'norm' is ambiguous: it matches 4 modules by suffix" in message
    for path in ("model.visual.merger.norm", "model.visual.deepstack_merger_list.0.norm", "model.language_model.norm"):
        assert path in message
    with pytest.raises(ConfigError, match=r"'model\.norm' is ambiguous: it matches 4 modules by moved"):
        resolve_module(model, "model.norm")


def test_layer_classes_exact_renamed_or_refused(models, caplog):
    qwen3, qwen25 = models("qwen3_vl"), models("qwen2_5_vl")
    assert {c.__name__ for c in layer_classes(qwen3, ["Qwen3VLTextDecoderLayer"])} == {"Qwen3VLTextDecoderLayer"}
    assert {c.__name__ for c in layer_classes(qwen25, ["Qwen2_5_VLDecoderLayer"])} == {"Qwen2_5_VLDecoderLayer"}
    with caplog.at_level(logging.INFO, logger="vlforge"):
        renamed = resolve_layer_classes(qwen3, ["Qwen3VLDecoderLayer"])  # the text layer, before transformers 5
    assert renamed["Qwen3VLDecoderLayer"].__name__ == "Qwen3VLTextDecoderLayer"
    assert any("'Qwen3VLDecoderLayer' -> Qwen3VLTextDecoderLayer" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigError) as info:
        layer_classes(qwen25, ["Qwen2VLDecoderLayer"])  # another family's class
    message = str(info.value)
    assert message.startswith("fsdp.transformer_layer_cls_to_wrap: no module of class 'Qwen2VLDecoderLayer'")
    assert "close matches: Qwen2_5_VLDecoderLayer" in message
    assert "its layer classes: Qwen2_5_VLDecoderLayer, Qwen2_5_VLVisionBlock" in message


def test_lora_targets_keep_peft_suffixes_and_resolve_old_paths(models):
    pytest.importorskip("peft")
    model = load("tiny:qwen2_5_vl", device="cpu").model
    targets = resolve_lora_targets(model, ["q_proj", "model.layers.0.self_attn.v_proj"])
    assert targets == ["q_proj", "model.language_model.layers.0.self_attn.v_proj"]
    cfg = TrainConfig(data={"datasets": [{"path": "d.jsonl"}]},
                      model={"load_from_pretrained_path": "tiny:qwen2_5_vl",
                             "lora": {"r": 2, "target_modules": ["model.layers.0.self_attn.v_proj"]}})
    wrapped = apply_lora(model, cfg.model.lora)
    adapted = {n.split(".lora_")[0] for n, p in wrapped.named_parameters() if p.requires_grad}
    assert adapted == {"base_model.model.model.language_model.layers.0.self_attn.v_proj"}
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: 'qproj' matches no module"):
        resolve_lora_targets(model, ["qproj"])


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_lora_suggestion_adapts_modules_of_its_text_layers(models, family):
    """`vlforge plan` suggests LoRA on the family's record of targets: each one names a linear module of the text
    layers (Qwen3-VL-MoE's experts are fused parameters, not gate/up/down projections)."""
    from vlforge.models.families import FAMILIES as RECORDS

    model = models(family)
    targets = RECORDS[family].lora_targets
    for target in targets:
        found = [name for name, module in model.named_modules()
                 if name.endswith(f".{target}") and isinstance(module, torch.nn.Linear)]
        assert any(".language_model.layers." in name for name in found), (family, target)
    assert resolve_lora_targets(model, list(targets)) == list(targets)


def test_freezing_everything_is_refused():
    cfg = TrainConfig(data={"datasets": [{"path": "d.jsonl"}]},
                      model={"load_from_pretrained_path": "tiny:qwen2_vl", "freeze_modules": ["model", "lm_head"],
                             "token_audit": False, "patch": False})
    with pytest.raises(ConfigError, match=r"model\.freeze_modules \['model', 'lm_head'\]: every parameter .* is "
                                          r"frozen; nothing would train"):
        prepare_model(cfg, init_distributed())


@pytest.mark.parametrize(("override", "needles"), [
    ("model.freeze_modules=[visiual]", ("model.freeze_modules: 'visiual' matches no module", "visual (= model.visual)")),
    ("fsdp.transformer_layer_cls_to_wrap=[Qwen2VLDecoderLayer]",
     ("fsdp.transformer_layer_cls_to_wrap: no module of class 'Qwen2VLDecoderLayer'", "Qwen2_5_VLDecoderLayer")),
])
def test_cli_refuses_bad_names_with_one_line(tmp_path, override, needles):
    """The guide YAML as published, with a bad name given on the command line: exit 2, one error line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    config = HERE / "guide_configs" / "lmms_guide_qwen2_5_vl.yaml"
    proc = subprocess.run(
        [warmstart.python(), "-m", "vlforge.cli", "train", str(config), "model.load_from_pretrained_path=tiny:qwen2_5_vl",
         "processor.processor_name=tiny:qwen2_5_vl", f"data.datasets.0.path={write_parquet_dataset(tmp_path, 2)}",
         f"checkpointing.output_dir={tmp_path / 'out'}",
         "--no-token-audit", override], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
