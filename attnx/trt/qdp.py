"""TensorRT QDP plugins (``tensorrt.plugin``) generated from :class:`attnx.trt.spec.PluginSpec`.

For each ``attnx::<Name>`` this registers, with the documented decorators:

* ``@trtp.register``: inputs as ``TensorDesc``, the fields as typed attributes, one output
  whose shape is the op's ``output_shape`` rule on the input shape expressions and whose
  dtype is the first input's;
* ``@trtp.autotune``: FP32 and FP16 for all float I/O together (``"FP32|FP16"``), the
  mask and other typed inputs at their own type, LINEAR format;
* ``@trtp.impl``: the variant's torch op on TensorRT's stream
  (``torch.cuda.ExternalStream``), inputs and output mapped with ``torch.as_tensor`` on
  their ``__cuda_array_interface__``, as in TensorRT's ``quickly_deployable_plugins`` sample.

No ``@trtp.aot_impl``: each variant's maths is a composition of torch ops, not a single
Triton kernel, so engines need Python and :func:`register_plugins` at load time (JIT QDP).

Optional inputs: QDP has no optional-input syntax and rejects defaults, while TensorRT
passes a plugin exactly the node's inputs (3 for a node without the mask). The generated
functions therefore take ``*args`` and carry an explicit ``__signature__`` with every
input, which is what ``tensorrt.plugin`` validates (``inspect.signature``); at call time
they split ``args`` by the known number of fields.

Registration happens only when asked (a plugin-lowered engine is built or loaded), never
at import; it is idempotent per process.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from attnx.trt.spec import PluginSpec, describe

_REGISTERED: set[str] = set()


def register_plugins(ops: Sequence[Any]) -> list[str]:
    """Register the QDP plugin of every op with TensorRT (idempotent); return their plugin ids.

    Raises:
        ImportError: tensorrt (or its libraries) cannot be imported.
    """
    import tensorrt.plugin as trtp

    ids = []
    for op in ops:
        spec = describe(op)
        if spec.plugin_id not in _REGISTERED:
            register, autotune, impl = plugin_functions(spec, trtp)
            trtp.register(spec.plugin_id)(register)
            trtp.autotune(spec.plugin_id)(autotune)
            trtp.impl(spec.plugin_id)(impl)
            _REGISTERED.add(spec.plugin_id)
        ids.append(spec.plugin_id)
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
    autotune.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_param(i.name) for i in spec.inputs] + [_param("outputs")]
    )
    impl.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_param(name) for name in [*(i.name for i in spec.inputs), *field_names, "outputs", "stream"]]
    )
    for function, role in ((register, "register"), (autotune, "autotune"), (impl, "impl")):
        function.__name__ = function.__qualname__ = f"{spec.name}_{role}"
    return register, autotune, impl


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


def _param(name: str, annotation: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=annotation)
