"""Repeated layers: convert a model's first layers once and stamp the rest in the ONNX graph.

A deployed LLM repeats a few kinds of decoder layer (the 0.8B Qwen3.5: 18 Gated DeltaNet and 6
attention layers), and torch.onnx's conversion costs the same for every layer: at real size it was
most of an export. So where the module names its layer stack (:func:`find_stack`), the exporter traces
and converts the module with only the stack's first layers (:attr:`LayerStack.prefix`: up to where
every later layer's kind has appeared once past the first layer) and stamps each later layer in the
converted graph from the prefix layer of its kind (:func:`stamp`): the same nodes, reading that layer's
own weights, its own state inputs and outputs (decode graphs), and the layer before it.

Layers are of one kind when ``torch.export`` traced them alike (:func:`traced_kinds`: the same ops on
the same arguments up to names, each reading its own weights), so a layer whose caller passes it a
constant (its index, choosing an adapter) is of its own kind. The adapter that converted a library's
model names its decoder layers (:attr:`attnx.adapter.AdapterImpl.layers`: the Hugging Face hybrid and
flash-linear-attention adapters do), a module of the user's own through a ``repeated_layers()`` method;
anything else exports as before. The ONNX graph says which node belongs to which layer (torch.onnx's
name scopes); a graph whose layers do not pass one activation from each to the next
(:class:`NotStampable`) is converted whole, as before. The default verify checks the result like any
export (parity against the whole module's forward).
"""

from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from attnx.models.spec import TensorSpec

SCOPES = "pkg.torch.onnx.name_scopes"  # torch.onnx's record of the modules a node was made in

Rename = Callable[[int, int, str], str | None]


class NotStampable(Exception):
    """The converted prefix is not a chain of layers the stamping can repeat (the reason)."""


@dataclasses.dataclass(frozen=True)
class LayerStack:
    """A module's decoder layers: ``owner.<attribute>``, an ``nn.ModuleList``."""

    owner: nn.Module
    attribute: str
    layers: tuple[nn.Module, ...]
    prototypes: tuple[int, ...]  # per layer: the prefix layer it is stamped from (itself in the prefix)

    @property
    def prefix(self) -> int:
        """How many leading layers are traced and converted."""
        return max(self.prototypes) + 1

    @contextlib.contextmanager
    def traced_prefix(self) -> Iterator[None]:
        """The owner holds only the prefix layers for this context."""
        whole = getattr(self.owner, self.attribute)
        setattr(self.owner, self.attribute, nn.ModuleList(self.layers[: self.prefix]))
        try:
            yield
        finally:
            setattr(self.owner, self.attribute, whole)

    def scope(self, root: nn.Module) -> str:
        """The stack's qualified name under ``root`` (the traced module): its layers' name scopes and
        weight names start with it."""
        for name, module in root.named_modules():
            if module is self.owner:
                return f"{name}.{self.attribute}" if name else self.attribute
        raise NotStampable("the layer stack is not part of the traced module")

    def weights(self, layer: int) -> dict[str, torch.Tensor]:
        """Layer ``layer``'s parameters and buffers by their name inside the layer."""
        module = self.layers[layer]
        return {**dict(module.named_parameters()), **dict(module.named_buffers())}


def find_stack(
    module: nn.Module, program: Any, under: str, named: tuple[nn.Module, str] | None = None
) -> LayerStack | None:
    """The layer stack of ``module`` worth stamping: ``named`` (owner, attribute: what the adapter that
    converted the model names, :attr:`attnx.adapter.AdapterImpl.layers`), else what a submodule's
    ``repeated_layers()`` names; with more layers than its prefix; None otherwise. ``program`` is the
    ``torch.export`` program of the whole module, traced as the attribute ``under`` of its root; it
    decides which layers are alike (:func:`traced_kinds`)."""
    found = named or _named_by_module(module)
    if found is None:
        return None
    owner, attribute = found
    layers = tuple(getattr(owner, attribute))
    stack = LayerStack(owner, attribute, layers, ())
    kinds = traced_kinds(program, f"{under}.{stack.scope(module)}", layers)
    stack = dataclasses.replace(stack, prototypes=_prototypes(kinds))
    return stack if stack.prefix < len(layers) else None


def _named_by_module(module: nn.Module) -> tuple[nn.Module, str] | None:
    """What the first submodule with a ``repeated_layers()`` method names (None: nothing)."""
    for candidate in module.modules():
        named = getattr(candidate, "repeated_layers", None)
        if callable(named):
            return named()
    return None


def traced_kinds(program: Any, scope: str, layers: Sequence[nn.Module]) -> list[tuple[Any, ...]]:
    """Each of ``layers`` (the stack under ``scope``) as ``program`` (a ``torch.export`` program) traced
    it, up to names: its nodes' ops and arguments in order, where an argument is a value of the layer (by
    position), a weight (its own by its name inside the layer; one it shares with other modules by its
    full name), the activation of the layer before, a shape (by its symbolic expression) or a constant.
    Two layers of one kind compute the same function of their input and their own weights: a layer that
    reads a constant its caller passed (its index), or another shared weight, is of another kind.
    """
    signature = program.graph_signature
    weights = {
        **signature.inputs_to_parameters,
        **signature.inputs_to_buffers,
        **signature.inputs_to_lifted_tensor_constants,
    }
    count = len(layers)
    tensors = [{id(t) for t in (*layer.parameters(), *layer.buffers())} for layer in layers]
    held = collections.Counter(i for own in tensors for i in own)
    paths = {f"{scope}.{i}": i for i in range(count)}
    nodes: list[list[Any]] = [[] for _ in range(count)]
    owner: dict[Any, int] = {}
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        found = [paths[path] for path, _ in stack.values() if path in paths]
        if node.op == "call_function" and found and not _symbolic(node):
            owner[node] = found[0]
            nodes[found[0]].append(node)

    def kind_of(layer: int) -> tuple[Any, ...]:
        position = {node: i for i, node in enumerate(nodes[layer])}
        own = f"{scope}.{layer}."

        def argument(value: Any) -> Any:
            if isinstance(value, torch.fx.Node):
                if _symbolic(value):
                    return ("shape", str(value.meta["val"]))
                if value in position:
                    return ("value", position[value])
                value = _unconverted(value)
                name = weights.get(value.name)
                if name is not None:
                    tensor = id(program.state_dict.get(name, program.constants.get(name)))
                    alone = tensor in tensors[layer] and held[tensor] == 1
                    return ("weight", name.removeprefix(own)) if alone else ("shared", name)
                if owner.get(value) == layer - 1 and value.op == "call_function":
                    return ("input",)
                return ("outside", value.name)
            if isinstance(value, list | tuple):
                return (type(value).__name__, *map(argument, value))
            if isinstance(value, dict):
                return ("dict", *sorted((k, argument(v)) for k, v in value.items()))
            return ("constant", repr(value))

        return tuple((str(n.target), argument(n.args), argument(n.kwargs)) for n in nodes[layer])

    return [kind_of(layer) for layer in range(count)]


def _unconverted(node: Any) -> Any:
    """``node`` before any conversion to its own dtype: ``x.to(x.dtype)`` returns ``x`` itself, and the
    trace then hands later readers of ``x`` that conversion's node (a mask one attention layer converted
    reaches the later layers as that layer's node), the same values."""
    while (
        node.op == "call_function"
        and str(node.target).startswith("aten.to.")
        and isinstance(node.args[0], torch.fx.Node)
        and _same_tensor(node.meta.get("val"), node.args[0].meta.get("val"))
    ):
        node = node.args[0]
    return node


def _same_tensor(a: Any, b: Any) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and (a.dtype, a.device, str(a.shape)) == (b.dtype, b.device, str(b.shape))
    )


def _symbolic(node: Any) -> bool:
    """A node whose value is a symbolic shape (a SymInt torch.export computes once and reuses)."""
    return isinstance(node.meta.get("val"), torch.SymInt | torch.SymFloat | torch.SymBool)


def _prototypes(kinds: Sequence[Any]) -> tuple[int, ...]:
    """Each layer's prototype: the last layer of its kind within the prefix, never the first layer for a
    later one (the first layer's input is the embedding, not a layer's output, so its copies could not be
    wired). The prefix ends where every kind of the later layers has appeared past the first layer."""
    firsts: dict[Any, int] = {}
    for i, k in enumerate(kinds[1:], start=1):
        firsts.setdefault(k, i)
    prefix = max(firsts.values(), default=0) + 1
    last = {k: i for i, k in enumerate(kinds[:prefix]) if i > 0}
    return tuple(i if i < prefix else last[k] for i, k in enumerate(kinds))


@dataclasses.dataclass(frozen=True)
class Stamping:
    """How a graph traced with the prefix becomes the whole model's: the stack, the traced module, the
    whole graph's inputs and outputs in order and ``rename(layer, prototype, name)``, the name of layer
    ``layer``'s graph input or output that is ``name`` for its prototype (None: the same value, shared by
    every layer)."""

    stack: LayerStack
    root: nn.Module
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    rename: Rename = lambda layer, prototype, name: None


def stamp(model: Any, stamping: Stamping) -> None:
    """Stamp the later layers of ``stamping.stack`` into the ONNX IR ``model`` (torch.onnx's graph of
    the module with its prefix, before any optimization) in place.

    Raises:
        NotStampable: a graph whose prefix layers do not each pass one activation to the next.
    """
    import onnx_ir as ir

    try:  # torch.onnx's own initializer type (torch 2.13, pinned), which the weight store recognises
        from torch.onnx._internal.exporter._core import TorchTensor
    except ImportError:
        raise NotStampable("this torch.onnx has no TorchTensor to hold a stamped layer's weights") from None

    stack, graph = stamping.stack, model.graph
    scope = stamping.stack.scope(stamping.root)
    layers = _layer_nodes(graph, scope, stack.prefix)
    made = [{v for n in nodes for v in n.outputs} for nodes in layers]
    streams = [_stream(layers[i + 1], made[i], f"layer {i + 1}") for i in range(stack.prefix - 1)]
    inside = {id(n) for nodes in layers for n in nodes}
    after = [
        (user, index)
        for value in made[-1]
        for user, index in value.uses()
        if id(user) not in inside and _is_activation(value)
    ]
    if len({id(user.inputs[index]) for user, index in after}) != 1:
        raise NotStampable("the last prefix layer does not hand one activation to what follows it")
    last = after[0][0].inputs[after[0][1]]
    outputs = {id(v) for v in graph.outputs}
    inputs = {v.name: v for v in graph.inputs}
    initializers = graph.initializers
    stream = last
    for layer in range(stack.prefix, len(stack.layers)):
        prototype = stack.prototypes[layer]
        entry = streams[prototype - 1]
        mapped: dict[int, Any] = {id(entry): stream}
        weights = stack.weights(layer)
        own = f"{scope}.{prototype}."
        for node in layers[prototype]:
            for value in node.inputs:
                if value is None or id(value) in mapped or value in made[prototype]:
                    continue
                if value.is_graph_input():
                    name = stamping.rename(layer, prototype, value.name)
                    if name is not None:
                        if name not in inputs:
                            inputs[name] = ir.Value(name=name, type=value.type, shape=value.shape)
                            graph.inputs.append(inputs[name])
                        mapped[id(value)] = inputs[name]
                elif value.is_initializer() and value.name.startswith(own):
                    name = f"{scope}.{layer}.{value.name[len(own) :]}"
                    tensor = weights.get(value.name[len(own) :])
                    if tensor is None:
                        raise NotStampable(f"layer {layer} has no tensor for {value.name}")
                    if name not in initializers:
                        copy = ir.Value(name=name, type=value.type, shape=value.shape)
                        copy.const_value = TorchTensor(tensor.detach(), name=name)
                        graph.register_initializer(copy)
                    mapped[id(value)] = initializers[name]
            copy = _clone(node, mapped, layer, (f"'{scope}.{prototype}", f"'{scope}.{layer}"))
            graph.append(copy)
            for old, new in zip(node.outputs, copy.outputs, strict=True):
                mapped[id(old)] = new
                if id(old) in outputs:
                    name = stamping.rename(layer, prototype, old.name)
                    if name is None:
                        raise NotStampable(
                            f"graph output {old.name} of layer {prototype} has no name in layer {layer}"
                        )
                    new.name = name
                    graph.outputs.append(new)
        stream = mapped[id(streams[prototype] if prototype < stack.prefix - 1 else last)]
    for user, index in after:
        user.replace_input_with(index, stream)
    _order(graph.inputs, [s.name for s in stamping.inputs], "input")
    _order(graph.outputs, [s.name for s in stamping.outputs], "output")
    graph.sort()


def _layer_nodes(graph: Any, scope: str, prefix: int) -> list[list[Any]]:
    """The nodes of each prefix layer, in graph order, by their name scopes."""
    layers: list[list[Any]] = [[] for _ in range(prefix)]
    names = {f"{scope}.{i}": i for i in range(prefix)}
    for node in graph:
        recorded = node.metadata_props.get(SCOPES)
        if not recorded:
            continue
        found = [names[s] for s in ast.literal_eval(recorded) if s in names]
        if found:
            if any(a.type.name in ("GRAPH", "GRAPHS") for a in node.attributes.values()):
                raise NotStampable(f"layer {found[0]} holds a subgraph")
            layers[found[0]].append(node)
    if not all(layers):
        raise NotStampable("a prefix layer has no nodes of its own")
    return layers


def _is_activation(value: Any) -> bool:
    return value.dtype is not None and value.dtype.is_floating_point()


def _stream(nodes: Sequence[Any], before: set[Any], where: str) -> Any:
    """The one activation ``nodes`` (a layer) read from the layer before (``before``: its values); the
    others it reads from there must be integers (torch.export computes a shape once and reuses it)."""
    read = {id(v): v for n in nodes for v in n.inputs if v is not None and v in before}
    activations = [v for v in read.values() if _is_activation(v)]
    if len(activations) != 1:
        raise NotStampable(f"{where} reads {len(activations)} activations of the layer before it, not one")
    return activations[0]


def _clone(node: Any, mapped: dict[int, Any], layer: int, scopes: tuple[str, str]) -> Any:
    """A copy of ``node`` for layer ``layer``: its inputs through ``mapped``, its outputs typed and named
    as the prototype's with the layer's number, its name scopes the layer's (``scopes``: the prototype's
    scope and the layer's, as torch.onnx quotes them)."""
    import onnx_ir as ir

    metadata = dict(node.metadata_props)
    if SCOPES in metadata:
        metadata[SCOPES] = metadata[SCOPES].replace(*scopes)

    copy = ir.Node(
        node.domain,
        node.op_type,
        [None if v is None else mapped.get(id(v), v) for v in node.inputs],
        [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()],
        overload=node.overload,
        num_outputs=len(node.outputs),
        version=node.version,
        name=f"{node.name}.{layer}" if node.name else None,
        metadata_props=metadata,
    )
    for old, new in zip(node.outputs, copy.outputs, strict=True):
        new.type, new.shape = old.type, old.shape
        new.name = f"{old.name}.{layer}" if old.name else None
    return copy


def _order(values: Any, names: Sequence[str], side: str) -> None:
    """Put the graph's ``values`` (its inputs or outputs) in the order of ``names``, which they must be."""
    by_name = {v.name: v for v in values}
    if sorted(by_name) != sorted(names):
        missing = sorted(set(names) - set(by_name)) or sorted(set(by_name) - set(names))
        raise NotStampable(f"the stamped graph's {side}s differ from the model's at {missing[:3]}")
    ordered = [by_name[n] for n in names]
    values.clear()
    values.extend(ordered)
