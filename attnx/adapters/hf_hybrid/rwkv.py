"""RWKV-4 (``rwkv``) as transformers 5.24 writes it: blocks of a time mix (``RwkvSelfAttention``: the WKV
recurrence) and a channel mix (``RwkvFeedForward``), each after a token shift; one layer kind, no
positions, no ``layer_types`` in its config.

What HF computes (``modeling_rwkv.py``, its CPU path ``rwkv_linear_attention_cpu``), per layer on the
normed hidden states x (batch, n, width):

1. token shift: s_t = x_{t-1} (zeros before the first token, or the carried last x of the previous call);
   per input, x * mix + s * (1 - mix) with the learnt ``time_mix_key/value/receptance``;
2. time mix: k, v, r = ``key``, ``value``, sigmoid(``receptance``) of their mixes; per channel c, with
   w = -exp(``time_decay``) and u = ``time_first``, a_t = e^w a_{t-1} + e^{k_t} v_t and
   b_t = e^w b_{t-1} + e^{k_t}, and wkv_t = (a_{t-1} + e^{u + k_t} v_t) / (b_{t-1} + e^{u + k_t})
   (HF keeps a running maximum of the exponents for stability; the same ratio); ``output``(r * wkv);
3. channel mix: sigmoid(``receptance``(mix)) * ``value``(relu(``key``(mix))^2).

The WKV is ``attnx::GatedDeltaRule`` with ``delta=False``, one value head per channel, d_k = 1 and the
value [v, 1] (numerator and denominator in one state; width 2, so the op runs token by token). The op's
output at t reads its state *after* token t's decay and update, e^w a_{t-1} + e^{k_t} v_t, while RWKV
reads a_{t-1} itself; dividing the decay back out (e^{-w} up to e^{e^{time_decay}}) would overflow or
cancel, so the op is fed the *previous* token instead: at t the key e^{k_{t-1}}, the value [v_{t-1}, 1] and
the decay w (none, 0, at a chunk's first token), so its state at t is exactly a_{t-1}, b_{t-1} (q = 1,
scale 1). The current token's bonus e^{u + k_t} [v_t, 1] is added outside, then the division; the state
carried to the next call is e^w S_n + e^{k_n} [v_n, 1]. The exponentials are not stabilised: exact for
keys below ~88 (float32's e^x), as trained RWKV-4 keys are.

HF's RWKV ignores ``attention_mask`` (it warns and drops it): a left-padded row's pad tokens shift into
its first token and run through the recurrence. attnx's contract is that a padded row equals the row
alone, so the layers take the 2D mask that :class:`~attnx.adapters.hf_hybrid.model.HybridModel` hands
over (:class:`~attnx.adapters.hf_hybrid.model.HandedPadding`): before a row's first real token x is
zeroed (so that token's shift is zeros) and a padded token neither decays nor adds to the state; on a
left-padded batch the model matches HF's forward of each row alone (``Architecture.leaky_padding``).
Padding after the real tokens reaches none of them and runs as HF runs it, pad tokens as tokens
(:func:`~attnx.adapters.hf_hybrid.mixer.leading_padding`, as RecurrentGemma's), so a right-padded batch
(``attnx export``'s own parity inputs) equals HF's padded forward at every position.

The token shifts are decode state: each layer carries its last input x as a conv carry of one tap
(batch, width, 1); the time mix also carries the WKV state (batch, channels, 1, 2). ``rescale_every``
(HF halves the hidden states every N blocks in inference, the ``output``/``value`` weights of later
blocks divided in place to match) is reproduced without touching the shared weights: :func:`_rescale`
scales the layers' outputs by the same powers of two (the same float numbers), and HF's forward halves
the hidden states; ``--from hf:DIR`` rescales the loaded model itself first (:func:`_rescaled`, as its
first eval forward would mid-export), so the exported weights are the model's own. Embeddings, the layer norms
(``pre_ln``, ``ln1``, ``ln2``, ``ln_out``), the residuals and the head are HF's own code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.models.rwkv import modeling_rwkv as rwkv

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.mixer import PaddedMixer, leading_padding, mask_padding
from attnx.adapters.hf_hybrid.model import HandedPadding
from attnx.plugins.gated.op import rule_state, run_rule
from attnx.state import StateTensor, conv_state


def _mixed(x: torch.Tensor, shifted: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """RWKV's interpolation of a token with the one before it (HF's expression)."""
    return x * mix + shifted * (1 - mix)


def _earlier(x: torch.Tensor, first: torch.Tensor | None) -> torch.Tensor:
    """(batch, n, ...) ``x`` one token later: ``first`` (batch, 1, ...; None: zeros), then x_0 .. x_{n-2}."""
    # padded by one, then cut: slicing x itself to n - 1 tokens makes torch.export guard on n - 1 != 1
    before = torch.zeros_like(x[:, :1]) if first is None else first.to(x.dtype)
    return torch.cat([before, x], dim=1)[:, :-1]


class TokenShift(HandedPadding, PaddedMixer):
    """An RWKV layer (HF's parameters and names) after a token shift: HF's call ``(hidden, state,
    use_cache) -> (out, state)``, the 2D padding mask handed over in ``padding``; its decode state starts
    with the carry of its last input (batch, width, 1)."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.width = layer.config.hidden_size
        self.scale = 2.0 ** -getattr(layer, "halvings", 0)  # HF's rescaled output weights (_rescale)

    def decode_state(self) -> list[StateTensor]:
        """The last input x (the token shift's carry)."""
        return [conv_state(self.width, 2)]

    def shifted(
        self, x: torch.Tensor, mask: torch.Tensor | None, carry: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``x`` with the padding before a row's first token zeroed (:func:`leading_padding`), the token
        before each ((batch, n, width); ``carry`` (batch, width, 1) before the first, None: zeros), the carry
        after ``x`` and the mask of the tokens that run (None: all)."""
        mask = leading_padding(mask)
        x = mask_padding(x, mask)
        before = None if carry is None else carry.transpose(1, 2)
        return x, _earlier(x, before), x[:, -1:].transpose(1, 2), mask


class TimeMix(TokenShift):
    """HF's ``RwkvSelfAttention`` with the WKV on ``attnx::GatedDeltaRule`` (module docstring)."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.channels = layer.attention_hidden_size

    def decode_state(self) -> list[StateTensor]:
        """The token shift's carry, then the WKV numerator and denominator (1 x 2 per channel)."""
        return rule_state(self.channels, 1, 2, super().decode_state()[0])

    def wkv_inputs(
        self, weighted: torch.Tensor, pair: torch.Tensor, decay: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The op's k (b, c, n, 1), v (b, c, n, 2) and g (b, c, n, 1) from each token's e^k (b, n, c), [v, 1]
        (b, n, c, 2) and decay (b, n, c; 0 at padding): at t those of token t - 1 (none at the first), so the
        op's state at t is RWKV's a_{t-1}, b_{t-1}."""
        return (
            _earlier(weighted, None).transpose(1, 2)[..., None],
            _earlier(pair, None).transpose(1, 2),
            _earlier(decay, None).transpose(1, 2)[..., None],
        )

    def mix(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        state: tuple[torch.Tensor | None, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the time mix (module docstring)."""
        carry, past = (None, None) if state is None else state
        x, shifted, carry, mask = self.shifted(x, mask, carry)
        key = self.key(_mixed(x, shifted, self.time_mix_key)).float()
        value = self.value(_mixed(x, shifted, self.time_mix_value)).float()
        receptance = torch.sigmoid(self.receptance(_mixed(x, shifted, self.time_mix_receptance)))
        real = torch.ones_like(key[..., :1]) if mask is None else mask[..., None].float()  # (b, n, 1)
        weighted = key.exp() * real  # e^k of the real tokens, 0 at padding
        pair = torch.stack([value, torch.ones_like(value)], dim=-1)  # (b, n, c, 2): [v, 1]
        decay = -self.time_decay.float().exp()
        k, v, g = self.wkv_inputs(weighted, pair, real * decay)
        q = torch.ones_like(k)
        beta = torch.ones_like(k[..., 0])
        step = state is not None
        out, recurrent = run_rule(q, k, v, g, beta, past, delta=False, scale=1.0, step=step)
        bonus = (self.time_first.float() + key).exp()[..., None] * pair
        total = out + bonus.transpose(1, 2)
        wkv = (total[..., 0] / total[..., 1]).transpose(1, 2)
        y = self.output(receptance * wkv.to(receptance.dtype)) * self.scale
        if not step:
            return y, None
        last = real[:, -1, :, None, None]  # (b, 1, 1, 1): 1 where the last token is real
        grown = (
            recurrent * (decay[:, None, None] * last).exp()
            + weighted[:, -1, :, None, None] * pair[:, -1, :, None]
        )
        return y, (carry, grown)


class ChannelMix(TokenShift):
    """HF's ``RwkvFeedForward`` after the carried token shift (no attnx op: its state is the carry alone)."""

    def mix(
        self, x: torch.Tensor, mask: torch.Tensor | None, state: tuple[torch.Tensor | None] | None
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the channel mix (module docstring)."""
        x, shifted, carry, _ = self.shifted(x, mask, None if state is None else state[0])
        key = torch.square(torch.relu(self.key(_mixed(x, shifted, self.time_mix_key))))
        receptance = torch.sigmoid(self.receptance(_mixed(x, shifted, self.time_mix_receptance)))
        return receptance * self.value(key) * self.scale, None if state is None else (carry,)


def _rescale(model: nn.Module) -> None:
    """HF's inference rescaling (``rescale_every``) without touching the weights, which the walk's copy
    shares with the model: HF's first eval forward divides the ``output``/``value`` weights of block i by
    2^(i // rescale_every) in place and from then on halves the hidden states; here each layer records
    its halvings (its output is scaled by 2^-halvings, the same float numbers) and the copy is marked
    rescaled, so HF's forward halves the hidden states and leaves the weights alone. Nothing to do in
    training mode, without rescaling, or where HF's forward has divided the weights already."""
    base = model.base_model
    every = base.config.rescale_every
    if base.training or every <= 0 or base.layers_are_rescaled:
        return
    for index, block in enumerate(base.blocks):
        block.attention.halvings = block.feed_forward.halvings = index // every
    base.layers_are_rescaled = True


def _rescaled(model: nn.Module) -> None:
    """HF's inference rescaling done on a loaded model before the export runs it (in place, as HF's first
    eval forward would do it: the exported weights are then the model's own)."""
    model.base_model._rescale_layers()


RWKV = Architecture(
    model_type="rwkv",
    config_class="RwkvConfig",
    classes=("RwkvForCausalLM", "RwkvModel"),
    models=(rwkv.RwkvForCausalLM, rwkv.RwkvModel),
    layers={rwkv.RwkvSelfAttention: TimeMix, rwkv.RwkvFeedForward: ChannelMix},
    untraceable=(rwkv.RwkvSelfAttention,),  # HF's WKV loops over the traced tokens
    rotary=None,
    mask_by_layer_type=False,
    prepare=_rescale,
    leaky_padding=True,
    loaded=_rescaled,
)
