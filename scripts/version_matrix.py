#!/usr/bin/env python3
"""The version matrix: vlforge's core suite from its built wheel, in fresh venvs, on the oldest and newest
transformers and torch it claims, and the one-line refusal of older ones.

For each point a fresh venv under the cache directory gets torch 2.13.0 (the local CPU build on this machine; the
torch points install theirs: CUDA builds, from this machine's package mirror or downloaded from PyPI), the point's
transformers and vlforge from a wheel built from this checkout (never editable, never the source tree), and runs
the core suite (patch, data, models, training on tiny models, plan) from a temporary copy of ``tests/`` and
``examples/``: no ``src/`` is on the path, and the script checks ``vlforge.__file__`` lies in the venv. Points:

- ``oldest``: transformers = vlforge's minimum (:data:`vlforge.versions.TRANSFORMERS_MIN`); also checks that a
  family needing a newer one (``Family.transformers_min``, e.g. Qwen3.5) is refused in one line;
- ``newest``: transformers 5.24.0 (what ``make test`` installs);
- ``torch_oldest``: torch = vlforge's minimum (:data:`vlforge.versions.TORCH_MIN`, a CUDA build from PyPI run on
  the CPU) with transformers 5.24.0: the core suite on the torch floor;
- ``torch_newest``: the newest torch this machine holds (:data:`TORCH_NEWEST`, a CUDA build from the local
  package mirror, run on the CPU) with transformers 5.24.0: the same core suite on a torch above make test's;
- ``below``: a transformers older than the minimum (vlforge installed with ``--no-deps``, as an environment pip
  does not manage would hold it): every entry point must print one line and exit 2, never a traceback;
- ``torch_below``: the same with a torch older than the minimum (:data:`TORCH_BELOW`) and transformers 5.24.0;
- ``offline``: the wheelhouse of a host holding torch alone (``scripts/wheelhouse.py`` without ``--host``) is
  installed with ``pip install --no-index`` into a fresh venv holding only torch, which then runs
  ``benchmarks/gpu_suite.py --size tiny`` (README, "GPU host without network").

Prints one JSON object per point as it finishes and, with ``--record``, writes them all to that file. Exit 1 when
a point failed. Standard library only (any Python >= 3.10 runs it); the venvs use ``--python`` (3.11 finds the
local torch wheels on this machine).

Default cache: ``$VLFORGE_MATRIX_DIR``, else ``$XDG_CACHE_HOME/vlforge/matrix`` (``~/.cache/...``).

Examples:
    python3 scripts/version_matrix.py --record benchmarks/records/version_matrix.json    # make matrix (15-45 min)
    python3 scripts/version_matrix.py --points below,offline                             # ~5 min
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH = "2.13.0"
TORCH_NEWEST = "2.14.1"
"""The newest torch on this machine's package mirror (pip takes it from disk; a CUDA build that runs on the CPU)."""
NEWEST = "5.24.0"
BELOW = "5.16.1"
"""A transformers just below the minimum, for the refusal point."""
TORCH_BELOW = "2.10.0"
"""A torch just below the minimum, for the torch refusal point (a CUDA build from PyPI)."""
TEST_DEPS = ("pytest>=8.0", "hypothesis>=6.100", "peft>=0.13", "accelerate>=1.0")
CORE_TESTS = (
    "tests/test_versions.py",
    "tests/patches",
    "tests/plan",
    "tests/models/test_models_tiny.py",
    "tests/models/test_frames_video.py",
    "tests/models/test_varlen.py",
    "tests/models/test_linear_attention.py",
    "tests/data/test_data_processing.py",
    "tests/data/test_data_packing.py",
    "tests/data/test_data_video.py",
    "tests/train/test_trainer_run.py",
    "tests/train/test_trainer_units.py",
    "tests/train/test_moe.py",
)
"""The core suite: patch, models, data, training on tiny models, plan (``-m 'not slow and not gpu'``)."""
COPIED = ("tests", "examples", "benchmarks", "pyproject.toml")
"""What the suite reads from a checkout besides the package (pytest's settings are pyproject's)."""


def _minimum(package: str = "transformers") -> str:
    """vlforge's minimum ``package`` (transformers or torch), read from the source: this script does not import
    vlforge."""
    text = (REPO / "src" / "vlforge" / "versions.py").read_text(encoding="utf-8")
    return re.search(rf'^{package.upper()}_MIN = "([\d.]+)"', text, re.M).group(1)


def _release(version: str) -> str:
    """``5.17`` -> ``5.17.0`` (the release pip installs for the minimum)."""
    return version + ".0" if version.count(".") == 1 else version


def default_dir() -> Path:
    if os.environ.get("VLFORGE_MATRIX_DIR"):
        return Path(os.environ["VLFORGE_MATRIX_DIR"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vlforge" / "matrix"


def _run(command: list[str], log: Path, *, cwd: Path | None = None, env: dict | None = None,
         timeout: float = 1800) -> subprocess.CompletedProcess:
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, timeout=timeout,
                              text=True)


def _fresh_venv(root: Path, python: str) -> Path:
    if root.exists():
        if not (root / "pyvenv.cfg").is_file():
            raise SystemExit(f"version_matrix: {root} exists and is not a venv; choose another --dir")
        shutil.rmtree(root)
    subprocess.run([python, "-m", "venv", str(root)], check=True)
    return root / "bin" / "python"


def _pip(python: Path, *args: str) -> list[str]:
    return [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", *args]


def _clean_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(VLFORGE_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1")
    return env


def build_wheel(out: Path) -> Path:
    """vlforge's wheel from this checkout, and the snapshot of the tests that go with it."""
    _snapshot(out.parent / "checkout")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("vlforge-*.whl"):
        old.unlink()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
                    "-w", str(out), str(REPO)], check=True)
    return next(out.glob("vlforge-*.whl"))


def _installed_versions(python: Path, env: dict) -> dict:
    code = ("import importlib.metadata as m, json, sys, vlforge\n"
            "print(json.dumps({'python': sys.version.split()[0], 'vlforge_file': vlforge.__file__,\n"
            "  **{n: m.version(n) for n in ('torch', 'transformers', 'vlforge')}}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir())
    if done.returncode:
        raise RuntimeError(f"import vlforge failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


_SNAPSHOT: Path | None = None
"""tests/, examples/, benchmarks/ as they were when the wheel was built (the checkout may change meanwhile)."""


def _snapshot(dest: Path) -> Path:
    global _SNAPSHOT
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, dest / name)
    _SNAPSHOT = dest
    return dest


def _checkout_copy(dest: Path) -> Path:
    """A fresh copy of the snapshot taken with the wheel (tests, examples, benchmarks, pyproject.toml; no src/)."""
    if _SNAPSHOT is None:
        raise RuntimeError("no snapshot: build_wheel first")
    shutil.copytree(_SNAPSHOT, dest)
    return dest


def _junit_counts(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = []
    for case in suite.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    counts["failed_tests"] = failed
    return counts


def _refusals(python: Path, env: dict, cwd: Path, checks: list[tuple[list[str], str]], log: Path) -> list[dict]:
    """Each command must exit 2 with stderr one ``error:`` line matching its pattern (no traceback)."""
    out = []
    for command, pattern in checks:
        done = subprocess.run([str(python), *command], capture_output=True, text=True, env=env, cwd=cwd,
                              timeout=600)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("error:")]
        ok = done.returncode == 2 and len(errors) == 1 and re.search(pattern, errors[0]) is not None \
            and "Traceback" not in done.stderr
        with log.open("a", encoding="utf-8") as handle:
            handle.write(f"$ {' '.join(command)}\nrc={done.returncode}\n{done.stderr}\n")
        out.append({"command": " ".join(command[2:] if command[:2] == ["-m", "vlforge.cli"] else command),
                    "rc": done.returncode, "line": errors[0] if errors else lines[-1:] or "", "ok": ok})
    return out


def suite_point(name: str, transformers: str, work: Path, wheel: Path, python: str, pytest_args: list[str],
                torch: str = TORCH) -> dict:
    started = time.monotonic()
    root = work / f"venv-{name}"
    log = work / f"{name}.log"
    log.unlink(missing_ok=True)
    venv = _fresh_venv(root, python)
    env = _clean_env(work / f"cache-{name}")
    record: dict = {"point": name, "date": time.strftime("%Y-%m-%d %H:%M"), "transformers_wanted": transformers,
                    "torch_wanted": torch}
    steps = [_pip(venv, "--upgrade", "pip"),
             _pip(venv, f"torch=={torch}", f"transformers=={transformers}", str(wheel), *TEST_DEPS)]
    for command in steps:
        if _run(command, log, env=env).returncode:
            return {**record, "ok": False, "error": f"install failed (see {log})",
                    "seconds": round(time.monotonic() - started, 1)}
    record["install_seconds"] = round(time.monotonic() - started, 1)
    record["versions"] = _installed_versions(venv, env)
    record["vlforge_from_wheel"] = record["versions"]["vlforge_file"].startswith(str(root))
    with tempfile.TemporaryDirectory(prefix=f"vlforge-matrix-{name}-") as scratch:
        checkout = _checkout_copy(Path(scratch) / "checkout")
        junit = Path(scratch) / "junit.xml"
        begun = time.monotonic()
        command = [str(venv), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu",
                   f"--junitxml={junit}", *pytest_args, *CORE_TESTS]
        rc = _run(command, log, cwd=checkout, env=env, timeout=3600).returncode
        record["pytest"] = {"rc": rc, "seconds": round(time.monotonic() - begun, 1),
                            **(_junit_counts(junit) if junit.is_file() else {"error": "no junit report"})}
        refusals = []
        newer = _family_minimums(venv, env)
        for family, minimum in sorted(newer.items()):
            if _older(transformers, minimum):
                refusals.append((["-m", "vlforge.cli", "tiny", family, str(Path(scratch) / family)],
                                 rf"\({family}\) needs transformers >= {re.escape(minimum)}"))
        record["refusals"] = _refusals(venv, env, checkout, refusals, log)
    record["ok"] = (record["vlforge_from_wheel"] and record["pytest"]["rc"] == 0
                    and all(r["ok"] for r in record["refusals"]))
    record["seconds"] = round(time.monotonic() - started, 1)
    shutil.rmtree(work / f"cache-{name}", ignore_errors=True)
    return record


def _family_minimums(python: Path, env: dict) -> dict[str, str]:
    """``{family: transformers_min}`` of the records that need a newer transformers, from the installed vlforge."""
    code = ("import json; from vlforge.models.families import FAMILIES\n"
            "print(json.dumps({n: f.transformers_min for n, f in FAMILIES.items() if f.transformers_min}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, check=True,
                          cwd=tempfile.gettempdir())
    return json.loads(done.stdout)


def _older(version: str, minimum: str) -> bool:
    def parse(text: str) -> tuple[int, ...]:
        return tuple(int(p) for p in re.match(r"(\d+(?:\.\d+)*)", text).group(1).split("."))
    return parse(version) < parse(minimum)


def below_point(name: str, package: str, work: Path, wheel: Path, python: str, *, torch: str = TORCH,
                transformers: str = NEWEST) -> dict:
    """An environment whose ``package`` (transformers or torch) is older than supported: one line and exit 2 from
    every entry point."""
    started = time.monotonic()
    root, log = work / f"venv-{name}", work / f"{name}.log"
    log.unlink(missing_ok=True)
    venv = _fresh_venv(root, python)
    env = _clean_env(work / f"cache-{name}")
    record: dict = {"point": name, "date": time.strftime("%Y-%m-%d %H:%M"), "transformers_wanted": transformers,
                    "torch_wanted": torch}
    # pip refuses the wheel beside an older package: its other requirements first, then the wheel alone
    steps = [_pip(venv, "--upgrade", "pip"),
             _pip(venv, f"torch=={torch}", f"transformers=={transformers}", *_wheel_requirements(wheel)),
             _pip(venv, "--no-deps", str(wheel))]
    for command in steps:
        if _run(command, log, env=env).returncode:
            return {**record, "ok": False, "error": f"install failed (see {log})"}
    record["versions"] = _installed_versions(venv, env)
    with tempfile.TemporaryDirectory(prefix=f"vlforge-matrix-{name}-") as scratch:
        checkout = _checkout_copy(Path(scratch) / "checkout")
        minimum, installed = re.escape(_minimum(package)), re.escape(record["versions"][package])
        line = rf"vlforge needs {package} >= {minimum}, this environment has {package} {installed}: " \
               rf"pip install '{package}>={minimum}'$"
        checks = [(["-m", "vlforge.cli", "--help"], line), (["-m", "vlforge.cli", "demo"], line),
                  (["-m", "vlforge.cli", "plan", "examples/qwen3_vl_tiny.yaml"], line),
                  (["-m", "vlforge.train", "examples/qwen3_vl_tiny.yaml"], line)]
        record["refusals"] = _refusals(venv, env, checkout, checks, log)
    record["ok"] = all(r["ok"] for r in record["refusals"])
    record["seconds"] = round(time.monotonic() - started, 1)
    return record


def _wheel_requirements(wheel: Path) -> list[str]:
    """vlforge's requirements other than torch and transformers, from the wheel's METADATA."""
    import email.parser
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))
    out = []
    for line in metadata.get_all("Requires-Dist") or []:
        if "extra ==" in line:
            continue
        if re.match(r"(torch|transformers)\b", line):
            continue
        out.append(line.split(";")[0].strip())
    return out


def offline_point(work: Path, python: str, max_mb: float) -> dict:
    """D5: a venv holding only torch installs the torch-alone wheelhouse with --no-index and runs the GPU suite."""
    started = time.monotonic()
    root, log = work / "venv-offline", work / "offline.log"
    log.unlink(missing_ok=True)
    house = work / "wheelhouse"
    shutil.rmtree(house, ignore_errors=True)
    record: dict = {"point": "offline", "date": time.strftime("%Y-%m-%d %H:%M")}
    py_version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    builder = REPO / ".venv" / "bin" / "python"  # scripts/wheelhouse.py reads vlforge's family records (make install)
    if _run([str(builder if builder.exists() else sys.executable), str(REPO / "scripts" / "wheelhouse.py"), "--out", str(house), "--python-version",
             py_version, "--max-mb", str(max_mb)], log).returncode:
        return {**record, "ok": False, "error": f"wheelhouse build failed (see {log})"}
    manifest = json.loads((house / "manifest.json").read_text())
    record["wheelhouse"] = {"python_version": py_version, "wheels": len(manifest["carried"]),
                            "megabytes": round(manifest["total_bytes"] / 1e6, 1),
                            "transformers": manifest["carried"].get("transformers", {}).get("version")}
    venv = _fresh_venv(root, python)
    env = _clean_env(work / "cache-offline")
    if _run(_pip(venv, f"torch=={TORCH}"), log, env=env).returncode:
        return {**record, "ok": False, "error": f"installing torch failed (see {log})"}
    begun = time.monotonic()
    offline = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}
    if _run(_pip(venv, "--no-index", "--find-links", str(house), "vlforge"), log, env=offline).returncode:
        return {**record, "ok": False, "error": f"offline install failed (see {log})"}
    record["offline_install_seconds"] = round(time.monotonic() - begun, 1)
    record["versions"] = _installed_versions(venv, env)
    record["vlforge_from_wheel"] = record["versions"]["vlforge_file"].startswith(str(root))
    with tempfile.TemporaryDirectory(prefix="vlforge-matrix-offline-") as scratch:
        checkout = _checkout_copy(Path(scratch) / "checkout")
        begun = time.monotonic()
        done = subprocess.run([str(venv), "benchmarks/gpu_suite.py", "--size", "tiny"], capture_output=True,
                              text=True, cwd=checkout, env=env, timeout=1200)
        with log.open("a", encoding="utf-8") as handle:
            handle.write(f"$ gpu_suite.py --size tiny\nrc={done.returncode}\n{done.stderr}\n")
        try:
            suite = json.loads(done.stdout)
        except json.JSONDecodeError:
            suite = None
        record["gpu_suite"] = {"rc": done.returncode, "seconds": round(time.monotonic() - begun, 1),
                               "json": suite is not None,
                               "sections": sorted(suite) if isinstance(suite, dict) else None}
    record["ok"] = record["vlforge_from_wheel"] and done.returncode == 0 and suite is not None
    record["seconds"] = round(time.monotonic() - started, 1)
    shutil.rmtree(work / "cache-offline", ignore_errors=True)
    return record


POINTS = ("oldest", "newest", "torch_oldest", "torch_newest", "below", "torch_below", "offline")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", default=",".join(POINTS), help=f"comma list from {', '.join(POINTS)} (default: all)")
    parser.add_argument("--dir", type=Path, default=None, help="cache directory for the venvs (default: %(default)s)")
    parser.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                        help="interpreter that creates the venvs (3.11 finds the local torch wheels here)")
    parser.add_argument("--record", type=Path, default=None, help="write the points' JSON here")
    parser.add_argument("--max-mb", type=float, default=200,
                        help="wheelhouse size limit of the offline point (a host with torch alone lacks everything)")
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments, e.g. '-x' or '-k video'")
    args = parser.parse_args(argv)
    points = [p.strip() for p in args.points.split(",") if p.strip()]
    unknown = set(points) - set(POINTS)
    if unknown:
        parser.error(f"unknown points: {', '.join(sorted(unknown))}")
    work = (args.dir or default_dir()).expanduser()
    work.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(work / "wheel")
    results = []
    for point in points:
        if point == "oldest":
            result = suite_point("oldest", _release(_minimum()), work, wheel, args.python,
                                 args.pytest_args.split())
        elif point == "newest":
            result = suite_point("newest", NEWEST, work, wheel, args.python, args.pytest_args.split())
        elif point == "torch_oldest":
            result = suite_point("torch_oldest", NEWEST, work, wheel, args.python, args.pytest_args.split(),
                                 torch=_release(_minimum("torch")))
        elif point == "torch_newest":
            result = suite_point("torch_newest", NEWEST, work, wheel, args.python, args.pytest_args.split(),
                                 torch=TORCH_NEWEST)
        elif point == "below":
            result = below_point("below", "transformers", work, wheel, args.python, transformers=BELOW)
        elif point == "torch_below":
            result = below_point("torch_below", "torch", work, wheel, args.python, torch=TORCH_BELOW)
        else:
            result = offline_point(work, args.python, args.max_mb)
        results.append(result)
        print(json.dumps(result), flush=True)
    if args.record is not None:  # the points run replace their namesakes in an existing record
        kept = []
        if args.record.is_file():
            ran = {r["point"] for r in results}
            kept = [r for r in json.loads(args.record.read_text())["points"] if r["point"] not in ran]
        merged = sorted([*kept, *results], key=lambda r: POINTS.index(r["point"]))
        record = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU", "default_torch": TORCH,
                  "command": "make matrix", "date": time.strftime("%Y-%m-%d"), "points": merged}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
