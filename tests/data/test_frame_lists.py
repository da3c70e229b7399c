"""A video given as a list of frame images (qwen-vl-utils' message format, LLaMA-Factory's ``videos``): read whole,
padded to a temporal patch, timed by ``sample_fps``; checked against qwen-vl-utils itself where LMMS Engine's peer
venv (which ships it) is built, and for its bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from datakit import chat
from PIL import Image

from vlforge.data import parse_conversation
from vlforge.data.errors import SampleError
from vlforge.data.media import resolve_item
from vlforge.data.video import decode_video
from vlforge.data.vision_settings import item_settings

ROOT = Path(__file__).resolve().parents[2]


def _frames(folder: Path, count: int, size=(56, 56), start: int = 0) -> list[str]:
    rng = np.random.default_rng(count)
    names = []
    for i in range(start, start + count):
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"f{i}.png")
        names.append(f"f{i}.png")
    return names


def _read(proc, part: dict, folder: Path):
    conv = parse_conversation(chat([part, {"type": "text", "text": "?"}]), "d.jsonl", "line 1")
    video_part = conv.media[0]
    media = resolve_item("video", video_part.ref, video_part.options, folder, source="d.jsonl", location="line 1")
    return decode_video(media, item_settings(proc.settings, video_part.options, "video"), source="d.jsonl",
                        location="line 1")


def test_every_frame_is_used_and_the_last_repeats_to_a_temporal_patch(make_processor, tmp_path):
    names = _frames(tmp_path, 5)
    video = _read(make_processor("qwen3_vl"), {"type": "video", "video": names}, tmp_path)
    assert video.indices == [0, 1, 2, 3, 4, 5] and video.total_frames == 6 and video.video_fps == 2.0
    assert video.sample_fps == 2.0 and video.method == "frames" and video.frames_decoded == 5
    for got, name in zip(video.frames, [*names, names[-1]], strict=True):
        assert np.array_equal(got, np.asarray(Image.open(tmp_path / name).convert("RGB")))


def test_more_frames_than_max_frames_are_sampled_evenly_down_to_it(make_processor, tmp_path):
    names = _frames(tmp_path, 10)
    (tmp_path / "f5.png").unlink()  # a frame not kept is never read
    video = _read(make_processor("qwen3_vl"), {"type": "video", "video": names, "max_frames": 4, "sample_fps": 5},
                  tmp_path)
    assert video.indices == [0, 3, 6, 9] and video.total_frames == 10 and video.frames_decoded == 4
    assert video.sample_fps == pytest.approx(2.0)  # 4 of 10 frames taken at 5 per second
    assert np.array_equal(video.frames[1], np.asarray(Image.open(tmp_path / "f3.png").convert("RGB")))


@pytest.mark.parametrize("rate", [0.5, np.float32(0.5)], ids=["float", "numpy"])  # parquet cells are numpy values
def test_sample_fps_times_the_frames(make_processor, tokenizer, tmp_path, rate):
    names = _frames(tmp_path, 4)
    proc = make_processor("qwen3_vl")
    part = {"type": "video", "video": [f"file://{n}" for n in names], "sample_fps": rate}
    sample = proc.process(parse_conversation(chat([part]), "d.jsonl", "line 1"), tmp_path)
    text = tokenizer.decode(sample.input_ids)
    assert "<1.0 seconds>" in text and "<5.0 seconds>" in text  # patches (0, 1) and (2, 3) at 2 s per frame
    assert sample.video_grid_thw[0, 0].item() == 2


def test_a_frame_list_from_the_record_videos_key(make_processor, tmp_path):
    names = _frames(tmp_path, 2)
    record = {"messages": [{"role": "user", "content": "<video>What happens?"},
                           {"role": "assistant", "content": "Noise."}], "videos": [names]}  # LLaMA-Factory's form
    sample = make_processor("qwen2_5_vl").process(parse_conversation(record, "d.jsonl", "line 1"), tmp_path)
    assert sample.video_grid_thw[0, 0].item() == 1 and sample.second_per_grid_ts.tolist() == [1.0]


@pytest.mark.parametrize(("part", "reason", "detail"), [
    ({"type": "video", "video": ["f0.png", "gone.png"]}, "missing_file", "frame 2 of 2: media file"),
    ({"type": "video", "video": ["f0.png", "big.png"]}, "corrupt_video",
     "frame 2 of 2 is 64x48, frame 1 is 56x56: the frames of one video must share a size"),
    ({"type": "video", "video": ["f0.png", "bad.png"]}, "corrupt_image", "frame 2 of 2: cannot decode image"),
    ({"type": "video", "video": ["f0.png", b"junk"]}, "corrupt_image",
     "frame 2 of 2: cannot decode image <inline bytes>"),
    ({"type": "video", "video": ["f0.png", "../f1.png"]}, "path_escape", "frame 2 of 2: media path '../f1.png'"),
    ({"type": "video", "video": []}, "schema", "a video given as an empty list of frames"),
    ({"type": "video", "video": ["f0.png", ["f1.png"]]}, "schema", "frame list holds a list"),
    ({"type": "video", "video": ["f0.png", None]}, "schema", "frame list holds null"),
    ({"type": "image", "image": ["f0.png", "f1.png"]}, "schema", "a list of 2 references as one image"),
    ({"type": "video", "video": ["f0.png", "f1.png"], "fps": 1}, "schema", "video option fps samples a clip"),
    ({"type": "video", "video": ["f0.png", "f1.png"], "nframes": 2}, "schema", "video option nframes / frame_num"),
    ({"type": "video", "video": ["f0.png", "f1.png"], "min_frames": 6}, "schema",
     "video option min_frames / video_min_frames samples a clip"),
    ({"type": "video", "video": ["f0.png", "f1.png"], "max_frames": 1}, "schema",
     "video option max_frames / video_max_frames: 1 is less than the 2 frames of one temporal patch"),
    ({"type": "video", "video": "clip.mp4", "sample_fps": 2}, "schema", "'sample_fps' is the rate of a video given"),
    ({"type": "video", "video": ["f0.png"], "sample_fps": 0}, "schema", "sample_fps: must be a number > 0, got 0"),
    ({"type": "video", "video": ["f0.png"], "sample_fps": "2"}, "schema", "sample_fps: must be a number > 0"),
    ({"type": "video", "video": ["f0.png"], "sample_fps": 10 ** 400}, "schema", "sample_fps: must be a number > 0"),
    ({"type": "video", "video": ["f0.png"], "sample_fps": float("nan")}, "schema", "sample_fps: must be a number"),
])
def test_bad_frame_lists_are_one_sample_error(make_processor, tmp_path, part, reason, detail):
    folder = tmp_path / "data"
    folder.mkdir()
    _frames(folder, 2)
    _frames(folder, 1, size=(64, 48), start=5)
    (folder / "f5.png").rename(folder / "big.png")
    (folder / "bad.png").write_bytes(b"not a png")
    with pytest.raises(SampleError) as caught:
        make_processor("qwen3_vl").process(parse_conversation(chat([part]), "d.jsonl", "line 1"), folder)
    assert caught.value.reason == reason and detail in str(caught.value), str(caught.value)
    assert str(caught.value).startswith("d.jsonl:line 1: ")


def test_validate_reads_a_frame_list_and_names_its_missing_frame(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from vlforge.cli import app

    names = _frames(tmp_path, 2)
    rows = [chat([{"type": "video", "video": names}]), chat([{"type": "video", "video": [names[0], "gone.png"]}])]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"datasets": [{"path": str(tmp_path / "d.jsonl"), "data_folder": str(tmp_path)}],
                 "on_error": "raise"},
        "model": {"load_from_pretrained_path": "tiny:qwen3_vl"}, "training": {"max_steps": 1}}))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "run.yaml"), "--json"])
    report = json.loads(done.stdout)
    assert done.exit_code == 2 and not report["ok"], report
    failures = json.dumps(report["errors"])
    assert "d.jsonl:line 2: missing_file: frame 2 of 2: media file" in failures and "gone.png" in failures, failures


@pytest.mark.parametrize(("family", "part", "fixed", "detail"), [
    ("qwen3_vl", {"type": "video", "video": ["f0.png", "f1.png"], "max_frames": 1}, {"max_frames": 2},
     "video option max_frames / video_max_frames: 1 is less than the 2 frames of one temporal patch"),
    ("qwen2_vl", {"type": "image", "image": "f0.png", "min_pixels": 10 ** 6, "max_pixels": 4096}, {"min_pixels": 1024},
     "image option min_pixels: 1000000 > max_pixels 4096"),
    ("qwen2_5_vl", {"type": "video", "video": "f0.png", "nframes": 0}, {"nframes": 2},
     "video option nframes / frame_num: Input should be greater than 0"),
])
def test_validate_checks_an_items_own_options_as_training_does(make_processor, tmp_path, family, part, fixed, detail):
    """A bad per-item option is the sample error of training, and `validate` reports it before any model loads."""
    import yaml
    from typer.testing import CliRunner

    from vlforge.cli import app

    _frames(tmp_path, 2)
    rows = [chat([{**part, **fixed}]), chat([part])]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"datasets": [{"path": str(tmp_path / "d.jsonl"), "data_folder": str(tmp_path)}],
                 "on_error": "raise"},
        "model": {"load_from_pretrained_path": f"tiny:{family}"}, "training": {"max_steps": 1}}))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "run.yaml"), "--json"])
    report = json.loads(done.stdout)
    assert done.exit_code == 2 and not report["ok"], report
    assert report["datasets"][0]["skipped"] == {"schema": 1}, report["datasets"]
    failures = json.dumps(report["errors"])
    assert f"d.jsonl:line 2: schema: {detail}" in failures, failures
    with pytest.raises(SampleError) as caught:  # training's processor: the same line
        make_processor(family).process(parse_conversation(rows[1], "d.jsonl", "line 2"), tmp_path)
    assert str(caught.value) == f"d.jsonl:line 2: schema: {detail}"


def test_validate_leaves_the_checkpoints_pixel_ceiling_to_training(tmp_path):
    """Qwen2.5-VL's released processors allow 12,845,056 pixels, its family default 1,003,520: an image's own
    min_pixels between the two trains, so validate does not refuse it (the checkpoint is not read before it loads)."""
    import yaml
    from typer.testing import CliRunner

    from vlforge.cli import app

    _frames(tmp_path, 1)
    part = {"type": "image", "image": "f0.png", "min_pixels": 2_000_000}
    (tmp_path / "d.jsonl").write_text(json.dumps(chat([part])) + "\n")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "data": {"datasets": [{"path": str(tmp_path / "d.jsonl"), "data_folder": str(tmp_path)}],
                 "on_error": "raise"},
        "model": {"load_from_pretrained_path": "tiny:qwen2_5_vl"}, "training": {"max_steps": 1}}))
    done = CliRunner().invoke(app, ["validate", str(tmp_path / "run.yaml"), "--json"])
    assert done.exit_code == 0, done.stdout
    capped = CliRunner().invoke(app, ["validate", str(tmp_path / "run.yaml"), "processor.max_pixels=1000000", "--json"])
    report = json.loads(capped.stdout)  # the config's own ceiling holds for training too
    assert capped.exit_code == 2 and "image option min_pixels: 2000000 > max_pixels 1000000" in json.dumps(report)


def _lmms_python() -> Path:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import peer_env
    finally:
        sys.path.pop(0)
    python = peer_env.peer_python()
    if python is None:
        pytest.skip("LMMS Engine's peer venv (which ships qwen-vl-utils) is not built: python3 scripts/peer_env.py "
                    "build")
    return python


def test_qwen_vl_utils_reads_the_same_frames_times_and_rate(make_processor, tmp_path):
    """qwen-vl-utils 0.0.14's ``fetch_video`` on the same list (56x56 frames: its two resizes keep them as they
    are): the same frames, the same padding, the metadata and sample_fps vlforge uses."""
    python = _lmms_python()
    names = _frames(tmp_path, 5)
    paths = [f"file://{tmp_path / n}" for n in names]
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from qwen_vl_utils import fetch_video
        (video, meta), rate = fetch_video({{"video": {paths!r}, "sample_fps": 1.5, "min_pixels": 56 * 56,
                                          "max_pixels": 56 * 56}}, image_patch_size=14,
                                         return_video_sample_fps=True, return_video_metadata=True)
        np.save({str(tmp_path / 'qvu.npy')!r}, video.round().to(dtype=__import__('torch').uint8).numpy())
        print(json.dumps({{"rate": rate, "meta": meta}}))
    """)
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    ours = _read(make_processor("qwen3_vl"), {"type": "video", "video": paths, "sample_fps": 1.5}, tmp_path)
    assert theirs["rate"] == ours.sample_fps == 1.5
    assert theirs["meta"]["frames_indices"] == ours.indices
    assert theirs["meta"]["fps"] == ours.video_fps and theirs["meta"]["total_num_frames"] == ours.total_frames
    frames = np.load(tmp_path / "qvu.npy").transpose(0, 2, 3, 1)  # TCHW -> THWC
    assert frames.shape == np.stack(ours.frames).shape and np.array_equal(frames, np.stack(ours.frames))
