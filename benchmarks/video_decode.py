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

Run: ``python benchmarks/video_decode.py --minutes 20 --fps 30 --sample-fps 1 --gop 250``;
``--sweep`` prints one JSON row per setting (GOP 250/60/30, 1 and 0.1 fps, with and without B-frames,
64x48 and 320x240) from one run.
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
            gop: int = 250, bframes: int = 3, cache_dir: str | Path | None = None, repeat: int = 3) -> dict:
    """Best-of-``repeat`` seconds to decode the sampled frames by seeking (with and without skipping
    non-reference frames) and sequentially, and the speedups over sequential."""
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
    return {
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
    args = parser.parse_args(argv)
    if args.sweep:
        rows = [measure(row["minutes"], args.fps, row["sample_fps"], row["size"], row["gop"], row["bframes"],
                        repeat=args.repeat) for row in SWEEP]
        print(json.dumps(rows, indent=1))
        return
    width, height = (int(v) for v in args.size.lower().split("x"))
    print(json.dumps(measure(args.minutes, args.fps, args.sample_fps, (width, height), args.gop, args.bframes,
                             repeat=args.repeat), indent=2))


if __name__ == "__main__":
    main()
