"""The generalised (diagonal-plus-low-rank) delta rule as attnx ops: RWKV-7's recurrence
(flash-linear-attention's ``fla.ops.generalized_delta_rule`` "dplr", which ``fla.ops.rwkv7`` calls).

Per batch row and head, with S the (d_k, d_v) state (float32; the gated family's orientation, and
flash-linear-attention's ``initial_state`` [N, H, K, V]):

    S_t = (diag(exp(w_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T,    o_t = scale * S_t^T q_t

i.e. S_t[i, :] = exp(w_t[i]) S_{t-1}[i, :] + b_t[i] (a_t^T S_{t-1}) + k_t[i] v_t: a per-key decay, a
removal read along a and written along b from the state *before* this token's decay, and an addition
along a key k apart from both. In the papers' value-major form (S^T, d_v x d_k) it is
S_t = S_{t-1} (diag(exp(w_t)) + a_t b_t^T) + v_t k_t^T. RWKV-7 has a = -kk, b = kk * rate (kk the
L2-normalised removal key, rate in (0, 1) per key channel), k the added key and w <= 0.

q, k, w, a, b are (b, h, n, dk), v (b, h, n, dv): one q/k head per value head (RWKV-7 has no grouping).

Why ops of their own, not options of ``attnx::gated_delta_rule``: that op's contract (q, k, v, g, beta;
chunked bodies, the ``LinearAttention`` bodies at opset 27 and on ONNX Runtime's kernel, a TensorRT
kernel) has its removal tied to the key it adds, scaled by one rate per head and read from the decayed
state. Optional separate removal vectors would have every one of those bodies and kernels either grow a
second rule or refuse half of its inputs. This rule has one contract and one portable body
(:mod:`attnx.plugins.gated._generalized_onnx`), and no ``ort`` target (``--target ort`` keeps the
portable body): ONNX Runtime's ``LinearAttention`` rules (linear, gated, delta, gated_delta) have no
diagonal-plus-low-rank transition.

``attnx::generalized_delta_rule`` runs from an empty state; ``attnx::generalized_delta_rule_step``
continues from a state (b, h, dk, dv) and returns the state after its tokens. Both run token by token
(the state update reads the state through a, so the token form is O(n dk dv) per head with no (C, C)
scores); layers call them through :func:`run_generalized_rule`.
"""

from __future__ import annotations

import torch

from attnx.ops import AttentionOp, trainable_op
from attnx.plugins.gated._generalized_onnx import (
    GeneralizedDeltaRule,
    GeneralizedDeltaRuleStep,
    GeneralizedDeltaRuleStepFirst,
)
from attnx.plugins.gated.op import STATE_INPUT_TYPE, STATE_OUTPUT_TYPE

__all__ = [
    "GENERALIZED_DELTA_RULE_OP",
    "GENERALIZED_DELTA_RULE_STEP_OP",
    "generalized_delta_rule",
    "generalized_delta_rule_step",
    "run_generalized_rule",
]


def check_shapes(*tensors: torch.Tensor) -> None:
    """Raise ValueError unless q, k, v, w, a, b fit the op's contract (module docstring)."""
    q, k, v, w, a, b = tensors
    problems = [
        f"{name} {tuple(t.shape)} must have q's shape {tuple(q.shape)}"
        for name, t in (("k", k), ("w", w), ("a", a), ("b", b))
        if t.shape != q.shape
    ]
    if v.dim() != 4 or tuple(v.shape[:3]) != tuple(q.shape[:3]):
        problems.append(f"v {tuple(v.shape)} must be {tuple(q.shape[:3])} + (dv,)")
    if problems:
        raise ValueError("generalized_delta_rule: " + "; ".join(problems))


def generalized_tokens(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule token by token after ``state`` (None: zeros): the output (b, h, n, dv) and the state after
    the last token, both in float32 (float64 for float64 inputs)."""
    check_shapes(q, k, v, w, a, b)
    dtype = torch.promote_types(v.dtype, torch.float32)
    q, k, v, a, b = (t.to(dtype) for t in (q, k, v, a, b))
    decays = w.to(dtype).exp()[..., None]  # (b, h, n, dk, 1)
    shape = (*v.shape[:2], q.shape[-1], v.shape[-1])
    s = q.new_zeros(shape) if state is None else state.to(dtype)
    outputs = []
    for t in range(q.shape[2]):
        removed = b[:, :, t, :, None] * (a[:, :, t, None, :] @ s)  # b_t (a_t^T S_{t-1})
        s = decays[:, :, t] * s + removed + k[:, :, t, :, None] * v[:, :, t, None, :]
        outputs.append((q[:, :, t, None, :] @ s)[:, :, 0])
    out = torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape, dtype=dtype)
    return scale * out, s


@trainable_op("attnx::generalized_delta_rule")
def generalized_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The rule from an empty state; the output (b, h, n, dv) in v's dtype."""
    return generalized_tokens(q, k, v, w, a, b, None, scale)[0].to(v.dtype)


@generalized_delta_rule.register_fake
def _(q, k, v, w, a, b, scale):
    return torch.empty_like(v)


@trainable_op("attnx::generalized_delta_rule_step")
def generalized_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    state: torch.Tensor | None,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule continued from ``state`` (b, h, dk, dv; None: zeros): (out in v's dtype, state after the
    new tokens in float32, float64 for float64 inputs)."""
    out, grown = generalized_tokens(q, k, v, w, a, b, state, scale)
    return out.to(v.dtype), grown


@generalized_delta_rule_step.register_fake
def _(q, k, v, w, a, b, state, scale):
    dtype = torch.promote_types(v.dtype, torch.float32)
    return torch.empty_like(v), v.new_empty((*v.shape[:2], q.shape[-1], v.shape[-1]), dtype=dtype)


def _output_shape(shapes):
    return tuple(shapes["v"])


def _preconditions(arguments) -> str | None:
    """w is a log-decay: a positive value grows the state (exp(w) > 1) instead of forgetting."""
    w = arguments["w"]
    largest = float(w.max()) if w.numel() else 0.0
    return None if largest <= 0 else f"w (the log-decay) must be <= 0; its largest value is {largest:.3g}"


GENERALIZED_DELTA_RULE_OP = AttentionOp(
    name="GeneralizedDeltaRule",
    torch_op=generalized_delta_rule,
    bodies=(GeneralizedDeltaRule,),
    doc="generalised (diagonal-plus-low-rank) delta rule from an empty state, RWKV-7's: "
    "S_t = (diag(exp(w_t)) + b_t a_t^T) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t; q, k, w, a, b "
    "(b, h, n, dk), v (b, h, n, dv).",
    output_shape=_output_shape,
    preconditions=_preconditions,
)

GENERALIZED_DELTA_RULE_STEP_OP = AttentionOp(
    name="GeneralizedDeltaRuleStep",
    torch_op=generalized_delta_rule_step,
    bodies=(GeneralizedDeltaRuleStep, GeneralizedDeltaRuleStepFirst),
    doc="GeneralizedDeltaRule continued from the float32 state (b, h, dk, dv) of earlier tokens (omitted: "
    "zeros); returns the output and the state after the new tokens.",
    input_types=STATE_INPUT_TYPE,
    output_names=("output", "new_state"),
    output_types=STATE_OUTPUT_TYPE,
    output_shape=_output_shape,
    preconditions=_preconditions,
)


def run_generalized_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    past: torch.Tensor | None,
    *,
    scale: float,
    step: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rule on the op's layout (module docstring): the one call of every layer built on it.

    Args:
        q, k, v, w, a, b: as the ops take them.
        past: the state (b, h, dk, dv) before these tokens; None: zeros.
        scale: the factor of the read q^T S.
        step: False: ``attnx::generalized_delta_rule`` from an empty state (no ``past``); True:
            ``attnx::generalized_delta_rule_step``, which returns the state after the tokens too.

    Returns:
        The output (b, h, n, dv) in v's dtype, and the state after the tokens (None unless ``step``).
    """
    if step:
        return generalized_delta_rule_step(q, k, v, w, a, b, past, scale)
    if past is not None:
        raise ValueError("run_generalized_rule: a past state is read only with step=True")
    return generalized_delta_rule(q, k, v, w, a, b, scale), None
