"""Lowering targets: whose kernels an export's ONNX bodies may call besides the standard ONNX ops (no torch).

Every ``attnx::<Op>`` has portable bodies (standard ONNX ops: any runtime). An op may also declare
bodies for a runtime's own kernels (:class:`attnx.ops.TargetBodies` in ``AttentionOp.targets``, e.g.
ONNX Runtime's ``com.microsoft::LinearAttention``); ``attnx export --target NAME`` lowers each op that
declares ``NAME`` with those bodies, and the others with their portable ones. A target is declared
once, here: its name, what it is, the runtime whose kernels its bodies call, the op domains those
kernels live in, and how to tell which of them the installed runtime has (:meth:`LoweringTarget.kernels`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Literal, get_args

Target = Literal["portable", "ort"]
TARGET_NAMES: tuple[str, ...] = get_args(Target)
PORTABLE = "portable"


@dataclasses.dataclass(frozen=True)
class LoweringTarget:
    """One lowering target.

    Attributes:
        name: ``--target`` name.
        summary: one line for ``attnx list``.
        runtime: the distribution whose kernels its bodies call ("" for ``portable``).
        domains: the op domains of those kernels (the ops a body uses there must exist in ``runtime``).
        installed: lists (domain, op type) of every kernel the installed ``runtime`` has (read lazily).
    """

    name: str
    summary: str
    runtime: str = ""
    domains: tuple[str, ...] = ()
    installed: Callable[[], Iterable[tuple[str, str]]] | None = None

    def version(self) -> str | None:
        """The installed version of :attr:`runtime` (None: not installed, or no runtime)."""
        try:
            return metadata.version(self.runtime) if self.runtime else None
        except metadata.PackageNotFoundError:
            return None

    def kernels(self) -> frozenset[tuple[str, str]]:
        """(domain, op type) of every kernel the installed runtime has in :attr:`domains`."""
        if self.installed is None:
            return frozenset()
        return frozenset(kernel for kernel in self.installed() if kernel[0] in self.domains)


@functools.cache
def _onnxruntime_kernels() -> frozenset[tuple[str, str]]:
    """ONNX Runtime's operator schemas (every kernel of the installed build)."""
    from onnxruntime.capi import _pybind_state

    return frozenset((s.domain, s.name) for s in _pybind_state.get_all_operator_schema())


TARGETS: dict[str, LoweringTarget] = {
    PORTABLE: LoweringTarget(PORTABLE, "standard ONNX ops only: any ONNX runtime and TensorRT (default)"),
    "ort": LoweringTarget(
        "ort",
        "ONNX Runtime's own kernels (com.microsoft ops) for the ops that declare a body for them",
        runtime="onnxruntime",
        domains=("com.microsoft",),
        installed=_onnxruntime_kernels,
    ),
}
assert tuple(TARGETS) == TARGET_NAMES, "every target is declared once, in Target and TARGETS alike"
