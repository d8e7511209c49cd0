"""NX-AI's xLSTM (``xlstm``, xLSTM-7B) as transformers 5.24 writes it: one kind of layer, the mLSTM
(a block: RMSNorm, mLSTM layer, residual; RMSNorm, SwiGLU feed-forward, residual). Its config has no
``layer_types``.

What HF computes in an mLSTM layer (``xLSTMLayer.forward`` on its native torch kernels, the only ones
it has without the external ``xlstm`` package: ``mlstm_chunkwise_native_autograd`` over whole chunks of
``chunk_size``, ``mlstm_recurrent_sequence_native`` for the rest and in decode), for x (batch, n, width):

1. q, k (``qk_dim`` / ``num_heads`` each per head), v, the output gate's pre-activation o (``v_dim``), and
   per head the input and forget pre-activations i, f, soft-capped: c tanh(. / c), c = ``gate_soft_cap``
   (``weight_mode`` "single": one linear each; "fused": ``qkv_opreact`` and ``ifgate_preact`` split);
2. per head, stabilised by a running max m_t = max(log f_t + m_{t-1}, i_t) (m_0 = 0), with
   log f = logsigmoid(f): C_t = f_t C_{t-1} + exp(i_t) k_t v_t^T, n_t = f_t n_{t-1} + exp(i_t) k_t (each
   kept times exp(-m_t)), h_t = (s C_t^T q_t) / (max(|s n_t . q_t|, exp(-m_t) [stabilised: 1]) + eps),
   s = d_k^-1/2;
3. a LayerNorm per head over h (``multihead_norm``), times sigmoid(o), ``out_proj``.

Step 2 is ``attnx::GatedDeltaRule`` with ``delta=False`` and one decay per head: g = log f, k scaled
by exp(i), beta = 1, q and k per head, scale s, and the value augmented with a ones column ([v, 1], width
d_v + 1) so that n_t . q_t comes out of the same state as its last column. In unstabilised terms HF's
ratio is s q.C / (max(|s q.n|, 1) + eps exp(m_t)); attnx drops eps exp(m_t) (the op keeps no running
max): a relative difference of at most eps exp(m_t), which is below 1e-6 wherever m_t <= 0 (every input
gate pre-activation so far <= 0, as HF initialises them at -10) and eps exp(gate_soft_cap) = 3.3 at the
very worst (i at the cap 15 with q orthogonal to the state). ``gate_soft_cap`` bounds exp(i) and the
unstabilised state in float32 (:func:`check`).

HF's xLSTM takes no padding mask: its forward ignores ``attention_mask``, so a left-padded row's padding
enters the state. attnx's contract is that a left-padded row equals the row alone: each mLSTM layer is
handed the 2D mask (:class:`~attnx.adapters.hf_hybrid.model.HandedPadding`, as RWKV's layers), and a
left-padded token gets exp(i) = 0 and g = 0 (a no-op on the state); padding after real tokens runs
unmasked, as HF runs it (the export's parity compares right-padded batches with HF's forward at every
position). The tests compare a left-padded row with HF's forward on the row alone
(``Architecture.leaky_padding``). Everything else (embeddings, blocks, norms, feed-forward, the logits'
soft cap) is HF's own code, run over the whole input at once (:class:`UnchunkedCausalLM`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.xlstm import modeling_xlstm as xlstm

from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.mixer import PaddedMixer
from attnx.adapters.hf_hybrid.model import HandedPadding, adopt
from attnx.errors import AttnxError
from attnx.plugins.gated.op import rule_state, run_rule
from attnx.state import StateTensor

# the largest gate_soft_cap whose exp(i) (<= e^cap) and unstabilised state (<= e^cap / (1 - f), 1 - f >=
# sigmoid(-cap)) stay far inside float32 (e^88): e^60 times |k| |v|
MAX_GATE_SOFT_CAP = 30.0


class MatrixLSTM(HandedPadding, PaddedMixer):
    """An HF mLSTM layer (same parameters, same names, HF's call ``(x, state) -> (out, state)``, the padding
    mask handed over) on ``attnx::GatedDeltaRule`` (module docstring); its decode state is the rule's
    (d_k x (d_v + 1)) per head: C and n side by side."""

    def __init__(self, layer: nn.Module):
        super().__init__(layer)
        self.config = layer.config
        self.heads, self.qk_dim, self.v_dim = layer.config.num_heads, layer.qk_dim, layer.v_dim

    def decode_state(self) -> list[StateTensor]:
        """The rule's state per head: C (d_k x d_v) and n (d_k) as its last column."""
        return rule_state(self.heads, self.qk_dim // self.heads, self.v_dim // self.heads + 1)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v, o and the soft-capped i, f pre-activations (HF's two weight modes)."""
        cap = self.config.gate_soft_cap
        if self.config.weight_mode == "single":
            q, k, v, o = self.q(x), self.k(x), self.v(x), self.ogate_preact(x)
            return (
                q,
                k,
                v,
                o,
                xlstm.soft_cap(self.igate_preact(x), cap),
                xlstm.soft_cap(self.fgate_preact(x), cap),
            )
        splits = (self.qk_dim, 2 * self.qk_dim, 2 * self.qk_dim + self.v_dim)
        q, k, v, o = torch.tensor_split(self.qkv_opreact(x), splits, dim=-1)
        i, f = torch.tensor_split(xlstm.soft_cap(self.ifgate_preact(x), cap), (self.heads,), dim=-1)
        return q, k, v, o, i, f

    def normalise(self, out: torch.Tensor) -> torch.Tensor:
        """h = s q.C / max(|s q.n|, 1) from the rule's output [s q.C, s q.n] (b, h, n, d_v + 1)."""
        return out[..., :-1] / out[..., -1:].abs().clamp(min=1.0)

    def mix(
        self, x: torch.Tensor, mask: torch.Tensor | None, state: tuple[torch.Tensor | None] | None
    ) -> tuple[torch.Tensor, Any]:
        """``PaddedMixer.mix`` of the mLSTM (module docstring)."""
        batch, n, _ = x.shape
        q, k, v, o, i, f = self.project(x)
        q, k, v = (t.reshape(batch, n, self.heads, -1).transpose(1, 2).float() for t in (q, k, v))
        g, gain = F.logsigmoid(f.float()).transpose(1, 2), i.float().exp().transpose(1, 2)
        if mask is not None:  # left padding (before a row's first token) leaves the state as it is; HF
            keep = (
                mask[:, None, :].long().cumsum(-1) > 0
            )  # masks none, so later padding runs unmasked as in HF
            g, gain = g * keep, gain * keep
        k = (
            k * gain[..., None]
        )  # exp(i) k: the rule's beta stays 1 (its ONNX bodies take the additive rule so)
        beta = torch.ones_like(gain)
        v = torch.cat((v, torch.ones_like(v[..., :1])), dim=-1)
        past = None if state is None else state[0]
        step = state is not None
        out, recurrent = run_rule(
            q, k, v, g[..., None], beta, past, delta=False, scale=q.shape[-1] ** -0.5, step=step
        )
        h = self.multihead_norm(self.normalise(out).transpose(1, 2).to(x.dtype))
        y = self.out_proj(self.ogate_act_fn(o) * h.reshape(batch, n, -1))
        return y, (recurrent,) if step else None


class UnchunkedCausalLM(nn.Module):
    """HF's ``xLSTMForCausalLM`` (same submodules, same names) over the whole input at once: in eval mode
    HF's model and head run an input longer than ``max_inference_chunksize`` chunk by chunk (the same
    values; the model through its own cache, which attnx's layers refuse) behind a Python comparison of the
    length, which would pin the traced length. This runs ``xLSTMModel.forward``'s embeddings, HF's blocks
    and ``out_norm``, then ``lm_head`` and the logits' soft cap, on every token; the padding mask reaches
    the mLSTM layers as :class:`~attnx.adapters.hf_hybrid.model.HybridModel` hands it (``HandedPadding``)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        adopt(self, model)
        self.config = model.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Logits for ``input_ids`` (the mask handed to the layers; ``position_ids`` and the rest of HF's
        call ignored, as HF does)."""
        if use_cache:
            raise AttnxError("an attnx xLSTM keeps its state through attnx decoding, not HF's cache")
        backbone = self.backbone
        x = backbone.embeddings(input_ids)
        for block in backbone.blocks:
            x, _ = block(x)
        x = backbone.out_norm(x)
        logits = xlstm.soft_cap(
            self.lm_head(x.to(self.lm_head.weight.dtype)).float(), self.config.output_logit_soft_cap
        )
        return xlstm.xLSTMCausalLMOutput(logits=logits)


def check(config: Any) -> None:
    """Refuse the xLSTM options attnx does not reproduce.

    Raises:
        AttnxError: ``inference_state_dtype`` other than float32 (HF's recurrent kernel rounds its state
            to it), ``gate_soft_cap`` above :data:`MAX_GATE_SOFT_CAP` (exp(i) too large for the
            unstabilised float32 state; HF's config refuses null).
    """
    if config.inference_state_dtype != "float32":
        raise AttnxError(
            f"xlstm with inference_state_dtype='{config.inference_state_dtype}': attnx keeps the mLSTM state "
            "in float32; export a config with inference_state_dtype float32"
        )
    cap = config.gate_soft_cap
    if cap > MAX_GATE_SOFT_CAP:
        raise AttnxError(
            f"xlstm with gate_soft_cap={cap}: attnx computes the mLSTM unstabilised in float32 (exp of the "
            f"input gate), which needs the gates capped at {MAX_GATE_SOFT_CAP:g} at most (released: 15)"
        )


XLSTM = Architecture(
    model_type="xlstm",
    config_class="xLSTMConfig",
    classes=("xLSTMForCausalLM",),
    models=(xlstm.xLSTMForCausalLM,),
    layers={xlstm.xLSTMLayer: MatrixLSTM},
    untraceable=(xlstm.xLSTMLayer,),
    rotary=None,
    check=check,
    mask_by_layer_type=False,
    leaky_padding=True,
    whole=UnchunkedCausalLM,
)
