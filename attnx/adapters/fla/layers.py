"""flash-linear-attention's layers as attnx layers: the library's projections and parameters, its
gates and norms in torch (:mod:`attnx.adapters.fla.parts`), and the recurrence on attnx's gated /
delta-rule op through its one entry (:func:`attnx.plugins.gated.op.run_rule`):

    S_t = diag(exp(g_t)) S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - (D_t S_{t-1})^T k_t) (delta) or beta_t v_t,
    o_t = scale * S_t^T q_t,

or, for RWKV-7, on the family's generalised delta rule
(:func:`attnx.plugins.gated.generalized.run_generalized_rule`).

Each class reads the options of one library layer (``fla.layers``, 0.6) and refuses, by name, those
it does not reproduce. The library's layout is (batch, seq, heads, dim); the op's is
(batch, heads, seq, dim). Every layer decodes (:class:`attnx.state.DecodableLayer`, stepping through
the model's own forward by :class:`attnx.attention.Stepping`): its state, in the rule's order
(:func:`attnx.plugins.gated.op.rule_state`), is the carry before the rule, ``conv`` (batch, channels,
kernel - 1) over the concatenated q, k, v projections with short convolutions (RWKV-6 and RWKV-7: the
token shift, one previous input), then ``recurrent`` (batch, value heads, key dim, value dim; float32).
Every layer takes the library's 2D padding mask and does with it what the library's layer does
(:class:`FlaLayer`), so a left-padded row equals the row alone.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnx.adapters.fla import parts
from attnx.adapters.hf_hybrid.mixer import mask_padding
from attnx.attention import Stepping
from attnx.errors import AttnxError
from attnx.plugins.gated.generalized import run_generalized_rule
from attnx.plugins.gated.op import l2norm, rule_state, run_rule, split_state, ssd_rule
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state


class FlaLayer(Stepping, nn.Module):
    """What every converted layer shares: the library's call convention, its decode step and the rule.

    Subclasses set ``heads`` (value heads), ``d_key``, ``d_value`` (the recurrent state's per-head
    sizes), ``conv`` (a :class:`parts.ShortConv` or None) and implement :meth:`run`.

    The library's 2D ``attention_mask`` (1 / True: a real token) reaches :meth:`run` as ``mask``. Where
    the library unpads by it (``unpads``: it runs each row's real tokens alone and its output is zero at
    the padding), a padded token is a step that keeps the state: its short-convolution inputs, key and
    log-decay are zeroed (:meth:`convolve`, :meth:`rule`), and its output is zeroed. RWKV-6, RWKV-7 and
    Mamba2 do not unpad: they zero some inputs and run the padded tokens, and their conversions do the same.
    """

    heads: int
    d_key: int
    d_value: int
    unpads = True

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.conv: parts.ShortConv | None = None
        self.kind = type(layer).__name__
        self.layer_idx = getattr(layer, "layer_idx", None)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None, Any]:
        refuse_call(self.kind, attention_mask, past_key_values, use_cache, kwargs)
        context = {"mask": attention_mask, **self.context(kwargs)}
        if self.stepping is None:
            out = self.run(hidden_states, None, None, **context)[0]
        else:
            out = self.stepped(hidden_states, **context)
        if self.unpads:
            out = mask_padding(out, attention_mask)
        return out, None, past_key_values

    def context(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """What else :meth:`run` takes from the keyword arguments the library's model passes the layer
        (HGRN2's ``lower_bound``); none by default."""
        return {}

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor, **context: Any
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The layer on new tokens x after ``state`` (None: none) at ``position``; the state after them."""
        return self.run(x, state, position, **context)

    def run(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, ...] | None,
        position: torch.Tensor | None,
        **context: Any,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The layer on x (batch, n, hidden) after ``past`` (None: nothing before) at ``position``
        (None: a full forward, no state kept) with its :meth:`context` and the padding ``mask`` (batch, n)
        (None: every token real); returns the output and the state after x."""
        raise NotImplementedError

    def take(self, layer: nn.Module, *names: str) -> None:
        """Hold the library layer's own submodules and parameters under the same names."""
        for name in names:
            setattr(self, name, getattr(layer, name))

    def decode_state(self) -> list[StateTensor]:
        return rule_state(self.heads, self.d_key, self.d_value, self.carry())

    def carry(self) -> StateTensor | None:
        """What the layer carries before the rule: its short convolutions' inputs (None without)."""
        return None if self.conv is None else conv_state(self.conv.channels, self.conv.kernel)

    def convolve(
        self, xs: list[torch.Tensor], past: tuple[torch.Tensor, ...] | None, mask: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]:
        """The short convolutions (if any) of the projections ``xs``, zero at padded tokens (the library's
        convolution of each row's real tokens alone sees zeros before the first); their state as a tuple
        (or ())."""
        if self.conv is None:
            return xs, ()
        ys, state = self.conv([mask_padding(x, mask) for x in xs], split_state(past, True)[0])
        return ys, (state,)

    def rule(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        past: tuple[torch.Tensor, ...] | None,
        position: torch.Tensor | None,
        delta: bool,
        scale: float,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The op on (batch, n, heads, dim) tensors (beta (batch, n, heads)): the output in that layout
        and (the state after the tokens,) when stepping, () otherwise. A padded token (``mask`` 0) keeps
        the state: its key and log-decay are zeroed (exp(0) = 1, k u^T = 0; the delta rule's correction
        S^T k too)."""
        k, g = mask_padding(k, mask), mask_padding(g, mask)
        args = [t.transpose(1, 2) for t in (q, k, v, g, beta)]
        step = position is not None
        recurrent = split_state(past, False)[1]
        out, state = run_rule(*args, recurrent, delta=delta, scale=scale, step=step)
        return out.transpose(1, 2), (state,) if step else ()


def refuse_call(kind: str, attention_mask: Any, past_key_values: Any, use_cache: Any, kwargs: dict) -> None:
    """The library's runtime arguments an exported layer does not take, refused in one line each."""
    if attention_mask is not None and attention_mask.dim() != 2:
        raise AttnxError(
            f"an exported flash-linear-attention {kind} takes a 2D attention_mask (batch, seq; 1 = a real "
            f"token), as the library does, not a {attention_mask.dim()}D one"
        )
    if past_key_values is not None or use_cache:
        raise AttnxError(
            f"an exported flash-linear-attention {kind} keeps no cache of the library's: pass "
            "use_cache=False (attnx export --decode makes the decode graphs)"
        )
    if kwargs.get("cu_seqlens") is not None:
        raise AttnxError(f"an exported flash-linear-attention {kind} takes no cu_seqlens (packed sequences)")


def short_conv(layer: nn.Module) -> parts.ShortConv | None:
    """The layer's q, k, v short convolutions as one (None without ``use_short_conv``)."""
    return parts.ShortConv([layer.q_conv1d, layer.k_conv1d, layer.v_conv1d]) if layer.use_short_conv else None


def heads(x: torch.Tensor, d: int, groups: int = 1) -> torch.Tensor:
    """(batch, n, h * d) -> (batch, n, h * groups, d), each head repeated ``groups`` times in a row
    (the library's ``repeat(x, '... (h d) -> ... (h g) d')``)."""
    x = x.unflatten(-1, (-1, d))
    return x.repeat_interleave(groups, dim=2) if groups > 1 else x


def ones(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """beta = 1 for every (batch, token, head) of x (batch, n, ...)."""
    return x.new_ones(x.shape[0], x.shape[1], n_heads)


def zeros_g(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """No decay: log-gate 0, one per (batch, token, head)."""
    return x.new_zeros(x.shape[0], x.shape[1], n_heads, 1)


def norm_weight(module: nn.Module) -> torch.Tensor | None:
    return getattr(module, "weight", None)


class OutputGate(nn.Module):
    """The output stage GLA and RetNet share: a per-head RMSNorm, then (``use_output_gate``) a gate
    g_proj(x), fused as rms_norm(o) * silu(g) or applied after the norm as ``gate_fn(g)``."""

    def __init__(self, layer: nn.Module, where: str) -> None:
        super().__init__()
        self.d_value, self.gated = layer.head_v_dim, layer.use_output_gate
        self.fused = layer.fuse_norm_and_gate
        norm = layer.g_norm_swish_gate if self.fused else layer.g_norm
        self.weight, self.eps = norm_weight(norm), norm.eps
        if self.gated:
            self.g_proj = layer.g_proj
        if self.gated and not self.fused:
            self.gate_fn = parts.activation(_name_of(layer.gate_fn), where)

    def forward(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return parts.norm(o, self.weight, None, self.eps, rms=True).flatten(-2)
        g = self.g_proj(x)
        if self.fused:
            return parts.gated_rms_norm(o, heads(g, self.d_value), self.weight, self.eps, "swish").flatten(-2)
        return parts.norm(o, self.weight, None, self.eps, rms=True).flatten(-2) * self.gate_fn(g)


class NormGate(nn.Module):
    """The delta-rule layers' output stage (``o_norm``): a per-head RMSNorm, or with ``gated``
    ``FusedRMSNormGated``, rms_norm(o) * act(g_proj(x)) (its ``activation``: swish/silu/sigmoid)."""

    def __init__(self, layer: nn.Module, gated: bool) -> None:
        super().__init__()
        self.d_value, self.gated = layer.head_v_dim, gated
        norm = layer.o_norm
        self.weight, self.eps = norm_weight(norm), norm.eps
        if gated:
            self.g_proj, self.gate = layer.g_proj, norm.activation

    def forward(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return parts.norm(o, self.weight, None, self.eps, rms=True).flatten(-2)
        g = heads(self.g_proj(x), self.d_value)
        return parts.gated_rms_norm(o, g, self.weight, self.eps, self.gate).flatten(-2)


def _act2fn() -> dict[str, Any]:
    from fla.modules.activations import ACT2FN

    return ACT2FN


class LinearAttention(FlaLayer):
    """``fla.layers.LinearAttention``: o = phi(q)^T S / ... with S = sum phi(k) v^T (no decay, beta 1).

    With ``do_feature_map_norm`` the library divides by scale * phi(q)·sum phi(k) + 1e-10: the value
    gets a column of ones, so the same state carries sum phi(k) (d_value + 1 columns).
    """

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.n_heads, self.groups = layer.num_heads, layer.num_kv_groups
        self.head_k, self.head_v = layer.head_k_dim, layer.head_v_dim
        self.take(layer, "q_proj", "k_proj", "v_proj", "o_proj")
        self.feature_q, self.feature_k = feature_map(layer.feature_map_q), feature_map(layer.feature_map_k)
        self.norm_q, self.norm_k, self.normalize = layer.norm_q, layer.norm_k, layer.do_feature_map_norm
        self.out_norm = isinstance(layer.norm, nn.Module) and not isinstance(layer.norm, nn.Identity)
        if self.out_norm:
            self.norm_w, self.norm_eps = norm_weight(layer.norm), layer.norm.eps
        probe = self.feature_k(self.k_proj.weight.new_zeros(1, 1, 1, self.head_k))  # on the weights' device
        self.heads, self.d_key = self.n_heads, probe.shape[-1]
        self.d_value = self.head_v + int(self.normalize)

    def run(self, x, past, position, mask=None):
        q = self.feature_q(heads(self.q_proj(x), self.head_k))
        k = self.feature_k(heads(self.k_proj(x), self.head_k, self.groups))
        v = heads(self.v_proj(x), self.head_v, self.groups)
        if self.norm_q:
            q = q / (q.sum(-1, True) + 1e-4)
        if self.norm_k:
            k = k / (k.sum(-1, True) + 1e-4)
        if self.normalize:
            v = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)
        scale = k.shape[-1] ** -0.5
        g, beta = zeros_g(x, self.n_heads), ones(x, self.n_heads)
        o, state = self.rule(q, k, v, g, beta, past, position, False, scale, mask=mask)
        if self.normalize:
            o = o[..., : self.head_v] / (o[..., self.head_v :] + 1e-10)
        if self.out_norm:
            o = parts.norm(o, self.norm_w, None, self.norm_eps, rms=True)
        return self.o_proj(o.flatten(-2)), state


def feature_map(fn: Any) -> Any:
    """A LinearAttention feature map as torch: the library's own modules (they are torch code), or
    elu(x) + 1 for its ``elu_p1`` kernel."""
    if isinstance(fn, nn.Module):
        return fn
    if getattr(fn, "__name__", "") == "elu_p1":
        return lambda x: F.elu(x) + 1
    raise AttnxError(f"flash-linear-attention LinearAttention feature map {fn!r} is not exported by attnx")


class GatedLinearAttention(FlaLayer):
    """``fla.layers.GatedLinearAttention`` (GLA): per-key-dim decay g = logsigmoid(gk_proj(x)) /
    gate_logit_normalizer (clamped below by ``clamp_min``), beta 1, scale d_k^-1/2."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        where = "flash-linear-attention GatedLinearAttention"
        self.n_heads, self.groups = layer.num_heads, layer.num_kv_groups
        self.head_k, self.head_v = layer.head_k_dim, layer.head_v_dim
        self.take(layer, "q_proj", "k_proj", "v_proj", "gk_proj", "o_proj")
        self.conv = short_conv(layer)
        self.normalizer, self.clamp_min = layer.gate_logit_normalizer, layer.clamp_min
        self.feature = parts.activation(_name_of(layer.feature_map_fn), where)
        self.output = OutputGate(layer, where)
        self.heads, self.d_key, self.d_value = self.n_heads, self.head_k, self.head_v

    def run(self, x, past, position, mask=None):
        (q, k, v), conv = self.convolve([self.q_proj(x), self.k_proj(x), self.v_proj(x)], past, mask)
        q = heads(q, self.head_k)
        k, gk = (heads(t, self.head_k, self.groups) for t in (k, self.gk_proj(x)))
        v = heads(v, self.head_v, self.groups)
        gk = F.logsigmoid(gk) / self.normalizer
        if self.clamp_min is not None:
            gk = torch.clamp_min(gk, self.clamp_min)
        q, k = self.feature(q), self.feature(k)
        beta = ones(x, self.n_heads)
        o, state = self.rule(q, k, v, gk, beta, past, position, False, self.head_k**-0.5, mask=mask)
        return self.o_proj(self.output(o, x)), conv + state


def _name_of(fn: Any) -> str | None:
    """The library's ``ACT2FN`` name of an activation function (None for None)."""
    if fn is None:
        return None
    for name, known in _act2fn().items():
        if fn == known:  # a bound autograd.Function.apply is a new object at each access
            return name
    return getattr(fn, "__name__", repr(fn))


class DeltaNet(FlaLayer):
    """``fla.layers.DeltaNet``: the delta rule (no decay), beta = sigmoid(b_proj(x)) (1 without
    ``use_beta``; doubled with ``allow_neg_eigval``), q/k after the activation, L2- (in-kernel, eps
    1e-6) or sum-normalised, scale d_k^-1/2; output RMSNorm per head, or gated by silu(g_proj(x))."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.n_heads, self.head_k, self.head_v = layer.num_heads, layer.head_k_dim, layer.head_v_dim
        self.take(layer, "q_proj", "k_proj", "v_proj", "o_proj")
        self.conv = short_conv(layer)
        self.activation, self.qk_norm = layer.qk_activation, layer.qk_norm
        self.use_beta, self.neg = layer.use_beta, layer.allow_neg_eigval
        if self.use_beta:
            self.b_proj = layer.b_proj
        self.output = NormGate(layer, layer.use_gate)
        self.heads, self.d_key, self.d_value = self.n_heads, self.head_k, self.head_v

    def run(self, x, past, position, mask=None):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.conv is not None:
            (q, k, v), conv = self.convolve([q, k, v], past, mask)
        else:
            conv = ()
            q, k = (F.silu(q), F.silu(k)) if self.activation == "silu" else (q, k)
            v = F.silu(v)
        q, k, v = heads(q, self.head_k), heads(k, self.head_k), heads(v, self.head_v)
        if self.activation == "relu":
            q, k = q.relu(), k.relu()
        elif self.activation == "elu":
            q, k = F.elu(q) + 1, F.elu(k) + 1
        if self.qk_norm == "sum":
            q, k = (F.normalize(t, p=1, dim=-1, eps=1e-6) for t in (q, k))
        else:
            q, k = l2norm(q), l2norm(k)
        beta = self.b_proj(x).sigmoid() if self.use_beta else ones(x, self.n_heads)
        if self.neg:
            beta = beta * 2.0
        g = zeros_g(x, self.n_heads)
        o, state = self.rule(q, k, v, g, beta, past, position, True, self.head_k**-0.5, mask=mask)
        return self.o_proj(self.output(o, x)), conv + state


class GatedDeltaNet(FlaLayer):
    """``fla.layers.GatedDeltaNet``: the gated delta rule with one decay per value head,
    g = -exp(A_log) * softplus(a_proj(x) + dt_bias), beta = sigmoid(b_proj(x)) (x2 with
    ``allow_neg_eigval``), L2-normalised q/k (eps 1e-6), scale d_k^-1/2, value heads a multiple of the
    q/k heads (each q/k head serves consecutive value heads); output gated RMSNorm (swish/sigmoid) or
    a plain per-head RMSNorm (:class:`NormGate`)."""

    output_gate = "use_gate"  # the library layer's option that gates the output

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        if layer.num_v_heads < layer.num_heads:
            raise AttnxError(
                f"flash-linear-attention {self.kind} with num_v_heads={layer.num_v_heads} < num_heads="
                f"{layer.num_heads}: the library's kernels need value heads a multiple of the q/k heads"
            )
        self.n_heads, self.v_heads = layer.num_heads, layer.num_v_heads
        self.head_k, self.head_v = layer.head_k_dim, layer.head_v_dim
        self.take(layer, "q_proj", "k_proj", "v_proj", "b_proj", "o_proj")
        self.decays = getattr(layer, "use_forget_gate", True)
        if self.decays:
            self.take(layer, "a_proj", "A_log", "dt_bias")
        self.conv = short_conv(layer)
        self.neg = layer.allow_neg_eigval
        self.output = NormGate(layer, getattr(layer, self.output_gate))
        self.heads, self.d_key, self.d_value = self.v_heads, self.head_k, self.head_v

    def projected(
        self, x: torch.Tensor, past: tuple[torch.Tensor, ...] | None, mask: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]:
        """q, k, v projections after the short convolutions (SiLU inside them), or SiLU alone without
        them; and the convolutions' state."""
        qkv = [self.q_proj(x), self.k_proj(x), self.v_proj(x)]
        return self.convolve(qkv, past, mask) if self.conv is not None else ([F.silu(t) for t in qkv], ())

    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """beta = sigmoid(b_proj(x)) (x2 with ``allow_neg_eigval``) and the log-decay g (batch, n, value
        heads): -exp(A_log) * softplus(a_proj(x) + dt_bias), 0 without a forget gate."""
        beta = self.b_proj(x).float().sigmoid() * (2.0 if self.neg else 1.0)
        if not self.decays:
            return beta, x.new_zeros(x.shape[0], x.shape[1], self.v_heads, dtype=torch.float32)
        return beta, -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias.float())

    def run(self, x, past, position, mask=None):
        (q, k, v), conv = self.projected(x, past, mask)
        q, k, v = l2norm(heads(q, self.head_k)), l2norm(heads(k, self.head_k)), heads(v, self.head_v)
        beta, g = self.gates(x)
        o, state = self.rule(q, k, v, g[..., None], beta, past, position, True, self.head_k**-0.5, mask=mask)
        return self.o_proj(self.output(o, x)), conv + state


class GatedDeltaProduct(GatedDeltaNet):
    """``fla.layers.GatedDeltaProduct``: ``num_householder`` (m) gated delta-rule updates per token, each
    with its own k, v, beta (the projections hold m blocks per token, ``(n h d)``), the decay before the
    first and the query read after the last.

    That is the gated delta rule on the sequence expanded to m sub-steps per token: sub-step j of token
    t takes k_{t,j}, v_{t,j}, beta_{t,j}, g = g_t at j = 0 and 0 after (exp(0) = 1 keeps S), q = 0
    before the last sub-step and q_t at it; token t's output is the last sub-step's. The library runs
    exactly this expansion in its fused_recurrent path and in its float64 reference
    (``naive_recurrent_gated_delta_product``); its chunk kernel computes the same sums without the
    zero queries. ``use_forget_gate=False``: g = 0. Otherwise as :class:`GatedDeltaNet` (the output
    gate is ``use_output_gate``); the state is per value head after the token's last sub-step."""

    output_gate = "use_output_gate"

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.householder = layer.num_householder

    def run(self, x, past, position, mask=None):
        m = self.householder
        (q, k, v), conv = self.projected(x, past, mask)
        expanded = [t.unflatten(-1, (m, -1)).flatten(1, 2) for t in (k, v)]  # (b, n * m, h * d)
        k, v = l2norm(heads(expanded[0], self.head_k)), heads(expanded[1], self.head_v)
        beta, g = self.gates(x)
        beta = beta.unflatten(-1, (m, -1)).flatten(1, 2)
        q, g = sub_steps(l2norm(heads(q, self.head_k)), g, m)
        mask = None if mask is None else mask.repeat_interleave(m, dim=1)  # each of a token's sub-steps
        o, state = self.rule(q, k, v, g[..., None], beta, past, position, True, self.head_k**-0.5, mask=mask)
        return self.o_proj(self.output(o.unflatten(1, (-1, m))[:, :, -1], x)), conv + state


def sub_steps(q: torch.Tensor, g: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q (batch, n, heads, d_k) and g (batch, n, value heads) on m sub-steps per token, (batch, n * m, ...):
    q read at each token's last sub-step and g decaying at its first, zeros at the others."""
    return (
        F.pad(q.unsqueeze(2), (0, 0, 0, 0, m - 1, 0)).flatten(1, 2),
        F.pad(g.unsqueeze(2), (0, 0, 0, m - 1)).flatten(1, 2),
    )


class HGRN2Attention(FlaLayer):
    """``fla.layers.HGRN2Attention`` (HGRN2): GLA's additive rule with the key tied to the forget gate:
    per key dim g = logsigmoid(f_proj(x)), k = 1 - exp(g), q = swish(q_proj(x)), v = i_proj(x), beta 1,
    scale ``expand_ratio``^-1/2 (the chunk_gla / fused_recurrent_gla default: d_k^-1/2); short convs
    without activation.

    In the library's model, from the second layer on (``layer_idx`` > 0), the forget gate is raised to
    the model's lower bound lb (``lower_bound``, passed by the model's forward):
    g = log(lb + (1 - lb) sigmoid(f)) = logaddexp(log lb, log1p(-lb) + g). The output is an RMSNorm over
    the whole width (not per head) then ``o_proj`` (``rms_norm_linear``), whose eps is that function's
    default 1e-5: the layer does not pass its ``norm_eps`` (:data:`NORM_EPS`)."""

    NORM_EPS = 1e-5  # fla.modules.norm.layernorm.rms_norm_linear's default eps (HGRN2 passes none)

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.n_heads, self.head_k, self.head_v = layer.num_heads, layer.head_f_dim, layer.head_i_dim
        self.take(layer, "q_proj", "f_proj", "i_proj", "o_proj")
        convs = [layer.q_conv1d, layer.f_conv1d, layer.i_conv1d] if layer.use_short_conv else None
        self.conv = parts.ShortConv(convs) if convs else None
        self.norm_w, self.norm_b = norm_weight(layer.g_norm), getattr(layer.g_norm, "bias", None)
        self.heads, self.d_key, self.d_value = self.n_heads, self.head_k, self.head_v

    def context(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"lower_bound": kwargs.get("lower_bound")}

    def run(self, x, past, position, lower_bound=None, mask=None):
        (q, f, i), conv = self.convolve([self.q_proj(x), self.f_proj(x), self.i_proj(x)], past, mask)
        g = F.logsigmoid(f)
        if lower_bound is not None and self.layer_idx > 0:
            g = torch.logaddexp(lower_bound.log(), torch.log1p(-lower_bound) + g)
        k = (1 - g.exp()).to(i.dtype)
        q, k, g = (heads(t, self.head_k) for t in (F.silu(q), k, g))
        v = heads(i, self.head_v)
        beta = ones(x, self.n_heads)
        o, state = self.rule(q, k, v, g, beta, past, position, False, self.head_k**-0.5, mask=mask)
        o = parts.norm(o.flatten(-2), self.norm_w, self.norm_b, self.NORM_EPS, rms=True)
        return self.o_proj(o), conv + state


class MultiScaleRetention(FlaLayer):
    """``fla.layers.MultiScaleRetention`` (RetNet): fixed decay per head gamma_h = 1 - 2^(-5 - h),
    rotary q/k (non-interleaved, from the token's position), beta 1, scale d_k^-1/2; output as GLA's."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        where = "flash-linear-attention MultiScaleRetention"
        rotary = layer.rotary
        if rotary.scale_base is not None or rotary.interleaved or not rotary.pos_idx_in_fp32:
            raise AttnxError(
                f"{where}: rotary embeddings with XPos scaling or interleaved pairs are not exported"
            )
        self.n_heads, self.groups = layer.num_heads, layer.num_kv_groups
        self.head_k, self.head_v = layer.head_k_dim, layer.head_v_dim
        self.take(layer, "q_proj", "k_proj", "v_proj", "o_proj")
        self.conv = short_conv(layer)
        self.feature = parts.activation(_name_of(layer.feature_map_fn), where)
        self.register_buffer("inv_freq", rotary._compute_inv_freq(), persistent=False)
        decay = (1 - 2.0 ** (-5.0 - torch.arange(self.n_heads, dtype=torch.float32))).log()
        self.register_buffer("decay", decay, persistent=False)
        self.output = OutputGate(layer, where)
        self.heads, self.d_key, self.d_value = self.n_heads, self.head_k, self.head_v

    def run(self, x, past, position, mask=None):
        (q, k, v), conv = self.convolve([self.q_proj(x), self.k_proj(x), self.v_proj(x)], past, mask)
        q, k = heads(q, self.head_k), heads(k, self.head_k)
        q, k = self.feature(q), self.feature(k)
        positions = token_positions(x, position, mask)
        q, k = parts.rotate(q, self.inv_freq, positions), parts.rotate(k, self.inv_freq, positions)
        k = k.repeat_interleave(self.groups, dim=2) if self.groups > 1 else k
        v = heads(v, self.head_v, self.groups)
        g = self.decay[:, None].expand(x.shape[0], x.shape[1], self.n_heads, 1)
        beta = ones(x, self.n_heads)
        o, state = self.rule(q, k, v, g, beta, past, position, False, self.head_k**-0.5, mask=mask)
        return self.o_proj(self.output(o, x)), conv + state


def token_positions(
    x: torch.Tensor, position: torch.Tensor | None, mask: torch.Tensor | None
) -> torch.Tensor:
    """The positions of x's tokens (float32) from ``position`` (None: 0): (n,) without a padding ``mask``;
    with one (batch, n), counting each row's real tokens only, as the library's rotary of each row's real
    tokens alone does."""
    if mask is None:
        positions = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)
    else:
        positions = mask.long().cumsum(1).to(torch.float32) - 1
    return positions if position is None else positions + position.to(torch.float32)


class RWKV6Attention(FlaLayer):
    """``fla.layers.RWKV6Attention``: per-key-dim decay w = -exp(w_proj(...)), scale 1, and the bonus u.

    RWKV-6 reads the state *before* the current token: o_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T),
    S_t = diag(exp(w_t)) S_{t-1} + k_t v_t^T. The op's rule reads S_t, so it runs on the sequence
    shifted by one token (k, v, w of token t - 1 at step t, a no-op first step, r at step t and one
    extra step at the end), which gives r_t^T S_{t-1} exactly and ends on S_n; the bonus
    (r_t * u · k_t) v_t is added outside the op. State: ``conv``, the token shift's last input
    (batch, hidden, 1), then ``recurrent`` S.

    Padding, as the library's layer: x and v zeroed at padded tokens, which run otherwise (their decay
    applies); before a row's first real token the state is zero and stays exactly zero.
    """

    unpads = False

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.n_heads, self.head_k, self.head_v = layer.num_heads, layer.head_k_dim, layer.head_v_dim
        self.rank = layer.proj_low_rank_dim
        self.take(
            layer, "x_proj", "x_bias", "r_proj", "w_proj", "k_proj", "v_proj", "g_proj", "o_proj", "bonus"
        )
        norm = layer.g_norm
        self.norm_w, self.norm_b, self.norm_eps = norm.weight, norm.bias, norm.eps
        self.gate_fn = parts.activation(_name_of(layer.gate_fn), "flash-linear-attention RWKV6Attention")
        self.hidden = layer.hidden_size
        self.heads, self.d_key, self.d_value = self.n_heads, self.head_k, self.head_v

    def carry(self) -> StateTensor:
        return token_shift_state(self.hidden)

    def run(self, x, past, position, mask=None):
        b, n, d = x.shape
        x = mask_padding(x, mask)
        delta = shift(x, split_state(past, True)[0]) - x
        xx = self.x_proj[0](x, delta).view(b, n, -1, self.rank)
        xx = torch.einsum("btnr,hnr->btnh", self.x_proj[1](xx), self.x_proj[2].weight.view(d, 5, -1))
        r, w, k, v, g = (xx + self.x_bias).unbind(-2)
        pairs = ((self.r_proj, r), (self.w_proj, w), (self.k_proj, k))
        r, w, k = (heads(proj(x, mix, delta), self.head_k) for proj, mix in pairs)
        v = heads(mask_padding(self.v_proj(x, v, delta), mask), self.head_v)
        g = self.g_proj(x, g, delta)
        w = -torch.exp(w)
        edge = x.new_zeros(b, 1, self.n_heads, self.head_k)
        shifted = [torch.cat([edge, t], dim=1) for t in (k, w)]
        vv = torch.cat([x.new_zeros(b, 1, self.n_heads, self.head_v), v], dim=1)
        qq = torch.cat([r, edge], dim=1)
        beta = ones(qq, self.n_heads)
        o, state = self.rule(qq, shifted[0], vv, shifted[1], beta, past, position, False, 1.0)
        o = o[:, :n] + (r * self.bonus * k).sum(-1, keepdim=True) * v
        o = parts.norm(o.flatten(-2), self.norm_w, self.norm_b, self.norm_eps, rms=False, groups=self.n_heads)
        if position is not None:
            state = (x[:, -1:].transpose(1, 2), *state)
        return self.o_proj(o * self.gate_fn(g)), state


class RWKV7Attention(FlaLayer):
    """``fla.layers.RWKV7Attention`` on the generalised delta rule (:mod:`attnx.plugins.gated.generalized`):

        S_t = (diag(exp(w_t)) - (kk_t * a_t) kk_t^T) S_{t-1} + k_t v_t^T,    o_t = S_t^T r_t

    the library's ``chunk_rwkv7`` / ``fused_mul_recurrent_rwkv7`` with its arguments (log-decay w, the
    rule's a = -kk and b = kk * a, scale 1). Around it, as the library computes them: the token shift
    dx and the lerps x + dx * x_{r,w,k,v,a,g}; w = -exp(-1/2) sigmoid(w_lora) (:data:`LOG_DECAY_BOUND`);
    a = sigmoid(a_lora); kk = L2-normalised k * k_k per head (``l2_norm``, eps 1e-6 inside the root,
    with ``fuse_norm``; ``F.normalize`` without); the added key k + k (a - 1) k_a; the values mixed
    towards the first layer's (``v_first``, which layer 0 produces and the library's model passes through
    its blocks) by sigmoid(v_lora) from the second layer on; a GroupNorm per head (eps head_dim *
    norm_eps, from the library); the bonus (r * k * r_k summed per head) v; the gate g_lora; ``o_proj``.

    The forward returns the library's four values (o, None, cache, v_first). State: ``conv``, the token
    shift's last input (batch, hidden, 1), then ``recurrent`` S (batch, heads, head_dim, head_v_dim).

    Padding, as the library's layer: x zeroed at padded tokens and v after the value mix (``v_first`` is
    the unmasked v), the padded tokens run otherwise (their decay and DPLR term apply); before a row's
    first real token the state is zero and stays exactly zero.
    """

    unpads = False

    LOG_DECAY_BOUND = -0.6065306597126334  # -exp(-0.5): the library's w = this * sigmoid(w_lora(x))
    MIXES = ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g")

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.n_heads, self.head_k, self.head_v = layer.num_heads, layer.head_dim, layer.head_v_dim
        self.first = layer.layer_idx == 0
        loras = ("w_lora", "a_lora", "g_lora") if self.first else ("w_lora", "a_lora", "g_lora", "v_lora")
        self.take(layer, *self.MIXES, "k_k", "k_a", "r_k", "r_proj", "k_proj", "v_proj", "o_proj", *loras)
        self.fused, norm = layer.fuse_norm, layer.g_norm
        self.norm_w, self.norm_b, self.norm_eps = norm.weight, norm.bias, norm.eps
        self.norm_rms = bool(getattr(norm, "is_rms_norm", False))
        self.hidden = layer.hidden_size
        self.heads, self.d_key, self.d_value = self.n_heads, self.head_k, self.head_v

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Any = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None, Any, torch.Tensor]:
        (out, v_first), _, cache = super().forward(
            hidden_states, attention_mask, past_key_values, use_cache, output_attentions, **kwargs
        )
        return out, None, cache, v_first

    def context(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {"v_first": kwargs.get("v_first")}

    def carry(self) -> StateTensor:
        return token_shift_state(self.hidden)

    def run(self, x, past, position, v_first=None, mask=None):
        x = mask_padding(x, mask)
        delta = shift(x, split_state(past, True)[0]) - x
        xr, xw, xk, xv, xa, xg = (torch.addcmul(x, delta, getattr(self, name)) for name in self.MIXES)
        r, k, v = self.r_proj(xr), self.k_proj(xk), self.v_proj(xv)
        w = self.LOG_DECAY_BOUND * self.w_lora(xw).sigmoid()
        if self.first:
            v_first = v
        elif v_first is None:
            raise AttnxError(
                f"flash-linear-attention RWKV7Attention layer {self.layer_idx} mixes in the first layer's "
                "values: pass v_first (the library's model does)"
            )
        else:
            v = torch.lerp(v, v_first, self.v_lora(xv).sigmoid())
        v = mask_padding(v, mask)
        a, g = self.a_lora(xa).sigmoid(), self.g_lora(xg)
        kk = heads(k * self.k_k, self.head_k)
        kk = l2norm(kk) if self.fused else F.normalize(kk, dim=-1, p=2.0)
        k = k.addcmul(k * (a - 1), self.k_a)
        r, w, k, a = (heads(t, self.head_k) for t in (r, w, k, a))
        v = heads(v, self.head_v)
        step = position is not None
        args = [t.transpose(1, 2) for t in (r, k, v, w, -kk, kk * a)]
        o, recurrent = run_generalized_rule(*args, split_state(past, False)[1], scale=1.0, step=step)
        o = parts.norm(
            o.transpose(1, 2).flatten(-2),
            self.norm_w,
            self.norm_b,
            self.norm_eps,
            self.norm_rms,
            self.n_heads,
        )
        o = (o + ((r * k * self.r_k).sum(-1, keepdim=True) * v).flatten(-2)) * g
        state = (x[:, -1:].transpose(1, 2), recurrent) if step else ()
        return (self.o_proj(o), v_first), state


def token_shift_state(hidden: int) -> StateTensor:
    """RWKV's token shift carries one previous input: a kernel-2 convolution's carry (role ``conv``)."""
    return StateTensor("conv", ("batch", hidden, 1), doc="the token shift's previous input", role="conv")


def shift(x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
    """RWKV's token shift: the previous input at each position ((batch, hidden, 1) ``last`` before the
    first; zeros without)."""
    first = x.new_zeros(x.shape[0], 1, x.shape[2]) if last is None else last.transpose(1, 2).to(x.dtype)
    # slicing after the concatenation keeps every size a multiple of the sequence length: x[:, :-1]
    # (n - 1 tokens) would make torch.export guard on n - 1 != 1 and refuse a dynamic length
    return torch.cat([first, x], dim=1)[:, :-1]


class Mamba2(FlaLayer):
    """``fla.layers.Mamba2`` (SSD; its torch path, the one it runs without ``mamba_ssm``/CUDA): the
    mapping of HF's Mamba2 mixer (:func:`attnx.plugins.gated.op.ssd_rule`: q = C, k = B,
    v = dt x, g = dt A per head, the D skip outside; a (heads, head_dim) D with ``D_has_hdim``), dt
    clamped to ``dt_limit``, the conv and its activation over [x, B, C], then the library's
    ``RMSNormGated`` (per group of intermediate_size / n_groups, the gate silu(z) before the norm or,
    with ``norm_before_gate``, after) or, without ``rmsnorm``, y * act(z). ``conv`` carries the conv's
    inputs (batch, intermediate_size + 2 n_groups d_state, kernel - 1).

    Padding, as the library's torch path (HF's): x, the conv's inputs and its outputs zeroed at padded
    tokens, dt not (a padded token's decay applies: before a row's first real token, to a zero state)."""

    unpads = False

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        where = "flash-linear-attention Mamba2"
        self.take(layer, "in_proj", "conv1d", "dt_bias", "A_log", "D", "out_proj")
        self.heads, self.d_key, self.d_value = layer.num_heads, layer.ssm_state_size, layer.head_dim
        self.groups, self.inner, self.conv_dim = layer.n_groups, layer.intermediate_size, layer.conv_dim
        self.dt_limit, self.per_channel_d = tuple(layer.dt_limit), layer.D_has_hdim
        self.act = parts.activation(_name_of(layer.act), where)
        self.rmsnorm, self.before = layer.rmsnorm, layer.norm_before_gate
        if self.rmsnorm:
            self.norm_w, self.norm_eps = layer.norm.weight, layer.norm.eps

    def carry(self) -> StateTensor:
        return conv_state(self.conv_dim, self.conv1d.weight.shape[-1])

    def run(self, x, past, position, mask=None):
        gate, channels, dt = self.in_proj(mask_padding(x, mask)).split(
            [self.inner, self.conv_dim, self.heads], -1
        )
        carried, recurrent = split_state(past, True)
        channels = mask_padding(channels, mask)
        mixed, conv = carried_conv(channels, self.conv1d.weight, self.conv1d.bias, carried)
        mixed = mask_padding(self.act(mixed), mask)
        width = self.groups * self.d_key
        xs, b, c = torch.split(mixed, [self.inner, width, width], dim=-1)
        dt = F.softplus(dt + self.dt_bias).clamp(*self.dt_limit)
        d = self.D.unflatten(0, (self.heads, -1)) if self.per_channel_d else self.D[:, None]
        # the torch path tiles the groups over the heads (head h reads group h % n_groups: B.repeat),
        # where the library's CUDA kernels and its own one-token step give each group consecutive heads
        b, c = (heads(t, self.d_key).repeat(1, 1, self.heads // self.groups, 1) for t in (b, c))
        step = position is not None
        y, state = ssd_rule(heads(xs, self.d_value), b, c, dt, self.A_log, d, recurrent, step)
        y = self.gated(y.flatten(-2), gate)
        return self.out_proj(y.to(x.dtype)), (conv, state) if step else ()

    def gated(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The library's ``RMSNormGated`` (``rms_norm_ref``, float32) or y * act(z) without a norm."""
        if not self.rmsnorm:
            return y * self.act(z)
        gate = F.silu(z.float())
        y = y.float() if self.before else y.float() * gate
        y = parts.norm(y, self.norm_w, None, self.norm_eps, rms=True, groups=self.groups)
        return y * gate if self.before else y


LAYERS = {
    "LinearAttention": LinearAttention,
    "GatedLinearAttention": GatedLinearAttention,
    "DeltaNet": DeltaNet,
    "GatedDeltaNet": GatedDeltaNet,
    "GatedDeltaProduct": GatedDeltaProduct,
    "HGRN2Attention": HGRN2Attention,
    "MultiScaleRetention": MultiScaleRetention,
    "RWKV6Attention": RWKV6Attention,
    "RWKV7Attention": RWKV7Attention,
    "Mamba2": Mamba2,
}


class TokenShiftFeedForward(Stepping, nn.Module):
    """RWKV's feed-forward (channel mix) on x and its token shift; while stepping it carries its last
    input (``conv``, (batch, hidden, 1)). Subclasses implement :meth:`run`."""

    def __init__(self, ffn: nn.Module) -> None:
        super().__init__()
        self.kind, self.hidden = type(ffn).__name__, ffn.hidden_size
        self.act = parts.activation(_name_of(ffn.act_fn), f"flash-linear-attention {self.kind}")

    def forward(
        self,
        x: torch.Tensor,
        attention_mask: Any = None,
        state: Any = None,
        cu_seqlens: Any = None,
        **kw: Any,
    ) -> tuple[torch.Tensor, Any]:
        refuse_call(self.kind, attention_mask, state, False, {"cu_seqlens": cu_seqlens})
        x = mask_padding(x, attention_mask)  # the library's: padded tokens' inputs zeroed, then shifted
        return (self.run(x, None) if self.stepping is None else self.stepped(x)), state

    def run(self, x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        """The feed-forward on x after the input ``last`` ((batch, hidden, 1); None: zeros)."""
        raise NotImplementedError

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The feed-forward on new tokens x after ``state`` (its last input); the state is x's last token."""
        return self.run(x, state[0] if state is not None else None), (x[:, -1:].transpose(1, 2),)

    def decode_state(self) -> list[StateTensor]:
        return [token_shift_state(self.hidden)]


class RWKV6FeedForward(TokenShiftFeedForward):
    """``fla.models.rwkv6.RWKV6FeedForward``: sigmoid(receptance(x, dx)) * value(act(key(x, dx))) with
    the token shift dx."""

    def __init__(self, ffn: nn.Module) -> None:
        super().__init__(ffn)
        self.key, self.value, self.receptance = ffn.key, ffn.value, ffn.receptance

    def run(self, x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        delta = shift(x, last) - x
        value = self.value(self.act(self.key(x, delta)))
        return self.receptance(x, delta).sigmoid() * value


class RWKV7FeedForward(TokenShiftFeedForward):
    """``fla.models.rwkv7.RWKV7FeedForward``: value(act(key(x + dx * x_k))) with the token shift dx
    (``act`` the config's ``hidden_act``, sqrelu: relu(x)^2)."""

    def __init__(self, ffn: nn.Module) -> None:
        super().__init__(ffn)
        self.key, self.value, self.x_k = ffn.key, ffn.value, ffn.x_k

    def run(self, x: torch.Tensor, last: torch.Tensor | None) -> torch.Tensor:
        return self.value(self.act(self.key(x.addcmul(shift(x, last) - x, self.x_k))))


# the library's feed-forward classes (fla.models.rwkv6 / rwkv7), by class name -> their conversions
FEED_FORWARDS = {"RWKV6FeedForward": RWKV6FeedForward, "RWKV7FeedForward": RWKV7FeedForward}
