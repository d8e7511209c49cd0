"""Graph layouts: an export's ONNX graph under another input/output contract.

A :class:`Layout` keeps every node and weight of the source graph and adds a few adapter nodes
around it: new graph inputs feed the source graph's inputs through nodes placed before it (a
position from ``position_ids``, a KV cache trimmed to its valid length, a state unpacked, an empty
state made from nothing), and new graph outputs are made from the source graph's outputs by nodes
placed after it. So the new graph computes exactly what the checked source graph computes, and
only the adapters are new (an lm's prefill graph, :mod:`attnx.decode.export`; the serving graphs,
:mod:`attnx.serve.genai`, :mod:`attnx.serve.triton`).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper

from attnx.exporter.lowering import check
from attnx.exporter.trace import save_onnx

PREFIX = "adapter/"  # names of the adapter's own values


def value(name: str, dtype: str, axes: Sequence[str | int]) -> onnx.ValueInfoProto:
    """A graph input/output of numpy ``dtype`` with ``axes`` (str: a named dynamic axis)."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return helper.make_tensor_value_info(name, elem, list(axes))


@dataclasses.dataclass
class Layout:
    """A source graph (``proto``, left unchanged) and the adapter that gives it new inputs/outputs."""

    proto: onnx.ModelProto
    inputs: list[onnx.ValueInfoProto] = dataclasses.field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = dataclasses.field(default_factory=list)
    before: list[onnx.NodeProto] = dataclasses.field(default_factory=list)
    after: list[onnx.NodeProto] = dataclasses.field(default_factory=list)
    renamed: dict[str, str] = dataclasses.field(default_factory=dict)

    def source(self, name: str) -> onnx.ValueInfoProto:
        """The source graph's input or output ``name``."""
        graph = self.proto.graph
        return next(v for v in [*graph.input, *graph.output] if v.name == name)

    def feed(self, name: str) -> str:
        """Take source input ``name`` off the graph's inputs; returns the value the adapter must
        compute for it (its consumers read that value instead)."""
        self.renamed[name] = f"{PREFIX}{name}"
        return self.renamed[name]

    def take(self, name: str) -> str:
        """Take source output ``name`` off the graph's outputs (so an adapter output may reuse the name);
        returns the value that holds it for the nodes after the source graph."""
        self.renamed[name] = f"{PREFIX}{name}"
        return self.renamed[name]

    def keep(self, name: str) -> None:
        """Keep source input or output ``name`` as it is."""
        spec = self.source(name)
        is_input = any(v.name == name for v in self.proto.graph.input)
        (self.inputs if is_input else self.outputs).append(spec)

    def constant(self, name: str, values: Sequence[int]) -> str:
        """An int64 constant before the source graph."""
        tensor = numpy_helper.from_array(np.asarray(values, dtype=np.int64), f"{PREFIX}{name}")
        self.before.append(helper.make_node("Constant", [], [tensor.name], value=tensor))
        return tensor.name

    def computed_from(self, output: str, source_input: str) -> bool:
        """Whether the source graph computes its output ``output`` from its input ``source_input``
        (through its nodes, a subgraph's reads of outer values included): then no node can write
        ``output`` before whatever reads ``source_input`` on the way has run."""
        producers = {name: node for node in self.proto.graph.node for name in node.output}
        return source_input in _upstream([output], producers)

    def node(
        self, op: str, inputs: Sequence[str], output: str, *, after: bool = False, **attrs: object
    ) -> str:
        """Add one adapter node (before the source graph, or ``after`` it); returns its output."""
        (self.after if after else self.before).append(helper.make_node(op, list(inputs), [output], **attrs))
        return output

    def build(self, name: str) -> onnx.ModelProto:
        """The serving graph: the adapter's inputs, nodes and outputs around the source graph."""
        source = self.proto.graph
        nodes = [_renamed(node, self.renamed) for node in source.node]
        graph = helper.make_graph(
            [*self.before, *nodes, *self.after],
            name,
            self.inputs,
            self.outputs,
            initializer=list(source.initializer),
            value_info=[*source.value_info, *self._renamed_types()],
        )
        model = helper.make_model(
            graph,
            opset_imports=list(self.proto.opset_import),
            functions=list(self.proto.functions),
            ir_version=self.proto.ir_version,
            producer_name=self.proto.producer_name,
            producer_version=self.proto.producer_version,
        )
        check(model)
        return model

    def _renamed_types(self) -> list[onnx.ValueInfoProto]:
        """The types of the values that stand for the source graph's inputs and outputs (graph tools, e.g.
        fp16 converters and quantizers, read a value's type from them)."""
        typed = []
        for name, renamed in self.renamed.items():
            spec = onnx.ValueInfoProto()
            spec.CopyFrom(self.source(name))
            spec.name = renamed
            typed.append(spec)
        return typed


def reads(node: onnx.NodeProto) -> list[str]:
    """The values ``node`` reads from its graph: its inputs and what its subgraphs read from outside
    (ONNX Runtime runs the node only once those exist)."""
    names = list(node.input)
    for attribute in node.attribute:
        for subgraph in [attribute.g, *attribute.graphs] if attribute.type in (5, 10) else []:
            inner = {v.name for v in subgraph.input} | {t.name for t in subgraph.initializer}
            inner |= {out for n in subgraph.node for out in n.output}
            names += [name for n in subgraph.node for name in reads(n) if name not in inner]
    return names


def _upstream(names: Iterable[str], producers: Mapping[str, onnx.NodeProto]) -> set[str]:
    """``names`` and every value they are computed from (through their producers' :func:`reads`)."""
    seen, pending = set(), list(names)
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            pending += reads(producers[name]) if name in producers else []
    return seen


def without_output_copies(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every graph output that an ``Identity`` copies from a value its nodes compute written
    by that value's node instead (the value renamed to the output), in place.

    ONNX Runtime keeps such an ``Identity`` when its input has other readers, and copies the whole tensor
    on every run: a decode step's grown KV cache, which the attention reads and the graph returns (at the
    0.8B shape, 12 copies of the cache per token; docs/benchmarks.md). The same values are computed."""
    graph = model.graph
    outputs = {v.name for v in graph.output}
    while True:
        produced = {name: node for node in graph.node for name in node.output}
        copies = {
            node.input[0]: node
            for node in graph.node
            if node.op_type == "Identity"
            and node.domain in ("", "ai.onnx")
            and node.output[0] in outputs
            and node.input[0] in produced
            and node.input[0] not in outputs
        }
        if not copies:
            return model
        names = {source: node.output[0] for source, node in copies.items()}
        kept = [_renamed(node, names) for node in graph.node if all(node is not c for c in copies.values())]
        del graph.node[:]
        graph.node.extend(kept)
        typed = [v for v in graph.value_info if v.name not in names]
        del graph.value_info[:]
        graph.value_info.extend(typed)


# ops whose output ONNX Runtime may hand out as a view of their input's buffer
_VIEWS = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"}


def without_input_copies(model: onnx.ModelProto, copies: Mapping[str, str]) -> onnx.ModelProto:
    """``model`` reading a graph input in place where its copy was only a guard, in place.

    ``copies`` maps the output of a copy of a graph input (the input read once, before a runtime writes the
    same buffer) to the graph output that the runtime binds to that buffer (onnxruntime-genai's recurrent
    and conv states). The copy goes where every node that reads it, or a view of it, is an ancestor of the
    node writing that output, in the graph ONNX Runtime runs (local functions inlined, a subgraph's reads
    of outer values counted): the buffer is then read to the end before anything writes it. A reader off
    that path keeps its copy."""
    if not copies:
        return model
    graph = model.graph
    inputs = {v.name for v in graph.input}
    copying = {
        node.output[0]: node
        for node in graph.node
        if node.output and node.output[0] in copies and node.input and node.input[0] in inputs
    }
    readers, producers = _run_graph_index(model)
    names = {
        copy: copying[copy].input[0]
        for copy, output in copies.items()
        if copy in copying
        and _read_before([copy, copying[copy].input[0]], producers.get(output), readers, producers, copy)
    }
    kept = [_renamed(node, names) for node in graph.node if node.output[0] not in names]
    read = {name for node in kept for name in reads(node)} | {v.name for v in graph.output}
    kept = [node for node in kept if node.op_type != "Constant" or node.output[0] in read]  # bounds
    del graph.node[:]
    graph.node.extend(kept)
    typed = [v for v in graph.value_info if v.name not in names]
    del graph.value_info[:]
    graph.value_info.extend(typed)
    return model


def read_before_written(model: onnx.ModelProto, state: str, output: str) -> bool:
    """Whether every node of ``model`` that reads the data of graph input ``state`` (through views, ``If``
    branches and inlined local functions) is a strict ancestor of the node writing graph output
    ``output``: a runtime that binds both to one buffer reads the state to the end before it writes it,
    whatever order it runs the nodes in."""
    readers, producers = _run_graph_index(model)
    return _read_before([state], producers.get(output), readers, producers)


def graph_index(
    graph: onnx.GraphProto,
) -> tuple[dict[str, list[onnx.NodeProto]], dict[str, onnx.NodeProto]]:
    """The readers (each once, in graph order) and the producer of each value of ``graph``'s nodes (a node
    reads what its subgraphs read from outside)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(reads(node)):
            readers.setdefault(name, []).append(node)
    return readers, {name: node for node in graph.node for name in node.output}


def _run_graph_index(
    model: onnx.ModelProto,
) -> tuple[dict[str, list[onnx.NodeProto]], dict[str, onnx.NodeProto]]:
    """:func:`graph_index` of the graph ONNX Runtime runs (local functions inlined)."""
    return graph_index(onnx.inliner.inline_local_functions(model).graph)


def _read_before(
    names: list[str],
    writer: onnx.NodeProto | None,
    readers: Mapping[str, list[onnx.NodeProto]],
    producers: Mapping[str, onnx.NodeProto],
    copy: str | None = None,
) -> bool:
    """Whether every node but the copy (the node writing ``copy``) that reads the data of ``names``
    (through views, and through the outputs of a node with subgraphs, conservatively) is a strict ancestor
    of ``writer``, or ``writer`` itself as an ``Identity`` (the state passed through unchanged)."""
    if writer is None:
        return False
    ancestors = {id(producers[name]) for name in _upstream(reads(writer), producers) if name in producers}
    values, seen = list(names), set()
    while values:
        name = values.pop()
        for node in readers.get(name, []):
            if (copy is not None and copy in node.output) or id(node) in seen or not _reads_data(node, name):
                continue
            if id(node) not in ancestors and not (node is writer and node.op_type == "Identity"):
                return False  # an Identity writing what it reads passes the buffer through
            seen.add(id(node))
            if node.op_type in _VIEWS or any(a.type in (5, 10) for a in node.attribute):
                values += list(node.output)
    return True


def _reads_data(node: onnx.NodeProto, name: str) -> bool:
    """Whether ``node`` reads the elements of ``name`` (not only its shape, as ``Shape`` and ``Size`` do,
    or its type, as ``CastLike`` does of its target)."""
    if node.domain not in ("", "ai.onnx") or any(a.type in (5, 10) for a in node.attribute):
        return True
    if node.op_type in ("Shape", "Size"):
        return False
    return node.op_type != "CastLike" or node.input[0] == name


def _renamed(node: onnx.NodeProto, names: dict[str, str]) -> onnx.NodeProto:
    """``node`` reading and writing ``names[x]`` wherever it read or wrote ``x`` (subgraphs too, which may
    read outer values)."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for i, name in enumerate(copy.input):
        copy.input[i] = names.get(name, name)
    for i, name in enumerate(copy.output):
        copy.output[i] = names.get(name, name)
    for attribute in copy.attribute:
        for graph in [attribute.g, *attribute.graphs]:
            for j, inner in enumerate(graph.node):
                graph.node[j].CopyFrom(_renamed(inner, names))
    return copy


def copy_graph(source: Path, target: Path) -> None:
    """Copy an ONNX file with the files its external data is in (see :func:`save_beside`)."""
    save_beside(onnx.load(str(source), load_external_data=False), source.parent, target)


def save_beside(model: onnx.ModelProto, data: Path, target: Path) -> None:
    """Save ``model`` (loaded without its external data) at ``target`` with every file its external data
    names in ``data`` copied beside it under the same name (not hard-linked: onnx refuses to read external
    data from a file with several links, as a possible link attack)."""
    save_onnx(model, target)
    for name in external_files(model):
        if not (target.parent / name).exists():
            shutil.copyfile(data / name, target.parent / name)


def external_files(model: onnx.ModelProto) -> set[str]:
    """The files ``model``'s tensors keep their data in."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

    return {
        ExternalDataInfo(t).location
        for t in _get_all_tensors(model)
        if t.data_location == onnx.TensorProto.EXTERNAL
    }
