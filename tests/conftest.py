"""Shared fixtures: tiny checkpoints written once per test session into a temporary directory."""

from __future__ import annotations

import os
import shutil
import tempfile
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


def _work_unit(item: pytest.Item) -> str | None:
    """The xdist work unit ``item`` must share a worker with: ``same_worker(NAME)`` when marked (tests that use
    an earlier test's files), its module when it uses a module-scoped fixture (a training run, a torchrun
    launch: built once, not once per worker), else None (any worker)."""
    mark = item.get_closest_marker("same_worker")
    if mark is not None:
        return str(mark.args[0])
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is not None and any(defs[-1].scope in ("module", "package", "class")
                                    for defs in fixtures.name2fixturedefs.values()):
        return item.nodeid.split("::")[0]
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Work units for ``--dist loadgroup`` (before xdist reads the ``xdist_group`` marks), and the heaviest
    first: units holding more ``slow`` tests run before the rest, so the cheap tests fill the last minutes of
    both workers instead of one worker finishing a long launch alone (the Makefile passes
    ``--no-loadscope-reorder`` so this order is kept)."""
    units = {item.nodeid: _work_unit(item) for item in items}
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if units[item.nodeid] is not None:
                item.add_marker(pytest.mark.xdist_group(units[item.nodeid]))
    slow: dict[str, int] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            key = units[item.nodeid] or item.nodeid
            slow[key] = slow.get(key, 0) + 1
    items.sort(key=lambda item: -slow.get(units[item.nodeid] or item.nodeid, 0))  # stable


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
