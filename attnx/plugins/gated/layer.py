"""The gated linear-attention layer that ``retention`` and ``gated_delta`` build (one class, two rules).

From the layer's input x (batch, n, d_model), with the options of :class:`attnx.plugins.gated.config.
GatedConfig` (docs/variants/retention.md and gated_delta.md give each model's values):

    q, k, v = act(conv(x W_qkv))            the short causal depthwise convolution is optional
    q, k    = l2norm(q), l2norm(k)          optional (x * rsqrt(sum x^2 + 1e-6) per head)
    g       = log-decay <= 0                none, fixed per head, or from x per head / per key dimension
    beta    = sigmoid(x W_b)                delta rule only (the additive rule: beta = 1)
    o       = run_rule(q, k, v, g, beta, ...)  attnx::gated_delta_rule (:mod:`attnx.plugins.gated.op`)
    y       = (rmsnorm(o) * act(x W_z)) W_o  the norm per head or over the full width; the gate optional

Padding (``key_padding_mask`` False) is exact: x is zeroed there (so the convolution reads zeros, as
transformers' ``apply_mask_to_padding_states`` does) and g = 0, beta = 0, so the state passes through.
The layer decodes by its own :meth:`GatedLayer.step`: the recurrent state (batch, hv, d_k, d_v) in float32
and, with the convolution, its carry (batch, channels, kernel - 1), the last inputs it has seen.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnx.attention import Stepping
from attnx.errors import AttnxError
from attnx.ops import VariantImpl, at_least_float32
from attnx.plugins.gated.config import GatedConfig
from attnx.plugins.gated.generalized import GENERALIZED_DELTA_RULE_OP, GENERALIZED_DELTA_RULE_STEP_OP
from attnx.plugins.gated.op import (
    GATED_DELTA_RULE_OP,
    GATED_DELTA_RULE_STEP_OP,
    join_state,
    l2norm,
    rule_state,
    run_rule,
    split_state,
)
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state
from attnx.variant import AttentionSpec

GLA_NORMALISER = 16.0  # GLA: g = logsigmoid(.) / 16 (flash-linear-attention's gate_logit_normalizer)
ACTIVATIONS = {"none": None, "silu": F.silu, "sigmoid": torch.sigmoid}


def fixed_log_decay(config: GatedConfig, spec: AttentionSpec, heads: int) -> torch.Tensor:
    """log gamma_h (heads,) of a fixed decay: RetNet's gamma_h = 1 - 2^(-5-h), MiniMax-01's slopes (rate_h =
    (2^(-8/H))^(h+1) scaled by 1 - layer / (n_layers - 1 + 1e-5) + 1e-5, g = -rate), or ``gammas``."""
    h = torch.arange(heads, dtype=torch.float64)
    if config.decay == "retnet":
        return torch.log1p(-(2.0 ** (-5.0 - h)))
    if config.decay == "minimax":
        depth = 1 - spec.layer / (spec.n_layers - 1 + 1e-5) + 1e-5
        return -((2.0 ** (-8.0 / heads)) ** (h + 1)) * depth
    if len(config.gammas) not in (1, heads):
        raise AttnxError(
            f"{config.variant} option gammas has {len(config.gammas)} values for {heads} value heads; "
            "give one per value head, or one for all"
        )
    return torch.tensor(config.gammas, dtype=torch.float64).log().expand(heads)


def projection(d_in: int, d_out: int, rank: int) -> nn.Module:
    """x -> x W (d_in -> d_out), through a rank-``rank`` bottleneck when ``rank`` > 0; no bias."""
    if rank:
        return nn.Sequential(nn.Linear(d_in, rank, bias=False), nn.Linear(rank, d_out, bias=False))
    return nn.Linear(d_in, d_out, bias=False)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(b, n, heads * d) -> (b, heads, n, d)."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


class GatedLayer(Stepping, nn.Module):
    """Gated linear attention with the additive (``retention``) or delta (``gated_delta``) rule.

    ``forward(x, context=None, key_padding_mask=None)``: causal self-attention of x (batch, n, d_model).
    """

    def __init__(self, config: GatedConfig, spec: AttentionSpec) -> None:
        super().__init__()
        self.config, self.spec = config, spec
        key_heads = config.key_heads or spec.n_heads
        value_heads = config.value_heads or key_heads
        if value_heads % key_heads:
            raise AttnxError(
                f"{config.variant} option value_heads={value_heads} must be a multiple of key_heads="
                f"{key_heads} (the model's n_heads when key_heads is 0); change value_heads or key_heads"
            )
        key_dim, value_dim = config.key_head_dim or spec.head_dim, config.value_head_dim or spec.head_dim
        self.heads, self.dims = (key_heads, value_heads), (key_dim, value_dim)
        self.widths = (key_heads * key_dim, key_heads * key_dim, value_heads * value_dim)
        self.scale = config.scale or 1 / math.sqrt(key_dim)
        channels, d = sum(self.widths), spec.d_model
        self.qkv_proj = nn.Linear(d, channels, bias=False)
        if config.short_conv:
            self.conv1d = nn.Conv1d(channels, channels, config.conv_kernel, groups=channels, bias=False)
        self._decay_parameters(config, spec)
        if config.delta:
            self.beta_proj = nn.Linear(d, value_heads, bias=False)
        if config.output_gate != "none":
            self.gate_proj = projection(d, self.widths[2], config.gate_rank)
        if config.output_norm != "none":
            width = value_dim if config.output_norm == "head" else self.widths[2]
            self.norm_weight = nn.Parameter(torch.ones(width))
        self.out_proj = nn.Linear(self.widths[2], d, bias=False)

    def _decay_parameters(self, config: GatedConfig, spec: AttentionSpec) -> None:
        """The decay's parameters; initialised as flash-linear-attention initialises Gated DeltaNet's
        (A ~ U(1, 16), softplus(dt_bias) ~ logU(1e-3, 0.1)): g in about [-1.6, 0] per token."""
        value_heads, width = self.heads[1], self.heads[1] * (self.dims[0] if config.per_key else 1)
        if config.decay in ("retnet", "minimax", "fixed"):
            log_decay = fixed_log_decay(config, spec, value_heads).float()
            self.register_buffer("fixed_decay", log_decay, persistent=False)
        if config.decay not in ("head", "key"):
            return
        self.decay_proj = projection(spec.d_model, width, config.decay_rank)
        if config.decay_gate == "logsigmoid":
            self.dt_bias = nn.Parameter(torch.zeros(width))
            return
        dt = torch.empty(width).uniform_(math.log(1e-3), math.log(1e-1)).exp().clamp_min(1e-4)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus(dt_bias) = dt
        self.A_log = nn.Parameter(torch.empty(value_heads).uniform_(1, 16).log())

    # -- the pieces ------------------------------------------------------------------------------------

    def _convolve(self, mixed: torch.Tensor, carry: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The causal depthwise convolution of ``mixed`` (b, n, C) after ``carry`` (b, C, K - 1; None: zeros):
        (output (b, n, C), the carry after it: the last K - 1 inputs)."""
        return carried_conv(mixed, self.conv1d.weight, None, carry)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """g (b, hv, n, 1 or d_k) <= 0, in float32 at least."""
        batch, n, value_heads = x.shape[0], x.shape[1], self.heads[1]
        wide = at_least_float32(x)
        decay = self.config.decay
        if decay == "none":
            return wide.new_zeros(batch, value_heads, n, 1)
        if decay in ("retnet", "minimax", "fixed"):
            return self.fixed_decay.to(wide.dtype)[None, :, None, None].expand(batch, value_heads, n, 1)
        logits = at_least_float32(self.decay_proj(x)) + self.dt_bias
        logits = logits.unflatten(-1, (value_heads, -1)).transpose(1, 2)  # (b, hv, n, dg)
        if self.config.decay_gate == "logsigmoid":
            return F.logsigmoid(logits) / GLA_NORMALISER
        return -self.A_log.to(logits.dtype).exp()[:, None, None] * F.softplus(logits)

    def beta(self, x: torch.Tensor) -> torch.Tensor:
        """beta (b, hv, n): sigmoid(x W_b) for the delta rule, ones for the additive rule."""
        if not self.config.delta:
            return at_least_float32(x).new_ones(x.shape[0], self.heads[1], x.shape[1])
        return torch.sigmoid(at_least_float32(self.beta_proj(x))).transpose(1, 2)

    def _output(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(rmsnorm(o) * act(z(x))) W_o for the rule's output ``out`` (b, hv, n, d_v)."""
        config, dtype = self.config, out.dtype
        o = at_least_float32(out.transpose(1, 2))  # (b, n, hv, dv)
        if config.output_norm == "full":
            o = o.flatten(2)
        if config.output_norm != "none":
            o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + config.norm_eps) * self.norm_weight
        o = o.flatten(2)
        gate = ACTIVATIONS[config.output_gate]
        if gate is not None:
            o = o * gate(at_least_float32(self.gate_proj(x)))
        return self.out_proj(o.to(dtype))

    def mix(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, torch.Tensor] | None]:
        """The layer on x; ``state`` None: the full forward (no state out), else (carry, recurrent) before
        x (each None: empty) and the pair after it is returned."""
        config, (key_heads, value_heads) = self.config, self.heads
        if key_padding_mask is not None:
            x = x * key_padding_mask[..., None].to(x.dtype)
        mixed, carry = self.qkv_proj(x), None
        if config.short_conv:
            mixed, carry = self._convolve(mixed, None if state is None else state[0])
        if config.activation == "silu":
            mixed = F.silu(mixed)
        q, k, v = mixed.split(self.widths, dim=-1)
        q, k, v = split_heads(q, key_heads), split_heads(k, key_heads), split_heads(v, value_heads)
        if config.qk_norm:
            q, k = l2norm(q), l2norm(k)
        g, beta = self.log_decay(x), self.beta(x)
        if key_padding_mask is not None:  # a padded token leaves the state as it was
            keep = key_padding_mask[:, None, :].to(g.dtype)
            g, beta = g * keep[..., None], beta * keep
        g, beta = g.to(v.dtype), beta.to(v.dtype)
        past, step = (None, False) if state is None else (state[1], True)
        out, recurrent = run_rule(
            q, k, v, g, beta, past, delta=config.delta, scale=self.scale, chunk=config.chunk, step=step
        )
        return self._output(out, x), (carry, recurrent) if step else None

    # -- the layer ---------------------------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if self.stepping is not None:
            return self.stepped(x)
        if context is not None:
            raise AttnxError(f"variant '{self.config.variant}' has no cross-attention")
        return self.mix(x, key_padding_mask, None)[0]

    def decode_state(self) -> list[StateTensor]:
        """The recurrent state S (batch, hv, d_k, d_v) in float32, after the convolution's carry if any."""
        config = self.config
        carry = conv_state(sum(self.widths), config.conv_kernel) if config.short_conv else None
        return rule_state(self.heads[1], *self.dims, carry)

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The layer's output for new tokens x after ``state`` (``decode_state()`` order; None: none)."""
        y, (carry, recurrent) = self.mix(x, None, split_state(state, self.config.short_conv))
        return y, join_state(carry, recurrent)


# The generalised delta rule's ops are the family's too (one plugin owns every op of the family, so an
# export that calls them names it); only adapters' layers (flash-linear-attention's RWKV-7) call them.
IMPL = VariantImpl(
    build=GatedLayer,
    ops=(GATED_DELTA_RULE_OP, GENERALIZED_DELTA_RULE_OP),
    decode_ops=(GATED_DELTA_RULE_STEP_OP, GENERALIZED_DELTA_RULE_STEP_OP),
    conditional_ops=(GENERALIZED_DELTA_RULE_OP.name,),
)
