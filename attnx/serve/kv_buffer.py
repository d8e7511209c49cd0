"""A decoder's KV cache in one buffer that its past and present share, as onnxruntime-genai holds it.

With ``search.past_present_share_buffer``, genai 0.18 (its ``DefaultKeyValueCache``, and the LFM2 cache)
allocates each attention layer's key and value once, (batch, kv heads, ``max_length``, head size), zeroed,
and binds that one tensor as both ``past_key_values.<layer>.key`` and ``present.<layer>.key`` at every run.
The graph must then write the new tokens' keys and values into the buffer at their positions and attend over
its valid part; the cache is never copied. Without it genai allocates a present of the grown length each
step, and the graph concatenates the whole cache into it (at the 0.8B Qwen3.5 shape after 4096 tokens,
96 MB a token).

decode.onnx grows the cache (attnx's portable contract, which every runtime can run): a layer's present key
is ``Concat(past key, new keys)`` along the sequence axis, read by one ``attnx::SoftmaxAttention`` (causal,
bottom-right: the last query sees every key), or written by the step op ``attnx::SoftmaxAttentionStep``.
:func:`share_kv_buffers` gives such a graph the shared buffer, layer by layer:

* ``ScatterND`` writes the new keys and values into the buffer at [past, past + new): in place when past
  and present are one tensor (ONNX Runtime copies its input only into another buffer; 4 us against 0.7 ms
  for the 8 MB of a 4096-token key);
* one new token (a decode step) attends with ``com.microsoft::MultiHeadAttention``, whose heads are the key/
  value heads and whose tokens are the query heads of each, over the buffer as it lies, each row's valid
  length given: every key is read once per step (ONNX Runtime's ``GroupQueryAttention`` reads it once per
  query head: 4.3 against 1.7 ms a layer at that shape);
* a prompt attends with ``GroupQueryAttention`` over the earlier tokens in the buffer and the new ones
  (``seqlens_k``: the last valid index, per row); its own present outputs, a copy, go unused. ONNX
  Runtime's kernel takes several new tokens after a non-empty cache for one sequence only (batch 1): genai
  runs a batch's prompt on the empty state, then one token at a time.

It does so only where every cache layer has that form, since genai's option holds for all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import onnx
import onnx.shape_inference
from onnx import helper

from attnx.domains import DOMAIN
from attnx.exporter.layout import graph_index
from attnx.plugins.lib.ort import MICROSOFT

BUFFER_AXIS = "max_length"  # the sequence axis of a shared buffer (genai: search.max_length positions)
ATTENTION, STEP = "SoftmaxAttention", "SoftmaxAttentionStep"  # the attnx ops a grown cache is read by
_SEQUENCE_AXES = (2, -2)  # a (batch, heads, sequence, head size) cache's sequence axis


@dataclasses.dataclass(frozen=True)
class Cache:
    """One attention layer's KV cache in a decoder graph: its graph inputs and outputs."""

    past_key: str
    past_value: str
    present_key: str
    present_value: str


@dataclasses.dataclass(frozen=True)
class _Match:
    """A layer's grown cache as the graph computes it: the nodes that go (the attention node last) and what
    the nodes in their place read and write."""

    cache: Cache
    nodes: tuple[onnx.NodeProto, ...]
    query: str
    new_key: str
    new_value: str
    output: str
    scale: float
    heads: int
    kv_heads: int
    head_size: int


def share_kv_buffers(
    model: onnx.ModelProto, caches: Sequence[Cache], past_length: str, tokens: str
) -> onnx.ModelProto | None:
    """``model`` (a decoder graph whose caches grow, ``past_length`` its int64 (1,) count of earlier
    tokens, ``tokens`` its (batch, new) input) with every cache of ``caches`` in a buffer its past and
    present share (see the module docstring); None, ``model`` untouched, where one of them is not a grown
    cache read by one causal attention node."""
    if not caches:
        return None
    readers, producers = graph_index(model.graph)
    dims = _dims(model)
    matches = [_match(cache, producers, readers, dims) for cache in caches]
    if any(match is None for match in matches):
        return None
    return _rewrite(model, [m for m in matches if m is not None], past_length, tokens)


def _dims(model: onnx.ModelProto) -> dict[str, list[int | str]]:
    """Every value's dims (int: static, str: named or unknown) from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    return {
        v.name: [
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim
        ]
        for v in [*inferred.input, *inferred.value_info, *inferred.output]
    }


def _match(
    cache: Cache,
    producers: dict[str, onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
    dims: dict[str, list[int | str]],
) -> _Match | None:
    """``cache`` as a grown cache read by one causal attention, in either form attnx traces (None: another
    form, a node reading the cache's length, or head counts that shape inference leaves open):

    * ``attnx::SoftmaxAttentionStep(q, k, v, past key, past value)`` writing the present key and value
      (attnx's own models);
    * ``Concat(past, new)`` for each, read by one ``attnx::SoftmaxAttention(q, key, value)`` (the adapted
      Hugging Face layers).
    """
    presents = (cache.present_key, cache.present_value)
    step = producers.get(cache.present_key)
    if step is not None and _is_attention(step, STEP) and tuple(step.output[1:]) == presents:
        if (
            len(step.input) != 5
            or any(readers.get(name) for name in presents)
            or not all(
                _reads_past(step.input[i], past, step, producers, readers)
                for i, past in ((3, cache.past_key), (4, cache.past_value))
            )
        ):
            return None
        return _sized(cache, (step,), step.input[1], step.input[2], dims)
    key = _grown(cache.past_key, cache.present_key, producers, readers)
    value = _grown(cache.past_value, cache.present_value, producers, readers)
    attention = _reader(cache, readers)
    if key is None or value is None or attention is None:
        return None
    return _sized(cache, (key, value, attention), key.input[1], value.input[1], dims)


def _sized(
    cache: Cache,
    nodes: tuple[onnx.NodeProto, ...],
    new_key: str,
    new_value: str,
    dims: dict[str, list[int | str]],
) -> _Match | None:
    """The match, with the head counts and size the kernel takes as attributes (None: not static, or keys
    and values of other widths)."""
    attention = nodes[-1]
    query, past = dims.get(attention.input[0], []), dims.get(cache.past_key, [])
    widths = {d[-1] if d else None for d in (query, past, dims.get(cache.past_value, []))}
    if len(query) != 4 or len(past) != 4 or not isinstance(query[1], int) or not isinstance(past[1], int):
        return None
    if len(widths) != 1 or not all(isinstance(w, int) for w in widths) or query[1] % past[1]:
        return None
    scale = next(helper.get_attribute_value(a) for a in attention.attribute if a.name == "scale")
    heads, kv_heads, size = query[1], past[1], int(past[3])
    return _Match(
        cache,
        nodes,
        attention.input[0],
        new_key,
        new_value,
        attention.output[0],
        scale,
        heads,
        kv_heads,
        size,
    )


def _reads_past(
    name: str,
    past: str,
    reader: onnx.NodeProto,
    producers: dict[str, onnx.NodeProto],
    readers: dict[str, list[onnx.NodeProto]],
) -> bool:
    """Whether ``reader`` reads graph input ``past`` as ``name`` (the input, or an ``Identity`` of it),
    and every other node reading it reads a dim before the sequence axis at most (a ``Shape`` of its
    batch): in a shared buffer the sequence axis is the buffer's length, not the cache's."""
    copy = producers.get(name)
    if name != past and not (copy is not None and copy.op_type == "Identity" and list(copy.input) == [past]):
        return False
    others = [node for value in {name, past} for node in readers.get(value, []) if node is not reader]
    return all(node is copy or _reads_leading_dims(node) for node in others)


def _reads_leading_dims(node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a ``Shape`` of the dims before a cache's sequence axis alone."""
    if node.op_type != "Shape" or node.domain not in ("", "ai.onnx"):
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return attrs.get("start", 0) >= 0 and 0 <= attrs.get("end", -1) <= _SEQUENCE_AXES[0]


def _grown(
    past: str, present: str, producers: dict[str, onnx.NodeProto], readers: dict[str, list[onnx.NodeProto]]
) -> onnx.NodeProto | None:
    """The ``Concat`` that writes ``present`` as ``past`` then the new entries along the sequence axis
    (None: another form)."""
    node = producers.get(present)
    if node is None or node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    if helper.get_node_attr_value(node, "axis") not in _SEQUENCE_AXES:
        return None
    return node if _reads_past(node.input[0], past, node, producers, readers) else None


def _reader(cache: Cache, readers: dict[str, list[onnx.NodeProto]]) -> onnx.NodeProto | None:
    """The one node reading the grown cache, if it is an ``attnx::SoftmaxAttention`` of the whole cache
    without a key padding mask (None: anything else)."""
    key_readers, value_readers = readers.get(cache.present_key, []), readers.get(cache.present_value, [])
    if len(key_readers) != 1 or key_readers != value_readers or not _is_attention(key_readers[0], ATTENTION):
        return None
    (node,) = key_readers
    if list(node.input[1:3]) != [cache.present_key, cache.present_value] or any(node.input[3:]):
        return None
    return node


def _is_attention(node: onnx.NodeProto, op_type: str) -> bool:
    """Whether ``node`` is attnx's ``op_type``, causal, with a stated scale (the kernel's 0 means another)."""
    if node.domain != DOMAIN or node.op_type != op_type:
        return False
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return set(attrs) == {"causal", "scale"} and attrs["causal"] == 1 and attrs["scale"] != 0


def _rewrite(
    model: onnx.ModelProto, matches: Sequence[_Match], past_length: str, tokens: str
) -> onnx.ModelProto:
    """``model`` with each match's attention on the shared buffer, in place: its nodes where the attention
    node was, the positions and scatter indices they take computed once before the first that reads them."""
    graph = model.graph
    dtypes = {v.name: v.type.tensor_type.elem_type for v in graph.input}  # a cache's: the activations'
    shared = {name for m in matches for name in dataclasses.astuple(m.cache)}
    copies = {  # the Identity copies of the pasts: their readers (a Shape of the batch) read the past
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Identity" and node.input[0] in shared
    }
    gone = {id(node) for m in matches for node in m.nodes[:-1]}
    by_attention = {id(m.nodes[-1]): m for m in matches}
    nodes: list[onnx.NodeProto] = []
    positions: _Positions | None = None
    indices: dict[int, str] = {}  # kv heads -> the scatter indices, the same for every layer of that count
    for node in graph.node:
        match = by_attention.get(id(node))
        if match is not None:
            positions = positions or _positions(nodes, past_length, tokens)
            if match.kv_heads not in indices:
                indices[match.kv_heads] = _scatter_indices(nodes, match.kv_heads, positions)
            nodes += _in_place_attention(
                match, positions, indices[match.kv_heads], dtypes[match.cache.past_key]
            )
        elif id(node) not in gone and node.output[0] not in copies:
            node.input[:] = [copies.get(name, name) for name in node.input]
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    for spec in [*graph.input, *graph.output]:
        dims = spec.type.tensor_type.shape.dim
        if spec.name in shared and len(dims) == 4:
            dims[2].Clear()
            dims[2].dim_param = BUFFER_AXIS
    typed = [v for v in graph.value_info if v.name not in shared]
    del graph.value_info[:]
    graph.value_info.extend(typed)
    if not any(o.domain == MICROSOFT.domain for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT.domain, MICROSOFT.version))
    return model


@dataclasses.dataclass(frozen=True)
class _Positions:
    """The values every layer's attention reads, computed once (int64 (1,) unless said): the earlier tokens,
    the new ones, their sum, the batch; ``lengths`` (int32 (batch,): each row's valid length) for
    MultiHeadAttention; ``seqlens`` (int32 (batch,): each row's last valid index) and ``total`` (int32
    scalar) for GroupQueryAttention; ``one_token`` (bool scalar: a decode step)."""

    past: str
    new: str
    total64: str
    batch: str
    lengths: str
    seqlens: str
    total: str
    one_token: str


def _positions(nodes: list[onnx.NodeProto], past_length: str, tokens: str) -> _Positions:
    """Append the nodes computing the :class:`_Positions` and return their names."""
    name = "kv_buffer/"

    def add(op: str, inputs: list[str], output: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [name + output], **attrs))
        return name + output

    nodes.append(_constant(name + "one", [1]))
    one = name + "one"
    new = add("Shape", [tokens], "new", start=1, end=2)
    total = add("Add", [past_length, new], "total")
    batch = add("Shape", [tokens], "batch", start=0, end=1)
    lengths = add("Expand", [add("Cast", [total], "total32", to=onnx.TensorProto.INT32), batch], "lengths")
    last = add("Cast", [add("Sub", [total, one], "last64")], "last", to=onnx.TensorProto.INT32)
    seqlens = add("Expand", [last, batch], "seqlens_k")
    length = add(
        "Cast", [add("Squeeze", [total], "total_scalar")], "total_sequence_length", to=onnx.TensorProto.INT32
    )
    one_token = add("Squeeze", [add("Equal", [new, one], "one_token1")], "one_token")
    return _Positions(past_length, new, total, batch, lengths, seqlens, length, one_token)


def _in_place_attention(match: _Match, at: _Positions, indices: str, elem_type: int) -> list[onnx.NodeProto]:
    """``match``'s attention on the shared buffer: the new keys and values scattered into it at their
    positions (in place where past and present are one tensor), then, for one new token, ONNX Runtime's
    ``MultiHeadAttention`` over the buffer's valid part with the query heads of a key/value head as its
    tokens (each key read once); for a prompt, its ``GroupQueryAttention``."""
    name = f"kv_buffer/{match.cache.past_key}/"
    cache = match.cache
    nodes = []
    for past, new, present in (
        (cache.past_key, match.new_key, cache.present_key),
        (cache.past_value, match.new_value, cache.present_value),
    ):
        nodes.append(helper.make_node("ScatterND", [past, indices, new], [present]))
    branches = {
        "then_branch": _one_token(match, at, name, elem_type),
        "else_branch": _prompt(match, at, name, elem_type),
    }
    nodes.append(helper.make_node("If", [at.one_token], [match.output], **branches))
    return nodes


def _scatter_indices(nodes: list[onnx.NodeProto], kv_heads: int, at: _Positions) -> str:
    """Append the nodes computing the (batch, kv heads, new, 3) int64 indices [row, head, past + i] of the
    new entries in a buffer of ``kv_heads`` heads; returns their name."""
    name = f"kv_buffer/indices_{kv_heads}/"

    def scalar(value: str, what: str) -> str:  # Range takes scalars
        nodes.append(helper.make_node("Squeeze", [value], [f"{name}{what}/scalar"]))
        return f"{name}{what}/scalar"

    heads, one, shape = name + "heads", name + "one", name + "shape"
    nodes += [_constant(name + "zero", [0]), _constant(one, [1]), _constant(heads, [kv_heads])]
    nodes.append(helper.make_node("Concat", [at.batch, heads, at.new, one], [shape], axis=0))
    zero, step = scalar(name + "zero", "zero"), scalar(one, "one")
    axes = []
    for what, start, stop, where in (
        ("row", zero, scalar(at.batch, "batch"), [-1, 1, 1, 1]),
        ("head", zero, scalar(heads, "heads"), [1, -1, 1, 1]),
        ("position", scalar(at.past, "past"), scalar(at.total64, "total"), [1, 1, -1, 1]),
    ):
        nodes.append(_constant(f"{name}{what}/where", where))
        nodes.append(helper.make_node("Range", [start, stop, step], [f"{name}{what}/range"]))
        nodes.append(
            helper.make_node("Reshape", [f"{name}{what}/range", f"{name}{what}/where"], [f"{name}{what}/1"])
        )
        nodes.append(helper.make_node("Expand", [f"{name}{what}/1", shape], [f"{name}{what}/all"]))
        axes.append(f"{name}{what}/all")
    nodes.append(helper.make_node("Concat", axes, [name + "indices"], axis=-1))
    return name + "indices"


def _one_token(match: _Match, at: _Positions, name: str, elem_type: int) -> onnx.GraphProto:
    """The decode step's branch: MultiHeadAttention with the key/value heads as its heads and the query
    heads of each as its tokens (each key read once per head), reading the buffer as it lies (batch, kv
    heads, max_length, head size), its valid length given per row."""
    groups = match.heads // match.kv_heads
    step = f"{name}step/"
    nodes = [
        _constant(step + "by_group", [0, match.kv_heads, groups, match.head_size]),
        _constant(step + "tokens", [0, groups, match.kv_heads * match.head_size]),
        _constant(step + "by_head", [0, groups, match.kv_heads, match.head_size]),
        helper.make_node("Reshape", [match.query, step + "by_group"], [step + "query/groups"]),
        helper.make_node("Transpose", [step + "query/groups"], [step + "query/heads"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [step + "query/heads", step + "tokens"], [step + "query"]),
        helper.make_node(
            "MultiHeadAttention",
            [step + "query", match.cache.present_key, match.cache.present_value, "", at.lengths],
            [step + "out"],
            domain=MICROSOFT.domain,
            num_heads=match.kv_heads,
            scale=match.scale,
        ),
        helper.make_node("Reshape", [step + "out", step + "by_head"], [step + "out/heads"]),
        helper.make_node("Transpose", [step + "out/heads"], [step + "out/groups"], perm=[0, 2, 1, 3]),
        helper.make_node("Shape", [match.query], [step + "out_shape"]),
        helper.make_node("Reshape", [step + "out/groups", step + "out_shape"], [step + "output"]),
    ]
    output = helper.make_tensor_value_info(step + "output", elem_type, None)
    return helper.make_graph(nodes, step + "graph", [], [output])


def _prompt(match: _Match, at: _Positions, name: str, elem_type: int) -> onnx.GraphProto:
    """A prompt's branch: GroupQueryAttention over the earlier tokens in the buffer and the new ones (its
    own present outputs, a copy, are not used: the buffer already holds the new tokens)."""
    out = f"{name}prompt/out"
    nodes = [
        _constant(f"{name}prompt/rows", [0, 0, -1]),
        _constant(f"{name}prompt/heads", [0, 0, match.heads, match.head_size]),
    ]
    rows = []
    for what, source in (("query", match.query), ("key", match.new_key), ("value", match.new_value)):
        nodes.append(
            helper.make_node("Transpose", [source], [f"{name}prompt/{what}/tokens"], perm=[0, 2, 1, 3])
        )
        nodes.append(
            helper.make_node(
                "Reshape",
                [f"{name}prompt/{what}/tokens", f"{name}prompt/rows"],
                [f"{name}prompt/{what}/rows"],
            )
        )
        rows.append(f"{name}prompt/{what}/rows")
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [*rows, match.cache.present_key, match.cache.present_value, at.seqlens, at.total],
            [f"{name}prompt/tokens", f"{name}prompt/unused_key", f"{name}prompt/unused_value"],
            domain=MICROSOFT.domain,
            num_heads=match.heads,
            kv_num_heads=match.kv_heads,
            scale=match.scale,
        )
    )
    nodes.append(
        helper.make_node("Reshape", [f"{name}prompt/tokens", f"{name}prompt/heads"], [f"{name}prompt/split"])
    )
    nodes.append(helper.make_node("Transpose", [f"{name}prompt/split"], [out], perm=[0, 2, 1, 3]))
    output = helper.make_tensor_value_info(out, elem_type, None)
    return helper.make_graph(nodes, f"{name}prompt/graph", [], [output])


def _constant(name: str, values: Sequence[int]) -> onnx.NodeProto:
    """An int64 ``Constant`` node writing ``name``."""
    tensor = helper.make_tensor(name, onnx.TensorProto.INT64, [len(values)], list(values))
    return helper.make_node("Constant", [], [name], value=tensor)
