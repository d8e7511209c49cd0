"""Machinery shared by the variants' op- and layer-level tests; each variant's maths stays in its test file.

Random inputs and padding masks, one attnx op call run as a one-node ONNX model, and the generic half of a
layer's reference (per-head projections). The one-node model is attnx.testing's ``node_model``/``OpSession``:
the node the exporter's translation emits, lowered by attnx's own code. On top of the kit, this module
builds calls from plain arguments (the kit replays recorded ones), caches one session per signature and
evaluates the body with onnx's reference evaluator; these might belong in ``attnx.testing``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_loop import Loop as ReferenceLoop
from torch import nn

from attnx.ops import AttentionOp
from attnx.testing.onnx_op import OPSET, OpSession
from attnx.testing.subject import Case, OpCall
from attnx.variant import AttentionSpec, Variant
from tests.helpers import assert_unchanged

LOWERINGS = ("function", "decomposed", "plugin")

# -- inputs ----------------------------------------------------------------------------------------------


def random_qkv(
    batch: int,
    heads: int,
    n: int,
    m: int,
    d: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    magnitude: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator]:
    """q (batch, heads, n, d) and k, v (batch, heads, m, d) ~ randn, in that order, q and k times magnitude;
    the generator is returned to draw masks and later changes from."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, n, d, generator=g) * magnitude
    k = torch.randn(batch, heads, m, d, generator=g) * magnitude
    v = torch.randn(batch, heads, m, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype), g


def padding_mask(kind: str, batch: int, m: int, g: torch.Generator) -> torch.Tensor | None:
    """A key padding mask (batch, m), True = real key, drawn from ``g``; ``kind`` is one of

    - ``none``: None;
    - ``prefix``: a real prefix of random length 1..m per row;
    - ``scattered``: each key real with probability 1/2, and one random key real in every row;
    - ``random``: each key real with probability 0.6 (a row may have no real key);
    - ``empty-row``: ``random`` with batch row 0 all padding (when batch > 1).
    """
    if kind == "none":
        return None
    if kind == "prefix":
        return torch.arange(m) < torch.randint(1, m + 1, (batch, 1), generator=g)
    if kind == "scattered":
        mask = torch.rand(batch, m, generator=g) > 0.5
        mask[:, torch.randint(0, m, (1,), generator=g)] = True
        return mask
    if kind not in ("random", "empty-row"):
        raise ValueError(f"unknown mask kind {kind!r}")
    mask = torch.rand(batch, m, generator=g) > 0.4
    if kind == "empty-row" and batch > 1:
        mask[0] = False
    return mask


# -- one op call in ONNX ---------------------------------------------------------------------------------


def op_call(op: AttentionOp, *args: Any) -> OpCall:
    """The call ``op(*args)`` (positional, in schema order) for the kit; its output is only shaped, by the
    op's fake kernel on meta tensors, since the one-node model needs just the output's dtype and rank."""
    meta = op.overload(*(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args))
    if isinstance(meta, tuple):
        output = tuple(torch.empty_like(t, device="cpu") for t in meta)
    else:
        output = torch.empty_like(meta, device="cpu")
    return OpCall(Case(op.name), op.overload, op, args, {}, output)


_SESSIONS: dict[tuple[Any, ...], OpSession] = {}


def op_session(op: AttentionOp, call: OpCall, lowering: str, opset: int = OPSET) -> OpSession:
    """The ONNX Runtime session of ``call``'s one-node model at ``opset``, one per op, lowering, opset,
    attributes and input dtypes and ranks (which optional inputs are present included)."""
    signature = tuple(
        (v.dtype, v.dim()) if isinstance(v, torch.Tensor) else tuple(v) if isinstance(v, list) else v
        for v in call.bound().values()
    )
    key = (op.name, lowering, opset, signature)
    if key not in _SESSIONS:
        session = OpSession(op, call, lowering, opset)
        session.options.log_severity_level = 3  # ORT's warnings about the bodies' shapes are not findings
        _SESSIONS[key] = session
    return _SESSIONS[key]


def close_sessions() -> None:
    """Drop the cached sessions. A session created with the attnx CPU kernels must not outlive a later
    kernel registration (another test's plugin): onnxruntime-extensions then crashes when it is run
    or destroyed (attnx.ortkernels.register_all), so the cache lives for one test module."""
    _SESSIONS.clear()
    gc.collect()


def run_onnx(op: AttentionOp, *args: Any, lowering: str = "function", opset: int = OPSET) -> torch.Tensor:
    """``op(*args)`` as a one-node model at ``opset`` with ``lowering`` in ONNX Runtime (CPU): the first
    output."""
    call = op_call(op, *args)
    return torch.from_numpy(op_session(op, call, lowering, opset).run(call.bound())[0])


def standard_linear_attention_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The standard (opset 27) ``LinearAttention`` nodes of ``model``'s graph and functions, in ``If``
    branches too: what shows that a model holds the bodies on the standard op."""
    found, stack = [], [*model.graph.node, *(n for f in model.functions for n in f.node)]
    while stack:
        node = stack.pop()
        found += [node] if node.op_type == "LinearAttention" and node.domain in ("", "ai.onnx") else []
        stack += [n for a in node.attribute if a.type == onnx.AttributeProto.GRAPH for n in a.g.node]
    return found


def run_reference(op: AttentionOp, *args: Any) -> torch.Tensor:
    """The function body of ``op(*args)`` in onnx's reference evaluator, every op in numpy in the inputs'
    dtype: for fp16, rounding as a native-fp16 backend (CUDA, TensorRT) does. ORT's CPU provider runs the
    fp16 ops it has no fp16 kernel for in float32 (Casts around them), so it alone would not see an fp16
    overflow in the body."""
    call = op_call(op, *args)
    session = op_session(op, call, "function")
    feed = {name: call.bound()[name].numpy() for name in session.input_names}
    return torch.from_numpy(run_natively(session.model, feed)[0])


class Loop(ReferenceLoop):
    """onnx.reference's ``Loop`` with the standard's meaning of an omitted ``cond`` input: true, so the loop
    runs its trip count M (a for loop, as onnxscript writes ``for _ in range(m)``). onnx 1.23.2's loop is
    ``while cond and it < M``, which runs no iteration when ``cond`` is omitted (None)."""

    def _run(self, trips: Any, cond: Any, *args: Any, **kwargs: Any) -> Any:
        return super()._run(trips, np.array(True) if cond is None else cond, *args, **kwargs)


def run_natively(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """``model`` (functions inlined) in onnx's reference evaluator: every op in numpy in its inputs' dtype
    (``Loop`` as the standard defines it, see :class:`Loop`)."""
    evaluator = ReferenceEvaluator(onnx.inliner.inline_local_functions(model), new_ops=[Loop])
    with np.errstate(over="ignore", invalid="ignore"):  # fp16 overflows: the checks see what comes out
        return evaluator.run(None, dict(feed))


def op_results(op: AttentionOp, *args: Any, lowerings: Sequence[str] = LOWERINGS) -> dict[str, torch.Tensor]:
    """``op(*args)`` in torch and in ONNX Runtime for each lowering, by backend name."""
    return {"torch": op.torch_op(*args)} | {name: run_onnx(op, *args, lowering=name) for name in lowerings}


def fp16_results(op: AttentionOp, *args: Any) -> dict[str, torch.Tensor]:
    """``op(*args)`` on fp16 inputs in torch, in ONNX Runtime (function body; float32 inside, see
    :func:`run_reference`) and in native fp16 arithmetic (``native``)."""
    return op_results(op, *args, lowerings=["function"]) | {"native": run_reference(op, *args)}


def assert_all_close(results: Mapping[str, torch.Tensor], expected: torch.Tensor, **tolerance: Any) -> None:
    """``torch.testing.assert_close(result, expected, **tolerance)`` for every backend, naming the one off."""
    for name, result in results.items():
        torch.testing.assert_close(result, expected, **tolerance, msg=lambda text, at=name: f"{at}: {text}")


def assert_fp16_close(
    results: Mapping[str, torch.Tensor], expected: torch.Tensor, rel: float = 5e-3, atol: float = 2e-3
) -> None:
    """Every result fp16, finite, within ``rel`` max|expected| + ``atol`` of the float64 reference.

    The default, 5e-3 max|ref| + 2e-3, is ~10 fp16 unit roundoffs (u = 2**-11): the reference sees the same
    fp16 inputs, so only intermediate roundings differ, while a dropped key or a wrong mask moves outputs by
    O(max |v|).
    """
    for name, result in results.items():
        assert result.dtype == torch.float16 and torch.isfinite(result).all(), name
        error = (result.double() - expected).abs().max()
        assert error <= rel * expected.abs().max() + atol, f"{name}: max |error| {error:.3g}"


def assert_fp16_rows_close(
    op: AttentionOp, args: Sequence[Any], rows: torch.Tensor, expected: torch.Tensor
) -> None:
    """``op(*args)`` on fp16 inputs, in torch and ONNX Runtime (function body): fp16 and finite everywhere,
    and at the query positions ``rows`` (a sample: a long sequence's full reference is too large) within
    5e-3 (absolute and relative) of the float64 reference ``expected``."""
    for result in op_results(op, *args, lowerings=["function"]).values():
        assert result.dtype == torch.float16 and torch.isfinite(result).all()
        torch.testing.assert_close(result[..., rows, :].double(), expected, atol=5e-3, rtol=5e-3)


def assert_padded_keys_ignored(
    attend: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], g: torch.Generator
) -> None:
    """Noise (100 randn) on the keys and values at padded positions (real: 4 and 9 of 9 keys) leaves
    ``attend(q, k, v, mask, causal)`` unchanged up to rounding, bidirectional and causal."""
    q, k, v = inputs
    mask = torch.arange(9) < torch.tensor([[4], [9]])
    noise = 100 * torch.randn(2, *k.shape, generator=g) * ~mask[:, None, :, None]
    for causal in (False, True):
        shaken = attend(q, k + noise[0], v + noise[1], mask, causal)
        assert_unchanged(shaken, attend(q, k, v, mask, causal), f"causal={causal}")


def assert_causal_op(
    op: AttentionOp, inputs: Sequence[torch.Tensor], rest: Sequence[Any], cut: int, g: torch.Generator
) -> None:
    """New values (10 randn) at positions >= cut (axis -2) of every input leave ``op(*inputs, *rest)``'s
    outputs before cut unchanged up to rounding in torch, and within 1e-6 in ONNX Runtime (function body),
    and change later ones."""
    changed = [t.clone() for t in inputs]
    for t in changed:
        t[..., cut:, :] = torch.randn(t[..., cut:, :].shape, generator=g) * 10
    before, after = op.torch_op(*inputs, *rest), op.torch_op(*changed, *rest)
    assert_unchanged(after[..., :cut, :], before[..., :cut, :])
    assert not torch.allclose(before[..., cut:, :], after[..., cut:, :])
    ort_before, ort_after = (run_onnx(op, *tensors, *rest) for tensors in (inputs, changed))
    torch.testing.assert_close(ort_after[..., :cut, :], ort_before[..., :cut, :], atol=1e-6, rtol=1e-5)


# -- layers ----------------------------------------------------------------------------------------------


def build_layer(variant: Variant, config: Any, seed: int = 0, **spec: Any) -> nn.Module:
    """The variant's attention layer (d_model 24, 3 heads) in eval mode, its parameters drawn after seed."""
    torch.manual_seed(seed)
    return variant.load().build(config, AttentionSpec(24, 3, **spec)).eval()


def layer_inputs(
    batch: int, n: int, m: int | None, mask_kind: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """x (batch, n, 24), a context (batch, m, 24) unless m is None, and a padding mask of the keys."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, 24, generator=g)
    context = None if m is None else torch.randn(batch, m, 24, generator=g)
    return x, context, padding_mask(mask_kind, batch, m or n, g)


def run_layer(
    layer: nn.Module, x: torch.Tensor, context: torch.Tensor | None = None, mask: torch.Tensor | None = None
) -> torch.Tensor:
    with torch.no_grad():
        return layer(x, context=context, key_padding_mask=mask)


def assert_layer_is_causal(layer: nn.Module) -> None:
    """New inputs from position 17 of 30 on leave the layer's first 17 outputs unchanged up to rounding."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 30, 24, generator=g)
    y = x.clone()
    y[:, 17:] = torch.randn(2, 13, 24, generator=g)
    assert_unchanged(run_layer(layer, y)[:, :17], run_layer(layer, x)[:, :17])


def split_heads(layer: nn.Module, name: str, inputs: torch.Tensor) -> torch.Tensor:
    """inputs @ W.T + b with the layer's Linear ``name`` in float64, as (batch, heads, n, d_head)."""
    projection = getattr(layer, name)
    y = inputs.double() @ projection.weight.detach().double().T + projection.bias.detach().double()
    return y.reshape(*y.shape[:2], layer.spec.n_heads, -1).transpose(1, 2)


def split_qkv(
    layer: nn.Module, x: torch.Tensor, context: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`split_heads` of q_proj on x, and of k_proj and v_proj on the context (x when None)."""
    source = x if context is None else context
    return (
        split_heads(layer, "q_proj", x),
        split_heads(layer, "k_proj", source),
        split_heads(layer, "v_proj", source),
    )


def merge_heads(layer: nn.Module, out: torch.Tensor, name: str = "out_proj") -> torch.Tensor:
    """Heads (batch, heads, n, d_head) concatenated and projected by the layer's Linear ``name``, float64."""
    projection = getattr(layer, name)
    merged = out.transpose(1, 2).flatten(2)
    return merged @ projection.weight.detach().double().T + projection.bias.detach().double()
