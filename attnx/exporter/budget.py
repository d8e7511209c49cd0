"""Memory and FLOPs of a model forward, and the guard that refuses jobs that cannot fit in memory.

The model declares how its layers, FFN and heads add up (``ModelSpec.cost``), each variant the
cost of one attention layer (``Variant.cost``); :func:`model_cost` puts them together for a
model at ``batch`` x ``seq`` tokens. See :mod:`attnx.cost` for what the FLOPs count.

Memory is an upper bound in float32, used to skip cases that cannot fit before running them:
every tensor the attention maths may hold at once plus the block's activations, times a 1.5
safety factor; layers run one after another, so the largest layer's working set counts once,
plus what outlives the layers (seq2seq's encoder output) or follows them (the (B, N, vocab)
logits, often the largest tensor of an lm). A variant without a cost model is assumed
quadratic (:func:`attnx.cost.dense_attention_cost`, so long inputs are skipped rather than
risked) and gets no FLOP count.

:func:`require_memory` is the guard ``attnx export`` and ``attnx verify`` apply before they
build or load anything (``attnx bench`` skips cases with the same estimate): the weights, the
copies an export or a check holds of them, and the activations of its largest parity case.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from attnx.config import Config

# available_memory and require_memory (the guard) live in attnx.cost, below the layers that use them
from attnx.cost import GiB, Part, Shape, available_memory, dense_attention_cost, require_memory  # noqa: F401
from attnx.errors import AttnxError, first_line
from attnx.models.spec import ModelSpec
from attnx.variant import Variant

SAFETY = 1.5
# ONNX Runtime's CPU arena grows in powers of two past what a forward holds, and it keeps three copies
# of the weights while loading (the proto, the initializers, MLAS's prepacked GEMM weights). Measured
# in benchmarks/sidebyside.py (every built-in, one layer and the default encoder, N = 1024 and 16384):
# ORT's peak growth stayed at or below 0.95x the bound times SAFETY (0.4-0.6x at 16384), and at most
# torch eager's; the factor keeps a margin over the worst case.
ORT_MEMORY_FACTOR = 1.25
ORT_WEIGHT_COPIES = 3
# With shared weights (attnx.exporter.store) a parity check's session maps weights.safetensors and skips
# ONNX Runtime's folding and packing (attnx.parity.runners.CHECK_SKIPS): at the 0.8B Qwen3.5 shape (3.01 GB
# of weights) a session held 0.11 GB loaded and 3.50 GB after 2 x 129 tokens, and the whole verified export
# peaked at 6.08 GB, 2.02 copies with the torch model's (docs/benchmarks.md, issue 31).
SHARED_ORT_WEIGHT_COPIES = 1.25
# Writing an export holds the torch weights, the exported ONNX proto (a copy of them), its serialisation
# and the safetensors file.
EXPORT_WEIGHT_COPIES = 4
# With shared weights no graph holds a copy: the export holds the torch weights alone (a Hugging Face
# checkpoint's memory-mapped).
SHARED_EXPORT_WEIGHT_COPIES = 1


def ort_weight_copies(shared: bool) -> float:
    """The copies of its weights an ONNX Runtime session of an export holds at its peak."""
    return SHARED_ORT_WEIGHT_COPIES if shared else ORT_WEIGHT_COPIES


def export_weight_copies(shared: bool, verified: bool) -> float:
    """The copies of its weights an export holds at its peak. The parity check runs ONNX Runtime after the
    torch model's part is done and the model freed (:mod:`attnx.parity.check`), so a verified export's
    peak is the larger of writing's and a session's, not their sum."""
    held = SHARED_EXPORT_WEIGHT_COPIES if shared else EXPORT_WEIGHT_COPIES
    return max(held, ort_weight_copies(shared)) if verified else held


@dataclasses.dataclass(frozen=True)
class ModelCost:
    flops: int | None  # None: a variant without a cost model
    working_bytes: int  # activation bound, safety factor included (weights not included)


def model_cost(
    model: ModelSpec,
    model_config: Config,
    roles: Mapping[str, tuple[Variant, Config]],
    batch: int,
    seq: int,
) -> ModelCost | None:
    """Cost of one forward of ``model`` at ``batch`` x ``seq`` tokens; None for a model without a
    cost model. ``roles`` maps "self" (and "cross" for cross-attention models) to the variant and
    its config serving that role."""
    if model.cost is None:
        return None

    def attend(shape: Shape, role: str) -> Part:
        variant, config = roles[role]
        if variant.cost is None:
            return Part(None, dense_attention_cost(shape).working_bytes)
        cost = variant.cost(shape, config)
        return Part(cost.flops, cost.working_bytes)

    shape = Shape(batch, seq, model_config.d_model, model_config.n_heads)
    part = model.cost(model_config, shape, attend)
    return ModelCost(flops=part.flops, working_bytes=int(SAFETY * part.working))


# Python's own memory per module while a model is built on the meta device (its dicts, its parameters'
# objects): about 3.1 KiB per nn.Module measured with torch 2.13 (a 3000-layer encoder of width 8);
# counted so that a model of a million tiny layers is refused too.
MODULE_BYTES = 4096


class _Exceeded(Exception):
    pass


@contextlib.contextmanager
def meta_build(what: str) -> Iterator[None]:
    """Build a model on torch's meta device (no memory) in the block; options whose sizes torch cannot
    even describe (a dimension past int64) become one line.

    Raises:
        AttnxError: naming ``what`` and torch's reason.
    """
    import torch

    try:
        with torch.device("meta"):
            yield
    except (RuntimeError, ValueError, OverflowError, MemoryError) as exc:
        raise AttnxError(
            f"cannot build {what} with these options ({first_line(exc, with_type=True)}); make it smaller"
        ) from None


@contextlib.contextmanager
def weights_within(limit: int | None, refusal: Callable[[int], AttnxError]) -> Iterator[None]:
    """Build a model (on the meta device) in the block, refusing it as soon as its parameters and
    buffers, plus :data:`MODULE_BYTES` per module, pass ``limit`` bytes (None: no limit): a model too
    large is refused before it is built, not after minutes of building.

    Raises:
        AttnxError: ``refusal(bytes counted)``.
    """
    if limit is None:
        yield
        return
    from torch.nn.modules import module as torch_module

    seen: set[int] = set()
    counted = [0]

    def add(size: int) -> None:
        counted[0] += size
        if counted[0] > limit:
            raise _Exceeded

    def tensor(module: Any, name: str, value: Any) -> None:
        if value is not None and id(value) not in seen:
            seen.add(id(value))
            add(value.numel() * value.element_size())

    handles = [
        torch_module.register_module_parameter_registration_hook(tensor),
        torch_module.register_module_buffer_registration_hook(tensor),
        torch_module.register_module_module_registration_hook(lambda module, name, child: add(MODULE_BYTES)),
    ]
    try:
        yield
    except _Exceeded:
        raise refusal(counted[0]) from None
    finally:
        for handle in handles:
            handle.remove()


def check_needs(
    model: ModelSpec,
    model_config: Config,
    roles: Mapping[str, tuple[Variant, Config]],
    *,
    weights_bytes: int,
    weight_copies: float,
    batch: int,
    seq: int,
) -> int:
    """Bytes a parity check of this model needs at its largest case: ``weight_copies`` copies of the
    weights plus the torch and ONNX Runtime activations of one forward at ``batch`` x ``seq``."""
    cost = model_cost(model, model_config, roles, batch, seq)
    activations = 0 if cost is None else int((1 + ORT_MEMORY_FACTOR) * cost.working_bytes)
    return int(weight_copies * weights_bytes) + activations


def shrink_hint(options: Mapping[str, object], traced: bool = False, batch: int = 1, shown: int = 3) -> str:
    """What a refused export can make smaller: its largest integer options, largest first
    ("d_ff=1000000, d_model=512, ..."), the verify lengths and batch, the traced example lengths."""
    sizes = sorted(((k, v) for k, v in options.items() if _integer(v)), key=lambda kv: -int(str(kv[1])))
    named = ", ".join(f"{key}={value}" for key, value in sizes[:shown]) or "vocab_size, d_model, n_layers"
    hint = f"make it smaller ({named}) or verify at shorter lengths (--seq-lens, verify.seq_lens)"
    hint += " with a smaller verify.batch" if batch > 2 else ""
    return hint + (" and trace at shorter export.example_lengths" if traced else "")


def _integer(value: object) -> bool:
    try:
        return not isinstance(value, bool) and int(str(value)) > 1
    except ValueError:
        return False


MADV_PAGEOUT = 21  # linux/mman.h (Linux 5.4+): reclaim these pages now; contents are never changed


def page_out_weight_files() -> int:
    """Ask the kernel to reclaim the pages of every ``.safetensors`` file this process maps (a Hugging Face
    checkpoint's weights, which its torch model reads in place), so that an ONNX Runtime session loaded
    next does not sit beside them in memory; returns the bytes of the regions asked.

    A clean page of a file is dropped and read again from the file if touched; a page written in memory
    is kept (there is no swap to page it out to), so no value changes. A no-op where ``/proc/self/maps``
    or ``madvise`` is missing (not Linux) or refuses (a kernel before 5.4)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return 0
    asked = 0
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].endswith(".safetensors"):
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_PAGEOUT) == 0:
                asked += end - start
    return asked


def return_freed_memory() -> None:
    """Give the memory this process has freed back to the system (glibc's ``malloc_trim``): freed blocks of
    a closed ONNX Runtime session otherwise stay in the process, and the next session's weights grow it
    past them. A no-op without glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
