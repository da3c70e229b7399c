"""``benchmarks/video_decode.py --peers``: qwen-vl-utils' readers next to vlforge's (issue 27, D7).

Without the qwen-vl-utils peer venv every backend is skipped with the build command; a fake peer (vlforge's
own frames, one of them altered) checks the JSON and the exactness comparison; with the peer venv
(``python3 scripts/peer_env.py build --peer qwen-vl-utils``) every backend that loads there must return
exactly vlforge's frames on one small clip.
"""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import video_decode  # noqa: E402
from vlforge.data.video import sample_frame_indices  # noqa: E402
from vlforge.media import decode  # noqa: E402

PEER_KEYS = {"peers", "fastest_peer", "vlforge_vs_fastest_peer", "vlforge_at_least_as_fast"}


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    """3 s at 30 fps, 64x48, GOP 30 with B-frames (the benchmark's own clip writer)."""
    return video_decode.write_clip(tmp_path_factory.mktemp("peers") / "clip.mp4", frames=90, fps=30, gop=30,
                                   size=(64, 48))


def _ours(clip: Path, sample_fps: float = 2, max_frames: int = 8) -> decode.DecodedVideo:
    return decode.read_video(clip, lambda total, rate: sample_frame_indices(total, rate, fps=sample_fps,
                                                                            max_frames=max_frames))


def test_without_the_peer_venv_every_backend_is_skipped_with_the_build_command(clip, monkeypatch, capsys):
    monkeypatch.setattr(video_decode, "find_peer_python", lambda: None)
    video_decode.main(["--minutes", "0.05", "--size", "64x48", "--gop", "30", "--repeat", "1", "--peers"])
    row = json.loads(capsys.readouterr().out)
    assert row.keys() >= PEER_KEYS and "seek_seconds" in row and "load_before" in row
    assert set(row["peers"]) == set(video_decode.PEER_BACKENDS)
    for entry in row["peers"].values():
        assert entry == {"skipped": "no qwen-vl-utils peer venv (python3 scripts/peer_env.py build --peer "
                                    "qwen-vl-utils)"}
    assert row["fastest_peer"] is None and row["vlforge_at_least_as_fast"] is None


def test_a_peer_process_that_fails_is_a_skip_reason(clip, tmp_path):
    ours = _ours(clip)
    got = video_decode.measure_peers(clip, 2, 8, ours, 0.1, python=Path("/bin/false"), cache_dir=tmp_path)
    assert got.keys() == PEER_KEYS
    assert all(e["skipped"].startswith("peer process exited 1") for e in got["peers"].values())


def _fake_peer(tmp_path: Path, alter: int | None, indices: list[int]) -> Path:
    """A 'python' that answers as ``peers/qvu_video.py`` would: decord from vlforge's decode of the same
    indices (frame ``alter`` changed by one level), torchcodec not loadable, torchvision failing."""
    runner = tmp_path / "fake_runner.py"
    runner.write_text(textwrap.dedent(f"""
        import json, sys, time
        import numpy as np
        from vlforge.media import decode  # PyAV and numpy only: starts fast
        job = json.loads(sys.argv[2])
        indices = {indices!r}
        video = decode.read_video(job["clip"], lambda total, rate: indices)
        frames = np.stack(video.frames)
        if {alter!r} is not None:
            frames[{alter!r}, 0, 0, 0] ^= 1
        np.save(job["out"] + "/decord.npy", frames)
        print(json.dumps({{
            "decord": {{"available": True, "seconds": 123.0, "indices": video.indices,
                        "total_frames": video.total_frames, "video_fps": video.video_fps,
                        "frames_decoded": 2 * len(video.indices), "frames": job["out"] + "/decord.npy"}},
            "torchcodec": {{"available": False, "reason": "RuntimeError: Could not load libtorchcodec"}},
            "torchvision": {{"available": True, "error": "AttributeError: no read_video"}}}}))
    """))
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {runner} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


@pytest.mark.parametrize("alter", [None, 1])
def test_peer_entries_compare_frames_exactly(clip, tmp_path, alter):
    ours = _ours(clip)
    got = video_decode.measure_peers(clip, 2, 8, ours, 0.5, python=_fake_peer(tmp_path, alter, ours.indices),
                                     cache_dir=tmp_path)
    decord = got["peers"]["decord"]
    assert decord["indices_equal"] and decord["indices_differing"] == 0
    assert decord["frames_kept"] == len(ours.indices) and decord["decoded_per_kept"] == 2.0
    assert decord["frames_identical"] is (alter is None)
    assert decord["frames_differing"] == (0 if alter is None else 1)
    assert decord["max_abs_diff"] == (0 if alter is None else 1)
    assert got["peers"]["torchcodec"] == {"skipped": "RuntimeError: Could not load libtorchcodec"}
    assert got["peers"]["torchvision"] == {"error": "AttributeError: no read_video"}
    assert got["fastest_peer"] == "decord" and got["vlforge_vs_fastest_peer"] == 246.0
    assert got["vlforge_at_least_as_fast"] is True


def test_peer_readers_return_vlforge_frames(clip, tmp_path):
    """The real peer venv, when built: each backend that loads there returns exactly vlforge's frames."""
    python = video_decode.find_peer_python()
    if python is None:
        pytest.skip("qwen-vl-utils' venv is not built: python3 scripts/peer_env.py build --peer qwen-vl-utils")
    ours = _ours(clip)
    got = video_decode.measure_peers(clip, 2, 8, ours, 1.0, python=python, cache_dir=tmp_path, repeat=1,
                                     timeout=300)
    crashed = {name: e for name, e in got["peers"].items() if e.get("skipped", "").startswith("peer process")}
    assert not crashed, crashed
    ran = {name: e for name, e in got["peers"].items() if "seconds" in e}
    if not ran:
        pytest.skip(f"no qwen-vl-utils backend loads in the peer venv: {got['peers']}")
    for name, entry in ran.items():
        assert entry["indices_equal"] and entry["total_frames"] == ours.total_frames, (name, entry)
        assert entry["frames_identical"], (name, entry)
        if entry["frames_decoded"] is not None:
            assert entry["frames_decoded"] >= len(set(ours.indices)), (name, entry)
    assert np.isfinite(got["vlforge_vs_fastest_peer"])
