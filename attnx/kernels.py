"""Triton kernels of attnx ops: the light description a kernel gives, and its torch launcher.

A variant may compute an ``attnx::<Op>`` with one Triton kernel. It names the kernel's
description on the op (:attr:`attnx.ops.AttentionOp.kernel`, "module:attribute" of a
:class:`TritonKernel`), so code that knows no variant (the TensorRT plugins, ``attnx bench``)
finds it with :func:`load`. Nothing here imports triton or torch at import time.

The kernel is written for TensorRT's ahead-of-time plugin ABI (``tensorrt.plugin.aot_impl``):

* **one launch** computes the op (a QDP AOT plugin returns one kernel and has no workspace);
* the kernel's parameters are, in order: the op's tensor inputs (named as the op names them; an
  absent optional input is a compile-time ``None``), then int32 scalars derived from the input
  shapes, then the output, then ``tl.constexpr`` parameters. TensorRT passes input pointers,
  then the "extra args", then output pointers, and extra args can only be int32 expressions of
  the shapes, so float attributes (scale, eps) and flags are compile-time constants (TensorRT
  does not serialise plugin attributes with an AOT kernel either);
* inputs and outputs are contiguous (TensorRT's LINEAR format), so strides follow from shapes.

:meth:`TritonKernel.plan` turns shapes, dtypes, attribute values and a :class:`Tactic` into a
:class:`LaunchPlan`. Its rules only index shapes and use ``+ - * //`` on dimensions, so they
work on ints (the torch launcher here) and on TensorRT's symbolic shape expressions alike;
dimensions the kernel needs at compile time (head sizes) must be ints (:func:`static`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attnx.errors import AttnxError
from attnx.variant import load_object

if TYPE_CHECKING:
    import torch

    from attnx.ops import AttentionOp

Shapes = Mapping[str, Sequence[Any]]  # present input name -> its dims (ints or symbolic expressions)

# torch dtype name -> Triton type name (pointers are "*" + it)
TRITON_TYPES = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "bool": "i1",
    "int32": "i32",
    "int64": "i64",
}


@dataclasses.dataclass(frozen=True)
class Tactic:
    """One compiled configuration of a kernel: block sizes (constexprs) and launch options.

    TensorRT numbers the tactics of an ``autotune`` combination; attnx uses 1 + the index in
    :attr:`TritonKernel.tactics` (TensorRT's sample starts at 1).
    """

    name: str
    blocks: Mapping[str, int]
    num_warps: int = 4
    num_stages: int = 2


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything one launch needs.

    Attributes:
        signature: every kernel parameter, in order, with its Triton type: ``"*fp32"``,
            ``"*i1"``, ... for tensors, ``"i32"`` for scalars, ``"constexpr"`` for compile-time
            ones (what ``triton.compiler.ASTSource(signature=...)`` takes).
        constants: the values of the ``"constexpr"`` parameters (``None`` for an absent input).
        scalars: the int32 runtime arguments, in order (TensorRT's extra args).
        grid: (x, y, z) programs.
    """

    signature: dict[str, str]
    constants: dict[str, Any]
    scalars: dict[str, Any]
    grid: tuple[Any, Any, Any]
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class TritonKernel:
    """A Triton kernel that computes one :class:`attnx.ops.AttentionOp` in one launch.

    Attributes:
        fn: the ``@triton.jit`` function (an interpreted one under ``TRITON_INTERPRET=1``).
        inputs: the op's tensor inputs, which are the kernel's first parameters, in order.
        scalars: int32 runtime arguments from the present inputs' shapes, in parameter order.
        constants: compile-time arguments from the shapes and the op's attribute values (by
            attribute name); the tactic's blocks are added to them.
        grid: (x, y, z) programs from the shapes and the tactic's blocks.
        tactics: block-size choices; the first is the default.
        output: the kernel's output parameter, after the scalars (one output: the op's first).
    """

    fn: Any
    inputs: Sequence[str]
    scalars: Callable[[Shapes], dict[str, Any]]
    constants: Callable[[Shapes, Mapping[str, Any]], dict[str, Any]]
    grid: Callable[[Shapes, Mapping[str, int]], tuple[Any, Any, Any]]
    tactics: Sequence[Tactic]
    output: str = "out"

    def tactic(self, choice: Tactic | int | str | None = None) -> Tactic:
        """``choice`` as a tactic: a Tactic, its TensorRT number (1-based), its name, or None (the first)."""
        if isinstance(choice, Tactic):
            return choice
        if choice is None:
            return self.tactics[0]
        for number, tactic in enumerate(self.tactics, start=1):
            if choice in (number, tactic.name):
                return tactic
        names = ", ".join(t.name for t in self.tactics)
        raise AttnxError(f"unknown tactic {choice!r} (tactics: {names}, or 1..{len(self.tactics)})")

    def plan(
        self,
        shapes: Shapes,
        dtypes: Mapping[str, str],
        attributes: Mapping[str, Any],
        tactic: Tactic | int | str | None = None,
    ) -> LaunchPlan:
        """This kernel's launch on present inputs of ``shapes`` and Triton ``dtypes`` ("fp32", "i1", ...).

        Inputs absent from ``shapes`` are compile-time ``None``; the output takes the first input's dtype.
        """
        chosen = self.tactic(tactic)
        signature: dict[str, str] = {}
        constants: dict[str, Any] = {}
        for name in self.inputs:
            if name in shapes:
                signature[name] = "*" + dtypes[name]
            else:
                signature[name], constants[name] = "constexpr", None
        scalars = self.scalars(shapes)
        signature.update(dict.fromkeys(scalars, "i32"))
        signature[self.output] = "*" + dtypes[self.inputs[0]]
        compiled = {**self.constants(shapes, attributes), **chosen.blocks}
        signature.update(dict.fromkeys(compiled, "constexpr"))
        return LaunchPlan(
            signature,
            {**constants, **compiled},
            scalars,
            self.grid(shapes, chosen.blocks),
            chosen.num_warps,
            chosen.num_stages,
        )


def load(op: AttentionOp) -> TritonKernel | None:
    """The Triton kernel ``op`` declares, imported (with triton) on first use; None when it has none."""
    if op.kernel is None:
        return None
    return load_object(op.kernel, f"op attnx::{op.name} kernel")


def run(op: AttentionOp, *args: Any, tactic: Tactic | int | str | None = None) -> torch.Tensor:
    """``op``'s Triton kernel on the torch op's arguments (schema order): the torch op's result.

    Tensors on CUDA run compiled; CPU tensors run in Triton's interpreter, which must have been
    switched on (``TRITON_INTERPRET=1``) before triton was first imported (torch._dynamo imports it).

    Raises:
        AttnxError: the op has no kernel, or CPU tensors without the interpreter.
    """
    kernel = load(op)
    if kernel is None:
        raise AttnxError(f"op attnx::{op.name} has no Triton kernel")
    names = [a.name for a in op.arguments]
    bound = dict(zip(names, args, strict=True))
    tensors = {name: bound[name] for name in op.input_names}
    attributes = {name: bound[name] for name in op.attribute_names}
    present = {name: t for name, t in tensors.items() if t is not None}
    shape = op.output_shape({name: tuple(t.shape) for name, t in present.items()})
    return launch(kernel, present, attributes, shape, tactic)


def launch(
    kernel: TritonKernel,
    tensors: Mapping[str, torch.Tensor],
    attributes: Mapping[str, Any],
    output_shape: Sequence[int],
    tactic: Tactic | int | str | None = None,
) -> torch.Tensor:
    """Run ``kernel`` on the present input ``tensors`` (by name); returns the new output tensor."""
    import torch

    inputs = {name: t.contiguous() for name, t in tensors.items()}
    first = inputs[kernel.inputs[0]]
    interpreted = _interpreted(kernel.fn)
    if first.device.type == "cpu" and not interpreted:
        raise AttnxError(
            "Triton kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 "
            "before triton is first imported (torch._dynamo imports it), or use CUDA tensors"
        )
    if interpreted and any(t.dtype == torch.bfloat16 for t in inputs.values()):
        # measured with Triton 3.9: bfloat16 arithmetic in the interpreter returns garbage
        raise AttnxError(
            "Triton's interpreter computes bfloat16 wrongly; use float32 or float16 inputs on CPU"
        )
    plan = kernel.plan(
        {name: tuple(t.shape) for name, t in inputs.items()},
        {name: TRITON_TYPES[str(t.dtype).removeprefix("torch.")] for name, t in inputs.items()},
        attributes,
        tactic,
    )
    out = torch.empty(tuple(output_shape), dtype=first.dtype, device=first.device)
    arguments = {name: inputs.get(name) for name in kernel.inputs} | plan.scalars | {kernel.output: out}
    arguments |= {name: value for name, value in plan.constants.items() if name not in arguments}
    with torch.cuda.device(first.device) if first.is_cuda else contextlib.nullcontext():
        kernel.fn[plan.grid](**arguments, num_warps=plan.num_warps, num_stages=plan.num_stages)
    return out


def _interpreted(fn: Any) -> bool:
    """Whether ``fn`` and triton's own library functions (``tl.zeros``, ...) were defined interpreted:
    triton decides at ``@triton.jit`` time, so an interpreted kernel fails when triton was imported first."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction) and isinstance(tl.zeros, InterpretedFunction)


# -- helpers for kernel rules (ints or TensorRT shape expressions) ------------------------------------


def query_key_scalars(shapes: Shapes) -> dict[str, Any]:
    """H, N_Q, N_K from q, k (batch, heads, length, dim): the scalars of a query-key attention kernel."""
    return {"H": shapes["q"][1], "N_Q": shapes["q"][2], "N_K": shapes["k"][2]}


def row_block_grid(first: str) -> Callable[[Shapes, Mapping[str, int]], tuple[Any, Any, int]]:
    """Grid rule: one program per BLOCK_M rows of input ``first`` (batch, heads, length, dim) per head."""

    def grid(shapes: Shapes, blocks: Mapping[str, int]) -> tuple[Any, Any, int]:
        batch, heads, length = shapes[first][:3]
        return cdiv(length, blocks["BLOCK_M"]), batch * heads, 1

    return grid


def per_head_grid(first: str) -> Callable[[Shapes, Mapping[str, int]], tuple[Any, Any, int]]:
    """Grid rule: ``PROGRAMS`` (a tactic block) programs per head of input ``first``."""

    def grid(shapes: Shapes, blocks: Mapping[str, int]) -> tuple[Any, Any, int]:
        batch, heads = shapes[first][:2]
        return blocks["PROGRAMS"], batch * heads, 1

    return grid


def cdiv(a: Any, b: int) -> Any:
    """ceil(a / b) with ``+ - //`` only, so ``a`` may be a TensorRT shape expression."""
    return (a + (b - 1)) // b


def static(dim: Any, what: str) -> int:
    """``dim`` as an int: a dimension the kernel is compiled for (e.g. the head size).

    Raises:
        AttnxError: ``dim`` is symbolic (TensorRT knows it only at run time).
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise AttnxError(f"the Triton kernel needs a fixed {what}; it is dynamic ({dim!r})")
    return dim


def block(n: int, least: int = 16) -> int:
    """The power of two >= n and >= ``least``: a tile size (``tl.dot`` needs 16 on each side)."""
    return max(least, 1 << max(n - 1, 0).bit_length())
