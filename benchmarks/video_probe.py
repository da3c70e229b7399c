"""The frame-index probe alone: MP4 sample tables (``vlforge.media.mp4_index``) against a demux pass.

For each clip, times ``decode._probe(clip, True)`` - open, frame count, rate and the frame index that
``read_video`` seeks with - once from the sample tables (checks against the container included) and once
by demuxing every packet, best of ``--repeat`` each, alternating in one process; both must give the same
index. Prints one JSON object: per clip both seconds, their ratio (demux / tables) and whether the tables
were used (else why not). The machine is shared: compare the ratio, not the seconds, across runs.

Run: ``python benchmarks/video_probe.py [CLIP ...] [--repeat 5]``; without clips it takes the
``clip_*.mp4`` files ``benchmarks/video_decode.py`` left in its cache folder, writing a 20-minute one
(36,000 frames, GOP 30, B-frames, 64x48) if there are none.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import av
import numpy as np

from video_decode import write_clip
from vlforge.media import decode

CACHE = Path(tempfile.gettempdir()) / "vlforge-bench-video"


def tables_used(clip: Path) -> tuple[bool, str]:
    """Whether the probe takes the sample tables for ``clip``, and why not."""
    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        demux = container.demux(stream)
        packets, why, _ = decode._packets_from_tables(clip, container, stream, demux)
        demux.close()
    return packets is not None, why


def measure_probe(clip: Path, repeat: int = 5) -> dict:
    """Best-of-``repeat`` seconds of the probe from the sample tables and by demuxing, and their ratio."""
    best = {"tables": float("inf"), "demux": float("inf")}
    results = {}
    for _ in range(repeat):
        for key in best:
            started = time.perf_counter()
            results[key] = decode._probe(clip, True, sample_tables=key == "tables")
            best[key] = min(best[key], time.perf_counter() - started)
    (total, rate, index, _), (total_d, rate_d, index_d, _) = results["tables"], results["demux"]
    same = (total, rate) == (total_d, rate_d) and (index is None) == (index_d is None) and (
        index is None or (np.array_equal(index.pts, index_d.pts) and index.keyframes == index_d.keyframes))
    if not same:
        raise AssertionError(f"{clip}: the sample tables and the demux pass give different frame indices")
    used, why = tables_used(clip)
    return {"clip": clip.name, "frames": total, "tables_used": used, **({} if used else {"why_not": why}),
            "tables_seconds": round(best["tables"], 4), "demux_seconds": round(best["demux"], 4),
            "ratio": round(best["demux"] / best["tables"], 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clips", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    clips = args.clips or sorted(CACHE.glob("clip_*.mp4")) or [
        write_clip(CACHE / "clip_36000f_30fps_g30_bf3_64x48_medium.mp4", frames=36000, fps=30, gop=30,
                   size=(64, 48))]
    rows = [measure_probe(clip, args.repeat) for clip in clips]
    print(json.dumps({"pyav": av.__version__, "repeat": args.repeat, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
