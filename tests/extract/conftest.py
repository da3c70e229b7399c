"""Fixtures for the extract tests: a tiny Qwen3-VL checkpoint and small image datasets written to tmp dirs."""

from __future__ import annotations

from pathlib import Path

import pytest
from extractkit import image_record, text_record, write_config, write_images, write_jsonl


@pytest.fixture(scope="session")
def qwen3_ckpt(tiny_checkpoint) -> Path:
    return tiny_checkpoint("qwen3_vl")


@pytest.fixture(scope="session")
def image_dataset(tmp_path_factory) -> Path:
    """16 image samples (shards of 2 with batch 2 -> 8 shards) plus one text-only sample: 17 lines."""
    folder = tmp_path_factory.mktemp("extract-images")
    names = write_images(folder, 16)
    records = [image_record(n, f"Picture {i}?") for i, n in enumerate(names)] + [text_record("Hello there.")]
    write_jsonl(folder / "train.jsonl", records)
    return write_config(folder, "train.jsonl")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread here and in subprocesses: on 2 cores shared with other jobs, two OpenMP threads
    make each small op ~100x slower (measured: tiny forward 5 ms vs 425 ms). Module scope, so the
    module-scoped caches are computed with the same thread count as the tests comparing against them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(before)
