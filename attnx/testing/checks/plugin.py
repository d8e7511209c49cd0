"""``plugin-kernel``: the op in the TensorRT plugin slot attnx derives from it, checked on CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnx.errors import AttnxError, first_line
from attnx.testing.checks.common import Skip, declared_calls, mismatch
from attnx.testing.onnx_op import OpSession
from attnx.testing.subject import Subject


class ShapeExpr:
    """A dimension restricted to what TensorRT shape expressions support: + - * // with ints and
    other dimensions. Comparing, branching on or converting it raises TypeError."""

    def __init__(self, value: int) -> None:
        self.value = value

    def _combine(self, other: Any, fn: Callable[[int, int], int]) -> ShapeExpr:
        if isinstance(other, ShapeExpr):
            return ShapeExpr(fn(self.value, other.value))
        if isinstance(other, int) and not isinstance(other, bool):
            return ShapeExpr(fn(self.value, other))
        return NotImplemented

    def __add__(self, other: Any) -> ShapeExpr:
        return self._combine(other, lambda a, b: a + b)

    __radd__ = __add__

    def __mul__(self, other: Any) -> ShapeExpr:
        return self._combine(other, lambda a, b: a * b)

    __rmul__ = __mul__

    def __sub__(self, other: Any) -> ShapeExpr:
        return self._combine(other, lambda a, b: a - b)

    def __rsub__(self, other: Any) -> ShapeExpr:
        return self._combine(other, lambda a, b: b - a)

    def __floordiv__(self, other: Any) -> ShapeExpr:
        return self._combine(other, lambda a, b: a // b)

    def __rfloordiv__(self, other: Any) -> ShapeExpr:
        return self._combine(other, lambda a, b: b // a)

    def _refuse(self, *args: Any) -> Any:
        raise TypeError("TensorRT shape expressions support only + - * // (no comparison, branch or int())")

    __bool__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __int__ = __index__ = __float__ = _refuse
    __hash__ = None  # type: ignore[assignment]


def check_plugin_kernel(subject: Subject) -> list[str]:
    """The TensorRT slot: the op describes as a plugin, its output_shape rule (the plugin's shape
    function) gives the eager shape, and the bare node run by attnx's CPU kernels matches torch."""
    from attnx.ortkernels import kernels_missing
    from attnx.trt.spec import describe

    calls, problems = declared_calls(subject), []
    for op in subject.impl.ops:
        try:
            describe(op)
        except AttnxError as exc:
            problems.append(f"op {op.name} cannot be a TensorRT plugin: {exc}")
    for call in calls:
        shapes = {
            name: tuple(ShapeExpr(n) for n in call.bound()[name].shape)
            for name in call.op.input_names
            if call.bound()[name] is not None
        }
        try:
            rule = tuple(d.value if isinstance(d, ShapeExpr) else d for d in call.op.output_shape(shapes))
        except Exception as exc:
            problems.append(
                f"output_shape rule of attnx::{call.op.name} raised {type(exc).__name__}: {exc} "
                f"({call.describe()})"
            )
            continue
        if len(call.outputs) != 1:
            problems.append(
                f"op {call.op.name} returns {len(call.outputs)} tensors; a TensorRT plugin returns one"
            )
        elif rule != tuple(call.output.shape):
            problems.append(
                f"output_shape rule of attnx::{call.op.name} gives {rule} but the op returns "
                f"{tuple(call.output.shape)}; set AttentionOp.output_shape ({call.describe()})"
            )
    missing = kernels_missing()
    if missing and not problems:
        raise Skip(f"attnx's CPU plugin kernels cannot run here: {missing}")
    tol = subject.variant.tolerance
    for call in [] if missing else [c for c in calls if len(c.outputs) == 1]:
        # One short-lived session per call: onnxruntime-extensions was seen to crash the process when
        # kernels registered earlier are used by a session created after later registrations.
        try:
            (output,) = OpSession(call.op, call, lowering="plugin").run(call.bound())
        except Exception as exc:
            problems.append(
                f"the plugin-lowered node attnx::{call.op.name} does not run: {first_line(exc)} "
                f"({call.describe()})"
            )
            continue
        problem = mismatch(output, call.output, tol.atol, tol.rtol)
        if problem:
            problems.append(
                f"the plugin-lowered node attnx::{call.op.name} (attnx CPU kernel) differs from "
                f"{call.name}: {problem} ({call.describe()})"
            )
    return problems
