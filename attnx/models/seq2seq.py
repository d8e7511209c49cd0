"""The ``seq2seq`` model: the encoder-decoder of "Attention Is All You Need" (pre-LN)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional

from attnx.models.blocks import TokenEmbedding
from attnx.models.config import Seq2SeqConfig
from attnx.models.spec import TensorSpec
from attnx.models.stack import AttentionFactory, CrossAttentionHook, SelfAttentionHook, Stack


class Seq2Seq(nn.Module):
    """Encoder self-attention; decoder causal self-attention + cross-attention to the encoder output.

    One embedding matrix serves the source, the target and the output projection (paper
    §3.4: shared source/target vocabulary). Both padding masks are inputs: the source
    mask hides padded source tokens from the encoder and from cross-attention, the
    target mask hides padded target tokens from decoder self-attention.
    """

    def __init__(self, config: Seq2SeqConfig, attention: AttentionFactory) -> None:
        super().__init__()
        self.config = config
        self.embedding = TokenEmbedding(config.vocab_size, config.d_model)
        self.encoder = Stack(config, attention, config.n_layers)
        self.decoder = Stack(config, attention, config.decoder_layers, causal=True, cross=True)

    def input_specs(self) -> list[TensorSpec]:
        vocab = self.config.vocab_size
        return [
            TensorSpec("input_ids", "int64", ("batch", "src_seq"), high=vocab, doc="source token ids"),
            TensorSpec("attention_mask", "bool", ("batch", "src_seq"), doc="True for real source tokens"),
            TensorSpec(
                "decoder_input_ids", "int64", ("batch", "tgt_seq"), high=vocab, doc="target token ids"
            ),
            TensorSpec(
                "decoder_attention_mask", "bool", ("batch", "tgt_seq"), doc="True for real target tokens"
            ),
        ]

    def output_specs(self) -> list[TensorSpec]:
        return [
            TensorSpec(
                "logits",
                "float32",
                ("batch", "tgt_seq", self.config.vocab_size),
                doc="next-token logits; target position i sees target tokens 0..i",
            )
        ]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        decoder_input_ids: torch.Tensor,
        decoder_attention_mask: torch.Tensor,
    ) -> tuple[torch.Tensor]:
        memory = self.encode(input_ids, attention_mask)
        return (self.decode(decoder_input_ids, memory, attention_mask, decoder_attention_mask),)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The encoder output (batch, src_seq, d_model) that cross-attention reads."""
        return self.encoder(self.embedding(input_ids), key_padding_mask=attention_mask)

    def decode(
        self,
        decoder_input_ids: torch.Tensor,
        memory: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        decoder_attention_mask: torch.Tensor | None = None,
        offset: torch.Tensor | None = None,
        self_attention: SelfAttentionHook | None = None,
        cross_attention: CrossAttentionHook | None = None,
    ) -> torch.Tensor:
        """Decoder logits; ``offset``, ``self_attention`` and ``cross_attention`` serve stateful decoding
        (:mod:`attnx.decode`). ``cross_attention(i, module, x)`` replaces layer i's cross-attention call
        (then ``memory`` and ``attention_mask`` may be None: the hook has what it reads)."""
        hidden = self.decoder(
            self.embedding(decoder_input_ids, offset),
            key_padding_mask=decoder_attention_mask,
            memory=memory,
            memory_mask=attention_mask,
            self_attention=self_attention,
            cross_attention=cross_attention,
        )
        return functional.linear(hidden, self.embedding.weight)
