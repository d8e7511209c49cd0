"""Weight-only block quantisation of a graph's weight MatMuls (``attnx optimize --int4`` / ``--int8``).

ONNX Runtime's own quantizer (``onnxruntime.quantization.matmul_nbits_quantizer``) does the work: it
replaces each chosen ``MatMul`` by a ``com.microsoft::MatMulNBits`` holding the weight in blocks of
``block_size`` values along the input dimension, each block with its scale (and a zero point unless
symmetric), and ONNX Runtime computes in float32 (``accuracy_level`` 0) or with int8 activations (4).
A table that is both the embedding and the output head (tied weights, as Qwen3.5's) is stored once: the
embedding's ``Gather`` becomes ``com.microsoft::GatherBlockQuantized`` reading the head's quantised blocks
and scales (``uint8`` data with a ``bits`` attribute, so no int4 tensor type and no IR version 10), as the
genai model builder does, and the float32 table leaves the graph (the 0.8B Qwen3.5: 1 GB of its 1.5).
That takes the head's symmetric blocks (no zero points: not ``--asymmetric`` or HQQ) over a width that is a
multiple of the block size; otherwise the table stays float32. An untied embedding stays float32.
Activations, states, decays and gates stay float32; only weights are quantised.

attnx chooses the precision per layer kind (:mod:`attnx.optimizer.layers`), folds a weight read through a
Transpose (the shared-weights layout) into a transposed copy first (the quantizer takes only constant
weights), and never quantises the recurrent rules' decay and gate projections.

An export's graphs share one weights file, so a :class:`QuantisedWeights` kept across them quantises each
weight once: the second graph's MatMul over the same stored bytes (decode.onnx's, after model.onnx's) takes
the blocks made for the first (at the Qwen3.5 0.8B shape, a minute and a half of the quantizer's work).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

from attnx.errors import AttnxError
from attnx.exporter.layout import reads
from attnx.exporter.manifest import QuantizationSection
from attnx.optimizer.layers import GATE, LAYER_KINDS, LayerWeight, classify
from attnx.optimizer.protos import name_nodes, quiet_root_logger
from attnx.optimizer.settings import ALGORITHMS, BLOCK_SIZES, DEFAULT_BLOCK_SIZE, PRECISIONS

BITS = {"int4": 4, "int8": 8}
# 4: int8 activations in the kernel, as the genai builder uses on CPU (its speed, and int4's error dominates);
# 0: float32 compute for int8 weights (level 4 tripled int8's KL and cost 0.3% top-1 on the trained hybrid)
DEFAULT_ACCURACY_LEVEL = {"int4": 4, "int8": 0}


def plan(
    precision: str,
    layers: Mapping[str, str] | None = None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    symmetric: bool = True,
    accuracy_level: int | None = None,
    algorithm: str = "rtn",
) -> QuantizationSection:
    """The quantisation of ``--int4``/``--int8`` (``precision``) with per-kind overrides ``layers``
    (kind -> "int4", "int8" or "fp32").

    Raises:
        AttnxError: an unknown kind, precision or algorithm, a block size MatMulNBits does not take, an
            accuracy level outside 0..4, HQQ for int8, or nothing left to quantise.
    """
    chosen = dict.fromkeys(LAYER_KINDS, precision)
    for kind, value in (layers or {}).items():
        if kind not in LAYER_KINDS:
            raise AttnxError(f"--layers: unknown layer kind {kind!r}; choose from {', '.join(LAYER_KINDS)}")
        if value not in PRECISIONS:
            raise AttnxError(f"--layers {kind}={value}: choose a precision from {', '.join(PRECISIONS)}")
        chosen[kind] = value
    if block_size not in BLOCK_SIZES:
        raise AttnxError(f"--block-size {block_size}: MatMulNBits takes {', '.join(map(str, BLOCK_SIZES))}")
    if algorithm not in ALGORITHMS:
        raise AttnxError(f"--algorithm {algorithm}: choose from {', '.join(ALGORITHMS)}")
    if algorithm == "hqq" and any(value == "int8" for value in chosen.values()):
        raise AttnxError("--algorithm hqq quantises to int4 only; use rtn for int8 layers")
    level = DEFAULT_ACCURACY_LEVEL[precision] if accuracy_level is None else accuracy_level
    if not 0 <= level <= 4:
        raise AttnxError(f"--accuracy-level {level}: MatMulNBits takes 0 to 4")
    if all(value == "fp32" for value in chosen.values()):
        raise AttnxError("--layers keeps every layer kind fp32: nothing to quantise")
    return QuantizationSection(chosen, block_size, symmetric, level, algorithm)


WeightKey = tuple[bool, str, tuple[tuple[str, str], ...]]  # transposed, precision, where its bytes lie


@dataclasses.dataclass
class QuantisedWeights:
    """The ``MatMulNBits`` made for weights stored in an export's external files, by weight (whether read
    transposed, its precision, where its bytes lie: one export's graphs may name a stored tensor
    differently), to be taken by the next graph over the same weights within one ``attnx optimize`` (one
    quantisation setting)."""

    made: dict[WeightKey, tuple[onnx.NodeProto, list[onnx.TensorProto]]] = dataclasses.field(
        default_factory=dict
    )

    @staticmethod
    def key(matmul: LayerWeight, tensor: onnx.TensorProto, precision: str) -> WeightKey | None:
        """``matmul``'s weight as stored, or None when it is not in an external file (nothing to share)."""
        if not uses_external_data(tensor):
            return None
        return matmul.transposed, precision, tuple((e.key, e.value) for e in tensor.external_data)

    def record(self, key: WeightKey, node: onnx.NodeProto, graph: onnx.GraphProto) -> None:
        """Keep ``node`` (a ``MatMulNBits`` the quantizer made) and copies of its constant inputs."""
        tensors = {tensor.name: tensor for tensor in graph.initializer}
        kept = onnx.NodeProto()
        kept.CopyFrom(node)
        copies = []
        for name in node.input[1:]:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensors[name])
            copies.append(copy)
        self.made[key] = (kept, copies)

    def take(self, key: WeightKey, matmul: LayerWeight, model: onnx.ModelProto) -> None:
        """Turn ``matmul`` into the kept ``MatMulNBits`` for ``key``, its tensors and its domain added where
        missing (the quantizer, which imports the domain, may not run on this graph at all)."""
        made, tensors = self.made[key]
        graph = model.graph
        if not any(entry.domain == made.domain for entry in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(made.domain, 1))
        have = {tensor.name for tensor in graph.initializer}
        graph.initializer.extend(tensor for tensor in tensors if tensor.name not in have)
        inputs = [matmul.node.input[0], *made.input[1:]]
        replacement = onnx.helper.make_node(
            made.op_type, inputs, list(matmul.node.output), name=made.name, domain=made.domain
        )
        replacement.attribute.extend(made.attribute)
        matmul.node.CopyFrom(replacement)


def quantize_weights(
    model: onnx.ModelProto,
    section: QuantizationSection,
    op_kinds: Mapping[str, str],
    source: Path,
    quantised: QuantisedWeights | None = None,
) -> tuple[onnx.ModelProto, dict[str, int]]:
    """``model`` (read from ``source``, its external data maybe not loaded) with its weight MatMuls
    quantised as ``section`` says; ``op_kinds``: attnx op type -> "attention" or "recurrent"; ``quantised``:
    blocks made for earlier graphs over the same weights, which it takes and adds to. Only the weights
    quantised here are read. Returns the model and how many MatMuls went to each precision, by "kind
    precision" (the gates: "gate fp32"), and the embeddings that now gather the head's blocks ("embedding
    int4").

    Raises:
        AttnxError: no weight MatMul of a kind ``section`` quantises (e.g. a graph without projections).
    """
    name_nodes(model)
    matmuls = classify(model, op_kinds, source.name)
    chosen = [m for m in matmuls if m.kind != GATE and section.precision[m.kind] != "fp32"]
    if not chosen:
        kinds = ", ".join(k for k, v in section.precision.items() if v != "fp32")
        raise AttnxError(f"{source.name} has no weight MatMul in the layer kinds to quantise ({kinds})")
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    read_through = {m.node.output[0]: m.weight for m in chosen if m.transposed}  # product -> its weight
    quantised = QuantisedWeights() if quantised is None else quantised
    keys = {
        m.node.output[0]: quantised.key(m, initializers[m.weight], section.precision[m.kind]) for m in chosen
    }
    for matmul in chosen:
        if keys[matmul.node.output[0]] in quantised.made:
            quantised.take(keys[matmul.node.output[0]], matmul, model)
    chosen = [m for m in chosen if m.node.op_type == "MatMul"]
    for matmul in chosen:  # the quantizer reads these; a transposed weight is read into its copy only
        tensor = initializers[matmul.weight]
        if not matmul.transposed and uses_external_data(tensor):
            load_external_data_for_tensor(tensor, str(source.parent))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    _untranspose(model, [m for m in chosen if m.transposed], source.parent)
    for precision, bits in BITS.items():
        names = {m.node.name for m in chosen if section.precision[m.kind] == precision}
        if names:
            model = _run_quantizer(model, section, bits, names)
    made = {m.node.output[0] for m in chosen if keys[m.node.output[0]] is not None}
    for node in model.graph.node:  # the quantizer's MatMulNBits keep their MatMul's output
        if node.op_type == "MatMulNBits" and node.output[0] in made:
            quantised.record(keys[node.output[0]], node, model.graph)
    gathers = _gather_quantised_tables(model, read_through)
    _drop_unused_initializers(model)
    counts = collections.Counter(
        f"{m.kind} {'fp32' if m.kind == GATE else section.precision[m.kind]}" for m in matmuls
    )
    counts.update(f"embedding int{bits}" for bits in gathers)
    return model, dict(sorted(counts.items()))


def _run_quantizer(
    model: onnx.ModelProto, section: QuantizationSection, bits: int, names: set[str]
) -> onnx.ModelProto:
    """``model`` with the MatMuls called ``names`` quantised to ``bits`` by ONNX Runtime's quantizer."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        HQQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    if section.algorithm == "hqq":
        config = HQQWeightOnlyQuantConfig(block_size=section.block_size, bits=bits)
    else:
        config = DefaultWeightOnlyQuantConfig(
            block_size=section.block_size,
            is_symmetric=section.symmetric,
            accuracy_level=section.accuracy_level,
            bits=bits,
        )
    others = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in names]
    quantizer = MatMulNBitsQuantizer(model, nodes_to_exclude=others, algo_config=config)
    with quiet_root_logger():
        quantizer.process()
    quantized = quantizer.model.model
    if section.algorithm == "hqq":  # the HQQ kernel's accuracy level is not the config's to set
        for node in quantized.graph.node:
            if node.op_type == "MatMulNBits":
                _set_int(node, "accuracy_level", section.accuracy_level)
    return quantized


def _gather_quantised_tables(model: onnx.ModelProto, read_through: Mapping[str, str]) -> list[int]:
    """Each row ``Gather`` of a weight that a ``MatMulNBits`` now holds transposed (``read_through``: that
    MatMul's output -> the weight) reads its symmetric blocks instead (module docstring). Returns the bits
    of each ``Gather`` replaced."""
    graph = model.graph
    heads = {
        read_through[node.output[0]]: node
        for node in graph.node
        if node.op_type == "MatMulNBits"
        and node.output[0] in read_through
        and len(node.input) == 3  # no zero points
        and _attribute(node, "K") % _attribute(node, "block_size") == 0
    }
    nodes, replaced = [], []
    for node in graph.node:
        head = (
            heads.get(node.input[0]) if node.op_type == "Gather" and _attribute(node, "axis") == 0 else None
        )
        if head is None:
            nodes.append(node)
            continue
        bits = _attribute(head, "bits")
        replaced.append(bits)
        nodes += _gather_blocks(graph, node, head, bits)
    del graph.node[:]
    graph.node.extend(nodes)
    return replaced


def _gather_blocks(
    graph: onnx.GraphProto, gather: onnx.NodeProto, head: onnx.NodeProto, bits: int
) -> list[onnx.NodeProto]:
    """``gather``'s rows from ``head``'s blocks: its (N, K / block, block * bits / 8) bytes as (N, K * bits
    / 8) rows, dequantised by its scales."""
    blocks, shape = f"{gather.output[0]}.blocks", f"{gather.output[0]}.blocks_shape"
    row_bytes = _attribute(head, "K") * bits // 8
    graph.initializer.append(
        numpy_helper.from_array(np.array([_attribute(head, "N"), row_bytes], np.int64), shape)
    )
    return [
        onnx.helper.make_node("Reshape", [head.input[1], shape], [blocks]),
        onnx.helper.make_node(
            "GatherBlockQuantized",
            [blocks, gather.input[1], head.input[2]],
            list(gather.output),
            name=gather.name,
            domain="com.microsoft",
            bits=bits,
            block_size=_attribute(head, "block_size"),
            gather_axis=0,
            quantize_axis=1,
        ),
    ]


def _attribute(node: onnx.NodeProto, name: str) -> int:
    """An int attribute of ``node`` (0 when absent: ``Gather``'s default axis)."""
    return next((a.i for a in node.attribute if a.name == name), 0)


def _untranspose(model: onnx.ModelProto, matmuls: list[LayerWeight], base: Path) -> None:
    """Point each of ``matmuls`` (weights read through a Transpose) at a transposed copy of its weight
    (read from ``base`` when external; the weight itself stays as it was, e.g. for a tied embedding)."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    made: dict[str, str] = {}
    for matmul in matmuls:
        if matmul.weight not in made:
            name = f"{matmul.weight}.transposed"
            array = numpy_helper.to_array(initializers[matmul.weight], str(base)).T.copy()
            graph.initializer.append(numpy_helper.from_array(array, name))
            made[matmul.weight] = name
        matmul.node.input[1] = made[matmul.weight]
    read = {value for node in graph.node for value in reads(node)} | {o.name for o in graph.output}
    kept = [node for node in graph.node if node.op_type != "Transpose" or any(o in read for o in node.output)]
    del graph.node[:]
    graph.node.extend(kept)


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    """Remove the initializers no node of the main graph or its subgraphs reads."""
    graph = model.graph
    read = {name for node in graph.node for name in reads(node)} | {o.name for o in graph.output}
    kept = [tensor for tensor in graph.initializer if tensor.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    for attribute in node.attribute:
        if attribute.name == name:
            attribute.i = value
            return
    node.attribute.append(onnx.helper.make_attribute(name, value))
