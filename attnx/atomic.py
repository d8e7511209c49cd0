"""Atomic artifact writes: a failed, killed or concurrent writer leaves nothing half-written, loses nothing.

An output directory OUT is built in a hidden sibling ``.OUT.<hex>.partial`` and published
by one rename (POSIX only: it relies on ``fcntl.flock`` and rename semantics):

* ``force`` replaces only a directory its writer recognises as an earlier output of its own
  (``marker``: a file that writer always puts there, e.g. ``attnx.json``) or an empty one.
* One writer per OUT: an exclusive ``flock`` on ``.OUT.lock`` next to OUT is held from the
  check to the final rename; a second writer gets a one-line error, and the rename itself
  refuses an OUT that appeared meanwhile (``renameat2(RENAME_NOREPLACE)`` on Linux).
* Replacement never leaves OUT missing: on Linux ``renameat2(RENAME_EXCHANGE)`` swaps the
  staging directory and OUT in one step. Where the kernel or filesystem lacks it, OUT is
  renamed to ``.OUT.<hex>.old`` before the staging directory takes its name; a crash between
  the two renames leaves the old OUT there, and the next writer of OUT renames it back.
* Staging folders of killed writers (SIGKILL, SIGTERM) are removed by the next writer of the
  same OUT: it holds the lock, so no live writer owns them.
* Files get mode 0666 & ~umask and directories 0777 & ~umask, whichever library wrote them.

:func:`made_once` builds a directory that several processes want (a test fixture that takes minutes to
make) the same way, except that a second process waits for the first and reuses what it made.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import re
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from attnx.errors import AttnxError

PARTIAL, OLD = "partial", "old"
_AT_FDCWD = -100
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def check_output_dir(out: str | Path, force: bool, marker: str | None = None) -> None:
    """Refuse an OUT that cannot be (re)placed, before any work; writes nothing.

    Args:
        force: an existing OUT may be replaced, if it holds ``marker`` or is empty.
        marker: path (relative to OUT) of a file that marks an earlier output of this writer.

    Raises:
        AttnxError: OUT is the working directory (or holds it), a symbolic link, a file, an
            existing directory (without ``force``; with it, one that holds other data), or
            cannot be created (a file or broken link on the way, no write permission).
    """
    path = _absolute(out)
    if Path(os.path.realpath(os.getcwd())).is_relative_to(os.path.realpath(path)):  # realpath: no loop errors
        raise AttnxError(
            f"output '{out}' is the working directory or holds it, so it cannot be replaced; "
            "choose a new output path"
        )
    if path.is_symlink():
        kind = "a symbolic link" if path.exists() else "a broken symbolic link"
        raise AttnxError(
            f"output '{out}' is {kind} (to '{os.readlink(path)}'); attnx replaces OUT as a whole, "
            "so give a real directory path with -o"
        )
    if path.exists():
        if not path.is_dir():
            raise AttnxError(f"output '{out}' exists and is not a directory; choose another output path")
        if not force:
            raise AttnxError(f"output directory '{out}' already exists; pass --force to replace it")
        if not _replaceable(path, marker):
            held = f"holds no {marker}, so it is not an earlier output" if marker else "is not empty"
            raise AttnxError(
                f"output directory '{out}' {held}; --force replaces only that or an empty directory, "
                "so choose another output path"
            )
    _check_parent(path, out)


def check_output_file(path: str | Path, force: bool, what: str = "output file") -> None:
    """Refuse a file target that cannot be written atomically, before any work; writes nothing.

    Raises:
        AttnxError: ``path`` is a directory, exists (without ``force``), or cannot be created.
    """
    absolute = _absolute(path)
    if absolute.is_dir():
        raise AttnxError(f"{what} '{path}' is a directory; give a file path")
    if os.path.lexists(absolute) and not force:
        raise AttnxError(f"{what} '{path}' already exists; pass --force to replace it")
    _check_parent(absolute, path)


@contextlib.contextmanager
def staged_directory(out: str | Path, force: bool = False, marker: str | None = None) -> Iterator[Path]:
    """Yield a fresh staging directory; it becomes ``out`` only if the block succeeds.

    ``force`` and ``marker`` as for :func:`check_output_dir`, checked again under the lock
    and once more at the final rename (OUT may appear meanwhile).

    Raises:
        AttnxError: as :func:`check_output_dir`; another process is writing ``out``; ``out``
            appeared while the block ran (without ``force``).
    """
    path = _absolute(out)
    check_output_dir(out, force, marker)
    created = _make_parents(path.parent)
    try:
        with _exclusive(path, out):
            _clean_stale(path)
            check_output_dir(out, force, marker)
            staging = _fresh(path, PARTIAL)
            os.mkdir(staging)
            try:
                yield staging
                _normalise_modes(staging)
                _publish(staging, path, lambda: check_output_dir(out, force, marker))
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except BaseException:
        for directory in reversed(created):
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise


def made_once(path: str | Path, make: Callable[[Path], None], done: str) -> Path:
    """The directory ``path``, made by ``make(staging)`` unless it already holds the file ``done``.

    One process makes it, holding the lock on ``.PATH.lock``; those asking meanwhile wait, then reuse
    it. ``make`` fills a fresh staging folder that becomes ``path`` only once it returns, so a killed
    maker leaves nothing half made (the next one removes its staging folder).
    """
    path = _absolute(path)
    if (path / done).is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(path, path, wait=True):
        if not (path / done).is_file():
            _clean_stale(path)
            staging = _fresh(path, PARTIAL)
            os.mkdir(staging)
            try:
                make(staging)
                _publish(staging, path, lambda: None)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    return path


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` (mode 0666 & ~umask) through a temporary file and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".{PARTIAL}", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _absolute(path: str | Path) -> Path:
    """``path`` made absolute and normalised lexically ("a/.." -> "."), links not followed."""
    return Path(os.path.abspath(path))


def _replaceable(path: Path, marker: str | None) -> bool:
    return (marker is not None and (path / marker).is_file()) or not any(path.iterdir())


def _check_parent(path: Path, shown: str | Path) -> None:
    """The nearest existing ancestor of ``path`` is a writable directory."""
    probe = path.parent
    while not os.path.lexists(probe):
        probe = probe.parent
    with contextlib.suppress(ValueError):  # show it as the user would write it
        probe = probe.relative_to(Path.cwd())
    if not probe.exists():
        raise AttnxError(
            f"cannot create '{shown}': '{probe}' is a broken symbolic link; choose another path"
        )
    if not probe.is_dir():
        raise AttnxError(f"cannot create '{shown}': '{probe}' is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise AttnxError(f"cannot write to '{probe}': permission denied; choose another path")


def _make_parents(directory: Path) -> list[Path]:
    """Create the missing ancestors of ``directory`` (and it); return those created, outermost first.

    Raises:
        AttnxError: one that cannot be made (a system directory such as /proc refuses new entries), the
            ones made before it removed again.
    """
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    created: list[Path] = []
    for d in missing:
        try:
            os.mkdir(d)
        except FileExistsError:  # a concurrent writer made it first
            continue
        except OSError as exc:
            for made in reversed(created):
                with contextlib.suppress(OSError):
                    made.rmdir()
            raise AttnxError(f"cannot create '{d}': {exc.strerror or exc}; choose another path") from None
        created.append(d)
    return created


@contextlib.contextmanager
def _exclusive(path: Path, shown: str | Path, wait: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``.OUT.lock`` (``wait``: for as long as another holds it, else refused);
    removed again on exit.

    The holder unlinks the lock file before unlocking, so a writer that opened the old file
    checks, once it holds a lock, that the name still refers to the file it locked.
    """
    lock = path.parent / f".{path.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:  # a directory that holds no files (/proc, /sys) or refuses them
            raise AttnxError(
                f"cannot write to '{path.parent}' ({exc.strerror}), so not '{shown}'; choose another path"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AttnxError(
                f"another attnx process is writing '{shown}' (it holds {lock.name}); "
                "wait for it to finish or choose another output path"
            ) from None
        if _same_file(fd, lock):
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _fresh(path: Path, kind: str) -> Path:
    """An unused sibling name ``.OUT.<8 hex>.<kind>``."""
    while True:
        candidate = path.parent / f".{path.name}.{secrets.token_hex(4)}.{kind}"
        if not os.path.lexists(candidate):
            return candidate


def _clean_stale(path: Path) -> None:
    """Remove the staging folders of dead writers of ``path`` (the caller holds the lock).

    An ``.old`` folder while OUT is missing is the OUT of a replacement that died between its
    two renames: it is renamed back.
    """
    pattern = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.({PARTIAL}|{OLD})")
    for entry in sorted(path.parent.iterdir()):
        found = pattern.fullmatch(entry.name)
        if not found or entry.is_symlink() or not entry.is_dir():
            continue
        if found.group(1) == OLD and not os.path.lexists(path):
            os.rename(entry, path)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _publish(staging: Path, path: Path, recheck: Callable[[], None]) -> None:
    """Rename ``staging`` to ``path``; an existing ``path`` is first ``recheck``-ed, then swapped."""
    if not os.path.lexists(path):
        with contextlib.suppress(FileExistsError):  # else it appeared meanwhile
            _rename_noreplace(staging, path)
            return
    recheck()
    if _renameat2(staging, path, _RENAME_EXCHANGE):
        shutil.rmtree(staging)  # it now holds the replaced OUT
        return
    retired = _fresh(path, OLD)
    os.rename(path, retired)
    os.rename(staging, path)
    shutil.rmtree(retired)


def _rename_noreplace(source: Path, target: Path) -> None:
    if not _renameat2(source, target, _RENAME_NOREPLACE):
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target))
        os.rename(source, target)


def _renameat2(source: Path, target: Path, flags: int) -> bool:
    """``renameat2(2)``; False where the C library, kernel or filesystem lacks it."""
    call = _renameat2_function()
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(source), None, str(target))


@functools.cache
def _renameat2_function() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    call = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc >= 2.28, musl >= 1.2.5
    if call is not None:
        call.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
        call.restype = ctypes.c_int
    return call


def _normalise_modes(root: Path) -> None:
    """Give every file 0666 & ~umask and every directory 0777 & ~umask (some writers use 0600)."""
    mask = _umask()
    os.chmod(root, 0o777 & ~mask)
    for directory, subdirs, files in os.walk(root):
        for name, mode in [*((d, 0o777) for d in subdirs), *((f, 0o666) for f in files)]:
            target = os.path.join(directory, name)
            if not os.path.islink(target):
                os.chmod(target, mode & ~mask)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
