"""``causality``: in causal mode, changing later tokens leaves earlier outputs unchanged.

Unchanged up to rounding in torch (the layer and the op): at most :data:`ROUNDING_ULPS`
units in the last place of the output's largest magnitude (:func:`rounding_bound`), and
within atol through the op's ONNX body in ONNX Runtime. Bit equality is no promise a
kernel can keep: a correct op moves earlier outputs by an ulp on some CPUs (BLAS blocks a
matmul differently once other rows change; 6e-8 to 1.2e-7 measured on AMD EPYC), while a
real leak moves them by orders of magnitude more (the seeded leak: ~1e-1). Sequence axes
are found by length (the kit's sequence length is a prime no other axis has); float
inputs get new random values at positions >= cut.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from attnx.testing.checks.common import Skip, forwards
from attnx.testing.onnx_op import OpSession
from attnx.testing.subject import LENGTH, OpCall, Subject

ROUNDING_ULPS = 32


def rounding_bound(reference: Any) -> float:
    """How far a correct kernel may move ``reference`` when inputs it does not read change:
    :data:`ROUNDING_ULPS` ulps (``torch.finfo(dtype).eps``) of its largest magnitude."""
    tensor = torch.as_tensor(np.asarray(reference)) if not isinstance(reference, torch.Tensor) else reference
    if not tensor.is_floating_point() or not tensor.numel():
        return 0.0
    return ROUNDING_ULPS * torch.finfo(tensor.dtype).eps * float(tensor.detach().abs().max())


def check_causality(subject: Subject) -> list[str]:
    """In causal mode, changing tokens at positions >= cut leaves outputs before cut unchanged:
    up to :func:`rounding_bound` in torch (layer and op), within atol in ONNX Runtime (op body)."""
    if not subject.variant.capabilities.causal:
        raise Skip(f"variant '{subject.variant.name}' does not declare causal attention")
    atol = subject.variant.tolerance.atol
    leaks: dict[str, str] = {}  # who leaks -> the first (earliest cut) finding
    generator = torch.Generator().manual_seed(subject.seed + 11)
    cuts = (1, LENGTH // 2)
    for fw in (f for f in forwards(subject) if f.case.causal and f.case.n_queries == LENGTH):
        for cut in cuts:
            x = fw.x.clone()
            x[:, cut:] = torch.randn(x[:, cut:].shape, generator=generator)
            change = _max_change(fw.output, fw.rerun(x=x), _positions(fw.output, cut, future=False))
            allowed = rounding_bound(fw.output)
            if change > allowed:
                leaks.setdefault(
                    f"the {fw.case.label} layer",
                    f"the {fw.case.label} layer's outputs before position {cut} change by {change:.3g} "
                    f"(allowed {allowed:.3g}: rounding) when tokens >= {cut} change",
                )
        for call in (c for c in fw.calls if c.op is not None):
            output = call.outputs[0]  # the attention output (later ones, if any, are state)
            if not _sequence_axes(output):
                leaks[call.name] = (
                    f"{call.name} output {tuple(output.shape)} has no sequence axis of length "
                    f"{LENGTH}; cannot check causality"
                )
                continue
            try:
                session = OpSession(call.op, call)
                baseline = session.run(call.bound())[0]
            except Exception:
                session = None  # the onnx-body check reports a body that does not load
            for cut in cuts:
                changed = _perturb_future(call, cut, generator)
                past = _positions(output, cut, future=False)
                rerun = call.run(changed)
                rerun = rerun[0] if isinstance(rerun, tuple) else rerun
                changes = {f"{call.name} (torch)": (_max_change(output, rerun, past), rounding_bound(output))}
                if session is not None:
                    change = _max_change(baseline, session.run({**call.bound(), **changed})[0], past)
                    changes[f"the ONNX body of attnx::{call.op.name}"] = (change, atol)
                for who, (change, allowed) in changes.items():
                    if change > allowed:
                        leaks.setdefault(
                            who,
                            f"{who} in causal mode leaks future tokens: outputs before position {cut} change "
                            f"by {change:.3g} (allowed {allowed:.3g}) when {', '.join(changed)} change at "
                            f"positions >= {cut} ({call.describe()})",
                        )
    return list(leaks.values())


def _sequence_axes(tensor: torch.Tensor) -> list[int]:
    return [axis for axis, size in enumerate(tensor.shape) if size == LENGTH]


def _positions(tensor: torch.Tensor, cut: int, future: bool) -> torch.Tensor:
    """Bool mask of ``tensor``: entries at a sequence position >= cut on any sequence axis (future),
    or < cut on every sequence axis (past)."""
    mask = torch.full(tensor.shape, not future, dtype=torch.bool)
    for axis in _sequence_axes(tensor):
        shape = [1] * tensor.dim()
        shape[axis] = LENGTH
        later = (torch.arange(LENGTH) >= cut).reshape(shape)
        mask = mask | later if future else mask & ~later
    return mask


def _perturb_future(call: OpCall, cut: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """New random values at positions >= cut for every float input with a sequence axis."""
    changed = {}
    for name, value in call.bound().items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and _sequence_axes(value):
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float32).to(value.dtype)
            changed[name] = torch.where(_positions(value, cut, future=True), noise, value)
    return changed


def _max_change(before: Any, after: Any, where: torch.Tensor) -> float:
    diff = (torch.as_tensor(np.asarray(after)).double() - torch.as_tensor(np.asarray(before)).double()).abs()
    return float(diff[where].max()) if where.any() else 0.0
