"""Atomic output directories: what --force may replace, one writer per OUT, crash-safe swaps, stale
staging folders, file modes; a directory several processes want, made once (``made_once``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attnx import atomic
from attnx.atomic import check_output_dir, made_once, staged_directory
from attnx.errors import AttnxError
from tests.helpers import start_holder

REPO = Path(__file__).resolve().parents[2]
MARKER = "attnx.json"


def write_export(directory: Path, text: str = "new") -> None:
    (directory / MARKER).write_text("{}")
    (directory / "model.onnx").write_text(text)


def listing(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def assert_refused(out: Path, match: str, force: bool = True) -> None:
    """``staged_directory(out)`` raises a one-line AttnxError matching ``match`` before its block runs."""
    with pytest.raises(AttnxError, match=match), staged_directory(out, force=force, marker=MARKER):
        pytest.fail("the block must not run")


def test_force_replaces_an_earlier_export_or_an_empty_directory(tmp_path):
    for setup in (lambda d: write_export(d, "old"), lambda d: None):
        out = tmp_path / "out"
        out.mkdir()
        setup(out)
        with staged_directory(out, force=True, marker=MARKER) as staging:
            write_export(staging)
        assert (out / "model.onnx").read_text() == "new"
        assert listing(tmp_path) == ["out"]
        for item in out.iterdir():
            item.unlink()
        out.rmdir()


def test_force_never_replaces_a_directory_that_is_not_an_earlier_output(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(AttnxError, match=r"holds no attnx\.json.*choose another output path"):
        check_output_dir(out, force=True, marker=MARKER)
    assert_refused(out, "holds no attnx.json")
    assert (out / "thesis.tex").read_text() == "years of work" and listing(tmp_path) == ["mine"]


@pytest.mark.parametrize("relative", [".", "..", "sub/..", ""])
def test_the_working_directory_and_its_parents_are_refused(tmp_path, monkeypatch, relative):
    work = tmp_path / "work"
    work.mkdir()
    write_export(work)  # even an export: replacing the working directory would pull the floor away
    monkeypatch.chdir(work)
    for force in (False, True):
        with pytest.raises(AttnxError, match="working directory"):
            check_output_dir(relative or os.getcwd(), force=force, marker=MARKER)


def test_links_files_and_unwritable_parents_are_refused_up_front(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    os.symlink(tmp_path / "dir", tmp_path / "link")
    cases = {
        "dangling": "is a broken symbolic link",
        "link": "is a symbolic link",
        "file": "exists and is not a directory",
        "file/out": "'{root}/file' is a file, not a directory",
        "file/a/b/out": "is a file, not a directory",
        "dangling/out": "is a broken symbolic link",
    }
    before = listing(tmp_path)
    for name, fragment in cases.items():
        assert_refused(tmp_path / name, re.escape(fragment.format(root=tmp_path)))
    assert listing(tmp_path) == before and not (tmp_path / "missing").exists()


def test_a_failed_block_removes_staging_lock_and_the_parents_it_created(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    with pytest.raises(RuntimeError, match="boom"), staged_directory(out) as staging:
        write_export(staging)
        raise RuntimeError("boom")
    assert listing(tmp_path) == []


def test_every_file_gets_the_umask_mode(tmp_path):
    out = tmp_path / "out"
    with staged_directory(out) as staging:
        (staging / "sub").mkdir(mode=0o700)
        for path in (staging / "weights.safetensors", staging / "sub" / "x"):
            path.write_text("w")
            path.chmod(0o600)
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.relative_to(out).as_posix(): p.stat().st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert modes == {
        ".": 0o777 & ~mask,
        "sub": 0o777 & ~mask,
        "sub/x": 0o666 & ~mask,
        "weights.safetensors": 0o666 & ~mask,
    }


def test_out_that_appears_while_writing_is_not_replaced(tmp_path):
    out = tmp_path / "out"
    refused = pytest.raises(AttnxError, match="already exists; pass --force")
    with refused, staged_directory(out, marker=MARKER) as staging:
        write_export(staging)
        out.mkdir()
        (out / "theirs").write_text("keep")
    assert listing(out) == ["theirs"] and listing(tmp_path) == ["out"]


@pytest.mark.skipif(atomic._renameat2_function() is None, reason="no renameat2 in this C library")
def test_replacement_is_one_exchange_and_out_is_never_missing(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    write_export(out, "old")
    probe_a, probe_b = tmp_path / "probe_a", tmp_path / "probe_b"
    probe_a.mkdir(), probe_b.mkdir()
    if not atomic._renameat2(probe_a, probe_b, atomic._RENAME_EXCHANGE):
        pytest.skip("this filesystem does not support RENAME_EXCHANGE")
    probe_a.rmdir(), probe_b.rmdir()

    def no_plain_rename(*args):
        raise AssertionError("a two-step rename leaves a window where OUT is missing")

    monkeypatch.setattr(os, "rename", no_plain_rename)
    monkeypatch.setattr(os, "replace", no_plain_rename)
    with staged_directory(out, force=True, marker=MARKER) as staging:
        write_export(staging)
    assert (out / "model.onnx").read_text() == "new" and listing(tmp_path) == ["out"]


def test_fallback_swap_interrupted_between_its_renames_is_recovered(tmp_path, monkeypatch):
    """Without renameat2, OUT goes to .OUT.<hex>.old first: a crash right after leaves it there, and the
    next writer of OUT renames it back before checking."""
    out = tmp_path / "out"
    out.mkdir()
    write_export(out, "old")
    monkeypatch.setattr(atomic, "_renameat2", lambda *args: False)
    real_rename = os.rename

    def crash_after_retiring(source, target):
        real_rename(source, target)
        if str(target).endswith(".old"):
            raise KeyboardInterrupt  # stands for the process dying here

    monkeypatch.setattr(os, "rename", crash_after_retiring)
    with pytest.raises(KeyboardInterrupt), staged_directory(out, force=True, marker=MARKER) as staging:
        write_export(staging)
    monkeypatch.setattr(os, "rename", real_rename)
    (old,) = [p for p in tmp_path.iterdir() if p.name.endswith(".old")]
    assert not out.exists() and (old / "model.onnx").read_text() == "old"

    assert_refused(out, "already exists", force=False)  # restored first, then refused
    assert (out / "model.onnx").read_text() == "old" and listing(tmp_path) == ["out"]
    with staged_directory(out, force=True, marker=MARKER) as staging:  # the fallback swap, uninterrupted
        write_export(staging)
    assert (out / "model.onnx").read_text() == "new" and listing(tmp_path) == ["out"]


def test_a_second_writer_of_the_same_out_gets_a_one_line_error(tmp_path):
    out = tmp_path / "out"
    holder = start_holder(out, seconds=30)
    try:
        assert_refused(out, r"another attnx process is writing .*out.*choose another output path")
    finally:
        holder.kill()
        holder.wait()


def test_racing_writers_one_wins_the_others_get_an_error(tmp_path):
    out = tmp_path / "out"
    racer = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from attnx.atomic import staged_directory
        from attnx.errors import AttnxError
        start = float(sys.argv[2])
        time.sleep(max(0.0, start - time.time()))
        try:
            with staged_directory(Path(sys.argv[1]), marker="attnx.json") as staging:
                (staging / "attnx.json").write_text(sys.argv[3])
                time.sleep(0.2)
        except AttnxError as exc:
            print(exc)
            sys.exit(2)
        """
    )
    start = time.time() + 3
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", racer, str(out), str(start), str(i)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    results = [(r.wait(timeout=120), r.stdout.read()) for r in racers]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2, 2, 2], results
    assert all("another attnx process" in text or "already exists" in text for code, text in results if code)
    winner = next(i for i, (code, _) in enumerate(results) if code == 0)
    assert (out / MARKER).read_text() == str(winner) and listing(tmp_path) == ["out"]


def test_a_killed_writer_leaves_staging_that_the_next_writer_removes(tmp_path):
    out = tmp_path / "out"
    holder = start_holder(out, seconds=60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    left = listing(tmp_path)
    assert any(name.startswith(".out.") and name.endswith(".partial") for name in left), left
    with staged_directory(out, marker=MARKER) as staging:
        write_export(staging)
    assert listing(tmp_path) == ["out"]


def test_staging_of_a_similarly_named_out_is_left_alone(tmp_path):
    other = tmp_path / ".out.b.0123abcd.partial"  # staging of OUT "out.b", maybe alive
    other.mkdir()
    with staged_directory(tmp_path / "out") as staging:
        write_export(staging)
    assert listing(tmp_path) == [other.name, "out"]


def test_made_once_makes_it_in_one_process_while_the_others_wait_and_reuse_it(tmp_path):
    out, calls, ready = tmp_path / "model", [], threading.Barrier(4)

    def make(staging: Path) -> None:
        calls.append(staging)
        time.sleep(0.3)  # the others ask meanwhile
        (staging / "config.json").write_text("{}")

    def ask(_: int) -> Path:
        ready.wait()
        return made_once(out, make, done="config.json")

    with ThreadPoolExecutor(4) as pool:  # each asks through its own lock file descriptor, as processes do
        assert list(pool.map(ask, range(4))) == [out] * 4
    assert len(calls) == 1 and listing(tmp_path) == ["model"]
    assert made_once(out, make, done="config.json") == out and len(calls) == 1


def test_a_failed_make_leaves_nothing_and_the_next_call_makes_it(tmp_path):
    out = tmp_path / "model"

    def broken(staging: Path) -> None:
        (staging / "config.json").write_text("{}")
        raise RuntimeError("killed while making")

    with pytest.raises(RuntimeError, match="killed while making"):
        made_once(out, broken, done="config.json")
    assert listing(tmp_path) == []
    made_once(out, lambda staging: (staging / "config.json").write_text("{}"), done="config.json")
    assert listing(tmp_path) == ["model"]
