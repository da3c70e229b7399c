"""Seek vs sequential decode of the data pipeline's sampled frames from a long generated video.

``measure()`` writes (once per parameter set, cached in the temp dir) a ``minutes``-long H.264 clip of
tiny frames at ``fps`` with keyframes every ``gop`` frames, samples it with the data pipeline's own
``sample_frame_indices`` at ``sample_fps`` (``max_frames`` high enough to keep them all) and times
:func:`vlforge.media.decode.read_video` with ``method="seek"`` and ``method="sequential"`` in one run.
Both must return the same frames (checked). A seek cannot skip frames inside a GOP (every P-frame
needs the one before), so the speedup is about ``frames_total / frames_decoded_seek``: large when the
sampled frames are further apart than the GOP, near 1 when several sampled frames share a GOP.

Run: ``python benchmarks/video_decode.py --minutes 20 --fps 30 --sample-fps 1 --gop 250``
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vlforge.data.video import sample_frame_indices
from vlforge.media import decode


def write_clip(path: Path, *, frames: int, fps: float, gop: int, size: tuple[int, int]) -> Path:
    """A tiny-frame H.264 clip (ultrafast, no B-frames) whose frames change every frame."""
    if path.exists():
        return path
    width, height = size
    part = path.with_suffix(".part.mp4")
    with av.open(str(part), "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001),
                                options={"preset": "ultrafast", "g": str(gop), "keyint_min": str(gop),
                                         "sc_threshold": "0"})
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        base = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
        for i in range(frames):
            pixels = np.roll(base, i, axis=1)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    part.rename(path)
    return path


def measure(minutes: float = 20, fps: float = 30, sample_fps: float = 1, size: tuple[int, int] = (64, 48),
            gop: int = 250, cache_dir: str | Path | None = None, repeat: int = 3) -> dict:
    """Best-of-``repeat`` seconds to decode the sampled frames by seeking and sequentially, and the speedup."""
    frames = round(minutes * 60 * fps)
    folder = Path(cache_dir or Path(tempfile.gettempdir()) / "vlforge-bench-video")
    folder.mkdir(parents=True, exist_ok=True)
    name = f"clip_{frames}f_{fps:g}fps_g{gop}_{size[0]}x{size[1]}.mp4"
    started = time.perf_counter()
    path = write_clip(folder / name, frames=frames, fps=fps, gop=gop, size=size)
    generate_seconds = time.perf_counter() - started
    wanted = round(minutes * 60 * sample_fps)

    def pick(total: int, rate: float) -> list[int]:
        return sample_frame_indices(total, rate, fps=sample_fps, max_frames=wanted + 2)

    timings = {"seek": float("inf"), "sequential": float("inf")}
    results = {}
    for _ in range(repeat):  # alternate, keep each method's best (the machine is shared)
        for method in ("seek", "sequential"):
            started = time.perf_counter()
            results[method] = decode.read_video(path, pick, method=method)
            timings[method] = min(timings[method], time.perf_counter() - started)
    seek, seq = results["seek"], results["sequential"]
    if seek.indices != seq.indices or not all(np.array_equal(a, b) for a, b in zip(seek.frames, seq.frames,
                                                                                   strict=True)):
        raise AssertionError("seek and sequential decode returned different frames")
    return {
        "seek_seconds": round(timings["seek"], 3),
        "sequential_seconds": round(timings["sequential"], 3),
        "seek_speedup": round(timings["sequential"] / timings["seek"], 2),
        "frames_kept": len(seek.indices),
        "frames_total": seq.total_frames,
        "frames_decoded_seek": seek.frames_decoded,
        "frames_decoded_sequential": seq.frames_decoded,
        "gop": gop,
        "fps": fps,
        "sample_fps": sample_fps,
        "minutes": minutes,
        "size": list(size),
        "generate_seconds": round(generate_seconds, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--fps", type=float, default=30)
    parser.add_argument("--sample-fps", type=float, default=1)
    parser.add_argument("--gop", type=int, default=250)
    parser.add_argument("--size", default="64x48", help="WIDTHxHEIGHT")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    print(json.dumps(measure(args.minutes, args.fps, args.sample_fps, (width, height), args.gop), indent=2))


if __name__ == "__main__":
    main()
