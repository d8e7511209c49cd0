"""Which layer each weight of an exported graph belongs to, for per-layer-kind quantisation.

torch.onnx records on every node the module path it was traced in (metadata ``pkg.torch.onnx.name_scopes``:
``['', 'model', ..., 'model.layers.0.linear_attn', 'model.layers.0.linear_attn.in_proj_qkv', 'linear']``).
An ``attnx::<Op>`` node marks its mixer, the module whose projections feed it (``model.layers.0.linear_attn``
for ``in_proj_qkv``), and the op's variant says what kind of mixer it is. So a MatMul whose weight is a
constant is:

* ``head``: the one the ``logits`` output is computed from (no other MatMul in between);
* ``gate``: a projection that reaches a recurrent op's decay or gate input (``g``, ``beta``) without
  another MatMul on the way (Qwen3.5's ``in_proj_a`` / ``in_proj_b``); these are never quantised: they are
  a head's width, and their error compounds through every step of the recurrence;
* ``attention``: inside a mixer whose op keeps a KV cache (or none: an encoder's softmax, LSH attention);
* ``recurrent``: inside a mixer whose op keeps a recurrent state (linear attention, the gated rules);
* ``mlp``: any other (the feed-forward blocks, MoE experts, and a mixer without an attnx op: LFM2's gated
  short convolution, whose decode state is only a conv carry, so an error in its projections reaches at
  most kernel - 1 later tokens and no recurrence compounds it, as in a feed-forward block).

The ops' formal input names come from the model-local functions of a function-lowered graph, so the
classification needs that lowering; :func:`classify` refuses others in one line.
"""

from __future__ import annotations

import ast
import dataclasses
from collections import deque
from collections.abc import Iterator, Mapping

import onnx

from attnx.domains import DOMAIN
from attnx.errors import AttnxError
from attnx.optimizer.text import LOGITS

LAYER_KINDS = ("attention", "recurrent", "mlp", "head")  # what a user may choose a precision for
GATE = "gate"  # never quantised
GATE_INPUTS = frozenset({"g", "beta"})  # the gated rules' log-decay and write strength
SCOPES = "pkg.torch.onnx.name_scopes"


@dataclasses.dataclass(frozen=True)
class LayerWeight:
    """A MatMul whose second input is a constant weight: the node, its kind and module path, and the
    weight's initializer (``transposed``: read through a Transpose node, as a weight shared between graphs
    is)."""

    node: onnx.NodeProto
    kind: str
    module: str
    weight: str
    transposed: bool


def classify(model: onnx.ModelProto, op_kinds: Mapping[str, str], name: str) -> list[LayerWeight]:
    """Every weight MatMul of ``model``'s main graph with its layer kind; ``op_kinds``: attnx op type ->
    "attention" or "recurrent"; ``name``: the graph file, for errors.

    Raises:
        AttnxError: the graph has no attnx op functions to read the mixers from (not function-lowered).
    """
    graph = model.graph
    ops = [node for node in graph.node if node.domain == DOMAIN]
    formal = {f.name: list(f.input) for f in model.functions if f.domain == DOMAIN}
    if not ops or any(node.op_type not in formal for node in ops):
        raise AttnxError(
            f"{name}: weight-only quantisation reads the layer kinds from attnx's op functions, which this "
            "graph does not carry; quantise a function-lowered export (the default --lowering)"
        )
    initializers = {tensor.name for tensor in graph.initializer if len(tensor.dims) == 2}  # MatMulNBits' B
    producers = {output: node for node in graph.node for output in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    mixers = {
        mixer: op_kinds.get(node.op_type, "attention") for node in ops for mixer in _mixers(node, producers)
    }
    head = _head(graph, producers)
    found = []
    for node in graph.node:
        weight = _weight(node, initializers, producers)
        if weight is None:
            continue
        module = _module(node)
        mixer = next((kind for path, kind in mixers.items() if module.startswith(f"{path}.")), None)
        if node.name == head:
            kind = "head"
        elif mixer == "recurrent" and _feeds_gate(node, consumers, formal):
            kind = GATE
        else:
            kind = mixer or "mlp"
        found.append(LayerWeight(node, kind, module, *weight))
    return found


def _weight(
    node: onnx.NodeProto, initializers: set[str], producers: Mapping[str, onnx.NodeProto]
) -> tuple[str, bool] | None:
    """The constant weight ``node`` multiplies by, and whether through a Transpose; None: not a MatMul
    with a constant matrix (``initializers``) as its second input (an MoE's stacked experts are 3-D)."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
        return None
    value = node.input[1]
    if value in initializers:
        return value, False
    producer = producers.get(value)
    if producer is not None and producer.op_type == "Transpose" and producer.input[0] in initializers:
        perm = next((list(a.ints) for a in producer.attribute if a.name == "perm"), [1, 0])
        if perm == [1, 0]:
            return producer.input[0], True
    return None


def _module(node: onnx.NodeProto) -> str:
    """The module path ``node`` was traced in (the last name scope is the call itself); "" if unrecorded."""
    for prop in node.metadata_props:
        if prop.key == SCOPES:
            scopes = ast.literal_eval(prop.value)
            return scopes[-2] if len(scopes) >= 2 else ""
    return ""


def _mixers(op: onnx.NodeProto, producers: Mapping[str, onnx.NodeProto]) -> set[str]:
    """The module paths of the mixers that feed attnx node ``op``: the parents of the projections met
    walking back from its inputs (the op itself may be called from another module, as a decode step
    is)."""
    queue, seen, found = deque(op.input), set(), set()
    while queue:
        node = producers.get(queue.popleft())
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type == "MatMul":
            module = _module(node)
            if "." in module:
                found.add(module.rsplit(".", 1)[0])
            continue
        queue.extend(node.input)
    return found


def _head(graph: onnx.GraphProto, producers: Mapping[str, onnx.NodeProto]) -> str | None:
    """The name of the first MatMul met walking back from the ``logits`` output; None without one."""
    if not any(output.name == LOGITS for output in graph.output):
        return None
    queue, seen = deque([LOGITS]), set()
    while queue:
        node = producers.get(queue.popleft())
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if node.op_type == "MatMul":
            return node.name
        queue.extend(node.input)
    return None


def _feeds_gate(
    node: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]], formal: Mapping[str, list[str]]
) -> bool:
    """Whether ``node``'s output reaches a gate input of an attnx op with no MatMul in between."""
    for user, value in _downstream(node, consumers):
        if user.domain == DOMAIN:
            names = formal[user.op_type]
            positions = [i for i, name in enumerate(user.input) if name == value and i < len(names)]
            if any(names[i] in GATE_INPUTS for i in positions):
                return True
    return False


def _downstream(
    node: onnx.NodeProto, consumers: Mapping[str, list[onnx.NodeProto]]
) -> Iterator[tuple[onnx.NodeProto, str]]:
    """(consumer, the value it reads) for every node reached from ``node``'s outputs, not walking past
    MatMuls or attnx ops."""
    queue, seen = deque(node.output), set()
    while queue:
        value = queue.popleft()
        for user in consumers.get(value, []):
            yield user, value
            if user.op_type == "MatMul" or user.domain == DOMAIN or id(user) in seen:
                continue
            seen.add(id(user))
            queue.extend(user.output)


def mixer_kinds() -> dict[str, str]:
    """attnx op type -> "recurrent" (its variant decodes with a recurrent state) or "attention"."""
    from attnx.registry import get_registry

    return {
        op.name: "recurrent" if variant.capabilities.decode == "recurrent" else "attention"
        for variant, op in get_registry().op_index()
    }
