"""A real ``tritonserver`` for the tests: the CPU build inside the ``nvidia-pytriton`` wheel.

Only the wheel's server files are used: it is installed with ``--no-deps`` into a cache folder of its
own (its numpy<2 pin never reaches attnx's environment), and the python backend stub for this Python
is put where the server looks for it (``backends/python``), as ``pytriton`` does for itself. The
server starts on free localhost ports with an empty environment (no PYTHONPATH, no
LD_LIBRARY_PATH: a repository must be self-sufficient), every wait is bounded, and a server that
dies fails the test with its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

WHEEL = "nvidia-pytriton==0.7.0"
FETCH_SECONDS = 600
START_SECONDS = 180
STOP_SECONDS = 30
T = TypeVar("T")


class Unavailable(Exception):
    """The server build cannot be had here (the reason is the message)."""


class ServerDied(AssertionError):
    """The server exited; the message ends with its log."""


def server_build(cache: Path) -> Path:
    """``pytriton/tritonserver`` of the wheel, installed (once) into ``cache``, with this Python's stub.

    Raises:
        Unavailable: not Linux x86_64, a Python the wheel has no stub for, or pip cannot fetch it.
    """
    if not sys.platform.startswith("linux") or os.uname().machine != "x86_64":
        raise Unavailable(f"{WHEEL} is a Linux x86_64 wheel (this is {sys.platform} {os.uname().machine})")
    target = cache / WHEEL.replace("==", "-")
    build = target / "pytriton" / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    with open(cache / ".wheel.lock", "a") as lock:  # one test session installs it at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").is_file():
            _install(target)
        stub = build / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise Unavailable(f"{WHEEL} has no python backend stub for Python {version}")
        installed = build / "backends" / "python" / stub.name
        if not installed.is_file():
            shutil.copy2(stub, installed)
    return build


def _stop_with_parent() -> None:
    """In the server's process, before exec: SIGTERM when the test process dies (PR_SET_PDEATHSIG), so
    a killed test run leaves no server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _install(target: Path) -> None:
    """pip install --no-deps --target: the wheel's files only, none of its dependencies.

    Raises:
        Unavailable: pip cannot fetch it.
    """
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
    command += ["--no-input", "--timeout", "30", "--target", str(partial), WHEEL]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_SECONDS)
    except subprocess.TimeoutExpired:
        raise Unavailable(f"pip did not fetch {WHEEL} in {FETCH_SECONDS} s") from None
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise Unavailable(
            f"pip cannot fetch {WHEEL}: {(errors or ['exit code ' + str(done.returncode)])[-1]}"
        )
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".complete").write_text(WHEEL + "\n")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TritonServer:
    """One ``tritonserver`` process serving ``repositories``; its output goes to ``log``."""

    def __init__(self, build: Path, repositories: Sequence[Path], log: Path) -> None:
        self.build, self.repositories, self.log_path = build, list(repositories), log
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.process: subprocess.Popen | None = None

    @property
    def command(self) -> list[str]:
        """The command line: the repositories, the wheel's backends, the ports; nothing else."""
        return [
            str(self.build / "bin" / "tritonserver"),
            *(f"--model-repository={repo}" for repo in self.repositories),
            f"--backend-directory={self.build / 'backends'}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--exit-timeout-secs=5",
        ]

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout: float = START_SECONDS) -> TritonServer:
        """Start the server and wait until it and every model are ready.

        Raises:
            ServerDied: it exited, or was not ready within ``timeout`` seconds (then it is stopped).
        """
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={"PATH": os.defpath, "HOME": str(self.log_path.parent)},
                preexec_fn=_stop_with_parent,
            )
        deadline = time.monotonic() + timeout
        while not self.ready():
            self.check()
            if time.monotonic() > deadline:
                self.stop()
                raise ServerDied(f"tritonserver was not ready after {timeout:g} s; its log:\n{self.log()}")
            time.sleep(0.25)
        return self

    def ready(self) -> bool:
        url = f"http://{self.http_url}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        """Raises: ServerDied: the server has exited (with its exit code and log)."""
        if self.process is not None and not self.alive():
            raise ServerDied(
                f"tritonserver exited with code {self.process.returncode}; its log:\n{self.log()}"
            )

    def call(self, request: Callable[[], T]) -> T:
        """``request()``, or the server's death and log where it failed because the server is gone."""
        try:
            return request()
        except Exception:
            self.check()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def stop(self) -> None:
        """Stop the server (it stops its python stubs): SIGTERM, then SIGKILL after a bound (a stub
        exits by itself once its server is gone)."""
        if self.process is None or not self.alive():
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_SECONDS)


@contextlib.contextmanager
def running(build: Path, repositories: Sequence[Path], log: Path) -> Iterator[TritonServer]:
    """A started server, stopped on the way out whatever happened."""
    server = TritonServer(build, repositories, log)
    try:
        yield server.start()
    finally:
        server.stop()


def triton_tokens(
    out: Path, build: Path, env_cache: Path, work: Path, prompt: list[int], new: int
) -> tuple[list[int], Any]:
    """Greedy tokens of one sequence served by a real tritonserver (``build``) from ``attnx triton OUT
    --backend python`` written under ``work`` (its python environment built once under ``env_cache``): the
    prompt, then one token per request (the server keeps each layer's state between requests); and the
    logits each token was chosen from ((new, vocab), numpy)."""
    import functools

    import numpy as np
    import tritonclient.http as client_module

    from tests.helpers import run_cli

    repo = work / "repo"
    args = ["triton", str(out), "--repo", str(repo), "--backend", "python", "--name", "served", "-q"]
    code, _, stderr = run_cli([*args, "--env-cache", str(env_cache)])
    assert code == 0, stderr
    tokens: list[int] = []
    chosen_from = []
    with running(build, [repo], work / "server.log") as server:
        client = client_module.InferenceServerClient(server.http_url, network_timeout=60)
        for step in range(new):
            ids = np.asarray([prompt if step == 0 else tokens[-1:]], dtype=np.int64)
            tensor = client_module.InferInput("input_ids", list(ids.shape), "INT64")
            tensor.set_data_from_numpy(ids)
            flags = {"sequence_start": step == 0, "sequence_end": step == new - 1}
            result = server.call(functools.partial(client.infer, "served", [tensor], sequence_id=7, **flags))
            chosen_from.append(result.as_numpy("logits")[0, -1])
            tokens.append(int(chosen_from[-1].argmax()))
        client.close()
    return tokens, np.stack(chosen_from)
