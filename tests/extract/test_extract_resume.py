"""Killing a run and resuming it, and memory over a long JSONL: real subprocesses, real files."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extractkit import cache_files, image_record, text_record, write_config, write_images, write_jsonl

import warmstart
from vlforge.extract import open_cache, run_extract

FLAGS = ["--batch-size", "2", "--shard-size", "2", "--features", "vision_pooled,hidden_mean,hidden_last",
         "--layers", "1,-1"]


@pytest.fixture(scope="module")
def long_images(tmp_path_factory) -> Path:
    """40 samples (20 shards of 2): images cycling over 8 files, every 10th text-only, one missing image."""
    folder = tmp_path_factory.mktemp("extract-long")
    names = write_images(folder, 8)
    records = [text_record(f"Question {i}?") if i % 10 == 9 else image_record(names[i % 8], f"Picture {i}?")
               for i in range(40)]
    records[13] = image_record("images/missing.png")
    write_jsonl(folder / "long.jsonl", records)
    return write_config(folder, "long.jsonl")


def test_sigkill_then_resume_gives_the_uninterrupted_cache(tmp_path, qwen3_ckpt, long_images):
    from vlforge.models import load

    loaded = load(str(qwen3_ckpt))
    reference = tmp_path / "reference"
    run_extract(model=str(qwen3_ckpt), data=str(long_images), out=reference, batch_size=2, shard_size=2,
                features=["vision_pooled", "hidden_mean", "hidden_last"], layers=[1, -1], loaded=loaded)

    killed = tmp_path / "killed"
    cmd = [warmstart.python(), "-m", "vlforge.extract", "--model", str(qwen3_ckpt), "--data", str(long_images),
           "--out", str(killed), "--no-progress", *FLAGS]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list((killed / "shards").glob("shard-*.json")):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "no shard appeared within 120 s"
        time.sleep(0.01)
    warmstart.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()

    manifest = json.loads((killed / "manifest.json").read_text())
    finished = sorted((killed / "shards").glob("shard-*.json"))
    assert manifest["status"] == "incomplete" and 1 <= len(finished) < 20
    # a finished shard damaged afterwards and a stale temporary file must both be handled
    first = killed / "shards" / "shard-00000.safetensors"
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    (killed / "shards" / ".shard-00019.safetensors.abc.tmp").write_bytes(b"partial")

    summary = run_extract(model=str(qwen3_ckpt), data=str(long_images), out=killed, batch_size=2, shard_size=2,
                          features=["vision_pooled", "hidden_mean", "hidden_last"], layers=[1, -1], loaded=loaded)
    assert summary.shards_reused == len(finished) - 1
    assert summary.shards_written == 20 - summary.shards_reused
    assert cache_files(killed) == cache_files(reference)
    cache = open_cache(killed, verify=True)
    assert len(cache) == 39 and "long:14" not in cache.ids
    assert [e["reason"] for e in cache.errors()] == ["missing_file"]


MEMORY_SCRIPT = r"""
import json, resource, sys
from pathlib import Path
from vlforge.extract import run_extract
from vlforge.models import load

root, ckpt = Path(sys.argv[1]), sys.argv[2]
loaded = load(ckpt)
out = {}
for n in (300, 3000):
    line = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "ok"}],
            "notes": "x" * 5000}
    data = root / f"text{n}.jsonl"
    data.write_text((json.dumps(line) + "\n") * n)
    s = run_extract(model=ckpt, data=str(data), out=root / f"cache{n}", features=["hidden_mean"], batch_size=50,
                    shard_size=250, loaded=loaded)
    out[n] = {"rows": s.rows_written, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
              "data_bytes": data.stat().st_size}
print(json.dumps(out))
"""


def test_memory_stays_flat_over_a_long_jsonl(tmp_path, qwen3_ckpt):
    """3,000 short text-only records padded to 5 KB each (a 15 MB JSONL): the peak RSS of the long run exceeds
    the peak of a 300-line run by less than a third of the file, so records are streamed, not kept."""
    result = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path), str(qwen3_ckpt)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    stats = {int(k): v for k, v in json.loads(result.stdout.strip().splitlines()[-1]).items()}
    assert stats[300]["rows"] == 300 and stats[3000]["rows"] == 3000
    growth = (stats[3000]["maxrss_kb"] - stats[300]["maxrss_kb"]) * 1024
    assert growth < stats[3000]["data_bytes"] / 3, stats


@pytest.mark.parametrize(("interrupt", "line", "code"), [
    (KeyboardInterrupt, "interrupted (Ctrl-C)", 130), ("sigterm", "terminated (SIGTERM)", 143)])
def test_a_stop_part_way_says_the_cache_resumes(tmp_path, monkeypatch, interrupt, line, code):
    """Ctrl-C or SIGTERM while extracting: one line naming the cache, that it keeps its shards and resumes."""
    import vlforge.extract.runner as runner
    from vlforge.errors import Interrupted
    from vlforge.extract.command import ExtractRun, extract
    from vlforge.extract.options import ExtractOptions
    from vlforge.terminate import TerminateSignal

    def stopped(*_args, **_kwargs):
        raise TerminateSignal if interrupt == "sigterm" else interrupt

    monkeypatch.setattr(runner, "run_extract", stopped)
    options = ExtractOptions(model="tiny:qwen3_vl", data=str(tmp_path / "d.jsonl"), out=str(tmp_path / "cache"))
    with pytest.raises(Interrupted) as caught:
        extract(ExtractRun(options, progress=False))
    assert str(caught.value) == f"{line}; {tmp_path / 'cache'} keeps every shard written so far; the same command " \
                                "resumes the cache"
    assert caught.value.exit_code == code
