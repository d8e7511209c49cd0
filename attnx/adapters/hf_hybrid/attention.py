"""Full attention of Hugging Face hybrids (Qwen3-Next, Qwen3.5 gated; MiniMax plain) on attnx's softmax.

What HF computes (``Qwen3NextAttention.forward``, ``Qwen3_5Attention.forward``): ``q_proj`` gives the
queries and a per-channel output gate (interleaved per head: [q_h, gate_h]); q and k pass a per-head
zero-centred RMSNorm (``q_norm``/``k_norm``), then the rotary embedding on the first
``partial_rotary_factor`` of each head (``apply_rotary_pos_emb`` with the model's cos/sin); the
``num_key_value_heads`` key/value heads are repeated to the query heads (``repeat_kv``: query head i reads
key/value head i // groups, which ``attnx::SoftmaxAttention`` takes as it is, without the copy); causal
softmax attention with scale head_dim^-1/2 over the keys the 2D padding mask keeps; the output is
multiplied by sigmoid(gate) and projected by ``o_proj``. A query that sees no key at all (a
left-padded position) gets a zero attention output, which is what HF's default SDPA path returns.
The norms, rotary and projections are HF's own modules and functions; the attention is
``attnx::SoftmaxAttention`` (causal, key padding mask). MiniMax's ``MiniMaxAttention`` (and Bamba's,
Granite's) is the same without the output gate and the q/k norms (``gated=False``); LFM2's
``Lfm2Attention`` without the gate, with RMSNorms ``q_layernorm``/``k_layernorm`` per head before the
rotary and ``out_proj`` for ``o_proj`` (``norms``, ``output``); OLMo Hybrid's ``OlmoHybridAttention``
without the gate, its RMSNorms over the whole q and k projections (``olmo.OlmoAttention``).

Decoding keeps the KV cache of the *key/value* heads (before ``repeat_kv``), as onnxruntime-genai's
``past_key_values.{i}.key/value`` are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from attnx.attention import Stepping
from attnx.errors import AttnxError
from attnx.plugins.softmax.kernel import softmax_attention
from attnx.state import StateTensor, kv_cache

# rotate(q, k, cos, sin) -> (q, k): the architecture's apply_rotary_pos_emb
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class FullAttention(Stepping, nn.Module):
    """What every full attention layer of the hybrids shares: HF's call, the KV-cache step and the softmax
    around the architecture's own projections (:meth:`project`).

    A :class:`attnx.state.DecodableLayer`: ``step(x, state, position)`` continues a KV cache of the
    key/value heads; while ``stepping`` holds a Step (:class:`attnx.attention.Stepping`), HF's call of the
    layer is that step. Subclasses set ``kv_heads``, ``head_dim`` (of the keys) and ``scaling``;
    ``output`` names the output projection (HF's ``o_proj``; LFM2's ``out_proj``).

    Stepping takes cos/sin from the model's own rotary module (``rotary``, set with the model's by
    :meth:`attnx.adapters.hf_hybrid.architecture.Architecture.convert`; :func:`no_positions` for a model or
    layer without positions).

    Values narrower than the keys (Kimi's MLA) are cached padded with zeros to the keys' head size:
    onnxruntime-genai sizes the key and the value cache by one ``head_size``. That is exact, since
    softmax(s) [v, 0] = [softmax(s) v, 0], and the padding is sliced off the output.
    """

    kv_heads: int
    head_dim: int
    scaling: float
    output: str = "o_proj"
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor] | None] | None = None

    def decode_state(self) -> list[StateTensor]:
        """A KV cache of the key/value heads (keys as the attention sees them: after norms and rotation)."""
        return kv_cache(self.kv_heads, self.head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """HF's call (with its cos/sin where the model rotates): the whole sequence, or (while ``stepping``
        holds a Step) the step of new tokens after its KV cache."""
        if cache is not None:
            raise ValueError(
                "an attnx full attention layer keeps its KV cache through attnx decoding, not HF's cache"
            )
        if self.stepping is not None:
            return self.stepped(hidden_states), None
        padding = None if attention_mask is None else attention_mask.to(torch.bool)
        return self.attend(hidden_states, position_embeddings, padding, None)[0], None

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The output for new tokens ``x`` at ``position`` after the KV cache ``state`` (None: empty), and
        the cache after them."""
        return self.attend(x, self.embeddings_at(x, position), None, state or ())

    def embeddings_at(
        self, x: torch.Tensor, position: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """cos/sin of the new tokens' positions, from the model's own rotary module (None: the model has
        none).

        Raises:
            AttnxError: a layer that rotates, converted on its own, without its model's rotary module.
        """
        if self.rotary is None:
            raise AttnxError(
                f"a {type(self).__name__} layer converted without its model cannot step; convert the model"
            )
        return self.rotary(x, (torch.arange(x.shape[1], device=x.device) + position)[None])

    def project(
        self, x: torch.Tensor, position_embeddings: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Queries (batch, heads, n, head_dim), keys, values of the key/value heads, and the output gate
        (batch, n, query heads * value head size; None: ungated) of (batch, n, width) ``x``."""
        raise NotImplementedError

    def attend(
        self,
        x: torch.Tensor,
        position_embeddings: Any,
        padding: torch.Tensor | None,
        past: tuple[torch.Tensor, ...] | None,
    ) -> tuple[torch.Tensor, Any]:
        """The layer on (batch, n, width) ``x``; with ``past`` (a KV cache, () when empty) the new keys and
        values are appended and the cache after ``x`` is returned too."""
        query, key, value, gate = self.project(x, position_embeddings)
        width, present = value.shape[-1], None
        if past is not None:
            if width != self.head_dim:
                value = torch.nn.functional.pad(value, (0, self.head_dim - width))
            if past:
                key, value = torch.cat([past[0], key], dim=-2), torch.cat([past[1], value], dim=-2)
            present = (key, value)
        out = softmax_attention(query, key, value, padding, True, self.scaling)
        if padding is not None:  # a query that sees no key (left padding) gets zeros, as HF's SDPA gives it
            out = out * (padding.cumsum(-1) > 0)[:, None, :, None].to(out.dtype)
        if out.shape[-1] != width:
            out = out[..., :width]
        out = out.transpose(1, 2).reshape(*x.shape[:-1], -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return getattr(self, self.output)(out), present


def no_positions(x: torch.Tensor, position_ids: torch.Tensor) -> None:
    """The cos/sin of a model without positions (no rotary module): None, which :meth:`GatedAttention.project`
    takes as "do not rotate"."""
    return None


class GatedAttention(FullAttention):
    """An HF full attention layer of Qwen3-Next, Qwen3.5, MiniMax, the Mamba hybrids or LFM2 (same
    parameters, same names) computed by ``attnx::SoftmaxAttention``; ``gated``: Qwen's output gate in
    ``q_proj`` (False: the plain layers, whose keys take Falcon-H1's ``key_multiplier`` where the layer has
    one); ``norms``: the names of the per-head norms of q and k, applied before the rotary (Qwen's
    ``q_norm``/``k_norm``, LFM2's ``q_layernorm``/``k_layernorm``; None: none); ``output``: the output
    projection's name.
    """

    def __init__(
        self,
        layer: nn.Module,
        rotate: Rotary,
        gated: bool = True,
        norms: tuple[str, str] | None = None,
        output: str = "o_proj",
    ):
        super().__init__()
        self.gated, self.norms, self.output = gated, norms, output
        for name, child in layer.named_children():
            self.add_module(name, child)
        self.rotate = rotate
        self.head_dim = layer.head_dim
        self.scaling = float(layer.scaling)
        self.kv_heads = layer.config.num_key_value_heads
        self.layer_idx = layer.layer_idx
        self.key_multiplier = getattr(layer, "key_multiplier", 1.0)  # Falcon-H1's keys before the rotary

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The flat query, key and value projections of ``x`` (Qwen's output gate still in the query)."""
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def project(
        self, x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        shape = x.shape[:-1]
        heads = (*shape, -1, self.head_dim)
        (query, key, value), gate = self.projections(x), None
        if self.gated:
            query, gate = torch.chunk(query.view(*shape, -1, self.head_dim * 2), 2, dim=-1)
            gate = gate.reshape(*shape, -1)
        query, key = query.view(heads), key.view(heads)
        if self.norms is not None:
            query, key = getattr(self, self.norms[0])(query), getattr(self, self.norms[1])(key)
        query, key = query.transpose(1, 2), key.transpose(1, 2) * self.key_multiplier
        value = value.view(heads).transpose(1, 2)
        if position_embeddings is not None:
            query, key = self.rotate(query, key, *position_embeddings)
        return query, key, value, gate
