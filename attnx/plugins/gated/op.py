"""The gated / delta-rule family as attnx ops, shared by the variants that use it (docs/variants/gated.md).

Per batch row and value head, with S the (d_k, d_v) state (float32), D_t = diag(exp(g_t)), g_t <= 0 one
value per head (dg = 1) or per key dimension (dg = d_k):

    S_t = D_t S_{t-1} + k_t u_t^T
    u_t = beta_t (v_t - (D_t S_{t-1})^T k_t)   delta rule (``delta=True``)
    u_t = beta_t v_t                           additive rule (beta = 1, g = 0: plain linear attention)
    o_t = scale * S_t^T q_t

q, k are (b, hk, n, dk), v (b, hv, n, dv), g (b, hv, n, dg), beta (b, hv, n); q/k head i serves the
consecutive value heads i*r .. i*r + r - 1 (r = hv // hk). q and k are used as given (normalisation,
feature maps and scales are the caller's). A token with g = 0 and beta = 0 leaves the state unchanged.

``attnx::gated_delta_rule`` runs from an empty state; ``attnx::gated_delta_rule_step`` continues from a
state (b, hv, dk, dv) and returns the state after its tokens (1 decoded token or a whole prompt). Both
compute chunk by chunk (``chunk_size`` tokens, :mod:`attnx.plugins.gated._chunks`), or token by token for
the additive rule on narrow values (:mod:`attnx.plugins.gated._tokens`, Mamba1's values of width 1;
:func:`~attnx.plugins.gated.config.by_token`), exported as single
``attnx::GatedDeltaRule`` / ``attnx::GatedDeltaRuleStep`` nodes whose portable ONNX bodies
(:mod:`attnx.plugins.gated._onnx`) do the same with standard ops, models at opset 27 hold bodies on
the standard ``LinearAttention`` op (:mod:`attnx.plugins.gated._standard`), and :data:`ORT_BODIES`
compute them with ONNX Runtime's own kernels (:mod:`attnx.plugins.gated._ort`).

Every layer built on the rule (this family's :mod:`attnx.plugins.gated.layer`, and the adapters'
layers of flash-linear-attention and Hugging Face hybrids) calls it through one entry: :func:`run_rule`
(full forward or step, one chunk-size policy), declares its state with :func:`rule_state` (one order:
a convolution's carry, then the recurrent state; :func:`split_state` and :func:`join_state` read and
write it) and normalises q and k with :func:`l2norm`; Mamba2's mixers run it through :func:`ssd_rule`.
"""

from __future__ import annotations

import torch

from attnx.ops import AttentionOp, TargetBodies, at_least_float32, trainable_op
from attnx.plugins.gated._chunks import gated_chunks
from attnx.plugins.gated._onnx import GatedDeltaRule, GatedDeltaRuleStep, GatedDeltaRuleStepFirst
from attnx.plugins.gated._ort import ORT_BODIES, ORT_SITE_BODIES
from attnx.plugins.gated._standard import (
    GatedDeltaRuleStandard,
    GatedDeltaRuleStepFirstStandard,
    GatedDeltaRuleStepStandard,
)
from attnx.plugins.gated._tokens import gated_tokens
from attnx.plugins.gated.config import MAX_CHUNK_SIZE, by_token, default_chunk_size
from attnx.plugins.lib.ort import ORT_SINCE
from attnx.state import StateTensor

# The state is float32 whatever the activations; the output is named apart from the input (one-node models
# and graphs need distinct names).
STATE_INPUT_TYPE = {"state": "tensor(float)"}
STATE_OUTPUT_TYPE = {"new_state": "tensor(float)"}
L2_EPS = 1e-6  # transformers' l2norm (Qwen3-Next, Kimi Linear), flash-linear-attention's kernels

__all__ = [
    "GATED_DELTA_RULE_OP",
    "GATED_DELTA_RULE_STEP_OP",
    "MAX_CHUNK_SIZE",
    "ORT_BODIES",
    "default_chunk_size",
    "gated_delta_rule",
    "gated_delta_rule_step",
    "join_state",
    "l2norm",
    "naive_gated_delta_rule",
    "rule_state",
    "run_rule",
    "split_state",
    "ssd_rule",
]


def check_shapes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> None:
    """Raise ValueError unless the shapes fit the op's contract (module docstring)."""
    batch, hk, n, dk = q.shape
    hv = v.shape[1]
    problems = []
    if k.shape != q.shape:
        problems.append(f"k {tuple(k.shape)} must have q's shape {tuple(q.shape)}")
    if v.dim() != 4 or v.shape[0] != batch or v.shape[2] != n or hv % hk:
        problems.append(f"v {tuple(v.shape)} must be (batch, hv, n, dv) with hv a multiple of {hk} q/k heads")
    if g.dim() != 4 or tuple(g.shape[:3]) != (batch, hv, n) or g.shape[3] not in (1, dk):
        problems.append(f"g {tuple(g.shape)} must be ({batch}, {hv}, {n}, 1 or {dk})")
    if tuple(beta.shape) != (batch, hv, n):
        problems.append(f"beta {tuple(beta.shape)} must be ({batch}, {hv}, {n})")
    if problems:
        raise ValueError("gated_delta_rule: " + "; ".join(problems))


def _check_chunk_size(chunk_size: int) -> None:
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise ValueError(f"gated_delta_rule: chunk_size={chunk_size} must be in 1..{MAX_CHUNK_SIZE}")


def _recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    delta: bool,
    scale: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, state after the tokens) in float32 at least, token by token or in chunks as
    :func:`~attnx.plugins.gated.config.by_token` says (the ONNX bodies choose alike)."""
    check_shapes(q, k, v, g, beta)
    _check_chunk_size(chunk_size)
    if by_token(delta, v.shape[-1]):
        return gated_tokens(q, k, v, g, beta, state, scale=scale)
    return gated_chunks(q, k, v, g, beta, state, delta=delta, scale=scale, chunk_size=chunk_size)


@trainable_op("attnx::gated_delta_rule")
def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    delta: bool,
    scale: float,
    chunk_size: int,
) -> torch.Tensor:
    """The recurrence from an empty state; the output (b, hv, n, dv) in v's dtype."""
    out, _ = _recurrence(q, k, v, g, beta, None, delta, scale, chunk_size)
    return out.to(v.dtype)


@gated_delta_rule.register_fake
def _(q, k, v, g, beta, delta, scale, chunk_size):
    return torch.empty_like(v)


@trainable_op("attnx::gated_delta_rule_step")
def gated_delta_rule_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    delta: bool,
    scale: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence continued from ``state`` (b, hv, dk, dv; None: zeros): (out in v's dtype, state
    after the new tokens in float32, float64 for float64 inputs)."""
    out, grown = _recurrence(q, k, v, g, beta, state, delta, scale, chunk_size)
    return out.to(v.dtype), grown


@gated_delta_rule_step.register_fake
def _(q, k, v, g, beta, state, delta, scale, chunk_size):
    dtype = torch.promote_types(v.dtype, torch.float32)
    return torch.empty_like(v), v.new_empty((v.shape[0], v.shape[1], q.shape[-1], v.shape[-1]), dtype=dtype)


def naive_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    delta: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence token by token in float64, written from the equations (tests' reference):
    (out (b, hv, n, dv), state (b, hv, dk, dv))."""
    ratio = v.shape[1] // q.shape[1]
    q, k = (x.double().repeat_interleave(ratio, dim=1) for x in (q, k))
    v, g, beta = v.double(), g.double(), beta.double()
    s = q.new_zeros((*v.shape[:2], q.shape[-1], v.shape[-1])) if state is None else state.double()
    outputs = []
    for t in range(q.shape[2]):
        k_t, v_t = k[:, :, t], v[:, :, t]
        s = g[:, :, t].exp()[..., None] * s  # D_t S_{t-1}: row i of S scaled by exp(g_t[i]) (or exp(g_t))
        target = v_t - (s * k_t[..., None]).sum(-2) if delta else v_t
        s = s + k_t[..., :, None] * (beta[:, :, t, None] * target)[..., None, :]
        outputs.append(scale * (s * q[:, :, t, :, None]).sum(-2))
    return torch.stack(outputs, dim=2) if outputs else v.new_zeros(v.shape), s


def _output_shape(shapes):
    return tuple(shapes["v"])


def _preconditions(arguments) -> str | None:
    """g is a log-decay: a positive value grows the state (exp(g) > 1) instead of forgetting."""
    g = arguments["g"]
    largest = float(g.max()) if g.numel() else 0.0
    return None if largest <= 0 else f"g (the log-decay) must be <= 0; its largest value is {largest:.3g}"


GATED_DELTA_RULE_OP = AttentionOp(
    name="GatedDeltaRule",
    torch_op=gated_delta_rule,
    bodies=(GatedDeltaRule, GatedDeltaRuleStandard),
    doc="gated / delta-rule linear attention from an empty state: S_t = diag(exp(g_t)) S_{t-1} + k_t u_t^T, "
    "u_t = beta_t (v_t - (diag(exp(g_t)) S_{t-1})^T k_t) (delta) or beta_t v_t, o_t = scale S_t^T q_t; "
    "q, k (b, hk, n, dk), v (b, hv, n, dv), g (b, hv, n, 1 or dk), beta (b, hv, n).",
    output_shape=_output_shape,
    kernel="attnx.plugins.gated._triton:GATED_KERNEL",
    targets={
        "ort": TargetBodies(
            ORT_BODIES["GatedDeltaRule"], since=ORT_SINCE, sited=ORT_SITE_BODIES["GatedDeltaRule"]
        )
    },
    preconditions=_preconditions,
)

GATED_DELTA_RULE_STEP_OP = AttentionOp(
    name="GatedDeltaRuleStep",
    torch_op=gated_delta_rule_step,
    bodies=(
        GatedDeltaRuleStep,
        GatedDeltaRuleStepFirst,
        GatedDeltaRuleStepStandard,
        GatedDeltaRuleStepFirstStandard,
    ),
    doc="GatedDeltaRule continued from the float32 state (b, hv, dk, dv) of earlier tokens (omitted: "
    "zeros); returns the output and the state after the new tokens.",
    input_types=STATE_INPUT_TYPE,
    output_names=("output", "new_state"),
    output_types=STATE_OUTPUT_TYPE,
    output_shape=_output_shape,
    targets={
        "ort": TargetBodies(
            ORT_BODIES["GatedDeltaRuleStep"], since=ORT_SINCE, sited=ORT_SITE_BODIES["GatedDeltaRuleStep"]
        )
    },
    preconditions=_preconditions,
)


def run_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    past: torch.Tensor | None,
    *,
    delta: bool,
    scale: float,
    chunk: int | None = None,
    step: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The rule on the op's layout (module docstring): the one call of every layer built on it.

    Args:
        q, k, v, g, beta: as the ops take them.
        past: the recurrent state (b, hv, dk, dv) before these tokens; None: zeros.
        delta: the delta rule, else the additive rule.
        scale: the factor of q . k.
        chunk: tokens per chunk; None: the measured default for the rule and g's width
            (:func:`attnx.plugins.gated.config.default_chunk_size`). A caller reproducing a library's own
            chunking passes the library's.
        step: False: ``attnx::gated_delta_rule`` from an empty state (no ``past``); True:
            ``attnx::gated_delta_rule_step``, which returns the state after the tokens too.

    Returns:
        The output (b, hv, n, dv) in v's dtype, and the state after the tokens (None unless ``step``).
    """
    if chunk is None:
        chunk = default_chunk_size(delta, g.shape[-1] > 1)
    if step:
        return gated_delta_rule_step(q, k, v, g, beta, past, delta, scale, chunk)
    if past is not None:
        raise ValueError("run_rule: a past state is read only with step=True")
    return gated_delta_rule(q, k, v, g, beta, delta, scale, chunk), None


def rule_state(
    value_heads: int, key_dim: int, value_dim: int, carry: StateTensor | None = None
) -> list[StateTensor]:
    """A layer's decode state: ``carry`` (the inputs a convolution or token shift before the rule keeps;
    None: none), then the rule's recurrent state S (batch, hv, d_k, d_v) in float32."""
    recurrent = StateTensor(
        "recurrent",
        ("batch", value_heads, key_dim, value_dim),
        "float32",
        doc="S (per value head, d_k x d_v) of the gated / delta rule",
        role="recurrent",
    )
    return [recurrent] if carry is None else [carry, recurrent]


def split_state(
    state: tuple[torch.Tensor, ...] | None, carried: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(carry, recurrent) of a state in :func:`rule_state`'s order (``carried``: it has a carry); each
    None when absent (``state`` None: nothing before)."""
    if state is None:
        return None, None
    return (state[0] if carried else None), state[-1]


def join_state(carry: torch.Tensor | None, recurrent: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A state in :func:`rule_state`'s order."""
    return (recurrent,) if carry is None else (carry, recurrent)


def l2norm(x: torch.Tensor, *, divide: bool = False) -> torch.Tensor:
    """q or k L2-normalised over the head dim, in float32 at least: x * rsqrt(sum x^2 + 1e-6)
    (transformers' ``l2norm``, flash-linear-attention's kernels), or with ``divide`` x / sqrt(sum x^2 +
    1e-6), Kimi Linear's spelling (a division rounds once, the reciprocal's product twice: kept so a
    Kimi export rounds as the model does)."""
    wide = at_least_float32(x)
    total = (wide * wide).sum(-1, keepdim=True) + L2_EPS
    return (wide / torch.sqrt(total) if divide else wide * torch.rsqrt(total)).to(x.dtype)


def ssd_rule(
    xs: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    dt: torch.Tensor,
    a_log: torch.Tensor,
    d: torch.Tensor,
    past: torch.Tensor | None,
    step: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mamba2's state-space duality (SSD) on the additive rule: q = C, k = B, v = dt x, g = dt A per head,
    scale 1, the D skip outside (HF's Mamba2 mixer, :mod:`attnx.adapters.hf_hybrid.ssd`, and
    flash-linear-attention's ``Mamba2``). xs (batch, n, heads, head_dim), B and C (batch, n, groups,
    d_state; group i serves consecutive heads), dt (batch, n, heads; after softplus and clamp),
    A = -exp(a_log) per head, the skip ``d`` broadcast to (heads, head_dim); y (batch, n, heads,
    head_dim) in float32 and the state after the tokens when ``step`` (``past``: the state before them,
    None: zeros)."""
    xs, dt = xs.float(), dt.float()
    g = (dt * -a_log.float().exp()).transpose(1, 2)[..., None]
    q, k = (t.float().transpose(1, 2) for t in (c, b))
    v = (xs * dt[..., None]).transpose(1, 2)
    beta = torch.ones_like(dt.transpose(1, 2))
    out, recurrent = run_rule(q, k, v, g, beta, past, delta=False, scale=1.0, step=step)
    return out.transpose(1, 2) + xs * d.float(), recurrent
