"""The family registry: every record is true of transformers' classes and of its tiny checkpoint, and no other
module of src/ names a family (the house rule of docs/ARCHITECTURE.md, "Adding a family")."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from vlforge.models import tiny
from vlforge.models.families import FAMILIES, family, names, supports

SRC = Path(__file__).resolve().parents[2] / "src" / "vlforge"
ALLOWED = {"models/families.py", "models/tiny.py", "models/presets.py"}


def test_every_family_has_a_tiny_spec_and_the_lookups_agree():
    assert set(tiny.SPECS) == set(FAMILIES)
    assert names(deepstack=True) == tuple(f for f in FAMILIES if FAMILIES[f].deepstack)
    assert supports("qwen3_vl", "deepstack") and not supports("no_such_family", "deepstack")
    with pytest.raises(Exception, match="unknown model family 'qwen3-vl'; did you mean 'qwen3_vl'"):
        family("qwen3-vl")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_record_matches_transformers_and_the_tiny_checkpoint(name, tiny_checkpoint):
    import transformers
    from transformers import AutoConfig, AutoModelForImageTextToText

    record = family(name)
    module = importlib.import_module(record.modeling_module)
    assert hasattr(getattr(module, record.inner_model_class), "get_rope_index")
    path = tiny_checkpoint(name)
    config = AutoConfig.from_pretrained(path)
    assert type(config).__name__ == record.config_class and config.model_type == name
    model = AutoModelForImageTextToText.from_config(config)
    assert type(model).__name__ == record.model_class
    classes = {type(m).__name__ for m in model.modules()}
    assert {record.text_layer_class, record.vision_block_class} <= classes
    assert type(model.get_submodule(record.vision_tower)).__name__ in classes
    assert bool(getattr(model.get_submodule(record.vision_tower), "deepstack_visual_indexes", None)) == record.deepstack
    for cls in (record.processor_class, record.image_processor_class):
        assert hasattr(transformers, cls), cls
    processor = transformers.AutoProcessor.from_pretrained(path)
    assert type(processor).__name__ == record.processor_class
    assert type(processor.image_processor).__name__ == record.image_processor_class
    assert processor.tokenizer.convert_tokens_to_ids(record.media.image) != processor.tokenizer.unk_token_id


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are not docstrings."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_module_outside_the_registry_names_a_family():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED:
            continue
        for line, text in _literals(ast.parse(path.read_text(encoding="utf-8"))):
            if text in FAMILIES or any(text.startswith(f"{name}.") for name in FAMILIES):
                found.append(f"{rel}:{line}: {text!r}")
    assert not found, "family names outside models/families.py:\n" + "\n".join(found)
