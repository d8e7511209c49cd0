"""The python environment a Triton python-backend model runs in (its ``EXECUTION_ENV_PATH``).

Triton's python backend runs ``model.py`` in a stub process that embeds the Python its stub was
built for and ignores ``PYTHONPATH``; a model that needs packages names an environment in its config
(``EXECUTION_ENV_PATH``), which the stub activates. attnx's models need only numpy and onnxruntime,
but numpy below 2: the stubs of Triton 2.51 (the ``nvidia-pytriton`` 0.7 wheel's server) fail every
reply under numpy 2 ("output tensor shape does not match size of output").

:func:`ensure_environment` makes that environment once per Python and requirement set, under a cache
folder (a virtualenv of the Python running attnx, with onnxruntime at attnx's own version, so the
server computes what ``attnx verify`` checked), and reuses it after that. The work is resumable: the
environment is complete only once ``attnx-env.json`` is written in it, last; an interrupted build is
continued by the next run (pip keeps what it downloaded), and one process builds at a time (a lock
file next to it). Progress goes to ``progress``; a build that fails (no access to the package index)
is one :class:`AttnxError` naming the step and the fix.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path

from attnx.errors import AttnxError

MARKER = "attnx-env.json"
_CHECK = "import json, numpy, onnxruntime; print(json.dumps([numpy.__version__, onnxruntime.__version__]))"
_PIP_LINES = ("Collecting", "Downloading", "Installing", "Successfully", "Requirement already satisfied")
Progress = Callable[[str], None]


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/attnx/triton-python`` (``~/.cache/attnx/triton-python`` without it)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "attnx" / "triton-python"


def requirements() -> list[str]:
    """What ``model.py`` imports: numpy below 2 and onnxruntime at the version attnx itself runs (whose
    CPU package the environment gets, also where attnx runs ``onnxruntime-gpu``)."""
    for distribution in ("onnxruntime", "onnxruntime-gpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return ["numpy<2", f"onnxruntime=={metadata.version(distribution)}"]
    raise AttnxError("onnxruntime is not installed next to attnx; reinstall attnx (pip install attnx)")


def python_version() -> str:
    """``major.minor`` of the Python the environment is made of (the server's stub must match)."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def environment_path(cache: Path, packages: Sequence[str]) -> Path:
    """The folder of the environment for this Python and ``packages`` inside ``cache``."""
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    key = hashlib.sha256(json.dumps([sys.version, base, list(packages)]).encode()).hexdigest()[:12]
    return cache / f"py{python_version()}-{key}"


def ensure_environment(cache: str | Path | None = None, progress: Progress | None = None) -> Path:
    """The environment folder for Triton's python backend, built under ``cache`` unless it is there.

    Raises:
        AttnxError: ``cache`` cannot be written, or the environment cannot be built (pip cannot
            reach the package index, or what it installed does not import).
    """
    report = progress or (lambda message: None)
    packages = requirements()
    folder = environment_path(Path(cache or default_cache()).resolve(), packages)  # the config names it
    if (folder / MARKER).is_file():
        report(f"python environment for Triton: reusing {folder}")
        return folder
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnxError(
            f"cannot create the python environment cache '{folder.parent}' ({exc.strerror}); "
            "give a writable folder with --env-cache"
        ) from None
    with _locked(folder, report):
        if not (folder / MARKER).is_file():
            _build(folder, packages, report)
    return folder


@contextlib.contextmanager
def _locked(folder: Path, report: Progress) -> Iterator[None]:
    """One builder per environment: an exclusive lock on ``<folder>.lock`` (waits for another)."""
    with open(folder.with_name(folder.name + ".lock"), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report(f"waiting for another attnx that is building {folder}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _has_pip() -> bool:
    """Whether attnx's own environment has pip, read from its installed metadata: finding pip's module
    instead (``importlib.util.find_spec("pip")``) makes setuptools' distutils shim hand every later
    ``import distutils`` to the standard library, and torch.compile then fails in this process."""
    try:
        metadata.version("pip")
    except metadata.PackageNotFoundError:
        return False
    return True


def _build(folder: Path, packages: Sequence[str], report: Progress) -> None:
    """A virtualenv without pip of its own (attnx's pip installs into it: no ``ensurepip``, which some
    system Pythons lack), this Python's ``libpython`` beside it, the packages, a check, the marker."""
    if not _has_pip():
        raise AttnxError(
            "building the python environment for Triton's python backend needs pip in attnx's own "
            f"environment ({sys.executable} -m pip); install pip there, e.g. `{sys.executable} -m ensurepip`"
        )
    python = folder / "bin" / "python"
    if python.is_file():
        report(f"python environment for Triton: resuming the build in {folder}")
    else:
        report(f"python environment for Triton: creating a Python {python_version()} virtualenv in {folder}")
        _run(
            [sys.executable, "-m", "venv", "--without-pip", str(folder)],
            "create a virtualenv",
            folder,
            report,
        )
    _link_libpython(folder)
    report(f"installing {', '.join(packages)} with pip (once; later runs reuse {folder})")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check"]
    _run(
        [*pip, "--no-input", "--timeout", "30", "--retries", "2", *packages],
        "install " + ", ".join(packages),
        folder,
        report,
    )
    numpy, onnxruntime = json.loads(_run([str(python), "-c", _CHECK], "import them", folder, report))
    record = {
        "python": sys.version.split()[0],
        "numpy": numpy,
        "onnxruntime": onnxruntime,
        "packages": packages,
    }
    (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    report(f"python environment for Triton ready: {folder} (numpy {numpy}, onnxruntime {onnxruntime})")


def _link_libpython(folder: Path) -> None:
    """Put this Python's shared library in the environment's ``lib``, which the stub launcher puts on
    ``LD_LIBRARY_PATH``: the stub then embeds the very Python the environment was made of (a system
    ``libpython`` of another patch release would run it otherwise)."""
    name, libdir = sysconfig.get_config_var("INSTSONAME"), sysconfig.get_config_var("LIBDIR")
    if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not name or not libdir:
        return
    source, link = Path(libdir) / name, folder / "lib" / name
    if source.is_file() and not os.path.lexists(link):
        link.symlink_to(source)


def _run(command: list[str], step: str, folder: Path, report: Progress) -> str:
    """Run one build step; its last output line that starts with "[" (a JSON list). pip's progress
    lines go to ``report``.

    Raises:
        AttnxError: the step failed, with its last error line.
    """
    lines: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_environment()
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip())
            if line.startswith(_PIP_LINES):
                report(line.strip())
    if process.returncode != 0:
        errors = [line for line in lines if line.startswith("ERROR")] or [line for line in lines if line]
        why = errors[-1].removeprefix("ERROR: ").strip() if errors else f"exit code {process.returncode}"
        raise AttnxError(
            f"cannot build the python environment for Triton's python backend in '{folder}': could not "
            f"{step} ({why}); check that pip reaches the package index and run the command again (it resumes)"
        )
    return next((line for line in reversed(lines) if line.startswith("[")), "[null, null]")


def _environment() -> dict[str, str]:
    """The environment of a build step: the new virtualenv's, not this one's."""
    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
