"""The two stateful graphs of a decode export, as torch modules around a causal LM or a seq2seq decoder.

* prefill: the prompt -> ``logits`` (batch, seq, vocab), ``present_length`` and every
  layer's ``present.<layer>.<name>`` state after the prompt;
* decode: the next tokens (batch, seq), usually one, ``past_length`` and every
  ``past.<layer>.<name>`` -> their logits, ``present_length`` and the next state (from an empty
  state, past_seq 0 or zero sums, it computes what prefill does).

``lm``: the prompt is ``input_ids``. ``seq2seq``: prefill takes the source (``input_ids``,
``attention_mask``) and the decoder prompt ``decoder_input_ids``; it runs the encoder once
and projects its output through each decoder layer's cross-attention k/v projections once,
returning them as ``cross.<layer>.key`` / ``cross.<layer>.value`` (batch, heads, src_seq,
head_dim). Decode takes them and ``attention_mask`` back at every step as *context*
(inputs that do not change), so a step projects only its own query: O(src_seq · d) per
layer instead of O(src_seq · d_model²). A cross layer that is not a plain
:class:`attnx.attention.MultiHeadAttention` (a third-party module without k/v projections to
cache) falls back to the uncached contract: prefill returns ``encoder_hidden_states`` and
decode re-runs the layer on it.

Both graphs run the model's own forward (embedding, layers, tied projection) with hooks:
the sinusoidal positions start at ``past_length``, each (decoder) layer's self-attention
is the layer's own ``step(x, state, position)`` (:class:`attnx.state.DecodableLayer`) instead of
its call, and each cached cross-attention is ``attend`` (or ``attend_cross_step``) on the cached
keys and values. So a decode export computes the same function as the full forward, one token at
a time. Each layer's state is its own declaration: layers of different kinds (a KV cache here, a
recurrent state and a convolution carry there) mix freely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnx.attention import MultiHeadAttention, merge_heads, split_heads
from attnx.errors import AttnxError
from attnx.exporter.manifest import ContextInput, DecodeSection, GraphIO, StatePair
from attnx.exporter.signature import fixed_arity
from attnx.models.spec import ModelSpec, TensorSpec
from attnx.state import GROWING, DecodableLayer, PositionalCrossAttention, StateTensor, layer_kind
from attnx.variant import Variant

PAST_LENGTH, PRESENT_LENGTH = "past_length", "present_length"
PRESENT_SEQ = "present_seq"  # = past_seq + seq in the decode graph
TOKENS, LOGITS = "input_ids", "logits"
DECODER_TOKENS, SOURCE_MASK, MEMORY = "decoder_input_ids", "attention_mask", "encoder_hidden_states"


@dataclasses.dataclass(frozen=True)
class StateSlot:
    """One state tensor of the export: layer ``layer``'s ``tensor`` (layer None: the position)."""

    layer: int | None
    tensor: StateTensor

    @property
    def input(self) -> str:
        return PAST_LENGTH if self.layer is None else f"past.{self.layer}.{self.tensor.name}"

    @property
    def output(self) -> str:
        return PRESENT_LENGTH if self.layer is None else f"present.{self.layer}.{self.tensor.name}"

    def spec(self, side: str, growing: str, activation: str) -> TensorSpec:
        """The graph tensor: ``side`` "input" (past) or "output" (present), GROWING renamed ``growing``,
        in ``activation`` dtype unless the state tensor fixes its own."""
        axes = tuple(growing if a == GROWING else a for a in self.tensor.axes)
        name = self.input if side == "input" else self.output
        return TensorSpec(name, self.tensor.dtype or activation, axes, doc=self.tensor.doc)


POSITION = StateTensor(
    "length", (1,), dtype="int64", doc="tokens processed so far (the position of the next token)"
)


def causal_stack(model: nn.Module) -> nn.Module:
    """The stack of causal layers that decodes: the ``lm`` itself, or the ``seq2seq`` decoder."""
    return model.decoder if model.config.kind == "seq2seq" else model


def self_attention_layers(stack: nn.Module) -> list[nn.Module]:
    """The self-attention module of each layer, in order (layer 0's for all when ``share_layers``)."""
    blocks = stack.blocks
    return [(blocks[0] if stack.share_layers else block).attention for block in blocks]


def layer_slots(layers: Sequence[nn.Module]) -> list[StateSlot]:
    """The state slots of decodable ``layers`` (layer i's state is ``past.<i>.*``), each its own declaration.

    Raises:
        AttnxError: a layer that does not decode (no ``decode_state()``/``step()``).
    """
    slots = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, DecodableLayer):
            raise AttnxError(
                f"attention layer {i} ({type(layer).__name__}) does not decode: it lacks "
                "decode_state()/step() (attnx.state.DecodableLayer; see docs/decoding.md)"
            )
        tensors = layer.decode_state()
        if not tensors:
            raise AttnxError(f"attention layer {i} ({type(layer).__name__}) declares no state tensors")
        slots += [StateSlot(i, tensor) for tensor in tensors]
    return slots


def cross_owner(stack: nn.Module, layer: int) -> int:
    """The layer whose cross-attention module (and so cached keys/values) layer ``layer`` uses."""
    return 0 if stack.share_layers else layer


def caches_cross(layer: nn.Module) -> bool:
    """Whether a cross-attention module is MultiHeadAttention's own forward around ``attend``, so its
    keys/values are ``k_proj``/``v_proj`` of the encoder output and can be computed once."""
    return isinstance(layer, MultiHeadAttention) and type(layer).forward is MultiHeadAttention.forward


@dataclasses.dataclass(frozen=True)
class CrossCache:
    """The cached cross-attention keys and values of decoder layer ``layer``'s module, per head.

    Prefill computes them from the encoder output and returns them; decode takes them as context.
    """

    layer: int
    heads: int
    key_dim: int
    value_dim: int

    @classmethod
    def of(cls, layer: int, module: MultiHeadAttention) -> CrossCache:
        heads = module.spec.n_heads
        return cls(layer, heads, module.k_proj.out_features // heads, module.v_proj.out_features // heads)

    @property
    def names(self) -> tuple[str, str]:
        return f"cross.{self.layer}.key", f"cross.{self.layer}.value"

    def specs(self, activation: str) -> list[TensorSpec]:
        key, value = self.names
        axes = ("batch", self.heads, "src_seq")
        what = f"of decoder layer {self.layer}'s cross-attention, per head"
        return [
            TensorSpec(key, activation, (*axes, self.key_dim), doc=f"k_proj(encoder output) {what}"),
            TensorSpec(value, activation, (*axes, self.value_dim), doc=f"v_proj(encoder output) {what}"),
        ]


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
    """The state slots of a model and the input/output specs of its prefill and decode graphs."""

    model: str  # "lm" or "seq2seq"
    vocab_size: int
    d_model: int
    slots: tuple[StateSlot, ...]
    activation: str = "float32"  # numpy dtype of the model's activations (float16 in an fp16 export)
    cross: tuple[CrossCache, ...] = ()  # seq2seq: the cached cross-attention keys/values
    memory: bool = False  # seq2seq whose cross layers cannot be cached: decode takes the encoder output

    @classmethod
    def of(cls, model: nn.Module) -> DecodeLayout:
        """The layout of an attnx ``lm`` or ``seq2seq``: each (decoder) layer's declared state.

        Raises:
            AttnxError: a layer that does not decode (no ``decode_state()``/``step()``).
        """
        stack = causal_stack(model)
        slots = [StateSlot(None, POSITION), *layer_slots(self_attention_layers(stack))]
        config = model.config
        activation = str(next(model.parameters()).dtype).removeprefix("torch.")
        cross, memory = (), False
        if config.kind == "seq2seq":
            owners = {cross_owner(stack, i) for i in range(len(stack.blocks))}
            modules = {i: stack.blocks[i].cross_attention for i in sorted(owners)}
            memory = not all(caches_cross(m) for m in modules.values())
            cross = () if memory else tuple(CrossCache.of(i, m) for i, m in modules.items())
        sizes = (config.vocab_size, config.d_model)
        return cls(config.kind, *sizes, tuple(slots), activation, cross, memory)

    @property
    def layer_slots(self) -> tuple[StateSlot, ...]:
        return tuple(s for s in self.slots if s.layer is not None)

    @property
    def tokens(self) -> str:
        """The name of the token input of both graphs."""
        return DECODER_TOKENS if self.model == "seq2seq" else TOKENS

    def source(self) -> list[TensorSpec]:
        """seq2seq prefill's source inputs (none for an lm)."""
        if self.model != "seq2seq":
            return []
        return [
            TensorSpec(TOKENS, "int64", ("batch", "src_seq"), high=self.vocab_size, doc="source token ids"),
            TensorSpec(SOURCE_MASK, "bool", ("batch", "src_seq"), doc="True for real source tokens"),
        ]

    def made(self) -> list[TensorSpec]:
        """The context prefill makes: the cached cross keys/values (or the encoder output); none for an lm."""
        if self.memory:
            axes = ("batch", "src_seq", self.d_model)
            return [TensorSpec(MEMORY, self.activation, axes, doc="encoder output")]
        return [spec for cache in self.cross for spec in cache.specs(self.activation)]

    def context(self) -> list[TensorSpec]:
        """Decode inputs that stay as prefill made or took them (seq2seq: :meth:`made`, the source mask)."""
        if self.model != "seq2seq":
            return []
        return [*self.made(), self.source()[1]]

    def inputs(self, with_past: bool) -> list[TensorSpec]:
        tokens = TensorSpec(self.tokens, "int64", ("batch", "seq"), high=self.vocab_size, doc="token ids")
        if not with_past:
            return [*self.source(), tokens]
        return [tokens, *self.context(), *(s.spec("input", GROWING, self.activation) for s in self.slots)]

    def outputs(self, with_past: bool) -> list[TensorSpec]:
        shape = ("batch", "seq", self.vocab_size)
        logits = TensorSpec(LOGITS, self.activation, shape, doc="next-token logits")
        made = [] if with_past else self.made()
        growing = PRESENT_SEQ if with_past else "seq"
        return [logits, *made, *(s.spec("output", growing, self.activation) for s in self.slots)]

    def kinds(self) -> list[str]:
        """The kind of each layer's state, layer by layer ("kv-cache" or "recurrent",
        :func:`attnx.state.layer_kind`)."""
        layers = sorted({s.layer for s in self.layer_slots})
        return [layer_kind([s.tensor.role for s in self.layer_slots if s.layer == i]) for i in layers]

    def describe(self) -> DecodeSection:
        """The manifest's ``decode`` section: everything a runtime needs to drive the loop."""
        made = {spec.name for spec in self.made()}
        return DecodeSection(
            layers=self.kinds(),
            tokens=self.tokens,
            prefill=GraphIO(self.inputs(False), self.outputs(False)),
            decode=GraphIO(self.inputs(True), self.outputs(True)),
            state=[
                StatePair(
                    s.input,
                    s.output,
                    s.layer,
                    s.tensor.name,
                    "position" if s.layer is None else s.tensor.role,
                    list(s.tensor.axes),
                    s.tensor.dtype or self.activation,
                    s.tensor.doc,
                )
                for s in self.slots
            ],
            context=[
                ContextInput(c.name, "prefill output" if c.name in made else "prefill input")
                for c in self.context()
            ],
            dynamic_state_axes=sorted({a for s in self.slots for a in s.tensor.axes if isinstance(a, str)}),
            loop=(
                "run prefill on the prompt; pick the next token from logits[:, -1]; run decode with "
                f"{self.tokens} = that token (batch, 1), each 'context' input as prefill took or made it, "
                "and each state input = the previous call's output named next to it in 'state'; repeat"
            ),
        )


def cross_keys_values(layer: MultiHeadAttention, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head keys and values (batch, heads, src_seq, d) of a cross layer over the encoder output."""
    heads = layer.spec.n_heads
    return split_heads(layer.k_proj(memory), heads), split_heads(layer.v_proj(memory), heads)


def cross_attention_step(
    layer: MultiHeadAttention,
    x: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    source_mask: torch.Tensor,
    position: torch.Tensor,
) -> torch.Tensor:
    """A cross layer's forward for new target tokens ``x`` (from ``position`` on) on cached keys/values:
    only the queries are projected. ``attend_cross_step`` serves a variant whose cross-attention
    depends on where the queries sit in the target (cosFormer's re-weighting); else ``attend``."""
    q = split_heads(layer.q_proj(x), layer.spec.n_heads)
    if isinstance(layer, PositionalCrossAttention):
        out = layer.attend_cross_step(q, *cache, source_mask, position)
    else:
        out = layer.attend(q, *cache, source_mask)
    return layer.out_proj(merge_heads(out))


class StepModel(nn.Module):
    """``model``'s forward with state in and out: prefill (``with_past`` False) or decode (True).

    Inputs and outputs follow :meth:`DecodeLayout.inputs` / :meth:`DecodeLayout.outputs`.
    """

    def __init__(self, model: nn.Module, layout: DecodeLayout, with_past: bool) -> None:
        super().__init__()
        self.model, self.layout, self.with_past = model, layout, with_past
        self.names = [s.name for s in layout.inputs(with_past)]
        self.layers = len(causal_stack(model).blocks)
        fixed_arity(self, self.step, len(self.names))

    def step(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = dict(zip(self.names, inputs, strict=True))
        tokens = given[self.layout.tokens]
        past: list[Any] = [None] * self.layers
        if self.with_past:
            position = given[PAST_LENGTH]
            for i in range(self.layers):
                past[i] = tuple(given[s.input] for s in self.layout.layer_slots if s.layer == i)
        else:
            position = torch.zeros(1, dtype=torch.int64, device=tokens.device)
        present: dict[int, tuple[torch.Tensor, ...]] = {}

        def attend(i: int, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            out, present[i] = layer.step(x, past[i], position)
            return out

        hooks: dict[str, Any] = {"offset": position, "self_attention": attend}
        made: list[torch.Tensor] = []
        if self.layout.model == "seq2seq":
            logits = self._decode_seq2seq(given, tokens, position, hooks, made)
        else:
            (logits,) = self.model(tokens, **hooks)
        tensors = [t for i in range(self.layers) for t in present[i]]
        return (logits, *made, position + tokens.shape[-1], *tensors)

    def _decode_seq2seq(
        self,
        given: dict[str, torch.Tensor],
        tokens: torch.Tensor,
        position: torch.Tensor,
        hooks: dict[str, Any],
        made: list[torch.Tensor],
    ) -> torch.Tensor:
        """The decoder's logits; prefill runs the encoder and appends what it makes to ``made``."""
        decoder, mask = self.model.decoder, given[SOURCE_MASK]
        if self.with_past:
            memory = given.get(MEMORY)
            caches = {c.layer: (given[c.names[0]], given[c.names[1]]) for c in self.layout.cross}
        else:
            memory = self.model.encode(given[TOKENS], mask)
            modules = {c.layer: decoder.blocks[c.layer].cross_attention for c in self.layout.cross}
            caches = {i: cross_keys_values(m, memory) for i, m in modules.items()}
            made += [memory] if self.layout.memory else [t for i in caches for t in caches[i]]
        if self.layout.memory:
            return self.model.decode(tokens, memory, mask, **hooks)

        def cross(i: int, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return cross_attention_step(layer, x, caches[cross_owner(decoder, i)], mask, position)

        return self.model.decode(tokens, None, None, **hooks, cross_attention=cross)


def check_decodable(model: ModelSpec, variant: Variant, decoders: Sequence[str]) -> None:
    """Refuse a decode export the model or variant cannot serve, naming what can.

    Raises:
        AttnxError: a model without a causal stack to decode, or a (self-attention)
            variant without a decode capability.
    """
    if not model.generates:
        raise AttnxError(
            f"--decode exports models that generate token by token (lm, seq2seq), not '{model.name}'"
        )
    if variant.capabilities.decode is None:
        raise AttnxError(
            f"variant '{variant.name}' cannot decode token by token (no kv-cache or recurrent state); "
            f"variants that decode: {', '.join(decoders)}"
        )
