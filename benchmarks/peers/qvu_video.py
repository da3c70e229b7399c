"""qwen-vl-utils' video readers on one clip, as Qwen's recipes call them (peer side of ``video_decode.py``).

Executed by the qwen-vl-utils peer venv's python (``scripts/peer_env.py build --peer qwen-vl-utils``),
never by vlforge's: it imports ``qwen_vl_utils``, torch and the backends. Each backend is called through
qwen-vl-utils' own reader (``vision_process.VIDEO_READER_BACKENDS[name]``, what ``fetch_video`` calls before
its resize) with ``{"video": path, "fps": ..., "max_frames": ...}``: the same ``smart_nframes`` sampling
rules as vlforge's ``sample_frame_indices``, the indices from qwen-vl-utils' own ``torch.linspace``.

Input: one JSON object as argv[1] ``{"clip", "fps", "max_frames", "backends", "repeat", "out"}``. Output: one
JSON line on stdout, per backend either ``{"available": false, "reason"}`` or the best-of-``repeat`` seconds,
the indices, the frame count and fps it saw, the frames decoded (when ``count_frames.c`` is preloaded:
``LD_PRELOAD``; else null), and ``frames`` (an ``.npy`` of the THWC uint8 frames, before any resize, in
``out``).
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from pathlib import Path


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _counter():
    """The preloaded frame counter's (reset, read) functions, or None."""
    try:
        lib = ctypes.CDLL(None)
        return lib.vlforge_frames_reset, lib.vlforge_frames_decoded
    except AttributeError:
        return None


def _available(name: str) -> str:
    """Empty when the backend loads, else why not (one line)."""
    try:
        if name == "decord":
            import decord  # noqa: F401
        elif name == "torchcodec":
            from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads the FFmpeg libraries)
        elif name == "torchvision":
            import torchvision
            import torchvision.io
            if not hasattr(torchvision.io, "read_video"):
                return (f"torchvision {torchvision.__version__} has no io.read_video (qwen-vl-utils' torchvision "
                        "backend needs a torchvision that still decodes video)")
        else:
            return f"unknown backend {name!r}"
    except Exception as exc:
        return _why(exc)
    return ""


def main() -> None:
    job = json.loads(sys.argv[1])
    import numpy as np
    from qwen_vl_utils import vision_process

    counter = _counter()
    out: dict = {}
    for name in job["backends"]:
        reason = _available(name)
        if reason:
            out[name] = {"available": False, "reason": reason}
            continue
        reader = vision_process.VIDEO_READER_BACKENDS[name]
        ele = {"video": job["clip"], "fps": job["fps"], "max_frames": job["max_frames"]}
        best, decoded = float("inf"), None
        try:
            for _ in range(job["repeat"]):
                if counter:
                    counter[0]()
                started = time.perf_counter()
                video, metadata, _sample_fps = reader(dict(ele))
                best = min(best, time.perf_counter() - started)
                if counter:
                    decoded = int(counter[1]())
        except Exception as exc:
            out[name] = {"available": True, "error": _why(exc)}
            continue
        frames = video.permute(0, 2, 3, 1).contiguous().numpy()  # TCHW -> THWC, as decoded (no resize yet)
        path = Path(job["out"]) / f"{name}.npy"
        np.save(path, frames)
        out[name] = {"available": True, "seconds": best, "indices": [int(i) for i in metadata["frames_indices"]],
                     "total_frames": int(metadata["total_num_frames"]), "video_fps": float(metadata["fps"]),
                     "frames_decoded": decoded, "frames": str(path), "dtype": str(frames.dtype),
                     "shape": list(frames.shape)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
