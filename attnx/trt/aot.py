"""Ahead-of-time plugin kernels: an op's Triton kernel compiled to PTX for ``tensorrt.plugin.aot_impl``.

The kernel (:mod:`attnx.kernels`, declared by the op as :attr:`attnx.ops.AttentionOp.kernel`)
already follows TensorRT's AOT ABI: input pointers, int32 scalars, the output pointer, then
compile-time constants. This module turns TensorRT's tensor descriptions into the kernel's
shapes and dtypes, compiles a launch plan with ``triton.compile(ASTSource(...))`` (cached), and
decides when a build can use AOT plugins at all (:func:`choose_plugin_mode`). It imports neither
tensorrt nor triton at import time.

* **Shapes.** A dimension TensorRT knows at build time (``desc.shape`` not -1: head sizes, hash
  rounds) is passed as an int, so it can be compiled in; a dynamic one as its shape expression
  (``desc.shape_expr``: the kernel's scalars and grid become TensorRT ``SymInt32`` expressions),
  or, where only the compiled kernel matters (``autotune``), as :data:`DYNAMIC`, which a kernel
  rule cannot compile in (``attnx.kernels.static`` refuses it).
* **Shared memory.** A kernel may use at most 48 KiB of dynamic shared memory unless the launcher
  raises ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``; TensorRT's AOT launcher is not open
  source and nothing documents that it does, so tactics above :data:`SHARED_MEMORY_LIMIT` are not
  offered. Before TensorRT runs, :func:`kernel_blocker` compiles the tactics for every plugin node
  of the graph (shapes and dtypes from the exporter's ``value_info``, dynamic dims left dynamic):
  an op none of whose tactics fits makes the build JIT (e.g. causal cosFormer at head size 64).
* **Triton's own parameters.** PTX from Triton >= 3.3 ends with global/profile scratch pointers;
  TensorRT pads kernel arguments it was not given with null (Torch-TensorRT's AOT path relies on
  this, libnvinfer logs "hidden args ... Padding with null/zero values"), which is right only for
  kernels that use no scratch memory: a kernel reporting scratch is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import onnx

from attnx.errors import AttnxError
from attnx.exporter.lowering import attnx_nodes
from attnx.kernels import LaunchPlan, TritonKernel, load
from attnx.trt import triton_missing
from attnx.trt.spec import describe

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

SHARED_MEMORY_LIMIT = 48 * 1024  # bytes of dynamic shared memory a launch gets without an opt-in
# TensorRT data type names (trt.DataType member names and autotune type strings) -> Triton types
TRITON_TYPES = {
    "FLOAT": "fp32", "FP32": "fp32", "HALF": "fp16", "FP16": "fp16", "BF16": "bf16",
    "BOOL": "i1", "INT32": "i32", "INT64": "i64",
}  # fmt: skip
FLOAT_TYPES = ("FP32", "FP16")  # the float I/O types the plugins offer TensorRT

PluginMode = Literal["aot", "jit"]


class _Dynamic:
    """A dimension known only at run time, where no expression is at hand: arithmetic keeps it dynamic."""

    def __repr__(self) -> str:
        return "a run-time dimension"

    def _same(self, other: object) -> _Dynamic:
        return self

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __floordiv__ = _same


DYNAMIC = _Dynamic()


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """What ``aot_impl`` returns for one launch plan: the PTX entry, the PTX, and its launch facts."""

    name: str
    ptx: str
    shared: int  # bytes of dynamic shared memory per program
    num_warps: int  # as compiled (Triton may lower the request)


Compiler = Callable[[TritonKernel, LaunchPlan], CompiledKernel]


def desc_dims(desc: Any, symbolic: bool) -> tuple[Any, ...]:
    """The dims of a ``tensorrt.plugin.TensorDesc``: ints where TensorRT knows them at build time, else
    the shape expression (``symbolic``) or :data:`DYNAMIC`."""
    return tuple(
        int(size) if size >= 0 else (desc.shape_expr[axis] if symbolic else DYNAMIC)
        for axis, size in enumerate(desc.shape)
    )


def triton_type(trt_name: str) -> str:
    """The Triton type of a TensorRT data type name ("FLOAT", "HALF", "FP32", "BOOL", ...)."""
    if trt_name not in TRITON_TYPES:
        raise AttnxError(f"the attnx Triton kernels take no TensorRT {trt_name} tensors")
    return TRITON_TYPES[trt_name]


def shared_memory(
    kernel: TritonKernel,
    shapes: Mapping[str, Sequence[Any]],
    dtypes: Mapping[str, str],
    attributes: Mapping[str, Any],
    compiler: Compiler,
) -> list[int]:
    """Bytes of shared memory each tactic of the kernel needs for these inputs (compiled by ``compiler``)."""
    plans = [kernel.plan(shapes, dtypes, attributes, tactic) for tactic in kernel.tactics]
    return [compiler(kernel, plan).shared for plan in plans]


def fitting_tactics(shared: Sequence[int]) -> list[int]:
    """The TensorRT numbers (1-based) of the tactics that fit in :data:`SHARED_MEMORY_LIMIT`."""
    return [number for number, size in enumerate(shared, start=1) if size <= SHARED_MEMORY_LIMIT]


def kernel_blocker(
    model: onnx.ModelProto, ops: Sequence[AttentionOp], compiler: Compiler | None = None
) -> str | None:
    """Why some plugin node of ``model`` cannot run as an AOT kernel (None when all can): no tactic of its
    op's kernel fits in :data:`SHARED_MEMORY_LIMIT` for the node's inputs. Nodes whose input shapes the
    graph does not record are left to the build-time check (``autotune``)."""
    known = {v.name: v.type.tensor_type for v in [*model.graph.input, *model.graph.value_info]}
    specs = {op.name: (describe(op), op) for op in ops}
    for node in attnx_nodes(model):
        spec, op = specs[node.op_type]
        inputs = list(zip(spec.present(len(node.input)), node.input, strict=True))
        if any(name not in known for _, name in inputs):
            continue
        shapes = {i.name: _onnx_dims(known[name]) for i, name in inputs}
        dtypes = {i.name: triton_type(_ONNX_TYPES.get(known[name].elem_type, "?")) for i, name in inputs}
        attributes = {a.name: spec.fields_by_name[a.name].from_attribute(a) for a in node.attribute
                      if a.name in spec.fields_by_name}  # fmt: skip
        shared = shared_memory(kernel_of(op), shapes, dtypes, attributes, compiler or compile_plan)
        if not fitting_tactics(shared):
            return (
                f"attnx::{op.name}'s Triton kernel needs {min(shared) / 1024:.0f} KiB of shared memory for "
                f"node {node.name} (AOT launches get {SHARED_MEMORY_LIMIT // 1024} KiB)"
            )
    return None


_ONNX_TYPES = {
    onnx.TensorProto.FLOAT: "FLOAT", onnx.TensorProto.FLOAT16: "HALF", onnx.TensorProto.BFLOAT16: "BF16",
    onnx.TensorProto.BOOL: "BOOL", onnx.TensorProto.INT32: "INT32", onnx.TensorProto.INT64: "INT64",
}  # fmt: skip


def _onnx_dims(tensor_type: onnx.TypeProto.Tensor) -> tuple[Any, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC for d in tensor_type.shape.dim)


_COMPILED: dict[tuple[Any, ...], CompiledKernel] = {}


def compile_plan(kernel: TritonKernel, plan: LaunchPlan, target: Any = None) -> CompiledKernel:
    """``kernel`` compiled for ``plan`` to PTX (cached per signature, constants and options).

    ``target`` is a ``triton.backends.compiler.GPUTarget`` (None: the current CUDA device).

    Raises:
        AttnxError: Triton cannot compile here (not installed, or its interpreter is on), or the
            kernel needs scratch memory, which TensorRT does not provide.
    """
    key = (
        kernel.fn.__name__,
        tuple(plan.signature.items()),
        tuple((name, _hashable(value)) for name, value in plan.constants.items()),
        plan.num_warps,
        plan.num_stages,
        repr(target),
    )
    if key not in _COMPILED:
        _COMPILED[key] = _compile(kernel, plan, target)
    return _COMPILED[key]


def _compile(kernel: TritonKernel, plan: LaunchPlan, target: Any) -> CompiledKernel:
    reason = triton_missing()
    if reason:
        raise AttnxError(f"cannot compile the AOT kernel {kernel.fn.__name__}: {reason}")
    import triton

    source = triton.compiler.ASTSource(fn=kernel.fn, signature=plan.signature, constexprs=plan.constants)
    options = {"num_warps": plan.num_warps, "num_stages": plan.num_stages}
    compiled = triton.compile(source, target=target, options=options)
    meta = compiled.metadata
    scratch = getattr(meta, "global_scratch_size", 0), getattr(meta, "profile_scratch_size", 0)
    if any(scratch):
        raise AttnxError(
            f"Triton kernel {meta.name} needs scratch memory {scratch} (global, profile), which a TensorRT "
            "AOT plugin cannot provide; build with --jit"
        )
    return CompiledKernel(meta.name, compiled.asm["ptx"], int(meta.shared), int(meta.num_warps))


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)


def choose_plugin_mode(
    ops: Sequence[AttentionOp],
    requested: PluginMode | None,
    triton_reason: str | None,
    tensorrt_reason: str | None,
    kernel_reason: Callable[[], str | None] = lambda: None,
) -> tuple[PluginMode | None, str]:
    """How the plugins of ``ops`` run, and why: AOT when every op declares a Triton kernel, Triton can
    compile, TensorRT has AOT plugins and the kernels fit (``--aot`` insists, ``--jit`` declines); None
    without plugins.

    Args:
        ops: the export's plugin ops (empty: the graph has no attnx plugin nodes).
        requested: "aot" (``--aot``), "jit" (``--jit``) or None (choose).
        triton_reason: why Triton cannot compile here (:func:`attnx.trt.triton_missing`), or None.
        tensorrt_reason: why this TensorRT has no AOT plugins, or None.
        kernel_reason: called last, when all else allows AOT: why the kernels cannot serve the graph
            (:func:`kernel_blocker`), or None.

    Raises:
        AttnxError: ``--aot`` where AOT cannot be had (naming why and ``--jit``).
    """
    if not ops:
        return None, "no attnx plugin nodes in the graph"
    if requested == "jit":
        return "jit", "--jit"
    without = [f"attnx::{op.name}" for op in ops if op.kernel is None]
    reason = (
        f"{', '.join(without)} {'has' if len(without) == 1 else 'have'} no Triton kernel" if without
        else triton_reason or tensorrt_reason or kernel_reason()
    )  # fmt: skip
    if reason is None:
        return "aot", "--aot" if requested == "aot" else "every plugin op has a Triton kernel"
    if requested == "aot":
        raise AttnxError(f"--aot: {reason}; build with --jit (the engine then needs Python and attnx)")
    return "jit", reason


def kernel_of(op: AttentionOp) -> TritonKernel:
    """The op's Triton kernel (imports it and triton).

    Raises:
        AttnxError: the op declares none.
    """
    kernel = load(op)
    if kernel is None:
        raise AttnxError(f"op attnx::{op.name} has no Triton kernel; build with --jit")
    return kernel


def tensorrt_aot_missing() -> str | None:
    """Why the installed TensorRT has no AOT Python plugins (None when it has them)."""
    import tensorrt.plugin as trtp

    if hasattr(trtp, "aot_impl") and hasattr(trtp, "KernelLaunchParams"):
        return None
    return "this TensorRT has no AOT Python plugins (tensorrt.plugin.aot_impl/KernelLaunchParams)"
