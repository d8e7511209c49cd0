"""Google's RecurrentGemma (Griffin; ``recurrent_gemma``), as transformers 5.24 writes it: recurrent
blocks (``block_types`` "recurrent", HF's ``layer_types`` "linear_attention") and local attention blocks
("attention", "sliding_attention").

What HF computes in a recurrent block (``RecurrentGemmaRecurrentBlock.forward`` and
``RecurrentGemmaRglru``), for hidden states x (batch, n, width) at positions p:

1. y = act(``linear_y``(x)) (``hidden_activation``, tanh GELU);
2. u = a causal depthwise conv (kernel ``conv1d_width``, bias) over ``linear_x``(x), zeros before the first
   token (in a decode step: the last ``conv1d_width`` - 1 inputs carried);
3. the RG-LRU on u, per channel of ``lru_width``: gates i, r = sigmoid(block-diagonal linears of u: the
   channels in ``num_attention_heads`` blocks, ``input_gate_weight``/``recurrent_gate_weight`` (blocks,
   in, out) and their biases); log a = -8 r softplus(``recurrent_param``); at p = 0 (a *reset*) a = 0 and the
   input is not scaled; elsewhere it is times sqrt(1 - a^2):
   h_t = a_t h_{t-1} + m_t (i_t u_t), m_t = 1 at a reset, sqrt(1 - a_t^2) otherwise, in float32;
4. ``linear_out``(h * y).

Step 3's recurrence is ``attnx::GatedDeltaRule`` with ``delta=False`` on one value head of width 1 per
channel: v = m (i u), g = log a (one decay per head; :data:`RESET_DECAY` at a reset), k = q = 1 (one q/k
head of width 1 shared by every channel, the op's grouped layout), beta = 1, scale 1. The op runs it token
by token (values of width 1: :func:`attnx.plugins.gated.config.by_token`), as Mamba1's scan does
(``scan.py``).

**Padding.** HF's recurrent block takes no padding mask: ``linear_x`` of a left-padded token (its bias at
least) enters the conv of the first ``conv1d_width`` - 1 real tokens, and through them the state, so HF's
left-padded row is not the same row alone (measured: 0.1 on the logits of the small fixture). HF's reset
at the first real token (generate's position 0: a = 0) clears what padding put in the state, not what the
conv carried. :class:`RecurrentBlock` zeroes ``linear_x``'s output and the rule's input at the padding
*before* a row's first real token (from the 2D mask HF's model hands every layer), so a left-padded row
equals the same row alone (attnx's contract): on left-padded batches it matches HF's forward of each row
alone, not HF's padded forward. Padding after the real tokens (right padding) reaches no real token, and
is computed unmasked, as HF does, so a right-padded batch equals HF's forward at every position. The
reset is HF's at any position 0 (a = 0 through a log-decay of :data:`RESET_DECAY`, the input unscaled).

The attention blocks (``RecurrentGemmaAttention``: plain q/k/v projections, MQA with
``num_key_value_heads``, HF's partial rotary from the layer's own ``rotary_emb``, ``o_proj`` with a bias)
become :class:`LocalAttention`. HF's attention is *local*: a query sees the last ``attention_window_size``
tokens (itself included); attnx's softmax sees every earlier token, so the two agree on sequences of up to
``attention_window_size`` tokens and the export is capped there (:attr:`Architecture.windowed`,
``longest``: its lengths, the genai ``context_length``, ``attnx generate``'s refusal). Everything else is
HF's own code: the embedding scaled by its bfloat16 ``normalizer`` (sqrt(width)), the ``temporal_pre_norm`` /
``channel_pre_norm`` RMSNorms (1 + weight), the gated MLP, ``final_norm``, the head and its logit
soft-cap tanh(logits / ``logits_soft_cap``) * ``logits_soft_cap``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.recurrent_gemma import modeling_recurrent_gemma as rgemma

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.attention import GatedAttention
from attnx.adapters.hf_hybrid.mixer import PaddedMixer, leading_padding, mask_padding
from attnx.errors import AttnxError
from attnx.plugins.gated.op import rule_state, run_rule
from attnx.shortconv import carried_conv
from attnx.state import StateTensor, conv_state

DECAY_SCALE = -8.0  # HF's log a = -8 r softplus(recurrent_param) (Griffin's c)
# log a at a reset (HF's a = 0): exp gives exactly 0 in float32 (and float16), finite where the rule's
# forms sum or subtract log-decays
RESET_DECAY = -1.0e4


class RecurrentBlock(PaddedMixer):
    """An HF RecurrentGemma recurrent block (same parameters, same names: ``linear_y``, ``linear_x``,
    ``conv_1d``, ``rg_lru``, ``linear_out``) computed by ``attnx::GatedDeltaRule``: a conv carry over the
    channels and the RG-LRU's state (1 x 1) per channel."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.act = layer.act_fn
        self.width, self.blocks = layer.lru_width, layer.rg_lru.num_attention_heads

    def decode_state(self) -> list[StateTensor]:
        """The conv carry over the channels, then the RG-LRU's state (1 x 1) per channel."""
        return rule_state(self.width, 1, 1, conv_state(self.width, self.conv_1d.weight.shape[-1]))

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """HF's call (positions, padding mask): the whole sequence, or (while ``stepping`` holds a Step) new
        tokens after its state."""
        if cache is not None or self.stepping is not None:
            return super().forward(hidden_states, cache, attention_mask), None
        return self.mix(hidden_states, attention_mask, None, position_ids)[0], None

    def step(
        self,
        x: torch.Tensor,
        state: tuple[torch.Tensor, ...] | None,
        position: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``PaddedMixer.step``, the new tokens at ``position`` on (a reset where that is 0)."""
        positions = (torch.arange(x.shape[1], device=x.device) + position)[None]
        return self.mix(x, mask, state or (None, None), positions)

    def conv_input(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``linear_x``(x), zero where ``mask`` is False (the padding before a row's first token; HF convolves
        it unmasked: the leak the module docstring describes)."""
        return mask_padding(self.linear_x(x), mask)

    def gate(self, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """sigmoid of HF's block-diagonal linear of (batch, n, width) ``u`` (its baddbmm per block)."""
        batch, n, width = u.shape
        blocks = u.reshape(batch * n, self.blocks, -1).permute(1, 0, 2)
        return torch.sigmoid(
            torch.baddbmm(bias[:, None, :], blocks, weight).transpose(0, 1).reshape(batch, n, width)
        )

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the recurrent block (module docstring); ``positions`` (batch or 1, n): HF's
        position ids, whose zeros are resets (None: 0..n-1)."""
        batch, n, _ = x.shape
        if positions is None:
            positions = torch.arange(n, device=x.device)[None]
        y = self.act(self.linear_y(x))
        past_conv, past = (None, None) if state is None else state
        leading = leading_padding(mask)
        xs = self.conv_input(x, leading)
        u, carry = carried_conv(xs, self.conv_1d.weight, self.conv_1d.bias, past_conv)
        u = u.to(x.dtype)
        lru = self.rg_lru
        log_a = DECAY_SCALE * self.gate(u, lru.recurrent_gate_weight, lru.recurrent_gate_bias)
        log_a = log_a * F.softplus(lru.recurrent_param)
        reset = (positions == 0)[:, :, None]
        scaled = torch.sqrt(1 - torch.exp(2 * log_a))
        multiplier = reset + ~reset * scaled
        v = mask_padding(
            u * self.gate(u, lru.input_gate_weight, lru.input_gate_bias) * multiplier.to(x.dtype), leading
        )
        q = torch.ones(batch, 1, n, 1, dtype=torch.float32, device=x.device)  # also k: one head, width 1
        beta = torch.ones(batch, self.width, n, dtype=torch.float32, device=x.device)
        g = torch.where(reset, RESET_DECAY, log_a.float()).transpose(1, 2)[..., None]  # a = 0 at a reset
        step = state is not None
        h, recurrent = run_rule(
            q, q, v.float().transpose(1, 2)[..., None], g, beta, past, delta=False, scale=1.0, step=step
        )
        out = self.linear_out(h[..., 0].transpose(1, 2).to(x.dtype) * y)
        return out, (carry, recurrent) if step else None


class LocalAttention(GatedAttention):
    """An HF RecurrentGemma attention block (plain, MQA, partial rotary from its own ``rotary_emb``,
    ``o_proj`` with a bias) computed by ``attnx::SoftmaxAttention``: HF's local window is not applied, which
    is exact on sequences of up to ``attention_window_size`` tokens (the export's cap)."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer, rgemma.apply_rotary_pos_emb, gated=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """HF's call (positions, padding mask): cos/sin from the layer's own rotary module, as HF's."""
        embeddings = None if self.stepping is not None else self.rotary_emb(hidden_states, position_ids)
        return super().forward(hidden_states, embeddings, attention_mask, cache)


def _check(config: Any) -> None:
    """Refuse a conv of one tap (no carry: an empty decode state, which onnxruntime-genai refuses).

    Raises:
        AttnxError: ``conv1d_width`` below 2.
    """
    if config.conv1d_width < 2:
        raise AttnxError(
            f"recurrent_gemma with conv1d_width={config.conv1d_width}: attnx decodes a recurrent block "
            "through its carry of conv1d_width - 1 inputs; export a config with conv1d_width >= 2"
        )


RECURRENT_GEMMA = Architecture(
    model_type="recurrent_gemma",
    config_class="RecurrentGemmaConfig",
    classes=("RecurrentGemmaForCausalLM", "RecurrentGemmaModel"),
    models=(rgemma.RecurrentGemmaForCausalLM, rgemma.RecurrentGemmaModel),
    layers={
        rgemma.RecurrentGemmaRecurrentBlock: RecurrentBlock,
        rgemma.RecurrentGemmaAttention: LocalAttention,
    },
    # HF's scan loops over the tokens in Python and keeps its cache on the modules
    untraceable=(rgemma.RecurrentGemmaRecurrentBlock,),
    rotary=rgemma.RecurrentGemmaRotaryEmbedding,
    check=_check,
    layer_types=("linear_attention", "sliding_attention"),
    windowed="sliding_attention",
    longest=lambda config: config.sliding_window,
    leaky_padding=True,
)
