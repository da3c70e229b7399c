"""vlforge.outputs: ledgers, staged directories, removal that keeps what vlforge did not write, checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vlforge.errors import OutputError
from vlforge.outputs import (
    LEDGER,
    atomic_write_bytes,
    atomic_write_text,
    check_output_dir,
    check_output_file,
    make_staging,
    owned,
    publish,
    record,
    remove_owned,
    staged_dir,
)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_staged_dir_seals_every_file_and_leaves_no_staging(tmp_path: Path) -> None:
    with staged_dir(tmp_path / "out", writer="test") as stage:
        (stage / "sub").mkdir()
        (stage / "sub" / "a.bin").write_bytes(b"a")
        (stage / "b.txt").write_text("b")
    ledger = json.loads((tmp_path / "out" / LEDGER).read_text())
    assert ledger["sealed"] and not ledger.get("partial")
    assert set(ledger["entries"]) == {"sub/a.bin", "b.txt"}
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # staging renamed, nothing left beside it
    assert owned(tmp_path / "out") and owned(tmp_path / "out" / "sub" / "a.bin")


def test_failed_staging_is_removed_and_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(RuntimeError), staged_dir(target, writer="test") as stage:
        (stage / "half").write_text("x")
        raise RuntimeError("killed")
    assert list(tmp_path.iterdir()) == [target] and not any(target.iterdir())


def test_remove_owned_keeps_planted_files_byte_for_byte(tmp_path: Path) -> None:
    with staged_dir(tmp_path / "out", writer="test") as stage:
        (stage / "deep").mkdir()
        (stage / "deep" / "w.bin").write_bytes(b"w" * 10)
        (stage / "x.json").write_text("{}")
    (tmp_path / "out" / "deep" / "mine.txt").write_bytes(b"\x00user\xff")
    kept = remove_owned(tmp_path / "out")
    assert [p.name for p in kept] == ["mine.txt"]
    assert _tree(tmp_path) == {"out/deep/mine.txt": b"\x00user\xff"}


def test_remove_owned_refuses_what_vlforge_did_not_write(tmp_path: Path) -> None:
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "f").write_text("keep")
    (tmp_path / "file.txt").write_text("keep")
    for path in (tmp_path / "user", tmp_path / "file.txt"):
        with pytest.raises(OutputError, match="not written by vlforge"):
            remove_owned(path)
    assert _tree(tmp_path) == {"user/f": b"keep", "file.txt": b"keep"}


def test_recorded_file_is_owned_until_someone_else_changes_it(tmp_path: Path) -> None:
    path = atomic_write_text(tmp_path / "plot.png", "one", writer="test")
    assert owned(path)
    check_output_file(path, flag="--plot")  # ours: may be replaced
    os.utime(path, ns=(1, 1))  # a user rewrote it (different mtime)
    assert not owned(path)
    with pytest.raises(OutputError, match=r"--plot .*: exists and was changed since vlforge wrote it; refusing"):
        check_output_file(path, flag="--plot")
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"--plot .*notes.txt: exists and was not written by vlforge; refusing"):
        check_output_file(tmp_path / "notes.txt", flag="--plot")


def test_growing_file_keeps_ownership_when_appended(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("a\n")
    record(path, writer="train", growing=True)
    with path.open("a") as handle:
        handle.write("b\n")
    assert owned(path)


def test_publish_replaces_only_a_clean_vlforge_output(tmp_path: Path) -> None:
    with staged_dir(tmp_path / "out", writer="test") as stage:
        (stage / "v1").write_text("1")
    with staged_dir(tmp_path / "out", writer="test") as stage:
        (stage / "v2").write_text("2")
    assert set(_tree(tmp_path / "out")) == {"v2", LEDGER}
    (tmp_path / "out" / "user.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"user\.txt"):
        check_output_dir(tmp_path / "out", flag="OUT", mode="replace")
    stage = make_staging(tmp_path / "out", writer="test", unique=True)
    (stage / "v3").write_text("3")
    with pytest.raises(OutputError, match=r"user\.txt"):
        publish(stage, tmp_path / "out", writer="test")
    assert (tmp_path / "out" / "user.txt").read_text() == "mine"


def test_partial_staging_of_a_killed_run_is_cleared_but_a_users_is_not(tmp_path: Path) -> None:
    stage = make_staging(tmp_path / "checkpoint-3", writer="train")
    (stage / "half.distcp").write_bytes(b"x")
    again = make_staging(tmp_path / "checkpoint-3", writer="train")
    assert again == stage and [p.name for p in again.iterdir()] == [LEDGER]
    (tmp_path / ".tmp-final").mkdir()
    (tmp_path / ".tmp-final" / "mine").write_text("keep")
    with pytest.raises(OutputError, match="not made by vlforge"):
        make_staging(tmp_path / "final", writer="train")
    assert (tmp_path / ".tmp-final" / "mine").read_text() == "keep"
    (tmp_path / ".tmp-checkpoint-10").mkdir()  # killed between making the directory and writing its ledger
    assert [p.name for p in make_staging(tmp_path / "checkpoint-10", writer="train").iterdir()] == [LEDGER]
    from vlforge.train.checkpoint import clear_unfinished

    (tmp_path / ".tmp-checkpoint-11").mkdir()
    clear_unfinished(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tmp-final"]


def test_unique_staging_clears_only_dead_processes(tmp_path: Path) -> None:
    stale = make_staging(tmp_path / "out", writer="test", unique=True)
    ledger = json.loads((stale / LEDGER).read_text())
    ledger["pid"] = 2**22 + 12345  # beyond pid_max on Linux: a dead process
    (stale / LEDGER).write_text(json.dumps(ledger))
    live = make_staging(tmp_path / "out", writer="test", unique=True)
    fresh = make_staging(tmp_path / "out", writer="test", unique=True)
    assert not stale.exists() and live.exists() and fresh.exists()


@pytest.mark.parametrize("mode", ["new", "replace", "into"])
def test_check_output_dir_errors_name_the_path(tmp_path: Path, mode: str) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OutputError, match=r"^--out .*/file: exists and is not a directory$"):
        check_output_dir(a_file, flag="--out", mode=mode)
    with pytest.raises(OutputError, match=r"^--out .*/file/sub/dir: .*/file is a file, not a directory$"):
        check_output_dir(a_file / "sub" / "dir", flag="--out", mode=mode)
    with pytest.raises(OutputError, match=r"^--out /proc/.*cannot write"):
        check_output_dir("/proc/vlforge-test-out", flag="--out", mode=mode)
    assert check_output_dir(tmp_path / "new" / "deeper", flag="--out", mode=mode).is_absolute()
    assert not (tmp_path / "new").exists()  # a check creates nothing


def test_check_output_dir_free_space(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match=r"needs about .* free"):
        check_output_dir(tmp_path / "big", flag="--out", required_bytes=1 << 62)


def test_atomic_write_leaves_no_temp_and_fsyncs(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "a" / "f.bin", b"123")
    assert _tree(tmp_path) == {"a/f.bin": b"123"}
    assert not owned(tmp_path / "a" / "f.bin")  # not recorded without a writer


def test_a_vlforge_output_inside_another_is_replaceable_but_a_planted_file_in_it_is_not(tmp_path: Path) -> None:
    """Files written into a subdirectory the caller made are recorded in that subdirectory's own ledger."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer").mkdir()
    atomic_write_text(out / "tokenizer" / "tokenizer.json", "{}", writer="test")
    atomic_write_text(out / "reward.py", "x = 1\n", writer="test")
    assert check_output_dir(out, flag="--rewrite-out", mode="replace") == out
    (out / "tokenizer" / "notes.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"holds tokenizer/notes.txt, which vlforge did not write"):
        check_output_dir(out, flag="--rewrite-out", mode="replace")
