"""TensorRT QDP plugins (``tensorrt.plugin``) generated from :class:`attnx.trt.spec.PluginSpec`.

For each ``attnx::<Name>`` this registers, with the documented decorators:

* ``@trtp.register``: inputs as ``TensorDesc``, the fields as typed attributes, one output
  whose shape is the op's ``output_shape`` rule on the input shape expressions and whose
  dtype is the first input's;
* ``@trtp.autotune``: FP32 and FP16 for all float I/O together (``"FP32|FP16"``), the
  mask and other typed inputs at their own type, LINEAR format;
* ``@trtp.impl`` (JIT): the variant's torch op on TensorRT's stream
  (``torch.cuda.ExternalStream``), inputs and output mapped with ``torch.as_tensor`` on
  their ``__cuda_array_interface__``, as in TensorRT's ``quickly_deployable_plugins`` sample.
  A JIT engine needs Python, torch and these registrations wherever it is loaded.

With ``aot=True``, every op that declares a Triton kernel (:attr:`attnx.ops.AttentionOp.kernel`)
also gets, generated the same way from the spec and the kernel's description:

* ``@trtp.aot_impl``: the kernel compiled to PTX for the present inputs' dtypes and build-time
  dims (:mod:`attnx.trt.aot`), the grid, block and shared memory as ``KernelLaunchParams`` and
  the kernel's int32 scalars as ``SymInt32`` extra args (expressions of the input shapes). The
  PTX serialises into the engine, which then loads without Python;
* ``@trtp.autotune`` (replacing the JIT one while AOT is asked for): per float type, the kernel's tactics
  (``AutoTuneCombination(..., tactics=[1, 2])``) that fit in 48 KiB of shared memory; TensorRT
  times them and keeps the fastest. It takes the fields, which the kernel compiles in.

Which implementation an engine uses is the network's choice (``PREFER_AOT_PYTHON_PLUGINS`` /
``PREFER_JIT_PYTHON_PLUGINS``, :mod:`attnx.trt.engine`); an op with only ``impl`` is always JIT.

Optional inputs: QDP has no optional-input syntax and rejects defaults, while TensorRT
passes a plugin exactly the node's inputs (3 for a node without the mask). The generated
functions therefore take ``*args`` and carry an explicit ``__signature__`` with every
input, which is what ``tensorrt.plugin`` validates (``inspect.signature``); at call time
they split ``args`` by the known number of fields (TensorRT passes every field, in
registration order, to ``impl``, ``autotune`` and ``aot_impl`` alike).

Exceptions raised inside these callbacks reach TensorRT, which logs them and fails the build;
:data:`CALLBACKS` keeps the attnx errors so that ``attnx build`` can say what went wrong, and
counts the AOT compilations per plugin.

Registration happens only when asked (a plugin-lowered engine is built or loaded), never
at import; it is idempotent per process.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from attnx.errors import AttnxError
from attnx.kernels import TritonKernel
from attnx.trt import aot
from attnx.trt.spec import FLOAT_INPUT, PluginSpec, describe


@dataclasses.dataclass
class CallbackLog:
    """What the AOT callbacks did in this process: attnx errors raised, ``aot_impl`` calls per plugin id."""

    errors: list[AttnxError] = dataclasses.field(default_factory=list)
    aot_calls: Counter[str] = dataclasses.field(default_factory=Counter)

    def clear(self) -> None:
        self.errors.clear()
        self.aot_calls.clear()


CALLBACKS = CallbackLog()


@dataclasses.dataclass
class _Registration:
    jit_autotune: Callable[..., Any]
    aot_autotune: Callable[..., Any] | None = None  # set once aot_impl is registered
    autotune: str = "jit"  # which autotune TensorRT currently has


_REGISTERED: dict[str, _Registration] = {}  # plugin id -> what is registered


def register_plugins(ops: Sequence[Any], aot_kernels: bool = False) -> list[str]:
    """Register the QDP plugin of every op with TensorRT (idempotent); return their plugin ids.

    With ``aot_kernels``, ops that declare a Triton kernel also get ``aot_impl`` and the tactic
    autotune; without, they get the JIT autotune back (a process may build AOT, then JIT).

    Raises:
        ImportError: tensorrt (or its libraries) cannot be imported.
    """
    import tensorrt.plugin as trtp

    ids = []
    for op in ops:
        spec = describe(op)
        plugin = spec.plugin_id
        if plugin not in _REGISTERED:
            register, autotune, impl = plugin_functions(spec, trtp)
            trtp.register(plugin)(register)
            trtp.autotune(plugin)(autotune)
            trtp.impl(plugin)(impl)
            _REGISTERED[plugin] = _Registration(autotune)
        entry = _REGISTERED[plugin]
        wanted = "aot" if aot_kernels and op.kernel is not None else "jit"
        if wanted == "aot" and entry.aot_autotune is None:
            entry.aot_autotune, aot_impl = aot_functions(spec, aot.kernel_of(op), trtp)
            trtp.aot_impl(plugin)(aot_impl)
        if entry.autotune != wanted:
            trtp.autotune(plugin)(entry.aot_autotune if wanted == "aot" else entry.jit_autotune)
            entry.autotune = wanted
        ids.append(plugin)
    return ids


def plugin_functions(spec: PluginSpec, trtp: Any) -> tuple[Callable[..., Any], ...]:
    """The (register, autotune, impl) functions of ``spec`` for the ``tensorrt.plugin`` module ``trtp``."""
    field_names = [f.name for f in spec.fields]

    def register(*tensors: Any, **values: Any) -> Any:
        shape = spec.output_shape([t.shape_expr for t in tensors])
        return trtp.from_shape_expr(tuple(shape), dtype=tensors[0].dtype)

    def autotune(*args: Any) -> list[Any]:
        *tensors, _outputs = args
        types = [i.trt_types for i in spec.present(len(tensors))] + ["FP32|FP16"]
        return [trtp.AutoTuneCombination(", ".join(types), "LINEAR")]

    def impl(*args: Any, stream: int) -> None:
        tensors, values, outputs = split_impl_args(args, field_names)
        import torch

        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            inputs = [torch.as_tensor(t, device="cuda") for t in tensors]
            result = spec.run(inputs, dict(zip(field_names, values, strict=True)))
            torch.as_tensor(outputs[0], device="cuda").copy_(result)

    tensor_params = [_param(i.name, trtp.TensorDesc) for i in spec.inputs]
    register.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        tensor_params + [_param(f.name, qdp_type(f.qdp_annotation)) for f in spec.fields],
        return_annotation=trtp.TensorDesc,
    )
    autotune.__signature__ = _signature(spec, "outputs", fields=False)  # type: ignore[attr-defined]
    impl.__signature__ = _signature(spec, "outputs", "stream")  # type: ignore[attr-defined]
    return _named(spec, "register", register), _named(spec, "autotune", autotune), _named(spec, "impl", impl)


def aot_functions(
    spec: PluginSpec, kernel: TritonKernel, trtp: Any, compiler: aot.Compiler = aot.compile_plan
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The (autotune, aot_impl) functions of ``spec`` computed by ``kernel`` (compiled with ``compiler``)."""
    field_names = [f.name for f in spec.fields]

    def autotune(*args: Any) -> list[Any]:
        tensors, values, _outputs = split_impl_args(args, field_names)
        present = spec.present(len(tensors))
        shapes = {i.name: aot.desc_dims(t, symbolic=False) for i, t in zip(present, tensors, strict=True)}
        combinations = []
        for float_type in aot.FLOAT_TYPES:
            types = [float_type if i.onnx_type == FLOAT_INPUT else i.trt_types for i in present]
            dtypes = {i.name: aot.triton_type(t) for i, t in zip(present, types, strict=True)}
            shared = aot.shared_memory(kernel, shapes, dtypes, spec.attributes(values), compiler)
            tactics = aot.fitting_tactics(shared)
            if tactics:
                io_types = ", ".join([*types, float_type])
                combinations.append(trtp.AutoTuneCombination(io_types, "LINEAR", tactics))
        if not combinations:
            raise AttnxError(
                f"{spec.plugin_id}: every tactic of its Triton kernel needs more than "
                f"{aot.SHARED_MEMORY_LIMIT // 1024} KiB of shared memory at these shapes; build with --jit"
            )
        return combinations

    def aot_impl(*args: Any) -> tuple[str, str, Any, Any]:
        *head, tactic = args
        tensors, values, _outputs = split_impl_args(head, field_names)
        present = spec.present(len(tensors))
        plan = kernel.plan(
            {i.name: aot.desc_dims(t, symbolic=True) for i, t in zip(present, tensors, strict=True)},
            {i.name: aot.triton_type(t.dtype.name) for i, t in zip(present, tensors, strict=True)},
            spec.attributes(values),
            tactic or None,  # 0: TensorRT's default tactic (none declared)
        )
        compiled = compiler(kernel, plan)
        if compiled.shared > aot.SHARED_MEMORY_LIMIT:  # autotune offers no such tactic
            raise AttnxError(f"{spec.plugin_id}: tactic {tactic} needs {compiled.shared} B of shared memory")
        params = trtp.KernelLaunchParams()
        params.grid_x, params.grid_y, params.grid_z = plan.grid
        params.block_x = compiled.num_warps * 32
        params.shared_mem = compiled.shared
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(value) for value in plan.scalars.values()])
        CALLBACKS.aot_calls[spec.plugin_id] += 1
        return compiled.name, compiled.ptx, params, extra

    autotune.__signature__ = _signature(spec, "outputs")  # type: ignore[attr-defined]
    aot_impl.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        _signature(spec, "outputs", "tactic").parameters.values(),
        return_annotation=tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs],
    )
    return _logged(_named(spec, "aot_autotune", autotune)), _logged(_named(spec, "aot_impl", aot_impl))


def split_impl_args(args: Sequence[Any], field_names: Sequence[str]) -> tuple[list[Any], list[Any], Any]:
    """TensorRT calls ``impl(*inputs, *field_values, outputs, stream=...)``; split the positional part."""
    *head, outputs = args
    cut = len(head) - len(field_names)
    return list(head[:cut]), list(head[cut:]), outputs


def qdp_type(annotation: str) -> Any:
    """The Python annotation ``tensorrt.plugin`` expects for a field type name."""
    if annotation.startswith("NDArray["):
        import numpy as np
        import numpy.typing as npt

        return npt.NDArray[getattr(np, annotation[len("NDArray["):-1])]
    return {"int": int, "float": float, "str": str}[annotation]


def _signature(spec: PluginSpec, *trailing: str, fields: bool = True) -> inspect.Signature:
    """``(inputs..., [fields...,] trailing...)`` without annotations."""
    names = [i.name for i in spec.inputs] + ([f.name for f in spec.fields] if fields else []) + list(trailing)
    return inspect.Signature([_param(name) for name in names])


def _named(spec: PluginSpec, role: str, function: Callable[..., Any]) -> Callable[..., Any]:
    function.__name__ = function.__qualname__ = f"{spec.name}_{role}"
    return function


def _logged(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` recording the AttnxErrors it raises in :data:`CALLBACKS` (TensorRT only logs them)."""

    @functools.wraps(function)
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except AttnxError as exc:
            CALLBACKS.errors.append(exc)
            raise

    return call


def _param(name: str, annotation: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
