"""Work run beside the caller's block, in a forked process, where the machine has a core to spare.

torch.export and torch.onnx convert a graph in single-threaded Python, so an export's graphs beside
model.onnx (the decode graphs, then genai's) take a second core's time instead of adding to the wall
clock. The child is a fork: it shares the parent's weights (read, never written, so the pages stay
shared), computes with one torch thread (an OpenMP pool does not survive a fork) and ends with
``os._exit`` (no exit handler of the parent's, such as a staging directory's cleanup, runs in it). Its
result comes back over a pipe from this process's own child, never from a file. Forking is done on
Linux only: macOS's system frameworks are not fork-safe (Python starts processes by spawning there), and
Windows has no fork. Elsewhere, or with one core, the work runs after the block instead, as it would have
without this module.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

from attnx.errors import AttnxError

T = TypeVar("T")


def spare_core() -> bool:
    """Whether this process runs on Linux and may use more than one core."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and len(os.sched_getaffinity(0)) > 1


@contextlib.contextmanager
def beside(work: Callable[[], T], parallel: bool) -> Iterator[Callable[[], T]]:
    """Run ``work`` while the block runs (in a forked child when ``parallel``, else after the block).

    Yields the function that returns ``work``'s result once the block is done, raising what ``work``
    raised: an :class:`AttnxError` as it was, anything else as a RuntimeError with the child's
    traceback. If the block raises, the child is stopped and the block's exception passes on.
    """
    if not parallel:
        yield work
        return
    receive, send = multiprocessing.Pipe(duplex=False)
    with warnings.catch_warnings():  # Python >= 3.12 warns of any fork with threads (torch's idle pool)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's frames
        receive.close()
        status = 1
        try:
            torch.set_num_threads(1)
            send.send(("done", work()))
            status = 0
        except AttnxError as exc:
            send.send(("refused", str(exc)))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            send.send(("failed", traceback.format_exc()))
        finally:
            os._exit(status)
    send.close()
    outcome: list[tuple[str, Any]] = []
    try:
        yield lambda: _result(outcome)
    except BaseException:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
        receive.close()
        raise
    try:
        outcome.append(receive.recv())
    except EOFError:
        outcome.append(("failed", "the process making the graphs beside model.onnx ended without a result"))
    finally:
        receive.close()
        os.waitpid(pid, 0)


def _result(outcome: list[tuple[str, Any]]) -> Any:
    """The child's result, or its error raised here."""
    kind, value = outcome[0]
    if kind == "refused":
        raise AttnxError(value)
    if kind == "failed":
        raise RuntimeError(f"making the graphs beside model.onnx failed in its own process:\n{value}")
    return value
