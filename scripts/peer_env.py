#!/usr/bin/env python3
"""Build (or locate) LMMS Engine, pinned, in its own virtual environment under a cache directory.

vlforge compares itself with LMMS Engine (``benchmarks/parity.py``, ``tests/train/test_parity.py``).
The peer is installed from PyPI into a separate venv, never into vlforge's ``.venv``: it brings its
own torch (a CUDA build, ~5.5 GB), torchvision, transformers and deepspeed. Standard library only,
so any Python >= 3.10 can run it.

Default location: ``$VLFORGE_PEER_DIR`` if set, else ``$XDG_CACHE_HOME/vlforge/peers/lmms-engine-0.1.4``
(``~/.cache/...``). A finished build holds ``vlforge-peer.json`` (versions, build seconds); the
tests and the benchmark use the peer only when that file is there.

Example:
    python scripts/peer_env.py build          # ~5.5 GB, minutes (mostly I/O)
    python scripts/peer_env.py path           # prints the peer's python, exit 1 when not built
    python scripts/peer_env.py info           # the JSON record of the build
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

PACKAGE = "lmms-engine"
VERSION = "0.1.4"
MARKER = "vlforge-peer.json"
# what the record reports; pip resolves them from lmms-engine's own requirements
REPORTED = ("lmms-engine", "torch", "torchvision", "transformers", "deepspeed", "accelerate", "numpy")


def default_dir() -> Path:
    """Where the peer venv lives: ``$VLFORGE_PEER_DIR`` or the user cache directory."""
    if os.environ.get("VLFORGE_PEER_DIR"):
        return Path(os.environ["VLFORGE_PEER_DIR"]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vlforge" / "peers" / f"{PACKAGE}-{VERSION}"


def peer_python(root: Path | None = None) -> Path | None:
    """The peer venv's python when a build finished there, else None."""
    root = Path(root) if root else default_dir()
    python = root / "bin" / "python"
    return python if (root / MARKER).is_file() and python.exists() else None


def _versions(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *REPORTED], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def build(root: Path, base_python: str, force: bool = False) -> dict:
    """Create the venv and ``pip install lmms-engine==VERSION``; return the build record."""
    if peer_python(root) and not force:
        return json.loads((root / MARKER).read_text())
    if root.exists() and any(root.iterdir()) and not (root / "pyvenv.cfg").is_file():
        raise SystemExit(f"peer_env: {root} exists and is not a virtual environment; choose another --dir")
    (root / MARKER).unlink(missing_ok=True)
    start = time.monotonic()
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base_python, "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, f"{PACKAGE}=={VERSION}"], check=True)
    # the import check the tests rely on (CPU only: no GPU is needed to import or process data)
    subprocess.run([str(python), "-c", "import lmms_engine, torch, transformers"], check=True)
    record = {"package": PACKAGE, "version": VERSION, "python": str(python),
              "base_python": base_python, "build_seconds": round(time.monotonic() - start, 1),
              "venv_bytes": _du(root), "versions": _versions(python)}
    tmp = root / (MARKER + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, root / MARKER)
    return record


def _du(root: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                total += path.stat().st_size
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("build", "path", "info", "remove"))
    parser.add_argument("--dir", type=Path, default=None, help="venv directory (default: %(default)s)")
    parser.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                        help="interpreter that creates the venv (3.11 finds the torch wheels on this disk)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a finished build is there")
    args = parser.parse_args(argv)
    root = (args.dir or default_dir()).expanduser()
    if args.action == "build":
        print(json.dumps(build(root, args.python, args.force), indent=2))
        return 0
    python = peer_python(root)
    if args.action == "path":
        if python is None:
            print(f"peer_env: no finished build in {root} (run: python scripts/peer_env.py build)", file=sys.stderr)
            return 1
        print(python)
        return 0
    if args.action == "info":
        if python is None:
            print(f"peer_env: no finished build in {root}", file=sys.stderr)
            return 1
        print((root / MARKER).read_text(), end="")
        return 0
    if (root / "pyvenv.cfg").is_file():  # remove: only a directory that is a venv
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
