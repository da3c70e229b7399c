"""A 15-row chat dataset with 5 bad rows of different kinds, for the skip-report tests of train and extract.

Rows 2, 5, 8, 11 and 14 (JSONL lines) are: a truncated PNG, a missing image, a malformed JSON line, a
conversation without an assistant turn, a corrupt MP4; the other 10 are good image samples. Also
:func:`vlforge_cli`: the real entry point in this process, its streams captured.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import sys
from pathlib import Path

import pytest
from PIL import Image

from vlforge import cli

REPO = Path(__file__).resolve().parents[1]

#: JSONL line -> the reason vlforge gives for skipping it
BAD_LINES = {2: "corrupt_image", 5: "missing_file", 8: "malformed_json", 11: "no_labels", 14: "corrupt_video"}


def _chat(media: dict | None, answer: str | None = "A square.") -> dict:
    user = {"role": "user", "content": [*([media] if media else []), {"type": "text", "text": "What is shown?"}]}
    return {"messages": [user, *([{"role": "assistant", "content": answer}] if answer else [])]}


def write_bad_dataset(folder: Path, name: str = "bad.jsonl", *, bad_lines: tuple[int, ...] = tuple(BAD_LINES)) -> Path:
    """``folder/name``: 15 lines, the bad ones at ``bad_lines`` (in the order of :data:`BAD_LINES`' kinds)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        Image.new("RGB", (56, 56), (200, 30 + 60 * i, 30)).save(folder / f"ok{i}.png")
    png = (folder / "ok0.png").read_bytes()
    (folder / "cut.png").write_bytes(png[: len(png) // 2])
    clip = (REPO / "examples" / "data" / "videos" / "moving_square.mp4").read_bytes()
    (folder / "broken.mp4").write_bytes(clip[: len(clip) // 4])
    faults = [json.dumps(_chat({"type": "image", "image": "cut.png"})),
              json.dumps(_chat({"type": "image", "image": "gone.png"})),
              '{"messages": [',
              json.dumps(_chat({"type": "image", "image": "ok0.png"}, answer=None)),
              json.dumps(_chat({"type": "video", "video": "broken.mp4"}))]
    bad = dict(zip(bad_lines, faults, strict=True))
    lines = [bad.get(n, json.dumps(_chat({"type": "image", "image": f"ok{n % 3}.png"}, f"Square {n}.")))
             for n in range(1, 16)]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def vlforge_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """``vlforge ARGV`` through ``vlforge.cli.main`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "argv", ["vlforge", *argv])
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    _drop_cli_handlers()  # one an earlier in-process run left would log to that run's (closed) stream
    code = 0
    try:
        cli.main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    finally:  # the CLI's handler holds this run's stderr: drop it so the next run installs its own
        _drop_cli_handlers()
    return code, out.getvalue(), err.getvalue()


def _drop_cli_handlers() -> None:
    root = logging.getLogger("vlforge")
    for handler in [h for h in root.handlers if getattr(h, "_vlforge_cli", False)]:
        root.removeHandler(handler)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
