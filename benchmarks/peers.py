"""The peers: what a user would pick instead of attnx, as the libraries' own PyTorch attention layers.

Each :class:`Peer` builds one library's self-attention layer at the benchmark's size (d_model, heads)
as a module ``y = layer(x)``, x (batch, seq, d_model), in eval mode, with its paper's settings matched
to attnx's defaults where the library has them (Reformer: 2 hash rounds, chunks of 64 tokens, 8
buckets). A library that is not installed is a skip reason, never an import error
(``pip install 'attnx[bench]'`` installs them; fast-transformers builds C++ for about 30 minutes and is
only used when already importable).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import torch
from torch import nn

REFORMER = {"n_hashes": 2, "chunk": 64, "n_buckets": 8}  # attnx's ReformerConfig defaults


@dataclasses.dataclass(frozen=True)
class Peer:
    """One peer layer: its row name, the attnx variant it stands beside (bidirectional or causal), the
    package it needs and how to build it from (d_model, heads)."""

    name: str
    variant: str
    causal: bool
    package: str  # the import name
    build: Callable[[int, int], nn.Module]

    def missing(self) -> str:
        """Why it cannot run here ("" when it can)."""
        if importlib.util.find_spec(self.package) is None:
            return f"not installed ({self.package})"
        return ""


class Wrapped(nn.Module):
    """``call(layer, x)``: a library layer whose forward takes more than ``x`` or returns more than ``y``."""

    def __init__(self, layer: nn.Module, call: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.layer, self.call = layer, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.call(self.layer, x)


def linear_attention_transformer(causal: bool) -> Callable[[int, int], nn.Module]:
    def build(d_model: int, heads: int) -> nn.Module:
        from linear_attention_transformer.linear_attention_transformer import SelfAttention

        return SelfAttention(d_model, heads, causal=causal)

    return build


def reformer_pytorch(causal: bool) -> Callable[[int, int], nn.Module]:
    def build(d_model: int, heads: int) -> nn.Module:
        from reformer_pytorch import LSHSelfAttention

        return LSHSelfAttention(
            d_model, heads, bucket_size=REFORMER["chunk"], n_hashes=REFORMER["n_hashes"], causal=causal
        )

    return build


def hf_reformer(causal: bool) -> Callable[[int, int], nn.Module]:
    """transformers' ``LSHSelfAttention`` (hash_seed fixed, so its hashing is deterministic; it has no
    output projection: that sits in ``ReformerSelfOutput``)."""

    def build(d_model: int, heads: int) -> nn.Module:
        from transformers import ReformerConfig
        from transformers.models.reformer.modeling_reformer import LSHSelfAttention

        config = ReformerConfig(
            hidden_size=d_model,
            num_attention_heads=heads,
            attention_head_size=d_model // heads,
            lsh_attn_chunk_length=REFORMER["chunk"],
            num_hashes=REFORMER["n_hashes"],
            num_buckets=REFORMER["n_buckets"],
            is_decoder=causal,
            hash_seed=0,
            use_cache=False,
        )
        return Wrapped(LSHSelfAttention(config), lambda layer, x: layer(x).hidden_states)

    return build


def fast_transformers(causal: bool) -> Callable[[int, int], nn.Module]:
    """fast-transformers' ``AttentionLayer`` around ``LinearAttention`` / ``CausalLinearAttention``."""

    def build(d_model: int, heads: int) -> nn.Module:
        from fast_transformers.attention import AttentionLayer, CausalLinearAttention, LinearAttention
        from fast_transformers.masking import FullMask, LengthMask, TriangularCausalMask

        inner = (CausalLinearAttention if causal else LinearAttention)(d_model // heads)

        def call(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[1]
            mask = TriangularCausalMask(n) if causal else FullMask(N=n)
            lengths = LengthMask(torch.full((x.shape[0],), n, dtype=torch.int64), max_len=n)
            return layer(x, x, x, mask, lengths, lengths)

        return Wrapped(AttentionLayer(inner, d_model, heads), call)

    return build


PEERS: tuple[Peer, ...] = tuple(
    Peer(name, variant, causal, package, make(causal))
    for causal in (False, True)
    for name, variant, package, make in (
        ("linear-attention-transformer", "linear", "linear_attention_transformer",
         linear_attention_transformer),
        ("reformer-pytorch", "reformer", "reformer_pytorch", reformer_pytorch),
        ("transformers Reformer", "reformer", "transformers", hf_reformer),
        ("fast-transformers", "linear", "fast_transformers", fast_transformers),
    )
)


def peers_for(variant: str, causal: bool) -> list[Peer]:
    return [p for p in PEERS if p.variant == variant and p.causal == causal]
