"""Session fixtures of the token tests: the real Qwen3 tokenizer, its Qwen2.5-style variant, trained LMs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import qwen3_tokenizer_dir, write_without_added
from .lm_fixture import TrainedLM, train_tiny_lm


@pytest.fixture(scope="session")
def qwen3_dir() -> Path:
    return qwen3_tokenizer_dir()


@pytest.fixture(scope="session")
def qwen25_dir(tmp_path_factory: pytest.TempPathFactory, qwen3_dir: Path) -> Path:
    """Qwen3's tokenizer without the added tokens from id 151665 up (<tool_response> ... </think>)."""
    return write_without_added(qwen3_dir, tmp_path_factory.mktemp("qwen25-tok"), from_id=151665)


@pytest.fixture(scope="session")
def lm_untied(tmp_path_factory: pytest.TempPathFactory) -> TrainedLM:
    return train_tiny_lm(tmp_path_factory.mktemp("lm-untied"), tied=False, seed=0)


@pytest.fixture(scope="session")
def lm_tied(tmp_path_factory: pytest.TempPathFactory) -> TrainedLM:
    return train_tiny_lm(tmp_path_factory.mktemp("lm-tied"), tied=True, seed=0)


@pytest.fixture(scope="session")
def qwen3_tok(qwen3_dir: Path):
    from vlforge.vocab.tokenizer import load_tokenizer

    return load_tokenizer(qwen3_dir)
