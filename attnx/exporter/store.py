"""The export's one weights file that every graph's weights point into (shared weights).

A real-size model's graphs cannot hold their weights: protobuf caps a model at 2 GiB, and four graphs
(model, prefill, decode, genai) each with its own copy would take four times the weights on disk and,
while written, in memory. So an export with shared weights writes the torch model's tensors once, into
``weights.safetensors`` (a safetensors file is a JSON header followed by each tensor's raw little-endian
bytes), and every ONNX graph keeps each initializer that *is* one of those tensors as external data
naming that file, at the tensor's byte offset. ONNX Runtime and onnx read such a graph as any graph
with external data; nothing is copied.

Identity decides, not equality: an initializer of a traced graph wraps the very torch tensor it was
made from (torch.onnx's ``TorchTensor``), so it is in the store when its bytes are a stored tensor's
bytes (same data pointer, dtype and shape). The exporter's constant folding would replace a weight by
its transposed copy (``x @ W.T``); :func:`keeps_weights` stops that fold for stored tensors, so the
graph transposes at run time (ONNX Runtime folds it into its pre-packed weights once, at load).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from attnx.errors import AttnxError
from attnx.exporter.files import check_safetensors

SHARE_FROM_BYTES = 1 << 30  # shared weights by default from 1 GiB of weights: the graphs stay far below 2 GiB


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes are in the store file."""

    name: str
    offset: int  # from the start of the file
    length: int


Key = tuple[int, torch.dtype, tuple[int, ...]]


def _key(tensor: torch.Tensor) -> Key | None:
    """The identity of a dense CPU tensor's bytes (None for a tensor whose bytes are not laid out densely)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
        return None
    return tensor.data_ptr(), tensor.dtype, tuple(tensor.shape)


class WeightStore:
    """The tensors of one weights file of an export, found by identity (:func:`_key`)."""

    def __init__(self, file: str, found: dict[Key, StoredTensor]) -> None:
        self.file, self._found = file, found

    @classmethod
    def save(cls, module: torch.nn.Module, path: Path) -> WeightStore:
        """Write ``module``'s state to the safetensors file ``path`` (:func:`write_safetensors`); returns its
        store."""
        state = module.state_dict()
        write_safetensors(state, path)
        return cls.index(state, path)

    @classmethod
    def index(cls, tensors: Mapping[str, torch.Tensor], path: Path) -> WeightStore:
        """The store of the safetensors file ``path`` that was written from ``tensors`` (by name)."""
        start, header = check_safetensors(path)
        found: dict[Key, StoredTensor] = {}
        for name, tensor in tensors.items():
            entry, key = header.get(name), _key(tensor)
            if entry is None or key is None:
                continue
            begin, end = entry["data_offsets"]
            found.setdefault(key, StoredTensor(name, start + begin, end - begin))
        return cls(path.name, found)

    def find(self, tensor: Any) -> StoredTensor | None:
        """Where ``tensor`` (a torch tensor, or an ONNX IR tensor wrapping one) is stored, if it is."""
        raw = getattr(tensor, "raw", tensor)
        if not isinstance(raw, torch.Tensor):
            return None
        key = _key(raw)
        return None if key is None else self._found.get(key)

    def externalize(self, model: Any) -> int:
        """Point every initializer of the ONNX IR ``model`` that is a stored
        tensor at the store file instead of holding its bytes; returns how many."""
        import onnx_ir as ir

        moved = 0
        for value in model.graph.initializers.values():  # the optimizer lifted every subgraph's here
            tensor = value.const_value
            stored = None if tensor is None else self.find(tensor)
            if stored is None:
                continue
            value.const_value = ir.ExternalTensor(
                self.file, stored.offset, stored.length, tensor.dtype, shape=tensor.shape, name=value.name
            )
            moved += 1
        return moved

    def keeps_weights(self, node: Any) -> bool | None:
        """onnxscript's constant-folding rule for the store: never fold a node that reads a stored tensor
        (a Transpose of a weight would become a second, transposed copy); None: its default rules."""
        for value in node.inputs:
            tensor = None if value is None else value.const_value
            if tensor is not None and self.find(tensor) is not None:
                return False
        return None


# torch dtype -> safetensors dtype, in the order safetensors lays tensors out (its dtype enum, descending)
SAFETENSORS_DTYPES = {
    torch.int64: "I64", torch.float64: "F64", torch.float32: "F32", torch.int32: "I32",
    torch.bfloat16: "BF16", torch.float16: "F16", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}  # fmt: skip
_LAYOUT = {dtype: rank for rank, dtype in enumerate(SAFETENSORS_DTYPES)}


def write_safetensors(tensors: Mapping[str, torch.Tensor], path: Path) -> None:
    """Write ``tensors`` to the safetensors file ``path`` one at a time, so writing holds no copy of them
    (``safetensors.torch.save_file`` turns every tensor into bytes first: at real size, a second copy of
    the weights). Tied tensors (the same bytes under several names) are written once, under the first of
    their names, the others named in the header's metadata, as ``safetensors.torch.save_model`` does;
    tensors are laid out by dtype, then by name, as safetensors lays them out.

    Raises:
        AttnxError: a tensor of a dtype safetensors does not store.
    """
    kept: dict[str, torch.Tensor] = {}
    seen: dict[tuple[int, torch.dtype, tuple[int, ...], tuple[int, ...]], str] = {}
    metadata: dict[str, str] = {}
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise AttnxError(f"the model's {name} is {tensor.dtype}, which safetensors does not store")
        alias = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and alias in seen:
            metadata[name] = seen[alias]
            continue
        seen[alias], kept[name] = name, tensor
    order = sorted(kept, key=lambda n: (_LAYOUT[kept[n].dtype], n))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name in order:
        size = kept[name].numel() * kept[name].element_size()
        shape = list(kept[name].shape)
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[kept[name].dtype],
            "shape": shape,
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as handle:
        handle.write(len(raw).to_bytes(8, "little") + raw)
        for name in order:
            data = kept[name].contiguous().reshape(-1)
            if data.numel():
                handle.write(memoryview(data.view(torch.uint8).numpy()))


def shares_weights(setting: bool | None, weights_bytes: int) -> bool:
    """Whether an export keeps its graphs' weights in its weights file: the setting, else from
    :data:`SHARE_FROM_BYTES` of weights."""
    return weights_bytes >= SHARE_FROM_BYTES if setting is None else setting
