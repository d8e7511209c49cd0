"""A stack of Transformer layers, the part every architecture shares.

Pre-LN layers (x + f(LN(x)), Xiong et al. 2020, rather than the paper's post-LN) with a
final LayerNorm; plain or reversible residuals (:mod:`attnx.models.reversible`); the
attention modules live on the layers that own them, which is every layer, or only
layer 0 when ``share_layers`` is set (so the state dict and the ONNX graph hold one copy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from attnx.models.blocks import FeedForward
from attnx.models.config import TransformerConfig
from attnx.models.reversible import Branch, ResidualBlock
from attnx.variant import AttentionSpec

AttentionFactory = Callable[[AttentionSpec, str], nn.Module]
# (layer index, its self-attention module, the normalised input) -> attention output; replaces the
# module's own call (attnx.decode runs the variants' stateful step this way)
SelfAttentionHook = Callable[[int, nn.Module, torch.Tensor], torch.Tensor]
# (layer index, its cross-attention module, the normalised input) -> cross-attention output; replaces the
# module's call on the encoder output (attnx.decode reads keys/values cached once per source this way)
CrossAttentionHook = Callable[[int, nn.Module, torch.Tensor], torch.Tensor]


class Block(nn.Module):
    """The parameters of one layer. ``attention``/``cross_attention`` are None on layers that
    use layer 0's (``share_layers``)."""

    def __init__(
        self,
        config: TransformerConfig,
        attention: nn.Module | None,
        cross_attention: nn.Module | None = None,
        cross: bool = False,
    ) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.d_model)
        self.attention = attention
        if cross:
            self.cross_norm = nn.LayerNorm(config.d_model)
            self.cross_attention = cross_attention
        self.ffn_norm = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.ff_chunks)


class Stack(nn.Module):
    """``n_layers`` layers of self-attention (causal or not), optional cross-attention, FFN.

    ``attention(spec, role)`` builds an attention module; role is "self" or "cross".
    """

    def __init__(
        self,
        config: TransformerConfig,
        attention: AttentionFactory,
        n_layers: int,
        causal: bool = False,
        cross: bool = False,
    ) -> None:
        super().__init__()
        self.reversible = config.reversible
        self.share_layers = config.share_layers
        self.cross = cross
        self_spec = AttentionSpec(config.d_model, config.n_heads, causal=causal)
        cross_spec = AttentionSpec(config.d_model, config.n_heads, cross=True)
        owners = 1 if config.share_layers else n_layers

        def at(spec: AttentionSpec, i: int) -> AttentionSpec:
            return dataclasses.replace(spec, layer=i, n_layers=n_layers)

        self.blocks = nn.ModuleList(
            Block(
                config,
                attention(at(self_spec, i), "self") if i < owners else None,
                attention(at(cross_spec, i), "cross") if cross and i < owners else None,
                cross=cross,
            )
            for i in range(n_layers)
        )
        self.norm = nn.LayerNorm(config.d_model)

    def block(
        self,
        i: int,
        key_padding_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        hook: SelfAttentionHook | None = None,
        cross_hook: CrossAttentionHook | None = None,
    ) -> ResidualBlock:
        """Layer ``i`` as residual branches; ``memory``/``memory_mask`` feed cross-attention (unless
        ``cross_hook`` replaces it)."""
        layer = self.blocks[i]
        owner = self.blocks[0] if self.share_layers else layer

        def self_attention(h: torch.Tensor) -> torch.Tensor:
            if hook is not None:
                return hook(i, owner.attention, layer.attn_norm(h))
            return owner.attention(layer.attn_norm(h), key_padding_mask=key_padding_mask)

        def cross_attention(h: torch.Tensor) -> torch.Tensor:
            if cross_hook is not None:
                return cross_hook(i, owner.cross_attention, layer.cross_norm(h))
            return owner.cross_attention(layer.cross_norm(h), context=memory, key_padding_mask=memory_mask)

        def feed_forward(h: torch.Tensor) -> torch.Tensor:
            return layer.ffn(layer.ffn_norm(h))

        branches: list[Branch] = [self_attention, cross_attention, feed_forward]
        return ResidualBlock(branches if self.cross else [self_attention, feed_forward])

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        self_attention: SelfAttentionHook | None = None,
        cross_attention: CrossAttentionHook | None = None,
    ) -> torch.Tensor:
        blocks = [
            self.block(i, key_padding_mask, memory, memory_mask, self_attention, cross_attention)
            for i in range(len(self.blocks))
        ]
        if self.reversible:
            x1, x2 = x, x
            for block in blocks:
                x1, x2 = block.reversible(x1, x2)
            x = (x1 + x2) / 2
        else:
            for block in blocks:
                x = block(x)
        return self.norm(x)
