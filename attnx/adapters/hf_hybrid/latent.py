"""Kimi Linear's multi-head latent attention (MLA) layers on attnx's softmax attention.

What HF computes (``KimiLinearAttention.forward``, transformers 5.24), for hidden states x (batch, n,
width), H heads:

1. queries: ``q_proj``(x), or with ``q_lora_rank`` set the low-rank ``q_b_proj``(RMSNorm(``q_a_proj``(x)))
   (``q_a_layernorm``), viewed as H heads of ``qk_nope_head_dim + qk_rope_head_dim``;
2. ``kv_a_proj_with_mqa``(x) splits into the latent (``kv_lora_rank``), which passes an RMSNorm
   (``kv_a_layernorm``), and one shared key part of ``qk_rope_head_dim``; ``kv_b_proj``(latent) gives per
   head the non-shared key part and the value (``v_head_dim``); each head's key is [its part, the shared
   part]. Nothing is rotated: Kimi Linear's MLA has no positional encoding (the shared part keeps its
   DeepSeek name only);
3. causal softmax attention with scale (``qk_nope_head_dim + qk_rope_head_dim``)^-1/2 over the keys the 2D
   padding mask keeps (a query that sees no key gets zeros, as HF's SDPA path returns), then ``o_proj``.

Bailing's (``BailingHybridAttention``, Ling) is the same with positions and a gate per head: the last
``qk_rope_head_dim`` of each query head and the shared key part are rotated by the model's cos/sin
(``rotate``: its ``apply_rotary_pos_emb_interleave``, pairs (x0, x1), (x2, x3), ...), the scale takes
the rotary's mscale where HF's ``layer.scaling`` does, and each head's output is multiplied by
sigmoid(``g_proj``(x)) of that head before ``o_proj`` (``head_gate``).

HF caches the normalised latent and the shared key part and re-expands them every step; attnx's decode
keeps the per-head keys and values instead (the KV cache onnxruntime-genai holds: ``past_key_values.{i}``),
which is the same function: the expansion is linear per token. The values (``v_head_dim``, narrower than
the keys in the released model) are cached padded with zeros to the keys' size, since genai sizes both
caches by one head size (:class:`~attnx.adapters.hf_hybrid.attention.FullAttention`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attnx.adapters.hf_hybrid.attention import FullAttention, Rotary, no_positions
from attnx.errors import AttnxError


class LatentAttention(FullAttention):
    """An HF MLA layer (Kimi's ``KimiLinearAttention``, Bailing's ``BailingHybridAttention``; same
    parameters, same names) on ``attnx::SoftmaxAttention``, stepping with a KV cache of its per-head keys
    and values. ``rotate``: the rotation of the positional parts (None: no positions, Kimi's);
    ``head_gate``: the output of each head is gated by sigmoid(``g_proj``(x)) (Bailing's)."""

    def __init__(self, layer: nn.Module, rotate: Rotary | None = None, head_gate: bool = False):
        super().__init__()
        for name, child in layer.named_children():
            self.add_module(name, child)
        self.low_rank_q = layer.q_lora_rank is not None
        self.kv_lora_rank, self.nope_dim = layer.kv_lora_rank, layer.qk_nope_head_dim
        self.shared_dim = layer.qk_rope_head_dim
        self.kv_heads, self.head_dim, self.value_dim = layer.num_heads, layer.qk_head_dim, layer.v_head_dim
        self.scaling = float(layer.scaling)
        self.layer_idx = layer.layer_idx
        self.rotate, self.head_gate = rotate, head_gate
        if rotate is None:
            self.rotary = no_positions  # steps on its own; a layer that rotates takes its model's

    def project(
        self, x: torch.Tensor, position_embeddings: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        batch, n = x.shape[:2]
        query = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.low_rank_q else self.q_proj(x)
        query = query.view(batch, n, -1, self.head_dim).transpose(1, 2)
        latent, shared = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.shared_dim], dim=-1)
        shared = shared[:, None]  # (batch, 1, n, shared_dim): one part for every head
        if self.rotate is not None:
            if position_embeddings is None:
                raise AttnxError(f"{type(self).__name__} layer {self.layer_idx} needs the model's cos/sin")
            own_q, rotated = torch.split(query, [self.nope_dim, self.shared_dim], dim=-1)
            rotated, shared = self.rotate(rotated, shared, *position_embeddings)
            query = torch.cat([own_q, rotated], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(batch, n, -1, self.nope_dim + self.value_dim)
        own, value = torch.split(kv.transpose(1, 2), [self.nope_dim, self.value_dim], dim=-1)
        key = torch.cat([own, shared.expand(-1, own.shape[1], -1, -1)], dim=-1)
        gate = None
        if self.head_gate:  # one gate per head, over that head's value channels
            per_head = self.g_proj(x)
            gate = per_head[..., None].expand(*per_head.shape, self.value_dim).reshape(batch, n, -1)
        return query, key, value, gate


def check_heads(config: Any) -> None:
    """Refuse an MLA model whose key/value heads are not its attention heads.

    Raises:
        AttnxError: ``num_key_value_heads`` other than ``num_attention_heads`` (HF's MLA expands every
            head from the latent and then repeats them again, which its own attention cannot run).
    """
    if config.num_key_value_heads != config.num_attention_heads:
        raise AttnxError(
            f"{config.model_type} with num_key_value_heads={config.num_key_value_heads} and "
            f"num_attention_heads={config.num_attention_heads}: its MLA layers make a key and value per "
            "attention head, so Hugging Face's own forward runs only with them equal; set "
            f"num_key_value_heads to {config.num_attention_heads}"
        )
