"""ONNX Runtime CPU kernels for the bare ``attnx::<Op>`` nodes of plugin-lowered models.

Each kernel is an onnxruntime-extensions PyOp in the ``attnx`` domain that computes the
node from its inputs and attributes only, through :meth:`attnx.trt.spec.PluginSpec.run`:
the same marshalling (inputs by position, fields by attribute name) and the same torch op
the TensorRT plugin calls on the GPU. So a plugin-lowered model that matches torch here has
nodes that carry everything a plugin needs; the maths itself is checked against the
independent ONNX bodies by the ``function``/``decomposed`` lowerings and the variants' tests.

PyOps have fixed arity and read only int, float and string attributes, so ORT sees a
re-encoded copy of each node (:func:`kernel_view`), never a different computation:

* a node that omits optional inputs calls the kernel ``<Op>_<present inputs>`` (the same
  naming as the function lowering's overloads) registered with exactly those inputs;
* INTS/FLOATS attributes travel as JSON strings and are decoded before the call.

* PyOps have no float16 type, so in an fp16 model each node's float inputs are cast to
  float32 before the kernel and its output back to float16 after it (the op computed at
  higher precision, as a TensorRT plugin may also choose).

Kernels run on the CPU execution provider.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import onnx
from onnx import AttributeProto, TensorProto, helper

from attnx.domains import DOMAIN
from attnx.errors import AttnxError
from attnx.registry import get_registry
from attnx.trt.spec import FLOAT_INPUT, PluginSpec, describe

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

INSTALL_HINT = "pip install onnxruntime-extensions"
_LISTS = (AttributeProto.INTS, AttributeProto.FLOATS)
_REGISTERED: set[str] = set()


def kernels_missing() -> str | None:
    """Why the attnx kernels cannot run here (None when they can)."""
    try:
        import onnxruntime_extensions  # noqa: F401
    except ImportError as exc:
        return f"onnxruntime-extensions is not importable ({exc}); {INSTALL_HINT}"
    return None


def kernel_name(spec: PluginSpec, present: Sequence[str]) -> str:
    """``<Op>`` when every input is given, else ``<Op>_<present inputs joined by _>``."""
    if list(present) == [i.name for i in spec.inputs]:
        return spec.name
    return f"{spec.name}_{'_'.join(present)}"


def kernel_view(model: onnx.ModelProto, ops: Sequence[AttentionOp]) -> onnx.ModelProto:
    """A copy of a plugin-lowered ``model`` whose attnx nodes call registered attnx kernels.

    Raises:
        AttnxError: a node of an op the model's variants do not provide, or onnxruntime-extensions missing.
    """
    missing = kernels_missing()
    if missing:
        raise AttnxError(f"a plugin-lowered model on ONNX Runtime CPU needs the attnx kernels: {missing}")
    specs = {op.name: describe(op) for op in ops}
    register_all(specs.values())
    view = onnx.ModelProto()
    view.CopyFrom(model)
    half = _activation_type(view) == TensorProto.FLOAT16
    nodes: list[onnx.NodeProto] = []
    for node in view.graph.node:
        if node.domain != DOMAIN:
            nodes.append(node)
            continue
        spec = specs.get(node.op_type)
        if spec is None:
            raise AttnxError(f"no attnx op named '{node.op_type}' is registered by the model's variants")
        if len(node.input) > len(spec.inputs):
            raise AttnxError(f"node {node.name}: attnx::{spec.name} takes at most {len(spec.inputs)} inputs")
        given = [(i, value) for i, value in zip(spec.inputs, node.input, strict=False) if value]
        present = [i.name for i, _ in given]
        absent = [i.name for i in spec.inputs if not i.optional and i.name not in present]
        if absent:
            raise AttnxError(f"node {node.name}: attnx::{spec.name} lacks input(s) {', '.join(absent)}")
        node.op_type = register_kernel(spec, present)
        del node.input[:]
        node.input.extend(value for _, value in given)
        for attribute in node.attribute:
            if attribute.type in _LISTS:
                text = json.dumps(list(helper.get_attribute_value(attribute)))
                attribute.CopyFrom(helper.make_attribute(attribute.name, text))
        floats = [k for k, (i, _) in enumerate(given) if i.onnx_type == FLOAT_INPUT]
        nodes += _in_float32(node, floats) if half else [node]
    del view.graph.node[:]
    view.graph.node.extend(nodes)
    return view


def _in_float32(node: onnx.NodeProto, floats: Sequence[int]) -> list[onnx.NodeProto]:
    """``node`` between Casts: float inputs (positions ``floats``) to float32, its output back to float16."""
    casts = []
    for index in floats:
        wide = f"{node.input[index]}__fp32__{node.name}"
        casts.append(helper.make_node("Cast", [node.input[index]], [wide], to=TensorProto.FLOAT))
        node.input[index] = wide
    out = node.output[0]
    node.output[0] = f"{out}__fp32"
    return [*casts, node, helper.make_node("Cast", [node.output[0]], [out], to=TensorProto.FLOAT16)]


def _activation_type(model: onnx.ModelProto) -> int:
    """The element type of the model's first floating-point output (its activations' type)."""
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)
    types = [v.type.tensor_type.elem_type for v in model.graph.output]
    return next((t for t in types if t in floats), TensorProto.FLOAT)


def register_all(extra: Any = ()) -> None:
    """Register the kernels of every op attnx knows of (each optional-input combination).

    onnxruntime-extensions rebuilds its kernel table on each registration, and a session
    created before a later registration crashes (segfault) when it runs next. So the first
    use registers everything the registry provides, and later uses register only what is
    new (an op of a plugin loaded after that, which no earlier session can use).
    """
    specs = {spec.name: spec for spec in extra}
    if not _REGISTERED:
        specs.update((spec.name, spec) for spec in _known_specs())
    for spec in specs.values():
        for present in _input_combinations(spec):
            register_kernel(spec, present)


def _known_specs() -> Iterator[PluginSpec]:
    for variant in get_registry().variants.values():
        try:
            ops = variant.load().ops
        except Exception:  # a broken variant is reported by `attnx list`; it has no kernels
            continue
        yield from (describe(op) for op in ops)


def _input_combinations(spec: PluginSpec) -> Iterator[list[str]]:
    optional = [i.name for i in spec.inputs if i.optional]
    for chosen in itertools.product((False, True), repeat=len(optional)):
        absent = {name for name, keep in zip(optional, chosen, strict=True) if not keep}
        yield [i.name for i in spec.inputs if i.name not in absent]


def register_kernel(spec: PluginSpec, present: Sequence[str]) -> str:
    """Register (once per process) the PyOp computing ``spec`` from ``present`` inputs; return its op type."""
    from onnxruntime_extensions import PyCustomOpDef, onnx_op

    name = kernel_name(spec, present)
    if name in _REGISTERED:
        return name
    by_name = {i.name: i for i in spec.inputs}
    input_types = [_DTYPES[by_name[n].onnx_type](PyCustomOpDef) for n in present]
    attrs = {f.name: _attribute_dtype(f.onnx_type, PyCustomOpDef) for f in spec.fields}
    onnx_op(op_type=f"{DOMAIN}::{name}", inputs=input_types, outputs=[PyCustomOpDef.dt_float], attrs=attrs)(
        _kernel(spec, present)
    )
    _REGISTERED.add(name)
    return name


def session_options() -> Any:
    """ORT session options with the onnxruntime-extensions library (and so the attnx kernels) loaded."""
    import onnxruntime
    from onnxruntime_extensions import get_library_path

    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    return options


def _kernel(spec: PluginSpec, present: Sequence[str]) -> Callable[..., Any]:
    lists = {f.name for f in spec.fields if f.onnx_type in _LISTS}

    def kernel(*arrays: Any, **attributes: Any) -> Any:
        import numpy as np
        import torch

        values = {k: json.loads(v) if k in lists else v for k, v in attributes.items()}
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        return spec.run(tensors, values, present).numpy()

    kernel.__name__ = kernel.__qualname__ = f"attnx_kernel_{kernel_name(spec, present)}"
    return kernel


def _attribute_dtype(onnx_type: int, defs: Any) -> int:
    if onnx_type == AttributeProto.INT:
        return defs.dt_int64
    if onnx_type == AttributeProto.FLOAT:
        return defs.dt_float
    return defs.dt_string  # STRING, and INTS/FLOATS re-encoded as JSON


_DTYPES: dict[str, Callable[[Any], int]] = {
    FLOAT_INPUT: lambda d: d.dt_float,
    "tensor(bool)": lambda d: d.dt_bool,
    "tensor(int32)": lambda d: d.dt_int32,
    "tensor(int64)": lambda d: d.dt_int64,
}
