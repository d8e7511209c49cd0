"""The options of the gated / delta-rule layers (no torch): what ``retention`` and ``gated_delta`` share,
and each variant's defaults (:class:`RetentionConfig`, :class:`GatedDeltaConfig`).

Both variants build :class:`attnx.plugins.gated.layer.GatedLayer` around the ``attnx::gated_delta_rule``
op (docs/variants/retention.md, docs/variants/gated_delta.md); they differ in the rule (additive or delta)
and in their defaults. Every option below is read from a released model's code (transformers 5.24:
``models/qwen3_next``, ``models/qwen3_5``, ``models/kimi_linear``, ``models/minimax``;
flash-linear-attention's layers for RetNet and GLA): the docs pages say which model uses which value.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from attnx.config import Config, require

Decay = Literal["none", "retnet", "minimax", "fixed", "head", "key"]
DecayGate = Literal["softplus", "logsigmoid"]
Activation = Literal["none", "silu"]
OutputGate = Literal["none", "silu", "sigmoid"]
OutputNorm = Literal["head", "full", "none"]

# The ONNX bodies' inverse doubles its blocks ceil(log2 C) times, counted from a table of powers up to 2^14:
# chunks of up to 2^15 tokens (a chunk that long would cost far more than it saves anyway).
MAX_CHUNK_SIZE = 32768

# Chunk sizes measured fastest for the portable body in ONNX Runtime (docs/variants/gated.md), by
# (delta, per-key decay).
DEFAULT_CHUNK_SIZES = {(False, False): 64, (False, True): 16, (True, False): 32, (True, True): 16}


# The additive rule runs token by token (:mod:`attnx.plugins.gated._tokens`) for values at most this wide:
# its state update, d_k x d_v per token, is then cheaper than the chunked form's (C, C) scores (measured,
# docs/variants/gated.md, "Token by token"). Mamba1's selective scan has values of width 1.
TOKEN_MAX_VALUE_WIDTH = 8


def by_token(delta: bool, value_dim: int) -> bool:
    """Whether the rule runs token by token rather than in chunks: the additive rule with values of at most
    :data:`TOKEN_MAX_VALUE_WIDTH` (the delta rule's update reads the state, so it stays chunked)."""
    return not delta and value_dim <= TOKEN_MAX_VALUE_WIDTH


def default_chunk_size(delta: bool, per_key: bool) -> int:
    """The default ``chunk_size`` for the delta (or additive) rule with a per-key (or scalar) decay."""
    return DEFAULT_CHUNK_SIZES[(delta, per_key)]


def block_size(chunk_size: int) -> int:
    """The block length s of a per-key-decay chunk: the largest power of two with s * s <= chunk_size."""
    size = 1
    while (2 * size) ** 2 <= chunk_size:
        size *= 2
    return size


def chunk_plan(n: int, chunk_size: int, per_key: bool) -> tuple[int, int]:
    """(C, s) for n tokens: C = min(chunk_size, n) tokens per chunk (a decoded token is one chunk of 1) and,
    for a per-key decay, blocks of s = :func:`block_size` (C) tokens, C rounded up to a multiple of s."""
    length = min(chunk_size, max(n, 1))
    size = block_size(length) if per_key else 1
    return -(-length // size) * size, size


@dataclasses.dataclass(frozen=True)
class GatedConfig(Config):
    """A gated linear-attention layer: projections, optional short convolution, the rule, output gate.

    Attributes:
        key_heads: q/k heads (0: the model's ``n_heads``).
        value_heads: value heads, a multiple of ``key_heads`` (0: ``key_heads``); q/k head i serves the
            consecutive value heads i*r .. i*r + r - 1, r = value_heads / key_heads (Qwen3-Next: 16, 32).
        key_head_dim, value_head_dim: d_k and d_v per head (0: d_model / n_heads).
        decay: the log-decay g_t <= 0 of the state: ``none`` (g = 0), ``retnet`` (fixed per head,
            gamma_h = 1 - 2^(-5-h)), ``minimax`` (fixed per head, MiniMax-01's slopes, which depend on the
            layer's depth), ``fixed`` (``gammas``), ``head`` (from x, one per value head, Gated DeltaNet)
            or ``key`` (from x, one per value head and key dimension: GLA, Kimi Delta Attention).
        decay_gate: how ``head``/``key`` decays come from x: ``softplus``, g = -exp(A_log) softplus(a(x) +
            dt_bias) (Qwen3-Next, Kimi), or ``logsigmoid``, g = logsigmoid(a(x) + dt_bias) / 16 (GLA).
        decay_rank: a(x) through a rank-r bottleneck (Kimi: head_dim, GLA: 16); 0: one full projection.
        gammas: decay factors in (0, 1] for ``decay="fixed"``: one for every value head, or one per head.
        qk_norm: L2-normalise q and k per head (x / sqrt(sum x^2 + 1e-6), transformers' ``l2norm``).
        scale: the factor of q . k (None: 1/sqrt(d_k); MiniMax: 1).
        activation: applied to q, k and v (after the convolution when there is one): ``silu`` or ``none``.
        short_conv: a causal depthwise convolution of width ``conv_kernel`` over the q, k, v channels
            before the activation (Gated DeltaNet, Kimi: width 4, SiLU).
        conv_kernel: its width.
        output_gate: out = norm(o) * act(z(x)), act ``silu`` (Qwen3-Next), ``sigmoid`` (Kimi, MiniMax) or
            ``none`` (out = norm(o)).
        gate_rank: z(x) through a rank-r bottleneck (Kimi: head_dim); 0: one full projection.
        output_norm: RMSNorm of o per ``head`` (Qwen3-Next, Kimi), over the ``full`` width (MiniMax) or
            ``none``.
        norm_eps: the RMSNorm's epsilon.
        chunk_size: tokens per chunk of the chunked form (None: :func:`default_chunk_size`).
    """

    delta: ClassVar[bool] = False
    variant: ClassVar[str] = ""

    key_heads: int = 0
    value_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0
    decay: Decay = "none"
    decay_gate: DecayGate = "softplus"
    decay_rank: int = 0
    gammas: tuple[float, ...] = ()
    qk_norm: bool = False
    scale: float | None = None
    activation: Activation = "none"
    short_conv: bool = False
    conv_kernel: int = 4
    output_gate: OutputGate = "none"
    gate_rank: int = 0
    output_norm: OutputNorm = "head"
    norm_eps: float = 1e-6
    chunk_size: int | None = None

    @property
    def per_key(self) -> bool:
        """Whether the decay has one value per key dimension."""
        return self.decay == "key"

    @property
    def chunk(self) -> int:
        """The chunk size the op runs with."""
        return self.chunk_size or default_chunk_size(self.delta, self.per_key)

    def validate(self) -> None:
        what = f"{self.variant} option"
        for name in ("key_heads", "value_heads", "key_head_dim", "value_head_dim", "decay_rank", "gate_rank"):
            value = getattr(self, name)
            require(value >= 0, f"{what} {name}={value} must be >= 0 (0: derived from the model)")
        if self.key_heads and self.value_heads:
            require(
                self.value_heads % self.key_heads == 0,
                f"{what} value_heads={self.value_heads} must be a multiple of key_heads={self.key_heads} "
                "(each q/k head serves value_heads / key_heads value heads); change one of them",
            )
        require(
            all(0 < gamma <= 1 for gamma in self.gammas),
            f"{what} gammas={self.gammas} must be decay factors in (0, 1] (a log-decay <= 0; a factor "
            "above 1 grows the state without bound), e.g. RetNet's 1 - 2^(-5-h)",
        )
        if self.decay == "fixed":
            require(bool(self.gammas), f"{what} decay=fixed needs gammas (decay factors in (0, 1])")
        else:
            require(
                not self.gammas, f"{what} gammas={self.gammas} is set but decay={self.decay}; set decay=fixed"
            )
        require(
            self.conv_kernel >= 2,
            f"{what} conv_kernel={self.conv_kernel} must be >= 2 (the convolution's width: it reads the last "
            "conv_kernel tokens); turn the convolution off with short_conv=false",
        )
        require(
            self.scale is None or self.scale > 0, f"{what} scale={self.scale} must be > 0 (none: 1/sqrt(d_k))"
        )
        require(self.norm_eps > 0, f"{what} norm_eps={self.norm_eps} must be > 0")
        require(
            self.chunk_size is None or 1 <= self.chunk_size <= MAX_CHUNK_SIZE,
            f"{what} chunk_size={self.chunk_size} must be in 1..{MAX_CHUNK_SIZE} "
            f"(none: {default_chunk_size(self.delta, self.per_key)}, the measured default)",
        )


@dataclasses.dataclass(frozen=True)
class RetentionConfig(GatedConfig):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t; the defaults are RetNet's multi-scale
    retention (fixed gamma_h = 1 - 2^(-5-h), swish output gate after a per-head norm). MiniMax-01's
    lightning attention: decay=minimax activation=silu scale=1 output_norm=full output_gate=sigmoid; GLA:
    decay=key decay_gate=logsigmoid decay_rank=16; plain linear attention without a normaliser:
    decay=none output_gate=none output_norm=none (docs/variants/retention.md)."""

    delta: ClassVar[bool] = False
    variant: ClassVar[str] = "retention"

    decay: Decay = "retnet"
    activation: Activation = "none"
    output_gate: OutputGate = "silu"


@dataclasses.dataclass(frozen=True)
class GatedDeltaConfig(GatedConfig):
    """S_t = D_t S_{t-1} + beta_t k_t (v_t - (D_t S_{t-1})^T k_t)^T, o_t = scale S_t^T q_t; the defaults are
    Gated DeltaNet's as Qwen3-Next and Qwen3.5 use it (a decay per value head from x, L2-normalised q/k,
    a short convolution of width 4 with SiLU, a SiLU output gate after a per-head RMSNorm). DeltaNet:
    decay=none; Kimi Delta Attention: decay=key decay_rank=<head dim> output_gate=sigmoid
    gate_rank=<head dim> (docs/variants/gated_delta.md)."""

    delta: ClassVar[bool] = True
    variant: ClassVar[str] = "gated_delta"

    decay: Decay = "head"
    qk_norm: bool = True
    activation: Activation = "silu"
    short_conv: bool = True
    output_gate: OutputGate = "silu"
