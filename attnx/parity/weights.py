"""Every weight in an export's graphs is the torch model's: the check that random inputs cannot make.

Parity on random inputs sees only the paths those inputs take: an edited element of one embedding
row of an 8000-token vocabulary passes it. So after parity, every tensor stored in each ONNX graph of
the export (initializers and ``Constant`` values, subgraphs and functions included) is matched
with the tensors of the torch model the check ran against (its parameters and buffers; a module
export's stored program's), and the stored ``weights.safetensors`` with them too:

* a graph tensor that equals one of them exactly, or as stored in the graph's dtype (fp16) or
  transposed (exporters fold ``x @ W.T`` into a transposed copy), comes from it;
* a graph tensor named after one of them must equal it; one that agrees with one of them (same
  size) in at least half of its elements (a sample decides, then every element is compared) but
  not in all is an edited weight: a mismatch naming both and the first differing element;
* an int8 tensor ``X_quantized`` (ONNX Runtime's dynamic quantisation, with ``X_scale`` and
  ``X_zero_point``) is compared dequantised, to half a quantisation step;
* a block-quantised weight ``X_Q4`` / ``X_Q8`` (``MatMulNBits``: packed blocks with ``X_scales`` and
  optional ``X_zero_points``) is compared dequantised (its padding dropped), to its largest block's
  whole step (HQQ may move a value past the nearest level);
* anything else is a constant of the model's code (shapes, frequencies), which parity covers.

For attnx's own models every parameter and buffer must also appear in ``model.onnx`` (or its image under
an element-wise map the exporter folds, e.g. a decay's -exp(A_log), to float32 rounding): a weight
replaced wholesale (matching no parameter at all) then shows as a missing parameter. A parameter whose
elements are all 1 or all 0 (an untrained norm's) may be missing: multiplying by it or adding it changes
nothing, and graph tools fold it away (onnxslim in ``attnx optimize --slim``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.files import REEXPORT, check_safetensors, open_plain

SAMPLE = 256
QUANTIZED = "_quantized"


@dataclasses.dataclass
class WeightMismatch:
    """A graph tensor (or stored weight) that is almost, but not exactly, the model's ``parameter``."""

    graph: str  # file name, e.g. "model.onnx" or "weights.safetensors"
    tensor: str
    parameter: str | None  # None: a tensor of the model the graph lacks; "": a tensor that is none of them
    elements: int  # how many elements differ
    index: list[int]  # the first one
    got: float
    want: float

    def describe(self) -> str:
        if self.parameter is None:
            return f"{self.graph} holds no copy of the model's {self.tensor}"
        if not self.parameter:
            return f"{self.graph} tensor {self.tensor} is none of the model's tensors"
        return (
            f"{self.graph} tensor {self.tensor} differs from the model's {self.parameter} in {self.elements} "
            f"element{'s' * (self.elements != 1)} (first at {self.index}: {self.got:.9g} vs {self.want:.9g})"
        )


@dataclasses.dataclass
class WeightCheck:
    """What one file's tensors were matched with."""

    graph: str
    matched: int  # tensors that are one of the model's
    constants: int  # tensors that are none of them (the model's code's constants)
    mismatches: list[WeightMismatch] = dataclasses.field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.mismatches


class Reference:
    """The model's tensors by name, with an index of their bytes (as stored in a dtype, transposed or not)."""

    def __init__(self, tensors: Mapping[str, np.ndarray]) -> None:
        self.tensors = dict(tensors)
        self._index: dict[tuple[np.dtype, int, bool], dict[str, list[str]]] = {}

    def exact(self, array: np.ndarray) -> list[str]:
        """The model tensors that ``array`` is exactly (in ``array``'s dtype, perhaps transposed).

        Only the model tensors of ``array``'s size are digested, once per dtype and size, and their
        transposes only when none is ``array`` as it is: a real-size model's largest matrices are hashed
        when a graph holds one of their size, and transposed when it holds one transposed."""
        return self.exact_digest(_digest(array), array.dtype, array.size)

    def exact_digest(self, digest: str, dtype: np.dtype, size: int) -> list[str]:
        """:meth:`exact` of the array of ``dtype`` and ``size`` whose :func:`_digest` is ``digest``."""
        for transposed in (False, True):
            found = self._digests(dtype, size, transposed).get(digest)
            if found:
                return found
        return []

    def _digests(self, dtype: np.dtype, size: int, transposed: bool) -> dict[str, list[str]]:
        """Digest -> names of the model tensors of ``size`` elements, in ``dtype``, as they are or
        (``transposed``) the transposes of the matrices among them."""
        key = (dtype, size, transposed)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = {}
            for name, tensor in self.tensors.items():
                if tensor.dtype.kind != dtype.kind or tensor.size != size:
                    continue
                view = _transpose(tensor) if transposed else tensor
                if view is not None:
                    index.setdefault(_digest(view.astype(dtype, copy=False)), []).append(name)
        return index

    def aliases(self, name: str) -> list[str]:
        """``name`` and the model tensors that share its memory (tied weights)."""
        tensor = self.tensors.get(name)
        if tensor is None:
            return [name]
        return [n for n, t in self.tensors.items() if _memory(t) == _memory(tensor)]

    def named(self, name: str) -> str | None:
        """The model tensor whose name ``name`` ends with (the longest; graphs of a wrapper add a prefix)."""
        found = [n for n in self.tensors if name == n or name.endswith("." + n)]
        return max(found, key=len) if found else None

    def closest(self, array: np.ndarray, step: float) -> tuple[str, bool, np.ndarray] | None:
        """(name, transposed, view) of the same-sized model tensor ``array`` agrees with in at least half of
        a sample of its elements, or None."""
        flat = array.reshape(-1)
        picks = np.random.default_rng(0).integers(0, flat.size, min(SAMPLE, flat.size))
        best, score = None, 0.5
        for name, tensor in self.tensors.items():
            if tensor.size != array.size:
                continue
            for transposed in (False, True) if _transpose_shape(tensor) else (False,):
                agree = float(np.mean(_agree(flat[picks], _sampled(tensor, picks, transposed), step)))
                if agree >= score:
                    best, score = (name, transposed), agree
        if best is None:
            return None
        name, transposed = best
        tensor = self.tensors[name]
        view = _transpose(tensor) if transposed else np.ascontiguousarray(tensor)
        return name, transposed, view.reshape(array.shape)


def check_weights(export: ExportDir, tensors: Mapping[str, Any], own_model: bool) -> list[WeightCheck]:
    """Match every tensor of every ONNX graph of ``export`` (and its stored weights) with ``tensors`` (the
    torch model's, name -> torch tensor or array: the assembly's ``tensors()``). ``own_model``: an attnx
    model, which puts every one of its tensors into model.onnx (the assembly's ``every_tensor_exported``).

    A graph tensor kept as external data at exactly a tensor of ``weights.safetensors`` (shared weights,
    :mod:`attnx.exporter.store`) is that stored tensor, which :func:`check_stored` matches: it is not read
    again, so the check holds one tensor at a time besides the model's."""
    reference = Reference({name: _numpy(t) for name, t in tensors.items()})
    stored = StoredWeights.of(export)
    checks = []
    for key, record in export.manifest.files.items():
        if record.path.endswith(".onnx"):
            model = onnx.load(str(export.file(key)), load_external_data=False)
            found = graph_tensors(model, export.path, stored)
            complete = own_model and key == "model"
            checks.append(check_graph(record.path, found, reference, complete, block_lengths(model)))
    checks.append(check_stored(export, reference))
    return checks


@dataclasses.dataclass(frozen=True)
class StoredWeights:
    """The tensors of an export's ``weights.safetensors`` by their byte range in the file."""

    file: str
    ranges: dict[tuple[int, int], tuple[str, str, list[int]]]  # (offset, length) -> (name, dtype, shape)

    @classmethod
    def of(cls, export: ExportDir) -> StoredWeights:
        path = export.file("weights")
        start, header = check_safetensors(path)
        ranges = {}
        for name, entry in header.items():
            if name != "__metadata__":
                begin, end = entry["data_offsets"]
                ranges[start + begin, end - begin] = (name, entry["dtype"], entry["shape"])
        return cls(path.name, ranges)

    def holds(self, tensor: onnx.TensorProto) -> str | None:
        """The stored tensor ``tensor`` (external data) is, byte for byte, dtype and shape; None if none."""
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return None
        info = {entry.key: entry.value for entry in tensor.external_data}
        if info.get("location") != self.file:
            return None
        found = self.ranges.get((int(info.get("offset", 0)), int(info.get("length", -1))))
        if found is None:
            return None
        name, dtype, shape = found
        same = _SAFETENSORS_TYPES.get(dtype) == tensor.data_type and list(tensor.dims) == shape
        return name if same else None


_SAFETENSORS_TYPES = {
    "F32": onnx.TensorProto.FLOAT, "F16": onnx.TensorProto.FLOAT16, "BF16": onnx.TensorProto.BFLOAT16,
    "F64": onnx.TensorProto.DOUBLE, "I64": onnx.TensorProto.INT64, "I32": onnx.TensorProto.INT32,
    "I8": onnx.TensorProto.INT8, "U8": onnx.TensorProto.UINT8, "BOOL": onnx.TensorProto.BOOL,
}  # fmt: skip


def check_graph(
    label: str,
    tensors: Iterable[tuple[str, np.ndarray | str]],
    reference: Reference,
    complete: bool,
    lengths: Mapping[str, int] | None = None,
) -> WeightCheck:
    """Match the tensors of one graph (``complete``: every model tensor must be among them); a tensor given
    as a str is the stored weight of that name (:class:`StoredWeights`); ``lengths``: the input length K
    of each block-quantised weight (:func:`block_lengths`)."""
    check = WeightCheck(label, 0, 0)
    used: set[str] = set()
    found: dict[str, np.ndarray] = {}
    for name, value in tensors:
        if isinstance(value, str):
            check.matched += 1
            used.update(reference.aliases(stored_name(reference, value)))
        else:
            found[name] = value
    for name, array in found.items():
        blocks = _dequantized_blocks(name, array, found, (lengths or {}).get(name))
        if blocks is not None:
            _match(check, used, name, blocks[0], reference, blocks[1])
            continue
        if name.endswith(QUANTIZED) and array.dtype in (np.int8, np.uint8):
            base = name[: -len(QUANTIZED)]
            scale, zero = found.get(f"{base}_scale"), found.get(f"{base}_zero_point")
            if scale is not None and zero is not None and scale.size == 1 and zero.size == 1:
                step = float(scale.reshape(-1)[0])
                value = (array.astype(np.float64) - float(zero.reshape(-1)[0])) * step
                _match(check, used, base, value, reference, step / 2 * (1 + 1e-6) + 1e-12)
                continue
        if array.dtype.kind != "f":
            continue
        _match(check, used, name, array, reference, 0)
    if complete:
        for name, tensor in reference.tensors.items():
            if name in used or tensor.dtype.kind != "f" or not tensor.size:
                continue
            if _folded(tensor, found):
                check.matched += 1
                continue
            if _neutral(tensor):  # x * 1 or x + 0: a graph tool may fold it away (onnxslim does)
                continue
            check.mismatches.append(WeightMismatch(label, name, None, tensor.size, [], math.nan, math.nan))
    return check


def block_lengths(model: onnx.ModelProto) -> dict[str, int]:
    """The input length K of each ``MatMulNBits`` weight of ``model``'s main graph, by its name."""
    return {
        node.input[1]: next((a.i for a in node.attribute if a.name == "K"), 0)
        for node in model.graph.node
        if node.op_type == "MatMulNBits"
    }


def _dequantized_blocks(
    name: str, packed: np.ndarray, found: Mapping[str, np.ndarray], length: int | None
) -> tuple[np.ndarray, float] | None:
    """A ``MatMulNBits`` weight (``name`` ending ``_Q4``/``_Q8``: (N, blocks, bytes) uint8, with
    ``<base>_scales``; ``length``: its input length K) as the (K, N) float matrix it stands for and one
    step of its coarsest block; None: not such a tensor."""
    bits = {"_Q4": 4, "_Q8": 8}.get(name[-3:])
    scales = found.get(f"{name[:-3]}_scales")
    zero_points = found.get(f"{name[:-3]}_zero_points")
    if bits is None or scales is None or length is None or packed.dtype != np.uint8 or packed.ndim != 3:
        return None
    rows, blocks, _ = packed.shape
    levels = _nibbles(packed) if bits == 4 else packed
    if zero_points is None:
        zero = np.full((rows, blocks), 1 << (bits - 1))
    elif zero_points.dtype.kind == "f" or bits == 8:  # HQQ's are in the scales' type; 8-bit ones whole
        zero = zero_points.reshape(rows, blocks)
    else:
        zero = _nibbles(zero_points.reshape(rows, -1))[:, :blocks]
    step = scales.reshape(rows, blocks).astype(np.float32)
    values = (levels.astype(np.float32) - zero[..., None].astype(np.float32)) * step[..., None]
    return values.reshape(rows, -1)[:, :length].T.copy(), _one_step(step)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """4-bit values packed two to a byte (low nibble first) along the last axis, unpacked."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def _one_step(step: np.ndarray) -> float:
    """The tolerance of a dequantised weight: its coarsest block's step (and a rounding's worth)."""
    return float(np.abs(step).max(initial=0.0)) * (1 + 1e-6) + 1e-12


# Element-wise maps the exporter's constant folding applies to a parameter used only through them (a
# decay's -exp(A_log)): the graph then holds the image, not the parameter.
FOLDS = (np.exp, lambda x: -np.exp(x), np.negative)


def _neutral(tensor: np.ndarray) -> bool:
    """Every element 1, or every element 0 (an untrained norm's weight or bias)."""
    return bool(np.all(tensor == 1) or np.all(tensor == 0))


def _folded(tensor: np.ndarray, found: Mapping[str, np.ndarray]) -> bool:
    """Whether a graph tensor of ``tensor``'s size (reshaped: a broadcast view) is one of :data:`FOLDS` of it,
    to float32 rounding (an edited element of the image leaves the parameter without a copy: a mismatch)."""
    wide = tensor.astype(np.float64).reshape(-1)
    for array in found.values():
        if array.dtype.kind == "f" and array.size == tensor.size:
            flat = array.reshape(-1).astype(np.float64)
            for fold in FOLDS:
                image = fold(wide)
                if np.all(np.abs(flat - image) <= 4 * np.finfo(array.dtype).eps * np.abs(image)):
                    return True
    return False


def stored_name(reference: Reference, name: str) -> str:
    """The name in ``reference`` of the stored weight ``name`` (a module export stores the module's own
    names; its program prefixes them with ``module.``)."""
    return name if reference.named(name) else f"module.{name}"


def check_stored(export: ExportDir, reference: Reference) -> WeightCheck:
    """Every tensor of ``weights.safetensors`` is one of the model's, exactly (read one at a time)."""
    check = WeightCheck(export.manifest.files["weights"].path, 0, 0)
    used: set[str] = set()
    for stored in stored_tensors(export.file("weights")):
        exact = reference.exact_digest(stored.digest(), stored.dtype, stored.size)
        if exact:  # hashed block by block: a 2 GB embedding is never read whole to be matched
            check.matched += 1
            used.update(exact)
            continue
        array = stored.read()
        _match(check, used, stored_name(reference, stored.name), array, reference, 0)
        if check.constants:  # a stored weight that is none of the model's tensors
            check.constants = 0
            check.mismatches.append(WeightMismatch(check.graph, stored.name, "", array.size, [], 0.0, 0.0))
    return check


_NUMPY_TYPES = {
    "F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I8": "i1", "U8": "u1", "BOOL": "?",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class FileTensor:
    """One tensor of a safetensors file, read with plain reads when asked (never memory-mapped: a mapped
    file's pages would stay resident beside the model's until it is closed)."""

    path: Path
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    length: int

    BLOCK = 1 << 26  # bytes hashed at a time

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def digest(self) -> str:
        """:func:`_digest` of the tensor, its bytes hashed :attr:`BLOCK` at a time."""
        hasher = hashlib.blake2b(digest_size=16)
        with os.fdopen(open_plain(self.path), "rb") as handle:
            handle.seek(self.offset)
            left = self.length
            while left:
                block = handle.read(min(left, self.BLOCK))
                if not block:
                    raise AttnxError(f"{self.path.name} ends inside {self.name}; {REEXPORT}")
                hasher.update(block)
                left -= len(block)
        return hasher.hexdigest() + str(self.size)

    def read(self) -> np.ndarray:
        with os.fdopen(open_plain(self.path), "rb") as handle:
            handle.seek(self.offset)
            return np.frombuffer(handle.read(self.length), dtype=self.dtype).reshape(self.shape)


def stored_tensors(path: Path) -> Iterator[FileTensor]:
    """Each tensor of a safetensors file (header checked first).

    Raises:
        AttnxError: a tensor of a dtype attnx does not write (bfloat16: an export stores float32 or float16).
    """
    start, header = check_safetensors(path)
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _NUMPY_TYPES.get(entry["dtype"])
        if dtype is None:
            raise AttnxError(
                f"{path.name} holds {name} in {entry['dtype']}, which attnx does not store; {REEXPORT}"
            )
        begin, end = entry["data_offsets"]
        yield FileTensor(path, name, np.dtype(dtype), tuple(entry["shape"]), start + begin, end - begin)


def graph_tensors(
    model: onnx.ModelProto, base: Path, stored: StoredWeights | None = None
) -> Iterator[tuple[str, np.ndarray | str]]:
    """(name, array) of every tensor stored in the model: initializers and tensor attributes (``Constant``
    values), in the main graph, its subgraphs and its functions; external data is read from ``base``, one
    tensor at a time, except a tensor that ``stored`` holds, given by its stored name instead."""
    graphs: list[Any] = [model.graph]
    nodes: list[Any] = [n for f in model.functions for n in f.node]
    while graphs or nodes:
        if graphs:
            graph = graphs.pop()
            for tensor in graph.initializer:
                name = stored.holds(tensor) if stored is not None else None
                yield tensor.name, name if name is not None else numpy_helper.to_array(tensor, str(base))
            nodes.extend(graph.node)
            continue
        node = nodes.pop()
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.TENSOR:
                yield (
                    f"{node.output[0] if node.output else node.name}:{attribute.name}",
                    numpy_helper.to_array(attribute.t, str(base)),
                )
            graphs.extend([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)


def _match(
    check: WeightCheck, used: set[str], name: str, array: np.ndarray, reference: Reference, step: float
) -> None:
    """Count ``array`` as one of the model's tensors, a constant, or a mismatch (see the module docstring)."""
    exact = reference.exact(array) if step == 0 else []
    if exact:
        check.matched += 1
        used.update(exact)
        return
    named = reference.named(name)
    if named is not None and reference.tensors[named].size == array.size:
        views = [(named, t, v.reshape(array.shape)) for t, v in _views(reference.tensors[named])]
        best = min(views, key=lambda c: int(np.sum(~_agree(array, c[2], step))))
    else:
        best = reference.closest(array, step)
    if best is None:
        check.constants += 1
        return
    parameter, transposed, view = best
    used.add(parameter)
    differs = ~_agree(array, view, step)
    if not differs.any():
        check.matched += 1
        return
    first = np.unravel_index(int(np.argmax(differs)), array.shape) if array.ndim else ()
    check.mismatches.append(
        WeightMismatch(
            check.graph,
            name,
            f"{parameter} (transposed)" if transposed else parameter,
            int(differs.sum()),
            [int(i) for i in first],
            float(array[first]),
            float(view[first]),
        )
    )


def _memory(array: np.ndarray) -> tuple[int, tuple[int, ...], np.dtype]:
    return array.__array_interface__["data"][0], array.shape, array.dtype


def _views(tensor: np.ndarray) -> list[tuple[bool, np.ndarray]]:
    """The tensor and, when it is a matrix, its transpose (contiguous)."""
    transposed = _transpose(tensor)
    views = [(False, np.ascontiguousarray(tensor))]
    return views if transposed is None else [*views, (True, transposed)]


def _transpose(tensor: np.ndarray) -> np.ndarray | None:
    """The transpose (contiguous) of a matrix of more than one row and column; None for anything else."""
    return np.ascontiguousarray(tensor.T) if _transpose_shape(tensor) else None


def _transpose_shape(tensor: np.ndarray) -> bool:
    """Whether ``tensor`` is a matrix of more than one row and column (one whose transpose differs)."""
    return tensor.ndim == 2 and tensor.shape[0] > 1 and tensor.shape[1] > 1


def _sampled(tensor: np.ndarray, picks: np.ndarray, transposed: bool) -> np.ndarray:
    """The elements at flat positions ``picks`` of ``tensor`` (``transposed``: of its transpose), without
    making the transpose."""
    if not transposed:
        return tensor.reshape(-1)[picks]
    rows = tensor.shape[0]
    return tensor[picks % rows, picks // rows]


def _agree(a: np.ndarray, b: np.ndarray, step: float) -> np.ndarray:
    """Element-wise: ``a`` (a graph's) is ``b`` (the model's) as stored in ``a``'s dtype (to that dtype's
    rounding where it is narrower: fp16 converters round tiny values up to the smallest subnormal), or
    within ``step`` when ``step`` > 0 (dequantised int8)."""
    if step > 0:  # in float32: its rounding is far below a quantisation step, and a 1 GB table stays 1 GB
        return np.abs(a.astype(np.float32, copy=False) - b.astype(np.float32, copy=False)) <= step
    wide, want = a.astype(np.float64), b.astype(np.float64)
    same = (a == b.astype(a.dtype)) | (np.isnan(wide) & np.isnan(want))
    if a.dtype.kind == "f" and b.dtype.kind == "f" and a.dtype.itemsize < b.dtype.itemsize:
        same |= np.abs(wide - want) <= np.spacing(np.abs(b).astype(a.dtype)).astype(np.float64)
    return same


def _digest(array: np.ndarray) -> str:
    """The bytes' hash (hashed in place, not copied) and the element count."""
    data = memoryview(np.ascontiguousarray(array)).cast("B")
    return hashlib.blake2b(data, digest_size=16).hexdigest() + str(array.size)


def _numpy(tensor: Any) -> np.ndarray:
    if isinstance(tensor, np.ndarray):
        return tensor
    import torch

    value = tensor.detach().cpu()
    if value.dtype == torch.bfloat16:
        value = value.float()
    return value.numpy()
