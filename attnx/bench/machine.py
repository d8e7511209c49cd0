"""The machine (CPU, cores, memory) and the process's peak resident memory.

Peak memory is measured as the Linux resident-set high-water mark (``VmHWM`` in
``/proc/self/status``). Before a measurement, ``malloc_trim(0)`` hands freed heap
pages back to the OS and writing ``5`` to ``/proc/self/clear_refs`` resets the
high-water mark to the current RSS, so one measurement's peak is not hidden by an
earlier, larger one. Where that reset is impossible (not Linux, or /proc is read-only)
the in-process peak is reported as unknown; ``--isolate`` then measures each case in a
fresh process, whose whole-life peak (``ru_maxrss``) is exact.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import os
import platform
import resource
import sys
from pathlib import Path
from typing import Any

from attnx.exporter.budget import available_memory

_STATUS = Path("/proc/self/status")
_MEMINFO = Path("/proc/meminfo")


def default_threads() -> int:
    """The cores this process may run on (its CPU affinity), else the machine's count."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _meminfo(key: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return None


def total_memory() -> int | None:
    return _meminfo("MemTotal")


def machine_info() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": default_threads(),
        "memory_total_bytes": total_memory(),
        "memory_available_bytes": available_memory(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
    }


def _status_bytes(key: str) -> int | None:
    with contextlib.suppress(OSError):
        for line in _STATUS.read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return None


def rss_bytes() -> int | None:
    """Current resident set size of this process."""
    return _status_bytes("VmRSS")


def lifetime_peak_bytes() -> int:
    """Peak RSS over the life of this process (``ru_maxrss``; KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _trim_heap() -> None:
    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(name).malloc_trim(0)


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        return False
    return _status_bytes("VmHWM") is not None


@dataclasses.dataclass
class MemoryProbe:
    """RSS baseline and high-water-mark reset taken at :meth:`start`; deltas against it."""

    baseline: int | None
    resettable: bool

    @classmethod
    def start(cls) -> MemoryProbe:
        _trim_heap()
        resettable = _reset_peak()
        return cls(rss_bytes(), resettable)

    def current_delta(self) -> int | None:
        now = rss_bytes()
        return None if now is None or self.baseline is None else now - self.baseline

    def peak_delta(self) -> int | None:
        """Peak RSS since :meth:`start` minus the baseline; None where the peak cannot be reset."""
        peak = _status_bytes("VmHWM")
        if not self.resettable or peak is None or self.baseline is None:
            return None
        return max(peak - self.baseline, 0)
