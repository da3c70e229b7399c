"""vlforge.collector: the cyclic collector paused around bulk reads, and frozen when a CLI process exits."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

import vlforge.collector
from vlforge.collector import collector_paused


def test_the_module_example_holds():
    import doctest

    assert doctest.testmod(vlforge.collector, raise_on_error=True).attempted >= 1


def test_the_collector_comes_back_as_it_was_even_after_an_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the outer pause still holds afterwards
            pass
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()


def test_a_cli_process_freezes_its_heap_when_it_exits_and_only_then():
    """The hook registered before main's runs after it (atexit is last-in first-out): it sees the frozen heap."""
    code = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
        "from vlforge.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('frozen while running:', gc.get_freeze_count() > 0, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("frozen at exit: True")
    assert "frozen while running: False" in proc.stderr


def test_a_cli_process_that_loaded_triton_exits_without_nanobind_noise():
    """triton's nanobind bindings report every object still alive at the end; a frozen heap is never freed, so a
    CLI that imported it (torch does, whenever triton is installed) must leave stderr to the command itself."""
    pytest.importorskip("triton", reason="triton comes with liger-kernel in the dev extra")
    code = (
        "import triton\n"
        "from vlforge.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Usage" in proc.stdout, proc.stderr
    assert "nanobind" not in proc.stderr and "leaked" not in proc.stderr, proc.stderr[-2000:]
