"""The torch/ONNX side of the variant contract: custom ops, their ONNX schemas and bodies.

A variant's maths is a ``torch.library.custom_op`` in the ``attnx`` namespace (with a
``register_fake``). :class:`AttentionOp` pairs it with onnxscript function bodies;
attnx derives everything else from the torch op's schema:

* the ONNX ``OpSchema`` for ``attnx::<Name>`` (tensor arguments become inputs,
  ``Tensor?`` ones optional; bool/int/float/list arguments become attributes),
* the exporter's translation function, which emits the bare ``attnx::<Name>`` node,
* which body serves a node: a node that omits optional inputs is served by the
  body whose parameters are exactly the inputs it has (an ONNX function overload).

:func:`trainable_op` defines such an op with a backward derived from its own eager code.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnxscript
import torch
from onnx import defs
from onnxscript import opset18

from attnx.domains import DOMAIN, LIBRARY_DOMAIN
from attnx.targets import PORTABLE
from attnx.variant import AttentionSpec

OPSET = onnxscript.values.Opset(DOMAIN, 1)
LIBRARY = onnxscript.values.Opset(LIBRARY_DOMAIN, 1)
FLOAT_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]

# Where a body must compute in float32 (sums that would overflow fp16), Cast(to=FLOAT) breaks the fp16
# converters (onnxconverter-common, onnxruntime.transformers.float16): they retype every float tensor of
# the graphs they visit to float16, so an inlined (decomposed) Cast output no longer matches its declared
# type. They convert constant tensors too, so CastLike against one widens to float32 in a model-local
# function (converters do not visit those) and to whatever the converted graph computes in once
# inlined. Constants meet tensors the same way: CastLike(constant, tensor), never a float32 literal.
_ACCUMULATOR = onnxscript.ir.tensor([0.0], dtype=onnxscript.ir.DataType.FLOAT)


@onnxscript.script(LIBRARY, default_opset=opset18)
def AttnxWiden(x):
    """x in float32, the dtype-generic way (float16 after an fp16 converter inlined it)."""
    return opset18.CastLike(x, opset18.Constant(value=_ACCUMULATOR))


_ATTRIBUTE_TYPES: dict[str, tuple[Any, type]] = {
    "bool": (defs.OpSchema.AttrType.INT, int),
    "int": (defs.OpSchema.AttrType.INT, int),
    "SymInt": (defs.OpSchema.AttrType.INT, int),
    "float": (defs.OpSchema.AttrType.FLOAT, float),
    "str": (defs.OpSchema.AttrType.STRING, str),
    "List[int]": (defs.OpSchema.AttrType.INTS, list),
    "int[]": (defs.OpSchema.AttrType.INTS, list),
    "List[float]": (defs.OpSchema.AttrType.FLOATS, list),
    "float[]": (defs.OpSchema.AttrType.FLOATS, list),
}


def trainable_op(qualname: str) -> Callable[[Callable[..., Any]], Any]:
    """``torch.library.custom_op(qualname, mutates_args=())`` with a backward derived from the function.

    The decorated function must be differentiable torch code (attnx ops are written in ATen
    ops). The backward re-runs it under ``torch.enable_grad()`` on the saved inputs and returns
    the vector-Jacobian product (``torch.autograd.grad``); inputs that are not float tensors
    (masks, ints, bools, floats) get no gradient, nor does anything reached only through a
    piecewise-constant step (an argmax, a sort: reformer's buckets stay fixed). With
    ``create_graph=True`` the backward is itself differentiable (higher-order gradients).

    Memory: only the inputs are saved; the forward's intermediates are recomputed during
    backward (one extra forward per backward), like activation checkpointing. It works
    eagerly, under ``torch.compile`` and ``torch.export`` (the op stays one node).
    """

    def define(fn: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(qualname, mutates_args=())(fn)
        op.register_autograd(_recompute_backward(fn), setup_context=_save_inputs)
        return op

    return define


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.tensor_positions = [i for i, value in enumerate(inputs) if isinstance(value, torch.Tensor)]
    ctx.arguments = [None if isinstance(value, torch.Tensor) else value for value in inputs]
    ctx.save_for_backward(*(inputs[i] for i in ctx.tensor_positions))


def _recompute_backward(fn: Callable[..., Any]) -> Callable[..., tuple[Any, ...]]:
    def backward(ctx: Any, *grad_outputs: torch.Tensor | None) -> tuple[Any, ...]:
        higher_order = torch.is_grad_enabled()  # backward(create_graph=True)
        arguments = list(ctx.arguments)
        wanted = []
        for position, tensor in zip(ctx.tensor_positions, ctx.saved_tensors, strict=True):
            if ctx.needs_input_grad[position]:
                tensor = tensor if higher_order else tensor.detach().requires_grad_()
                wanted.append(position)
            arguments[position] = tensor
        with torch.enable_grad():
            outputs = fn(*arguments)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if g is not None]
        pairs = [(o, g) for o, g in pairs if o.requires_grad]
        gradients: list[Any] = [None] * len(arguments)
        if pairs and wanted:
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [arguments[p] for p in wanted],
                [g for _, g in pairs],
                allow_unused=True,
                create_graph=higher_order,
            )
            for position, gradient in zip(wanted, found, strict=True):
                # contiguous: eager and fake kernels may lay a gradient out differently, and a backward
                # traced by torch.compile (AOTAutograd) relies on the traced strides
                gradients[position] = None if gradient is None else gradient.contiguous()
        return tuple(gradients)

    return backward


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or float64 if it is float64: the compute dtype of attnx's sums and features
    (half precision would overflow or round them; float64 is kept for ``gradcheck``)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def query_shaped_output(shapes: Mapping[str, Sequence[Any]]) -> tuple[Any, ...]:
    """Default output shape: the first input's (the queries') shape with ``v``'s last dimension."""
    first = next(iter(shapes.values()))
    return (*first[:-1], shapes.get("v", first)[-1])


@dataclasses.dataclass(frozen=True)
class OpArgument:
    name: str
    is_tensor: bool
    optional: bool = False
    attribute_type: str | None = None  # torch type string for attributes

    @property
    def onnx_type(self) -> int:
        """The ONNX ``AttributeProto`` type of an attribute argument."""
        assert self.attribute_type is not None, f"{self.name} is a tensor, not an attribute"
        return int(_ATTRIBUTE_TYPES[self.attribute_type][0])


@dataclasses.dataclass(frozen=True)
class SiteBodies:
    """Target bodies that a call site's static dims specialise: beside the op's inputs and attributes,
    each takes one int attribute per entry of ``dims`` (attribute -> (input, axis)), such as the head
    counts a kernel takes as attributes and a body cannot read from the shapes. A node whose model declares
    those dims of its inputs is served by one of these, the dims bound in a function overload of its own
    (:func:`attnx.exporter.lowering.attach_functions`); any other by the target's other bodies.
    """

    bodies: Sequence[onnxscript.OnnxFunction]
    dims: Mapping[str, tuple[str, int]]

    def body_for(self, present_inputs: Sequence[str]) -> onnxscript.OnnxFunction | None:
        """The body whose inputs are exactly ``present_inputs``, if one was given."""
        return next((b for b in self.bodies if body_inputs(b) == list(present_inputs)), None)


@dataclasses.dataclass(frozen=True)
class TargetBodies:
    """An op's bodies for a lowering target's runtime kernels (:mod:`attnx.targets`), beside its portable
    ones: onnxscript functions in the ``attnx`` opset with the op's inputs and attributes, matched to a
    node's present inputs as :attr:`AttentionOp.bodies` are, that may call the target's kernels (e.g.
    ``onnxscript.values.Opset("com.microsoft", 1).LinearAttention``).

    ``since``: the oldest release of the target's runtime that has every kernel the bodies call (named
    when the installed one lacks one). ``sited``: bodies that serve a node in place of these where the
    model declares the static dims they take (:class:`SiteBodies`).
    """

    bodies: Sequence[onnxscript.OnnxFunction]
    since: str = ""
    sited: SiteBodies | None = None


@dataclasses.dataclass(frozen=True)
class AttentionOp:
    """One ``attnx::<name>`` op: a torch custom op plus its ONNX function bodies.

    Attributes:
        name: ONNX op type (CamelCase), also the TensorRT plugin name.
        torch_op: the ``torch.library.custom_op`` object implementing the maths.
        bodies: onnxscript functions in the ``attnx`` opset; the first takes every
            input, others cover calls that omit optional inputs. Bodies with the same inputs may
            be written against different ai.onnx opsets (their ``default_opset``): a newer one
            (e.g. on the standard ``Attention`` op) serves models at that opset, the oldest (the
            portable body) lower opsets and the ``decomposed`` lowering (:meth:`body_for`).
        input_types: ONNX type of inputs that are not float tensors, e.g.
            ``{"key_padding_mask": "tensor(bool)"}``.
        doc: one paragraph for the schema's documentation.
        output_names: ONNX names of the outputs, one per tensor the torch op returns;
            empty: "output" (an op returning several tensors must name them).
        output_types: ONNX type of outputs that are not bound to the inputs' float type
            ``T``, e.g. ``{"kv_sum": "tensor(float)"}`` for float32 state.
        output_shape: the (first) output's shape from the present inputs' shapes (name -> dims,
            in input order); dims may be ints or TensorRT shape expressions, so the rule
            may only index and do + - * // on them. TensorRT plugins need it because the
            torch fake kernel cannot be evaluated on symbolic dimensions.
        kernel: "module:attribute" of an :class:`attnx.kernels.TritonKernel` computing the op in
            one launch (TensorRT's AOT plugins, GPU benchmarks), imported only when asked; None: none.
        targets: bodies for lowering targets' runtime kernels, by target name (``{"ort":
            TargetBodies(...)}``): ``attnx export --target ort`` lowers the op with them. A node whose
            inputs none of them takes is refused then, as a missing portable body is.
        preconditions: what a call's arguments (name -> value, tensors and attributes) must satisfy beyond
            their shapes, e.g. a log-decay <= 0: returns one line naming what is outside the op's domain,
            or None. The conformance kit's ``capabilities`` check applies it to every call a layer makes.
    """

    name: str
    torch_op: Any
    bodies: Sequence[onnxscript.OnnxFunction]
    input_types: Mapping[str, str] = dataclasses.field(default_factory=dict)
    doc: str = ""
    output_shape: Callable[[Mapping[str, Sequence[Any]]], tuple[Any, ...]] = query_shaped_output
    output_names: Sequence[str] = ()
    output_types: Mapping[str, str] = dataclasses.field(default_factory=dict)
    kernel: str | None = None
    targets: Mapping[str, TargetBodies] = dataclasses.field(default_factory=dict)
    preconditions: Callable[[Mapping[str, Any]], str | None] | None = None

    @functools.cached_property
    def overload(self) -> torch._ops.OpOverload:
        return self.torch_op._opoverload

    @functools.cached_property
    def arguments(self) -> tuple[OpArgument, ...]:
        result = []
        for arg in self.overload._schema.arguments:
            type_text = str(arg.type)
            if type_text in ("Tensor", "Optional[Tensor]", "Tensor?"):
                result.append(OpArgument(arg.name, True, optional=type_text != "Tensor"))
            elif type_text in _ATTRIBUTE_TYPES:
                result.append(OpArgument(arg.name, False, attribute_type=type_text))
            else:
                raise TypeError(f"attnx op {self.name}: argument {arg.name} has unsupported type {type_text}")
        return tuple(result)

    @functools.cached_property
    def outputs(self) -> tuple[str, ...]:
        """ONNX output names, one per tensor the torch op returns."""
        returns = [str(r.type) for r in self.overload._schema.returns]
        if any(t != "Tensor" for t in returns):
            raise TypeError(f"attnx op {self.name}: returns ({', '.join(returns)}) must all be Tensor")
        names = tuple(self.output_names) or ("output",)
        if len(names) != len(returns):
            raise TypeError(f"attnx op {self.name}: returns {len(returns)} tensors, {len(names)} names")
        return names

    @property
    def input_names(self) -> list[str]:
        return [a.name for a in self.arguments if a.is_tensor]

    @property
    def attribute_names(self) -> list[str]:
        return [a.name for a in self.arguments if not a.is_tensor]

    def schema(self) -> defs.OpSchema:
        """The ONNX schema of ``attnx::<name>``, derived from the torch op."""
        param = defs.OpSchema.FormalParameter
        option = defs.OpSchema.FormalParameterOption
        inputs, constraints = [], {"T": FLOAT_TYPES}
        for arg in self.arguments:
            if not arg.is_tensor:
                continue
            type_str = "T"
            if arg.name in self.input_types:
                type_str = f"T_{arg.name}"
                constraints[type_str] = [self.input_types[arg.name]]
            kind = option.Optional if arg.optional else option.Single
            inputs.append(param(arg.name, type_str, param_option=kind))
        outputs = []
        for name in self.outputs:
            type_str = "T"
            if name in self.output_types:
                type_str = f"T_out_{name}"
                constraints[type_str] = [self.output_types[name]]
            outputs.append(param(name, type_str))
        attributes = [
            defs.OpSchema.Attribute(a.name, _ATTRIBUTE_TYPES[a.attribute_type][0], a.name, required=True)
            for a in self.arguments
            if not a.is_tensor
        ]
        return defs.OpSchema(
            self.name,
            DOMAIN,
            1,
            doc=self.doc,
            inputs=inputs,
            outputs=outputs,
            type_constraints=[(name, types, "") for name, types in constraints.items()],
            attributes=attributes,
        )

    def register_schema(self) -> None:
        """Make ``attnx::<name>`` known to onnx (idempotent)."""
        if not defs.has(self.name, DOMAIN):
            defs.register_schema(self.schema())

    def translation(self) -> Callable[..., Any]:
        """The exporter's translation function: emits the bare ``attnx::<name>`` node."""
        self.register_schema()
        emit = getattr(OPSET, self.name)
        args = self.arguments

        def translate(*values: Any, **kwargs: Any) -> Any:
            bound = dict(zip([a.name for a in args], values, strict=False))
            bound.update(kwargs)
            inputs = [bound.get(a.name) for a in args if a.is_tensor]
            while inputs and inputs[-1] is None:
                inputs.pop()  # trailing optional inputs are omitted, not passed empty
            attributes = {a.name: _attribute_value(a, bound[a.name]) for a in args if not a.is_tensor}
            return emit(*inputs, **attributes)

        parameters, annotations = [], {}
        for arg in args:
            parameters.append(inspect.Parameter(arg.name, inspect.Parameter.POSITIONAL_OR_KEYWORD))
            if not arg.is_tensor:
                annotations[arg.name] = _ATTRIBUTE_TYPES[arg.attribute_type][1]
        translate.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        translate.__annotations__ = annotations
        translate.__name__ = self.name
        return translate

    def body_opsets(self) -> list[int]:
        """The distinct ai.onnx opsets the bodies are written against, lowest first."""
        return sorted({body_opset(body) for body in self.bodies})

    def body_for(
        self,
        present_inputs: Sequence[str],
        opset: int | None = None,
        portable: bool = False,
        target: str = PORTABLE,
    ) -> onnxscript.OnnxFunction | None:
        """The body for a node with exactly ``present_inputs``, if one was given.

        Among such bodies that a model at ``opset`` can hold (None: any), the one written against the
        newest opset (built on newer standard ops, e.g. softmax's ``Attention`` from opset 23), or with
        ``portable`` the oldest (primitive ops that every runtime and graph tool handles). With a
        ``target`` the op declares (:attr:`targets`), among that target's bodies instead.
        """
        present = list(present_inputs)
        bodies = self.targets[target].bodies if target in self.targets else self.bodies
        fitting = [
            body
            for body in bodies
            if body_inputs(body) == present and (opset is None or body_opset(body) <= opset)
        ]
        if not fitting:
            return None
        return (min if portable else max)(fitting, key=body_opset)


def body_inputs(body: onnxscript.OnnxFunction) -> list[str]:
    """The names of a body's inputs, which a node's present inputs must equal for the body to serve it."""
    return [p.name for p in body.function_ir.inputs]


@functools.cache
def body_opset(body: onnxscript.OnnxFunction) -> int:
    """The ai.onnx opset an onnxscript body needs: the newest that it, or a function it calls, is written
    against (their ``default_opset``)."""
    ir = body.function_ir
    versions = [version for domain, version in ir.opset_imports.items() if domain in ("", "ai.onnx")]
    versions += [body_opset(callee) for callee in ir.get_called_functions().values()]
    return max(versions, default=1)


def _attribute_value(arg: OpArgument, value: Any) -> Any:
    if arg.attribute_type == "bool":
        return int(bool(value))
    return value


@dataclasses.dataclass(frozen=True)
class VariantImpl:
    """The heavy half of a variant, loaded from :attr:`attnx.variant.Variant.impl`.

    The TensorRT plugin of each op is generated from the op itself (``attnx.trt``), with
    :attr:`AttentionOp.output_shape` as its shape rule; a variant writes no TensorRT code.

    Attributes:
        build: ``build(config, spec) -> torch.nn.Module``; the module's forward is
            ``forward(x, context=None, key_padding_mask=None) -> Tensor``.
        ops: the ``attnx::`` ops the module calls (with any options) or that adapters call.
        conditional_ops: names of ``ops`` that a layer built with the variant's test options does
            not call (another layout's op, an op only adapters call); the conformance kit does not
            require those to be called.
        decode_ops: the ops the module's stateful decode step calls (``attnx.decode``),
            exported only into ``prefill.onnx``/``decode.onnx``.
    """

    build: Callable[[Any, AttentionSpec], torch.nn.Module]
    ops: Sequence[AttentionOp]
    decode_ops: Sequence[AttentionOp] = ()
    conditional_ops: Sequence[str] = ()
