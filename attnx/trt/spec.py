"""An :class:`attnx.ops.AttentionOp` described as a TensorRT plugin (pure Python, no tensorrt).

Everything is derived from the torch op's schema, exactly as the ONNX schema is:

* plugin id ``attnx::<Name>``, version "1": the plugin lowering's node has op_type
  ``<Name>``, ``plugin_namespace="attnx"`` and ``plugin_version="1"``;
* inputs: the op's tensor arguments, in order; optional ones may be missing at the end;
* fields: the op's non-tensor arguments, named exactly as the ONNX node attributes. The
  ONNX parser hands TensorRT INT/FLOAT/STRING/INTS/FLOATS attributes as int32, float32,
  char, int32[] and float32[] plugin fields, so the QDP annotations are int, float, str,
  ``NDArray[int32]``, ``NDArray[float32]`` (a torch ``bool`` is an ONNX INT, hence ``int``);
* output: one tensor, dtype of the first input, shape from ``AttentionOp.output_shape``.

:meth:`PluginSpec.run` is the one place where a plugin's inputs and field values become a
call of the variant's torch op; the TensorRT plugin and the ONNX Runtime kernels both use
it, so the CPU path exercises the same marshalling as the GPU one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from onnx import AttributeProto, helper

from attnx.domains import PLUGIN_NAMESPACE, PLUGIN_VERSION
from attnx.errors import AttnxError

if TYPE_CHECKING:
    from attnx.ops import AttentionOp

FLOAT_INPUT = "tensor(float)"  # the schema's "T": float, float16, bfloat16
# ONNX input type -> TensorRT autotune type string (dependent "|": all float I/O share one type).
_TRT_TYPES = {
    FLOAT_INPUT: "FP32|FP16",
    "tensor(bool)": "BOOL",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
}
# torch schema type -> (ONNX attribute type, QDP annotation)
_FIELD_TYPES: dict[str, tuple[int, str]] = {
    "bool": (AttributeProto.INT, "int"),
    "int": (AttributeProto.INT, "int"),
    "SymInt": (AttributeProto.INT, "int"),
    "float": (AttributeProto.FLOAT, "float"),
    "str": (AttributeProto.STRING, "str"),
    "int[]": (AttributeProto.INTS, "NDArray[int32]"),
    "List[int]": (AttributeProto.INTS, "NDArray[int32]"),
    "float[]": (AttributeProto.FLOATS, "NDArray[float32]"),
    "List[float]": (AttributeProto.FLOATS, "NDArray[float32]"),
}


@dataclasses.dataclass(frozen=True)
class PluginInput:
    name: str
    optional: bool
    onnx_type: str  # FLOAT_INPUT or the op's input_types entry

    @property
    def trt_types(self) -> str:
        return _TRT_TYPES[self.onnx_type]


@dataclasses.dataclass(frozen=True)
class PluginField:
    """One plugin field = one ONNX node attribute = one non-tensor torch op argument."""

    name: str
    torch_type: str
    onnx_type: int  # onnx.AttributeProto.AttributeType
    qdp_annotation: str

    def to_torch(self, value: Any) -> Any:
        """The torch op's argument from a runtime's field value (python scalar, 1-element array, array)."""
        if self.onnx_type in (AttributeProto.INTS, AttributeProto.FLOATS):
            cast = int if self.onnx_type == AttributeProto.INTS else float
            return [cast(x) for x in value]
        if self.onnx_type == AttributeProto.STRING:
            return value.decode() if isinstance(value, bytes) else str(value)
        scalar = value.item() if hasattr(value, "item") else value  # TensorRT: 1-element arrays
        if self.torch_type == "bool":
            return bool(scalar)
        return float(scalar) if self.onnx_type == AttributeProto.FLOAT else int(scalar)

    def from_attribute(self, attribute: AttributeProto) -> Any:
        """The torch op's argument from the ONNX node attribute; checks name and type."""
        if attribute.name != self.name or attribute.type != self.onnx_type:
            type_name = AttributeProto.AttributeType.Name
            raise AttnxError(
                f"attribute {attribute.name} ({type_name(attribute.type)}) does not match "
                f"plugin field {self.name} ({type_name(self.onnx_type)})"
            )
        return self.to_torch(helper.get_attribute_value(attribute))


@dataclasses.dataclass(frozen=True)
class PluginSpec:
    op: AttentionOp
    inputs: tuple[PluginInput, ...]
    fields: tuple[PluginField, ...]
    namespace: str = PLUGIN_NAMESPACE
    version: str = PLUGIN_VERSION

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def plugin_id(self) -> str:
        return f"{self.namespace}::{self.name}"

    def present(self, count: int) -> tuple[PluginInput, ...]:
        """The inputs a plugin gets when called with ``count`` tensors (optional ones drop off the end)."""
        required = sum(not i.optional for i in self.inputs)
        if not required <= count <= len(self.inputs) or any(not i.optional for i in self.inputs[count:]):
            raise AttnxError(
                f"plugin {self.plugin_id} got {count} inputs; it takes {', '.join(self.signature_inputs())}"
            )
        return self.inputs[:count]

    def signature_inputs(self) -> list[str]:
        return [f"{i.name}?" if i.optional else i.name for i in self.inputs]

    def output_shape(
        self, shapes: Sequence[Sequence[Any]], names: Sequence[str] | None = None
    ) -> tuple[Any, ...]:
        """Evaluate the op's output shape rule on the present inputs' shapes (ints or shape expressions)."""
        names = list(names) if names is not None else [i.name for i in self.present(len(shapes))]
        return tuple(self.op.output_shape(dict(zip(names, shapes, strict=True))))

    @property
    def fields_by_name(self) -> dict[str, PluginField]:
        return {f.name: f for f in self.fields}

    def attributes(self, values: Sequence[Any]) -> dict[str, Any]:
        """Field values as a runtime delivers them (in field order), by name, as the torch op takes them."""
        return {f.name: f.to_torch(value) for f, value in zip(self.fields, values, strict=True)}

    def torch_args(
        self, tensors: Sequence[Any], values: Mapping[str, Any], names: Sequence[str] | None = None
    ) -> list[Any]:
        """Arguments of the torch op, in schema order: missing optional tensors are None."""
        names = list(names) if names is not None else [i.name for i in self.present(len(tensors))]
        given = dict(zip(names, tensors, strict=True))
        missing = [f.name for f in self.fields if f.name not in values]
        if missing:
            raise AttnxError(f"plugin {self.plugin_id} lacks field(s) {', '.join(missing)}")
        fields = {f.name: f for f in self.fields}
        return [
            given.get(arg.name) if arg.is_tensor else fields[arg.name].to_torch(values[arg.name])
            for arg in self.op.arguments
        ]

    def run(
        self, tensors: Sequence[Any], values: Mapping[str, Any], names: Sequence[str] | None = None
    ) -> Any:
        """Call the variant's torch op on ``tensors`` (torch) with field ``values``; check the shape rule."""
        import torch

        with torch.inference_mode():
            result = self.op.torch_op(*self.torch_args(tensors, values, names))
        expected = self.output_shape([tuple(t.shape) for t in tensors], names)
        if tuple(result.shape) != expected:
            raise AttnxError(
                f"op attnx::{self.name} returned shape {tuple(result.shape)} but its output_shape rule gives "
                f"{expected}; set AttentionOp.output_shape for this op"
            )
        return result


def describe(op: AttentionOp) -> PluginSpec:
    """The plugin description of ``op``.

    Raises:
        AttnxError: an argument type TensorRT plugin fields cannot carry, or an input type
            without a TensorRT data type.
    """
    inputs, fields = [], []
    for arg in op.arguments:
        if arg.is_tensor:
            onnx_type = op.input_types.get(arg.name, FLOAT_INPUT)
            if onnx_type not in _TRT_TYPES:
                raise AttnxError(f"op attnx::{op.name}: input {arg.name} ({onnx_type}) has no TensorRT type")
            inputs.append(PluginInput(arg.name, arg.optional, onnx_type))
        else:
            if arg.attribute_type not in _FIELD_TYPES:
                raise AttnxError(
                    f"op attnx::{op.name}: {arg.name} ({arg.attribute_type}) cannot be a plugin field"
                )
            onnx_type, annotation = _FIELD_TYPES[arg.attribute_type]
            fields.append(PluginField(arg.name, arg.attribute_type, onnx_type, annotation))
    return PluginSpec(op, tuple(inputs), tuple(fields))
