"""One file of tensor bytes that every graph of an optimised export points into, each distinct tensor once.

An export's graphs hold the same weights: ``model.onnx`` and ``decode.onnx`` are transformed alike (the
same int4 blocks, the same fp16 halves), and ``prefill.onnx`` and ``genai.onnx`` are laid out again from
the new decode graph. Written each with its own tensors, a real-size export would hold four copies (four
1.5 GB graphs for a 0.8B model in int4, whose float32 embedding alone is 1 GB). So before a graph is saved,
:meth:`SharedData.offload` moves each of its tensors of at least :data:`MIN_BYTES` into ``optimized.data``
as ONNX external data, appending only bytes it does not hold yet (a SHA-256 of the bytes decides), at
page-aligned offsets; the graph keeps a reference. A tensor that is already external data (a weight
left as it was, still in the export's ``weights.safetensors``) is not touched. Only an export whose graphs
keep external data already (shared weights, from 1 GiB by default) is written so; a small one's graphs
stay self-contained, as tools that copy a graph file alone expect.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
from onnx import numpy_helper
from onnx.external_data_helper import set_external_data, uses_external_data

DATA_FILE = "optimized.data"
DATA_KEY = "optimized_data"  # its manifest file key
MIN_BYTES = 1024  # smaller tensors (shapes, scalars) stay inside their graph
ALIGNMENT = 4096  # ONNX Runtime maps external data page by page


class SharedData:
    """``directory/optimized.data``, appended to by each graph's :meth:`offload`."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / DATA_FILE
        self._where: dict[bytes, tuple[int, int]] = {}  # digest -> (offset, length)
        self._end = 0

    @property
    def used(self) -> bool:
        """Whether any tensor was written (the file exists)."""
        return bool(self._where)

    def offload(self, model: onnx.ModelProto) -> None:
        """Point every tensor of ``model``'s graph and subgraphs holding at least :data:`MIN_BYTES` of
        raw data at its bytes in the shared file (written there unless already held)."""
        for tensor in _tensors(model.graph):
            if uses_external_data(tensor):
                continue
            if not tensor.HasField("raw_data"):  # typed fields (a converter's), as raw bytes
                tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
            data = tensor.raw_data
            if len(data) < MIN_BYTES:
                continue
            digest = hashlib.sha256(data).digest()
            if digest not in self._where:
                self._where[digest] = self._append(data)
            set_external_data(tensor, DATA_FILE, *self._where[digest])
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL

    def _append(self, data: bytes) -> tuple[int, int]:
        offset = -(-self._end // ALIGNMENT) * ALIGNMENT
        with open(self.path, "ab") as handle:
            handle.write(b"\0" * (offset - self._end))
            handle.write(data)
        self._end = offset + len(data)
        return offset, len(data)


def _tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    """The initializers of ``graph`` and of every subgraph inside it."""
    found = list(graph.initializer)
    for node in graph.node:
        for attribute in node.attribute:
            for subgraph in (
                [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs
            ):
                found += _tensors(subgraph)
    return found
