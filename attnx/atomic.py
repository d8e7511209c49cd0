"""Atomic artifact writes: a failed or interrupted export leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from attnx.errors import AttnxError


def check_output_dir(out: Path, force: bool) -> None:
    """Refuse an existing OUT without ``force``, and an OUT whose parent cannot hold it."""
    if out.exists() and not out.is_dir():
        raise AttnxError(f"output '{out}' exists and is not a directory; choose another -o path")
    if out.exists() and not force:
        raise AttnxError(f"output directory '{out}' already exists; pass --force to replace it")
    parent = out.parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise AttnxError(f"cannot create '{out}': '{probe}' is a file, not a directory")
    if not os.access(probe, os.W_OK):
        raise AttnxError(f"cannot write to '{probe}': permission denied; choose another -o path")


@contextlib.contextmanager
def staged_directory(out: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``out``; rename it to ``out`` only if the block succeeds."""
    out = Path(out)
    check_output_dir(out, force)
    created_parent = not out.parent.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_parent:
            with contextlib.suppress(OSError):
                out.parent.rmdir()
        raise
    if out.exists():
        retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
        os.replace(out, retired / out.name)
        os.replace(staging, out)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.replace(staging, out)


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
