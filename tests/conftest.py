"""Shared fixtures: tiny checkpoints written once per test run into a temporary directory, shared by the workers."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch

import warmstart

_SHARED = "VLFORGE_TEST_SESSION_CACHE"
"""Set by the main pytest process: its xdist workers inherit it and share one cache (presets are built under a
file lock, cached audits written atomically), so each tiny preset is built once per run, not once per worker."""
_WORKER = "PYTEST_XDIST_WORKER" in os.environ
_CACHE_DIR = os.environ.get(_SHARED) if _WORKER and os.environ.get(_SHARED) else \
    tempfile.mkdtemp(prefix="vlforge-test-cache-")


def pytest_configure(config: pytest.Config) -> None:
    """Tests never read or write the user's preset cache: ``tiny:FAMILY`` presets go to a session dir. Tests
    run offline, without progress bars. A process that runs tests starts its warm-start server
    (tests/warmstart.py) here, in the background: its subprocesses skip ~6 s of importing torch and transformers."""
    os.environ["VLFORGE_CACHE_DIR"] = _CACHE_DIR
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # as vlforge's CLI does; quieter captured output
    if not _WORKER:
        os.environ[_SHARED] = _CACHE_DIR
    _share_the_cores()
    runs_tests = _WORKER or not config.getoption("numprocesses", None)
    if runs_tests and os.environ.get(warmstart.SWITCH_VARIABLE, "1") != "0" and not config.option.collectonly:
        from vlforge.models.families import FAMILIES

        warmstart.start(sorted({name for family in FAMILIES.values() for name in (
            family.config_class, family.model_class, family.processor_class, family.image_processor_class,
            family.stock_video_processor)}))


def _share_the_cores() -> None:
    """An xdist worker computes with its share of the cores (2 workers on 2 cores: one thread each): two
    workers of 2 threads each on 2 cores ran a tiny model's forward and backward 45% slower than two of one
    thread (OpenMP threads waiting on each other across the oversubscribed cores). Only this process: its
    subprocesses keep torch's default, as a user's would (tests that train in a subprocess set
    ``OMP_NUM_THREADS=1`` themselves). A user's own ``OMP_NUM_THREADS`` wins."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if _WORKER and workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


def pytest_unconfigure(config: pytest.Config) -> None:
    warmstart.stop(Path(_CACHE_DIR) / f"warmstart-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json")
    if not _WORKER or os.environ.get(_SHARED) != _CACHE_DIR:  # the main process removes the shared one
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def pytest_terminal_summary(terminalreporter) -> None:
    """One line: how many subprocesses the warm start served, how many started cold and why (tests/warmstart.py)."""
    if _WORKER:
        return
    warmstart.stop(Path(_CACHE_DIR) / "warmstart-main.json")  # -n 0: this process ran the tests
    tallies = [json.loads(path.read_text()) for path in sorted(Path(_CACHE_DIR).glob("warmstart-*.json"))]
    if sum(t["served"] + t["cold"] for t in tallies):
        variables = sorted({name for tally in tallies for name in tally["variables"]})
        terminalreporter.write_line(
            f"warm start: {sum(t['served'] for t in tallies)} subprocesses served, {sum(t['cold'] for t in tallies)} "
            f"started cold" + (f" (their environment differs in {', '.join(variables)})" if variables else ""))


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


def pytest_collection_finish(session: pytest.Session) -> None:
    """The imported heap (torch, transformers, every test module) goes to the permanent generation: the
    collector's full passes during the tests then walk only what the tests made (measured: GC time of an
    in-process slice of the suite 11.1 -> 6.1 s). Objects made at import stay alive anyway. With triton loaded,
    the frozen heap would make its nanobind bindings report 'leaked' objects at exit: quieted as in warmstart."""
    import atexit
    import gc
    import sys

    gc.collect()
    gc.freeze()
    if "triton" in sys.modules:
        atexit.register(warmstart.quiet_frozen_nanobind)


_MODULE_DIRS: dict[str, set[Path]] = {}
"""Per test module: the directories of the base temp dir its module-scoped fixtures made (their training runs and
checkpoints, up to 0.8 GB each). Session fixtures' directories are never among them: they outlive every module."""


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef, request: pytest.FixtureRequest):
    if fixturedef.scope != "module":
        return (yield)
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    before = set(base.iterdir())
    try:
        return (yield)
    finally:
        _MODULE_DIRS.setdefault(request.node.nodeid, set()).update(set(base.iterdir()) - before)


@pytest.fixture(scope="module", autouse=True)
def _module_temp_dirs(request: pytest.FixtureRequest):
    """A module's fixtures' temp dirs are removed when its last test ends and none failed, as the
    ``tmp_path_retention_policy = "failed"`` does for a test's ``tmp_path``: the suite's disk peak is one module per
    worker, not the whole run's (4-5 GB)."""
    failed = request.session.testsfailed
    yield
    made = _MODULE_DIRS.pop(request.node.nodeid, set())
    if request.session.testsfailed == failed:
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _deterministic_cpu() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """Factory fixture: ``tiny_checkpoint("qwen3_vl", seed=0) -> Path`` of a written tiny checkpoint: the
    ``tiny:FAMILY@SEED`` preset of this run's shared cache (written once per run under a file lock, whichever
    xdist worker asks first; a run's ``tiny:`` presets and cached token audits are the same files)."""
    from vlforge.models.load import preset_path

    cache: dict[tuple[str, int], Path] = {}

    def make(family: str, seed: int = 0) -> Path:
        key = (family, seed)
        if key not in cache:
            with pytest.MonkeyPatch.context() as patch:  # the run's cache, even inside a test that moved it
                patch.setenv("VLFORGE_CACHE_DIR", _CACHE_DIR)
                cache[key] = preset_path(f"tiny:{family}@{seed}")
        return cache[key]

    return make
