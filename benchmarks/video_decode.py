"""Seek vs sequential decode of the data pipeline's sampled frames from a long generated video.

``measure()`` writes (once per parameter set, cached in the temp dir) a ``minutes``-long H.264 clip at
``fps`` with a keyframe every ``gop`` frames (libx264 defaults: preset medium, ``bframes`` B-frames with
b-pyramid; ``bframes=3`` is x264's default), samples it with the data pipeline's own
``sample_frame_indices`` at ``sample_fps`` (``max_frames`` high enough to keep them all) and times
:func:`vlforge.media.decode.read_video` with ``method="seek"`` (skipping non-reference frames, the
default), ``method="seek", skip_nonref=False`` and ``method="sequential"`` in one run. All three must
return the same frames (checked). An exact frame needs every reference frame from its keyframe on, so
``frames_decoded_seek / frames_kept`` (frames decoded per kept frame) bounds the speedup: at most
``frames_total / frames_decoded_seek`` plus what the decoder saves on the frames it drops.

With ``--peers`` each row also runs the readers users of Qwen's recipes and LMMS Engine have:
qwen-vl-utils' ``decord``, ``torchcodec`` and ``torchvision`` backends (``vision_process``'s own reader
functions, what ``fetch_video`` calls before it resizes; ``benchmarks/peers/qvu_video.py``), in the
qwen-vl-utils peer venv (``python3 scripts/peer_env.py build --peer qwen-vl-utils``) through a subprocess, so
nothing enters vlforge's venv. They get the same clip and the same sampling (``fps`` = the row's sample fps,
``max_frames`` as above: qwen-vl-utils' ``smart_nframes`` is the rule ``sample_frame_indices`` follows). Per
backend: best-of-``repeat`` seconds (measured inside the peer process, import and start-up excluded, as
vlforge's), frames decoded per kept frame (counted by ``benchmarks/peers/count_frames.c``, preloaded into the
peer process: it counts the frames FFmpeg's ``avcodec_receive_frame`` hands out, which is exactly
``DecodedVideo.frames_decoded`` for vlforge's own reads - null when no C compiler is there), whether its
indices and frame count equal vlforge's, and whether its frames (RGB uint8, before any resize) are
identical to vlforge's frames at the backend's own indices (decoded by vlforge for that comparison, so a
sampling difference is reported apart from a decoding one). A backend that is missing, does not load or
fails on the clip is a row entry with the reason; without the peer venv every backend is skipped with
the build command.

Run: ``python benchmarks/video_decode.py --minutes 20 --fps 30 --sample-fps 1 --gop 250``;
``--sweep`` prints one JSON row per setting (GOP 250/60/30, 1 and 0.1 fps, with and without B-frames,
64x48 and 320x240) from one run; ``--sweep --peers`` adds the peer readers and prints one object
``{"schema", "machine", "rows"}`` (the machine: CPU, load averages before each row and after, UTC times,
versions of PyAV/FFmpeg and of the peer venv).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vlforge.data.video import sample_frame_indices
from vlforge.media import decode

HERE = Path(__file__).resolve().parent
PEER_SCRIPT = HERE / "peers" / "qvu_video.py"
COUNTER_SOURCE = HERE / "peers" / "count_frames.c"
PEER = "qwen-vl-utils"
PEER_BACKENDS = ("decord", "torchcodec", "torchvision")
"""qwen-vl-utils' video readers (``vision_process.VIDEO_READER_BACKENDS``)."""
SCHEMA = "vlforge.video_decode_peers/1"

METHODS = {"seek": {"method": "seek"}, "seek_no_skip": {"method": "seek", "skip_nonref": False},
           "sequential": {"method": "sequential"}}


def _base(width: int, height: int) -> np.ndarray:
    """A smooth random picture (bilinear upsampling of an 8x coarser grid), wider than the frame."""
    rng = np.random.default_rng(0)
    coarse = rng.uniform(0, 255, (height // 8 + 2, (2 * width) // 8 + 2, 3))
    ys = np.linspace(0, coarse.shape[0] - 1.001, height)
    xs = np.linspace(0, coarse.shape[1] - 1.001, 2 * width)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    rows = coarse[y0] * (1 - fy) + coarse[y0 + 1] * fy
    return rows[:, x0] * (1 - fx) + rows[:, x0 + 1] * fx


def write_clip(path: Path, *, frames: int, fps: float, gop: int, size: tuple[int, int], bframes: int = 3) -> Path:
    """An H.264 clip (x264 preset medium, fixed GOP) of a picture panning 1 px a frame with light noise."""
    if path.exists():
        return path
    width, height = size
    part = path.with_suffix(".part.mp4")
    base = _base(width, height)
    rng = np.random.default_rng(1)
    with av.open(str(part), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001),
                                options={"preset": "medium", "g": str(gop), "keyint_min": str(gop),
                                         "sc_threshold": "0", "bf": str(bframes)})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            start = i % width
            pixels = base[:, start:start + width] + rng.normal(0, 2, (height, width, 1))
            frame = av.VideoFrame.from_ndarray(np.clip(pixels, 0, 255).astype(np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    part.rename(path)
    return path


def measure(minutes: float = 20, fps: float = 30, sample_fps: float = 1, size: tuple[int, int] = (64, 48),
            gop: int = 250, bframes: int = 3, cache_dir: str | Path | None = None, repeat: int = 3,
            peers: bool = False, peer_python: Path | None = None) -> dict:
    """Best-of-``repeat`` seconds to decode the sampled frames by seeking (with and without skipping
    non-reference frames) and sequentially, and the speedups over sequential; with ``peers``, qwen-vl-utils'
    readers on the same clip (:func:`measure_peers`; ``peer_python`` defaults to the built peer venv's)."""
    frames = round(minutes * 60 * fps)
    folder = Path(cache_dir or Path(tempfile.gettempdir()) / "vlforge-bench-video")
    folder.mkdir(parents=True, exist_ok=True)
    name = f"clip_{frames}f_{fps:g}fps_g{gop}_bf{bframes}_{size[0]}x{size[1]}_medium.mp4"
    started = time.perf_counter()
    path = write_clip(folder / name, frames=frames, fps=fps, gop=gop, size=size, bframes=bframes)
    generate_seconds = time.perf_counter() - started
    wanted = round(minutes * 60 * sample_fps)

    def pick(total: int, rate: float) -> list[int]:
        return sample_frame_indices(total, rate, fps=sample_fps, max_frames=wanted + 2)

    timings = dict.fromkeys(METHODS, float("inf"))
    results = {}
    for _ in range(repeat):  # alternate, keep each method's best (the machine is shared)
        for key, kwargs in METHODS.items():
            started = time.perf_counter()
            results[key] = decode.read_video(path, pick, **kwargs)
            timings[key] = min(timings[key], time.perf_counter() - started)
    seq = results["sequential"]
    for key in ("seek", "seek_no_skip"):
        got = results[key]
        if got.method != "seek" or got.indices != seq.indices or not all(
                np.array_equal(a, b) for a, b in zip(got.frames, seq.frames, strict=True)):
            raise AssertionError(f"{key} and sequential decode returned different frames")
    kept = len(seq.indices)
    row = {
        "seek_seconds": round(timings["seek"], 3),
        "seek_no_skip_seconds": round(timings["seek_no_skip"], 3),
        "sequential_seconds": round(timings["sequential"], 3),
        "seek_speedup": round(timings["sequential"] / timings["seek"], 2),
        "seek_no_skip_speedup": round(timings["sequential"] / timings["seek_no_skip"], 2),
        "frames_kept": kept,
        "frames_total": seq.total_frames,
        "frames_decoded_seek": results["seek"].frames_decoded,
        "frames_decoded_seek_no_skip": results["seek_no_skip"].frames_decoded,
        "frames_decoded_sequential": seq.frames_decoded,
        "decoded_per_kept_seek": round(results["seek"].frames_decoded / kept, 1),
        "gop": gop,
        "bframes": bframes,
        "fps": fps,
        "sample_fps": sample_fps,
        "minutes": minutes,
        "size": list(size),
        "generate_seconds": round(generate_seconds, 2),
    }
    if peers:
        row.update(measure_peers(path, sample_fps, wanted + 2, results["seek"], timings["seek"], repeat=repeat,
                                 python=peer_python if peer_python is not None else find_peer_python(),
                                 cache_dir=folder))
    return row


def find_peer_python() -> Path | None:
    """The qwen-vl-utils peer venv's python (``scripts/peer_env.py``'s location), or None when not built."""
    sys.path.insert(0, str(HERE.parent / "scripts"))
    try:
        import peer_env
    finally:
        sys.path.pop(0)
    return peer_env.peer_python(peer=PEER)


def frame_counter(cache_dir: Path) -> tuple[Path | None, str]:
    """``count_frames.c`` built into ``cache_dir`` (once per source), or None and why not."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler to build benchmarks/peers/count_frames.c"
    source = COUNTER_SOURCE.read_bytes()
    library = cache_dir / f"libcount_frames_{hashlib.sha256(source).hexdigest()[:12]}.so"
    if not library.exists():
        part = library.with_suffix(".part.so")
        done = subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(part), str(COUNTER_SOURCE), "-ldl",
                               "-lpthread"], capture_output=True, text=True)
        if done.returncode:
            return None, f"count_frames.c did not build: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
        part.rename(library)
    return library, ""


def _skipped(reason: str, backends: tuple[str, ...]) -> dict:
    return {"peers": {name: {"skipped": reason} for name in backends}, "fastest_peer": None,
            "vlforge_vs_fastest_peer": None, "vlforge_at_least_as_fast": None}


def measure_peers(path: Path, sample_fps: float, max_frames: int, ours: decode.DecodedVideo, our_seconds: float,
                  *, repeat: int = 3, python: Path | None = None, cache_dir: Path | None = None,
                  backends: tuple[str, ...] = PEER_BACKENDS, timeout: float = 900) -> dict:
    """qwen-vl-utils' readers on ``path`` in the peer venv ``python``: ``{"peers": {backend: entry},
    "fastest_peer", "vlforge_vs_fastest_peer" (the fastest peer's seconds / vlforge's seek seconds: >= 1 means
    vlforge is at least as fast), "vlforge_at_least_as_fast"}``. An entry is ``{"skipped": reason}`` when the
    venv or the backend is missing, ``{"error": ...}`` when the backend fails on the clip, else its figures."""
    if python is None:
        return _skipped(f"no {PEER} peer venv (python3 scripts/peer_env.py build --peer {PEER})", backends)
    folder = Path(cache_dir or tempfile.gettempdir())
    counter, why_not_counted = frame_counter(folder)
    env = dict(os.environ)
    if counter is not None:
        env["LD_PRELOAD"] = " ".join(filter(None, [str(counter), env.get("LD_PRELOAD", "")]))
    with tempfile.TemporaryDirectory(dir=folder) as out:
        job = {"clip": str(path), "fps": sample_fps, "max_frames": max_frames, "backends": list(backends),
               "repeat": repeat, "out": out}
        try:
            done = subprocess.run([str(python), str(PEER_SCRIPT), json.dumps(job)], capture_output=True, text=True,
                                  env=env, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _skipped(f"peer process failed: {type(exc).__name__}: {exc}", backends)
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return _skipped(f"peer process exited {done.returncode}: {tail}", backends)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        entries = {name: _compare(path, report[name], ours, why_not_counted) for name in backends}
    timed = {name: e["seconds"] for name, e in entries.items() if "seconds" in e}
    if not timed:
        return {"peers": entries, "fastest_peer": None, "vlforge_vs_fastest_peer": None,
                "vlforge_at_least_as_fast": None}
    fastest = min(timed, key=timed.get)
    return {"peers": entries, "fastest_peer": fastest,
            "vlforge_vs_fastest_peer": round(timed[fastest] / our_seconds, 2),
            "vlforge_at_least_as_fast": our_seconds <= timed[fastest]}


def _compare(path: Path, got: dict, ours: decode.DecodedVideo, why_not_counted: str) -> dict:
    """One backend's entry: its figures and the exactness checks against vlforge's reader."""
    if not got.get("available", False):
        return {"skipped": got.get("reason", "not available")}
    if "error" in got:
        return {"error": got["error"]}
    frames = np.load(got["frames"])
    indices = got["indices"]
    kept = len(indices)
    # vlforge's frames at the backend's own indices (its sampling may differ): exact by construction
    try:
        ours_at = decode.read_video(path, lambda total, rate: list(indices)) if indices else None
    except (*decode.DECODE_ERRORS, IndexError) as exc:
        ours_at, entry_note = None, f"vlforge cannot read the backend's indices: {exc}"
    else:
        entry_note = ""
    entry = {
        "seconds": round(got["seconds"], 3),
        "frames_kept": kept,
        "frames_decoded": got["frames_decoded"],
        "decoded_per_kept": round(got["frames_decoded"] / kept, 1) if got["frames_decoded"] and kept else None,
        "total_frames": got["total_frames"],
        "video_fps": round(got["video_fps"], 3),
        "indices_equal": indices == ours.indices,
        "indices_differing": sum(a != b for a, b in zip(indices, ours.indices, strict=False))
        + abs(kept - len(ours.indices)),
    }
    if got["frames_decoded"] is None:
        entry["decoded_note"] = why_not_counted or "the preloaded counter was not found in the peer process"
    same_shape = ours_at is not None and frames.shape == (kept, *ours_at.frames[0].shape)
    if not same_shape:
        entry.update(frames_identical=False, frames_differing=kept, max_abs_diff=None,
                     note=entry_note or f"frame shape {list(frames.shape)} differs from vlforge's")
        return entry
    ref = np.stack(ours_at.frames)
    diff = np.abs(frames.astype(np.int16) - ref.astype(np.int16))
    differing = int((diff.reshape(kept, -1).max(axis=1) > 0).sum())
    entry.update(frames_identical=differing == 0, frames_differing=differing, max_abs_diff=int(diff.max()),
                 mean_abs_diff=round(float(diff.mean()), 4))
    return entry


def machine(peer_python: Path | None) -> dict:
    """Where and with what the sweep ran (CPU model, versions, the peer venv's record)."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    info = {"cpu": cpu, "logical_cpus": os.cpu_count(), "python": platform.python_version(),
            "pyav": av.__version__, "ffmpeg": {k: ".".join(map(str, v)) for k, v in av.library_versions.items()
                                               if k in ("libavcodec", "libavformat")},
            "utc_start": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if peer_python is not None:
        sys.path.insert(0, str(HERE.parent / "scripts"))
        try:
            import peer_env
            record = peer_env.peer_record(peer_python.parent.parent, peer=PEER) or {}
        finally:
            sys.path.pop(0)
        info["peer"] = {"versions": record.get("versions"), "backends": record.get("backends")}
    return info


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


SWEEP = ([{"size": (64, 48), "minutes": 20, "gop": gop, "bframes": bf, "sample_fps": sf}
          for gop in (250, 60, 30) for bf in (3, 0) for sf in (1, 0.1)]
         + [{"size": (320, 240), "minutes": 5, "gop": gop, "bframes": bf, "sample_fps": sf}
            for gop in (250, 30) for bf in (3, 0) for sf in (1, 0.1)])
"""The ``--sweep`` settings (30 fps; 320x240 clips are 5 minutes to keep the run short)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--fps", type=float, default=30)
    parser.add_argument("--sample-fps", type=float, default=1)
    parser.add_argument("--gop", type=int, default=250)
    parser.add_argument("--bframes", type=int, default=3, help="x264 B-frames (3 = x264's default, 0 = none)")
    parser.add_argument("--size", default="64x48", help="WIDTHxHEIGHT")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="all settings of SWEEP, one JSON row each")
    parser.add_argument("--peers", action="store_true",
                        help="also qwen-vl-utils' readers (decord, torchcodec, torchvision) in the peer venv")
    parser.add_argument("--peer-python", type=Path, default=None,
                        help="the peer venv's python (default: scripts/peer_env.py's qwen-vl-utils build)")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    python = (args.peer_python or find_peer_python()) if args.peers else None
    if args.sweep:
        if not args.peers:
            rows = [measure(row["minutes"], args.fps, row["sample_fps"], row["size"], row["gop"], row["bframes"],
                            repeat=args.repeat) for row in SWEEP]
            _emit(rows, args.out)
            return
        info, rows = machine(python), []
        for row in SWEEP:
            load = load_average()
            rows.append({**measure(row["minutes"], args.fps, row["sample_fps"], row["size"], row["gop"], row["bframes"],
                                   repeat=args.repeat, peers=True, peer_python=python), "load_before": load})
        info.update(utc_end=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), load_after=load_average())
        _emit({"schema": SCHEMA, "machine": info, "repeat": args.repeat, "rows": rows}, args.out)
        return
    width, height = (int(v) for v in args.size.lower().split("x"))
    load = load_average()
    row = measure(args.minutes, args.fps, args.sample_fps, (width, height), args.gop, args.bframes,
                  repeat=args.repeat, peers=args.peers, peer_python=python)
    if args.peers:
        row["load_before"] = load
    _emit(row, args.out)


def _emit(data: object, out: Path | None) -> None:
    text = json.dumps(data, indent=1)
    if out is not None:
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
