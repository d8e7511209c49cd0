"""The heavy half of the ``hf_reformer`` adapter (imports transformers and torch).

What Hugging Face computes (``transformers.models.reformer.modeling_reformer``), and how attnx
reproduces it:

* ``LSHSelfAttention``: shared-QK LSH attention in the trax layout, i.e. the reformer variant's
  ``ReformerTraxAttention`` op (rounds sorted jointly, cyclic windows of ``lsh_num_chunks_before``
  / ``lsh_num_chunks_after`` chunks, keys of any bucket, padded and (``is_decoder``) later keys
  -1e9, a query's own key -1e5, keys length-normalised as ``_len_and_dim_norm``), with the layer's
  ``query_key`` and ``value`` projections. Its rotations, which HF draws at every forward with
  ``torch.manual_seed(hash_seed)``, are drawn once the same way and kept as a buffer (an ONNX
  initializer); a layer without ``hash_seed`` is refused (``attnx export --from hf:DIR`` sets one);
* ``LocalSelfAttention``: the ``ReformerLocalAttention`` op (cyclic windows of
  ``local_num_chunks_before`` / ``local_num_chunks_after`` chunks, keys / sqrt(d), masked -1e9);
* ``ReformerModel`` pads its input with ``pad_token_id`` (mask 0) up to a multiple of the least
  common multiple of its chunk lengths when it is longer than the smallest, with a Python branch
  on the sequence length that cannot be traced for every length: the adapted model
  (:class:`PaddedReformerModel`) pads exactly as far with symbolic sizes and gathers, and its
  private copy of the config turns HF's own padding off; how far it pads decides which tokens
  share the cyclic windows, so this is needed for parity at lengths that are not multiples;
* ``AxialPositionEmbeddings`` in eval mode loops over the batch and cuts its table at
  ``position_ids.max().item()``; the adapted one looks the positions up in the whole table (the
  same rows);
* the chunked feed-forward and LM head (``chunk_size_feed_forward``, ``chunk_size_lm_head``) split
  the sequence into a Python number of chunks; they are position-wise (chunking only saves
  memory), so the adapted ones run unchunked (chunk size 0, HF's own switch);
* everything else (embeddings, feed-forward, reversible layers, heads) runs HF's own code;
* the lengths HF's own forward takes (its position table after its padding, chunk multiples) are
  declared (:func:`lengths`), so an export verifies by default at lengths the model takes.

Decoding with HF's bucket cache (``past_buckets_states``) and ``output_attentions`` are refused.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from transformers.models.reformer import modeling_reformer as hf

from attnx.adapter import AdapterImpl, Lengths
from attnx.attention import merge_heads, split_heads
from attnx.errors import AttnxError
from attnx.plugins.reformer.trax_ops import reformer_local_attention, reformer_trax_attention


def _no_cache(past_buckets_states: Any, layer_idx: int | None, output_attentions: bool) -> None:
    """Refuse HF's incremental decoding cache and attention probabilities (an empty cache, which
    HF passes whenever ``use_cache`` is set, is fine)."""
    if past_buckets_states is not None and len(past_buckets_states) > (layer_idx or 0):
        raise AttnxError(
            "an exported Hugging Face Reformer takes the whole sequence: pass use_cache=False and no "
            "past_buckets_states (HF's bucket cache is not exported)"
        )
    if output_attentions:
        raise AttnxError(
            "an exported Hugging Face Reformer returns no attention probabilities; drop output_attentions"
        )


def _mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    return None if attention_mask is None else attention_mask.to(torch.bool)


class TraxLSHAttention(nn.Module):
    """An HF ``LSHSelfAttention`` computed by attnx's ``ReformerTraxAttention`` op.

    Takes and returns what the HF layer does (``LSHSelfAttentionOutput``, no buckets).
    """

    def __init__(self, layer: hf.LSHSelfAttention) -> None:
        super().__init__()
        _check_lsh(layer)
        self.query_key, self.value = layer.query_key, layer.value
        self.heads, self.layer_idx = layer.num_attention_heads, layer.layer_idx
        self.num_hashes, self.causal = layer.num_hashes, bool(layer.is_decoder)
        self.chunk_length = layer.chunk_length
        self.window = (layer.num_chunks_before, layer.num_chunks_after)
        self.register_buffer("rotations", hf_rotations(layer), persistent=True)
        _float32_only(layer.query_key.weight)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        num_hashes: int | None = None,
        buckets: Any = None,
        past_buckets_states: Any = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> Any:
        _no_cache(past_buckets_states, self.layer_idx, output_attentions)
        if num_hashes not in (None, self.num_hashes):
            raise AttnxError(
                f"this Reformer was exported with num_hashes={self.num_hashes} (its rotations); "
                f"num_hashes={num_hashes} cannot be chosen per call"
            )
        qk = split_heads(self.query_key(hidden_states), self.heads)
        v = split_heads(self.value(hidden_states), self.heads)
        out = reformer_trax_attention(
            qk, v, self.rotations, _mask(attention_mask), self.causal, self.chunk_length, *self.window
        )
        return hf.LSHSelfAttentionOutput(hidden_states=merge_heads(out), attention_probs=(), buckets=None)


class TraxLocalAttention(nn.Module):
    """An HF ``LocalSelfAttention`` computed by attnx's ``ReformerLocalAttention`` op."""

    def __init__(self, layer: hf.LocalSelfAttention) -> None:
        super().__init__()
        if layer.chunk_length is None:
            raise AttnxError(
                "a Hugging Face LocalSelfAttention without local_attn_chunk_length cannot be exported"
            )
        self.query, self.key, self.value = layer.query, layer.key, layer.value
        self.heads, self.layer_idx, self.causal = (
            layer.num_attention_heads,
            layer.layer_idx,
            bool(layer.is_decoder),
        )
        self.chunk_length = layer.chunk_length
        self.window = (layer.num_chunks_before, layer.num_chunks_after)
        _float32_only(layer.query.weight)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_buckets_states: Any = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> Any:
        _no_cache(past_buckets_states, self.layer_idx, output_attentions)
        q, k, v = (split_heads(p(hidden_states), self.heads) for p in (self.query, self.key, self.value))
        out = reformer_local_attention(
            q, k, v, _mask(attention_mask), self.causal, self.chunk_length, *self.window
        )
        return hf.LocalSelfAttentionOutput(hidden_states=merge_heads(out), attention_probs=())


class AxialPositions(nn.Module):
    """HF's eval-mode ``AxialPositionEmbeddings`` as one lookup in the whole table (same weights)."""

    def __init__(self, layer: hf.AxialPositionEmbeddings) -> None:
        super().__init__()
        self.weights = layer.weights
        self.shape = tuple(layer.axial_pos_shape)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        table = torch.cat([w.expand(*self.shape, w.shape[-1]) for w in self.weights], dim=-1)
        return table.reshape(math.prod(self.shape), -1)[position_ids]


def hf_rotations(layer: hf.LSHSelfAttention) -> torch.Tensor:
    """The rotations HF's ``_hash_vectors`` draws: ``torch.manual_seed(hash_seed)`` then
    ``torch.randn((heads, head_size, num_hashes, num_buckets // 2))`` in the layer's dtype."""
    shape = (layer.num_attention_heads, layer.attention_head_size, layer.num_hashes, layer.num_buckets // 2)
    generator = torch.Generator().manual_seed(layer.hash_seed)
    weight = layer.query_key.weight
    return torch.randn(shape, generator=generator, dtype=weight.dtype).to(weight.device)


def _check_lsh(layer: hf.LSHSelfAttention) -> None:
    """Refuse what attnx cannot reproduce, naming the config field to set."""
    if layer.hash_seed is None:
        raise AttnxError(
            "Hugging Face LSHSelfAttention with hash_seed=None draws new LSH rotations at every forward; "
            "set config.hash_seed before loading the model (`attnx export --from hf:DIR` does and says so)"
        )
    if not isinstance(layer.num_buckets, int):
        raise AttnxError(
            f"Hugging Face Reformer num_buckets={layer.num_buckets}: attnx exports an int number of buckets; "
            "a factorised (list) or unset num_buckets is not supported"
        )
    if layer.chunk_length is None:
        raise AttnxError("a Hugging Face LSHSelfAttention without lsh_attn_chunk_length cannot be exported")


def _float32_only(weight: torch.Tensor) -> None:
    """Refuse a float16 layer (HF masks with -1e4 / -1e3 there, attnx's ops with float32's -1e9 /
    -1e5)."""
    if weight.dtype != torch.float32:
        raise AttnxError(
            f"a {str(weight.dtype).removeprefix('torch.')} Hugging Face Reformer: attnx reproduces its "
            "float32 mask values only; export the float32 model"
        )


def _layer(module: nn.Module) -> nn.Module | None:
    if isinstance(module, hf.LSHSelfAttention):
        return TraxLSHAttention(module)
    if isinstance(module, hf.LocalSelfAttention):
        return TraxLocalAttention(module)
    if isinstance(module, hf.AxialPositionEmbeddings):
        return AxialPositions(module)
    return _unchunked(module)


def _unchunked(module: nn.Module) -> nn.Module | None:
    """HF's chunked feed-forward or LM head, its chunking switched off (the same module)."""
    if isinstance(module, hf.ChunkReformerFeedForward):
        module.chunk_size_feed_forward = 0
        return module
    if isinstance(module, hf.ReformerOnlyLMHead):
        module.chunk_size_lm_head = 0
        return module
    return None


class PaddedReformerModel(nn.Module):
    """HF's ``ReformerModel`` with its input padding as traceable tensor ops (see the module docstring)."""

    def __init__(self, model: hf.ReformerModel) -> None:
        super().__init__()
        self.multiple = int(hf._get_least_common_mult_chunk_len(model.config))
        self.shortest = int(hf._get_min_chunk_len(model.config))
        self.pad_token_id = model.config.pad_token_id or 0
        self.model = convert_model(model)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        if input_ids is None or position_ids is not None or inputs_embeds is not None or output_hidden_states:
            raise AttnxError(
                "an exported Hugging Face Reformer takes input_ids and attention_mask (no position_ids, "
                "inputs_embeds or output_hidden_states)"
            )
        batch, length = input_ids.shape
        # (-n) mod lcm when n > the shortest chunk length, else 0: HF's rule, without a Python branch.
        longer = torch.sym_min(torch.sym_max(length - self.shortest, 0), 1)
        pad = ((-length) % self.multiple) * longer
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids, dtype=torch.bool)
        # Gathers, not cat/slice with a symbolic size: positions >= n take one pad column.
        index = torch.arange(length + pad, device=input_ids.device).clamp(max=length)
        input_ids = torch.cat([input_ids, input_ids.new_full((batch, 1), self.pad_token_id)], dim=1)[:, index]
        attention_mask = torch.cat([attention_mask, attention_mask.new_zeros((batch, 1))], dim=1)[:, index]
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **kwargs)
        hidden = out.last_hidden_state[:, index[:length]]
        if not (self.model.config.return_dict if return_dict is None else return_dict):
            return (hidden,)
        return hf.ReformerModelOutput(last_hidden_state=hidden)


def convert_model(model: hf.ReformerModel) -> hf.ReformerModel:
    """``model`` (the walk's private copy) with its attention layers and axial position embeddings
    converted and its own padding turned off."""
    config = model.config
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            replacement = _layer(child)
            if replacement is not None:
                setattr(parent, name, replacement)
    # ReformerModel.forward pads when seq % lcm(chunk lengths) != 0: with both chunk lengths 1 in its
    # (private) config that test is False for every length, so it never branches on the length.
    model.config = copy.copy(config)
    model.config.lsh_attn_chunk_length = model.config.local_attn_chunk_length = 1
    # ReformerEmbeddings raises for n > max_position_embeddings: a bound torch.export cannot keep on a
    # dynamic length. Longer inputs still fail, in ONNX Runtime: their positions index past the table.
    model.embeddings.max_position_embeddings = math.inf
    return model


def convert(module: nn.Module) -> nn.Module | None:
    """A ``ReformerModel`` (inside any head) or a bare HF attention layer with attnx ops; None for
    anything else."""
    if isinstance(module, hf.ReformerModel):
        return PaddedReformerModel(module)
    if isinstance(module, hf.ReformerOnlyLMHead):
        return _unchunked(module)
    return _layer(module) if needs_adapter(module) else None


def lengths(module: nn.Module) -> Lengths | None:
    """The lengths Hugging Face's own forward of ``module`` takes (the parity reference): a
    ``ReformerModel`` pads inputs longer than its shortest chunk to a multiple of the lcm of its chunk
    lengths, and the padded length must fit its position table (``max_position_embeddings``; axial
    positions: the product of ``axial_pos_shape``); its chunked feed-forward (and an LM head's chunks)
    take only multiples of their chunk."""
    if isinstance(module, hf.ReformerOnlyLMHead):
        return Lengths(multiple=module.chunk_size_lm_head) if module.chunk_size_lm_head else None
    if not isinstance(module, hf.ReformerModel):
        return None
    config = module.config
    padding = int(hf._get_least_common_mult_chunk_len(config))
    limit = config.max_position_embeddings
    if config.axial_pos_embds:
        limit = min(limit, math.prod(config.axial_pos_shape))
    longest = limit // padding * padding or min(limit, int(hf._get_min_chunk_len(config)))
    chunk = config.chunk_size_feed_forward or 1
    return Lengths(longest, chunk if padding % chunk == 0 else math.lcm(chunk, padding))


def needs_adapter(module: nn.Module) -> bool:
    """HF's Reformer attention layers (random rotations, Python branches on the length)."""
    return isinstance(module, hf.LSHSelfAttention | hf.LocalSelfAttention)


IMPL = AdapterImpl(convert=convert, needs_adapter=needs_adapter, lengths=lengths)
