"""``decode``: prefill and steps reproduce the full causal forward, in torch and through ONNX step graphs.

For a variant that declares ``Capabilities.decode``, the causal layer's own ``step`` (:class:`attnx.
state.DecodableLayer`) runs a split of the kit's sequence: a prompt, then single tokens, then one
multi-token step (:data:`SPLIT`), each continuing from the state the previous call returned. The
outputs, concatenated, must equal the layer's full causal forward within the variant's tolerance,
in torch and through two ONNX graphs of the step (no state: the prompt; with state: the rest)
lowered as a decode export is and run in ONNX Runtime. After every call each state tensor must have
its declared shape and dtype: only a KV cache's growing axis follows the position, so a recurrent
state is the same size at any position. The full forward never calls the step ops, so no other
check sees a step that drops its state or is right only for the first call.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch
from torch import nn

from attnx.errors import first_line
from attnx.exporter.export import export_onnx, save_onnx
from attnx.exporter.lowering import lower
from attnx.exporter.opsets import DEFAULT_OPSET
from attnx.exporter.signature import dynamic_shapes, fixed_arity
from attnx.models.spec import TensorSpec
from attnx.state import GROWING, DecodableLayer, StateTensor
from attnx.testing.checks.common import Skip, mismatch
from attnx.testing.subject import BATCH, D_MODEL, LENGTH, Case, Subject

SPLIT = (4, 1, 1, 1, LENGTH - 7)  # a prompt, single tokens, then several at once: LENGTH tokens in all
_ACTIVATIONS = "float32"


def check_decode(subject: Subject) -> list[str]:
    """Prefill + steps against the full causal forward (torch, ONNX Runtime); state shapes and dtypes."""
    if not subject.variant.capabilities.decode:
        raise Skip(f"variant '{subject.variant.name}' does not declare decode (Capabilities.decode)")
    layer = subject.build(Case("causal", causal=True))
    if not isinstance(layer, DecodableLayer):
        return [
            f"the causal layer ({type(layer).__name__}) declares decode but lacks decode_state()/step() "
            "(attnx.state.DecodableLayer)"
        ]
    declared = layer.decode_state()
    x = torch.randn(BATCH, LENGTH, D_MODEL, generator=torch.Generator().manual_seed(subject.seed + 13))
    with torch.no_grad():
        full = layer(x).numpy()
        problems = _compare(subject, "torch", _steps(layer, declared, x), full)
    try:
        onnx_outputs = _onnx_steps(subject, layer, declared, x)
    except Exception as exc:
        return [*problems, f"the step graphs do not export or run: {type(exc).__name__}: {first_line(exc)}"]
    return problems + _compare(subject, "ONNX Runtime", onnx_outputs, full)


def _compare(subject: Subject, where: str, pieces: list[Any], full: np.ndarray) -> list[str]:
    """Each piece of the split against the full forward's positions; or the state problems found."""
    problems, start = [], 0
    tol = subject.variant.tolerance
    for piece, n in zip(pieces, SPLIT, strict=False):  # a state problem ends the pieces early
        if isinstance(piece, str):
            return [*problems, f"{where}: {piece}"]
        found = mismatch(piece, full[:, start : start + n], tol.atol, tol.rtol)
        if found:
            what = "the prompt" if start == 0 else f"the step of {n} token{'s' * (n > 1)} at position {start}"
            problems.append(f"{where}: {what} differs from the full causal forward: {found}")
        start += n
    return problems


def _steps(layer: nn.Module, declared: Sequence[StateTensor], x: torch.Tensor) -> list[Any]:
    """The layer's step over :data:`SPLIT` in torch: each piece's output, or what is wrong with the state."""
    pieces, state, start = [], None, 0
    for n in SPLIT:
        position = torch.tensor([start], dtype=torch.int64)
        y, state = layer.step(x[:, start : start + n], state, position)
        start += n
        wrong = state_problem(declared, state, start)
        pieces.append(wrong or y.numpy())
        if wrong:
            break
    return pieces


def state_problem(declared: Sequence[StateTensor], state: Sequence[Any], seen: int) -> str | None:
    """What differs between ``state`` after ``seen`` tokens and the declaration (None: nothing)."""
    if len(state) != len(declared):
        return f"the step returns {len(state)} state tensors, decode_state() declares {len(declared)}"
    for tensor, value in zip(declared, state, strict=True):
        shape = tuple(BATCH if a == "batch" else seen if a == GROWING else a for a in tensor.axes)
        dtype = str(value.dtype).removeprefix("torch.")
        if tuple(value.shape) != shape or dtype != (tensor.dtype or _ACTIVATIONS):
            return (
                f"after {seen} tokens state '{tensor.name}' is {tuple(value.shape)} {dtype}; declared "
                f"{shape} {tensor.dtype or _ACTIVATIONS} (axes {tensor.axes}: only '{GROWING}' may grow)"
            )
    return None


class _StepGraph(nn.Module):
    """The layer's step as a graph: (x, position[, state...]) -> (y, state...)."""

    def __init__(self, layer: nn.Module, inputs: int, with_state: bool) -> None:
        super().__init__()
        self.layer, self.with_state = layer, with_state
        fixed_arity(self, self.run, inputs)

    def run(self, x: torch.Tensor, position: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, state = self.layer.step(x, tuple(state) if self.with_state else None, position)
        return (y, *state)


def _specs(declared: Sequence[StateTensor], side: str, growing: str) -> list[TensorSpec]:
    return [
        TensorSpec(
            f"{side}.{t.name}", t.dtype or _ACTIVATIONS, tuple(growing if a == GROWING else a for a in t.axes)
        )
        for t in declared
    ]


def _onnx_steps(
    subject: Subject, layer: nn.Module, declared: Sequence[StateTensor], x: torch.Tensor
) -> list[Any]:
    """The split through the two step graphs (function lowering, ONNX Runtime CPU)."""
    ops = [*subject.impl.ops, *subject.impl.decode_ops]
    tokens = [TensorSpec("x", _ACTIVATIONS, ("batch", "seq", D_MODEL)), TensorSpec("position", "int64", (1,))]
    sessions = []
    with tempfile.TemporaryDirectory(prefix="attnx-decode-check-") as tmp:
        for with_state in (False, True):
            inputs = [*tokens, *(_specs(declared, "past", "past_seq") if with_state else [])]
            outputs = [
                TensorSpec("y", _ACTIVATIONS, ("batch", "seq", D_MODEL)),
                *_specs(declared, "present", "total"),
            ]
            example = _example(layer, with_state)
            graph = _StepGraph(layer, len(inputs), with_state)
            proto = export_onnx(graph, example, ops, DEFAULT_OPSET, inputs, outputs, dynamic_shapes(inputs))
            path = Path(tmp) / f"step-{with_state}.onnx"
            save_onnx(lower(proto, ops, "function"), path)
            sessions.append(onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]))
    return _run_split(sessions, x.numpy(), declared)


def _example(layer: nn.Module, with_state: bool) -> tuple[torch.Tensor, ...]:
    """Inputs to trace with: 3 tokens after a real 5-token state, batch 2 (sizes > 1 stay dynamic)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, D_MODEL, generator=generator)
    with torch.no_grad():
        _, state = layer.step(x[:, :5], None, torch.tensor([0]))
    return (x[:, 5:], torch.tensor([5]), *(state if with_state else ()))


def _run_split(sessions: list[Any], x: np.ndarray, declared: Sequence[StateTensor]) -> list[Any]:
    first, later = sessions
    names = [f"past.{t.name}" for t in declared]
    pieces, state, start = [], [], 0
    for n in SPLIT:
        feed = {"x": x[:, start : start + n], "position": np.array([start], dtype=np.int64)}
        session = later if state else first
        y, *state = session.run(None, {**feed, **dict(zip(names, state, strict=False))})
        start += n
        wrong = state_problem(declared, [torch.from_numpy(s) for s in state], start)
        pieces.append(wrong or y)
        if wrong:
            break
    return pieces
