"""Build an offline wheelhouse: vlforge and every runtime requirement a torch host lacks, for that host's Python.

A GPU host often has torch with CUDA but no network. This script runs where pip can reach PyPI and writes
``dist/wheelhouse/``: vlforge's own wheel plus the wheels of every requirement (walked transitively from the
wheels' own metadata, markers evaluated for the target Python and platform) that the host does not already
satisfy. torch is never carried: the host's CUDA build stays.

What the host holds is read from ``--host FILE``: the output of ``python -m pip list --format=freeze`` run on the
host (works offline). A line ``name==version`` is checked against each requirement's specifier (a version that
does not satisfy it is carried anyway); a bare ``name`` means present at an unknown version and is trusted.
Without ``--host`` the host is taken to hold torch alone. transformers is carried at the version every family
needs (Qwen3.5 needs a newer one than vlforge's minimum) when the host's is older. A ``manifest.json`` beside the
wheels records what was carried, what was left to the host and why, and the total size; ``--max-mb`` fails the build when the total
exceeds it.

Install on the host (no network):
    python -m pip install --no-index --find-links wheelhouse/ vlforge

Run (here, for a Python 3.12 x86-64 host whose package list is in host.txt):
    .venv/bin/python scripts/wheelhouse.py --python-version 3.12 --host host.txt --max-mb 50
"""

from __future__ import annotations

import argparse
import email.parser
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                     "manylinux2014_x86_64", "manylinux1_x86_64")
ALWAYS_HOST = ("torch",)
"""Never carried: the host's own (CUDA) build is the reason for the wheelhouse."""


class WheelhouseError(RuntimeError):
    pass


def read_host(path: Path | None) -> dict[str, Version | None]:
    """``{canonical name: version or None}`` from a ``pip list --format=freeze`` file (torch alone without one)."""
    if path is None:
        return {"torch": None}
    host: dict[str, Version | None] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name, _, version = line.partition("==")
        if " @ " in name:  # "name @ file:///..." (a local install): present, version unknown
            name = name.split(" @ ", 1)[0]
        if not name.strip() or any(c in name for c in "<>=!~ "):
            raise WheelhouseError(f"{path}:{number}: expected 'name==version' or 'name', got {raw.strip()!r}")
        try:
            host[canonicalize_name(name.strip())] = Version(version.strip()) if version.strip() else None
        except ValueError as error:
            raise WheelhouseError(f"{path}:{number}: bad version {version.strip()!r}: {error}") from None
    if "torch" not in host:
        raise WheelhouseError(f"{path}: the host list has no torch; this wheelhouse is for hosts that have it")
    return host


def target_environment(python_version: str) -> dict[str, str]:
    """Marker environment of a CPython Linux x86-64 host of ``python_version`` (e.g. '3.12')."""
    env = dict(default_environment())
    major_minor = ".".join(python_version.split(".")[:2])
    env.update(python_version=major_minor, python_full_version=f"{major_minor}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix", implementation_name="cpython",
               platform_python_implementation="CPython")
    return env


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def applies(requirement: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**env, "extra": extra}) for extra in ({""} | extras))


def download(requirement: str, out: Path, python_version: str, platforms: tuple[str, ...]) -> Path:
    """One wheel for the target, without its dependencies; the path of the file pip saved."""
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                   "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
                   *[arg for platform in platforms for arg in ("--platform", platform)], "-d", scratch, requirement]
        proc = subprocess.run(command, capture_output=True, text=True)
        saved = sorted(Path(scratch).glob("*.whl"))
        if proc.returncode or len(saved) != 1:
            tail = "; ".join(line for line in proc.stderr.splitlines() if line.startswith("ERROR"))[-400:]
            raise WheelhouseError(f"no wheel of {requirement!r} for Python {python_version} on "
                                  f"{', '.join(platforms)}: {tail or proc.stderr[-400:]}")
        target = out / saved[0].name
        saved[0].replace(target)
        return target


def build_vlforge(out: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
                           "--no-deps", "-w", str(out), str(REPO)], capture_output=True, text=True)
    wheels = sorted(out.glob("vlforge-*.whl"))
    if proc.returncode or not wheels:
        raise WheelhouseError(f"building vlforge's wheel failed: {proc.stderr[-600:]}")
    return wheels[-1]


def every_family() -> tuple[str, ...]:
    """``transformers>=M`` where some family needs a newer transformers than vlforge's minimum
    (``Family.transformers_min``, e.g. Qwen3.5): the host then trains every family, as the GPU check does."""
    from vlforge.models.families import FAMILIES
    from vlforge.versions import parse

    newest = max((f.transformers_min for f in FAMILIES.values() if f.transformers_min), key=parse, default=None)
    return (f"transformers>={newest}",) if newest else ()


def build(out: Path, python_version: str, platforms: tuple[str, ...], host: dict[str, Version | None],
          extras: set[str], also: tuple[str, ...] = ()) -> dict:
    """Write the wheelhouse into ``out``; returns the manifest."""
    also = (*also, *every_family())
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.whl"):
        old.unlink()
    env = target_environment(python_version)
    root = build_vlforge(out)
    carried: dict[str, dict] = {"vlforge": {"file": root.name, "version": parse_wheel_filename(root.name)[1].public,
                                            "because": "the project itself"}}
    left: dict[str, str] = {}
    queue: list[tuple[Requirement, str]] = [(r, "vlforge") for r in wheel_requirements(root)
                                            if applies(r, env, extras)]
    queue += [(Requirement(text), "--also") for text in also]
    while queue:
        requirement, wanted_by = queue.pop(0)
        name = canonicalize_name(requirement.name)
        if name in carried:
            have = Version(carried[name]["version"])
            if not requirement.specifier.contains(have, prereleases=True):
                raise WheelhouseError(f"{wanted_by} needs {requirement}, but {name} {have} was already chosen")
            continue
        if name in ALWAYS_HOST:
            left.setdefault(name, "the host's own build is used, never carried")
            continue
        if name in host:
            version = host[name]
            if version is None:
                left.setdefault(name, "on the host (version not given: trusted)")
                continue
            if requirement.specifier.contains(version, prereleases=True):
                left.setdefault(name, f"on the host: {version} satisfies {requirement.specifier or 'any'}")
                continue
            because = f"the host's {version} does not satisfy {requirement.specifier} ({wanted_by})"
        else:
            because = f"not on the host; needed by {wanted_by}"
        spec = f"{requirement.name}{requirement.specifier}"
        wheel = download(spec, out, python_version, platforms)
        version = parse_wheel_filename(wheel.name)[1]
        carried[name] = {"file": wheel.name, "version": str(version), "because": because}
        left.pop(name, None)
        queue.extend((r, name) for r in wheel_requirements(wheel) if applies(r, env, set()))
    total = sum((out / entry["file"]).stat().st_size for entry in carried.values())
    manifest = {"python_version": python_version, "platforms": list(platforms), "extras": sorted(extras),
                "also": list(also),
                "carried": carried, "left_to_host": left, "total_bytes": total,
                "install": "python -m pip install --no-index --find-links wheelhouse/ vlforge"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist" / "wheelhouse")
    parser.add_argument("--python-version", default="3.12", help="the host's Python, e.g. 3.12 (default)")
    parser.add_argument("--platform", action="append", dest="platforms", metavar="TAG",
                        help="a wheel platform tag the host accepts; repeat for several "
                             f"(default: {', '.join(DEFAULT_PLATFORMS)})")
    parser.add_argument("--host", type=Path, default=None, metavar="FILE",
                        help="the host's `python -m pip list --format=freeze` (default: a host with torch alone)")
    parser.add_argument("--extras", default="", help="comma list of vlforge extras to carry too (e.g. lora)")
    parser.add_argument("--also", action="append", default=[], metavar="REQ",
                        help="another requirement to carry unless the host has it (e.g. pytest, for the GPU check)")
    parser.add_argument("--max-mb", type=float, default=None, help="fail when the wheels exceed this many MB")
    args = parser.parse_args(argv)
    try:
        if args.host is not None and not args.host.is_file():
            raise WheelhouseError(f"--host {args.host}: no such file (write it on the host with "
                                  "`python -m pip list --format=freeze > host.txt`)")
        host = read_host(args.host)
        extras = {e.strip() for e in args.extras.split(",") if e.strip()}
        also = tuple(args.also)
        for text in also:
            try:
                Requirement(text)
            except ValueError as error:
                raise WheelhouseError(f"--also {text!r}: not a requirement: {error}") from None
        manifest = build(args.out, args.python_version, tuple(args.platforms or DEFAULT_PLATFORMS), host, extras,
                         also)
    except WheelhouseError as error:
        print(f"wheelhouse: {error}", file=sys.stderr)
        return 2
    mb = manifest["total_bytes"] / 1e6
    for _, entry in sorted(manifest["carried"].items()):
        print(f"carried  {entry['file']}  ({entry['because']})")
    for name, why in sorted(manifest["left_to_host"].items()):
        print(f"host     {name}: {why}")
    print(f"{len(manifest['carried'])} wheels, {mb:.1f} MB in {args.out}")
    if args.max_mb is not None and mb > args.max_mb:
        print(f"wheelhouse: {mb:.1f} MB exceeds --max-mb {args.max_mb:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
