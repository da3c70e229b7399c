"""Shared fixtures: tiny checkpoints written once per test session into a temporary directory."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

_SHARED = "VLFORGE_TEST_SESSION_CACHE"
"""Set by the main pytest process: its xdist workers inherit it and share one cache (presets are built under a
file lock, cached audits written atomically), so each tiny preset is built once per run, not once per worker."""
_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_CACHE_DIR = os.environ.get(_SHARED) if _WORKER and os.environ.get(_SHARED) else \
    tempfile.mkdtemp(prefix="vlforge-test-cache-")


def pytest_configure(config: pytest.Config) -> None:
    """Tests never read or write the user's preset cache: ``tiny:FAMILY`` presets go to a session dir."""
    os.environ["VLFORGE_CACHE_DIR"] = _CACHE_DIR
    if not _WORKER:
        os.environ[_SHARED] = _CACHE_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _WORKER or os.environ.get(_SHARED) != _CACHE_DIR:  # the main process removes the shared one
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def _family_refused_here(error: BaseException) -> bool:
    """A family needing a newer transformers than installed (``Family.transformers_min``) refused a test's model:
    on the matrix's older transformers (``make matrix``) such tests are skipped with that line; never on one
    that satisfies every family, where the refusal would be a bug."""
    from vlforge import versions
    from vlforge.models.families import FAMILIES

    newest = max((versions.parse(f.transformers_min) for f in FAMILIES.values() if f.transformers_min), default=())
    return isinstance(error, versions.VersionError) and \
        versions.parse(versions.installed("transformers") or "0") < newest


def _skip_refused_families():
    """Hook wrapper body: a test a family refused here (see :func:`_family_refused_here`) is skipped with that line."""
    try:
        return (yield)
    except Exception as error:
        if _family_refused_here(error):
            pytest.skip(str(error))
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _skip_refused_families())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _skip_refused_families())


def _test_file(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with more ``slow`` tests first (stable within a file). The Makefile runs ``--dist loadfile
    --no-loadscope-reorder``: a file stays on one xdist worker (its module fixtures - a training run, a torchrun
    launch - are built once; a docs page's blocks see the files earlier blocks wrote), files start in this
    order, and the cheap ones fill the last minutes of both workers."""
    slow = Counter(_test_file(item) for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[_test_file(item)])


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """Factory fixture: ``tiny_checkpoint("qwen3_vl", seed=0) -> Path`` of a written tiny checkpoint."""
    from vlforge.models.tiny import write_tiny

    cache: dict[tuple[str, int], Path] = {}

    def make(family: str, seed: int = 0) -> Path:
        key = (family, seed)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"tiny-{family}-{seed}")
            cache[key] = write_tiny(family, out, seed=seed)
        return cache[key]

    return make
