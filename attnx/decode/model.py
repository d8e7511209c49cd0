"""The two stateful graphs of a decode export, as torch modules around a causal LM.

* prefill: ``input_ids (batch, seq)`` -> ``logits (batch, seq, vocab)``, ``present_length``
  and every layer's ``present.<layer>.<name>`` state after the prompt;
* decode: ``input_ids (batch, 1)``, ``past_length`` and every ``past.<layer>.<name>`` ->
  the logits of that one token, ``present_length`` and the next state.

Both run the LM's own forward (embedding, layers, tied projection) with two hooks: the
sinusoidal positions start at ``past_length``, and each layer's self-attention is the
variant's ``attend_step`` (:mod:`attnx.decode.state`) instead of ``attend``. So a decode
export computes the same function as the full forward, one token at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from attnx.decode.state import GROWING, StateTensor
from attnx.errors import AttnxError
from attnx.models.spec import TensorSpec
from attnx.nn import merge_heads, split_heads

PAST_LENGTH, PRESENT_LENGTH = "past_length", "present_length"
PRESENT_SEQ = "present_seq"  # = past_seq + 1 in the decode graph
TOKENS, LOGITS = "input_ids", "logits"
DECODE_MODELS = ("lm",)


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

    def spec(self, side: str, growing: str) -> TensorSpec:
        """The graph tensor: ``side`` "input" (past) or "output" (present), GROWING renamed ``growing``."""
        axes = tuple(growing if a == GROWING else a for a in self.tensor.axes)
        name = self.input if side == "input" else self.output
        return TensorSpec(name, self.tensor.dtype, axes, doc=self.tensor.doc)


POSITION = StateTensor(
    "length", (1,), dtype="int64", doc="tokens processed so far (the position of the next token)"
)


def self_attention_layers(model: nn.Module) -> list[nn.Module]:
    """The self-attention module of each layer, in order (layer 0's for all when ``share_layers``)."""
    blocks = model.blocks
    return [(blocks[0] if model.share_layers else block).attention for block in blocks]


@dataclasses.dataclass(frozen=True)
class DecodeLayout:
    """The state slots of a model and the input/output specs of its prefill and decode graphs."""

    mode: str
    vocab_size: int
    slots: tuple[StateSlot, ...]

    @classmethod
    def of(cls, model: nn.Module, mode: str) -> DecodeLayout:
        slots = [StateSlot(None, POSITION)]
        for i, layer in enumerate(self_attention_layers(model)):
            if not (hasattr(layer, "decode_state") and hasattr(layer, "attend_step")):
                raise AttnxError(
                    f"attention layer {type(layer).__name__} declares decode={mode!r} but lacks "
                    "decode_state()/attend_step() (see docs/decoding.md)"
                )
            slots += [StateSlot(i, tensor) for tensor in layer.decode_state()]
        return cls(mode, model.config.vocab_size, tuple(slots))

    @property
    def layer_slots(self) -> tuple[StateSlot, ...]:
        return tuple(s for s in self.slots if s.layer is not None)

    def inputs(self, with_past: bool) -> list[TensorSpec]:
        tokens = TensorSpec(
            TOKENS, "int64", ("batch", 1 if with_past else "seq"), high=self.vocab_size, doc="token ids"
        )
        if not with_past:
            return [tokens]
        return [tokens, *(s.spec("input", GROWING) for s in self.slots)]

    def outputs(self, with_past: bool) -> list[TensorSpec]:
        length = 1 if with_past else "seq"
        logits = TensorSpec(LOGITS, "float32", ("batch", length, self.vocab_size), doc="next-token logits")
        return [logits, *(s.spec("output", PRESENT_SEQ if with_past else "seq") for s in self.slots)]

    def describe(self) -> dict[str, Any]:
        """The manifest's ``decode`` entry: everything a runtime needs to drive the loop."""
        return {
            "mode": self.mode,
            "prefill": {
                "inputs": [s.to_dict() for s in self.inputs(False)],
                "outputs": [s.to_dict() for s in self.outputs(False)],
            },
            "decode": {
                "inputs": [s.to_dict() for s in self.inputs(True)],
                "outputs": [s.to_dict() for s in self.outputs(True)],
            },
            "state": [
                {"input": s.input, "output": s.output, "layer": s.layer, **s.tensor.to_dict()}
                for s in self.slots
            ],
            "dynamic_state_axes": sorted(
                {a for s in self.slots for a in s.tensor.axes if isinstance(a, str)}
            ),
            "loop": (
                "run prefill on the prompt; pick the next token from logits[:, -1]; run decode with "
                f"{TOKENS} = that token (batch, 1) and each state input = the previous call's output "
                "named next to it in 'state'; repeat"
            ),
        }


def attention_step(
    layer: nn.Module, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """A :class:`attnx.nn.MultiHeadAttention` layer's forward for new tokens ``x``, continuing ``state``."""
    heads = layer.spec.n_heads
    q, k, v = (split_heads(project(x), heads) for project in (layer.q_proj, layer.k_proj, layer.v_proj))
    out, state = layer.attend_step(q, k, v, state, position)
    return layer.out_proj(merge_heads(out)), state


class StepModel(nn.Module):
    """``model``'s forward with state in and out: prefill (``with_past`` False) or decode (True).

    Inputs and outputs follow :meth:`DecodeLayout.inputs` / :meth:`DecodeLayout.outputs`.
    """

    def __init__(self, model: nn.Module, layout: DecodeLayout, with_past: bool) -> None:
        super().__init__()
        self.model, self.with_past = model, with_past
        self.sizes = [sum(s.layer == i for s in layout.layer_slots) for i in range(len(model.blocks))]
        # torch.export matches dynamic shapes to forward's parameters: give it one per graph input.
        count = len(layout.inputs(with_past))
        self.forward = functools.partial(self.step)
        self.forward.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(f"input_{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(count)]
        )

    def step(self, input_ids: torch.Tensor, *state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.with_past:
            position, flat = state[0], list(state[1:])
            past: list[Any] = [
                tuple(flat[sum(self.sizes[:i]) : sum(self.sizes[: i + 1])]) for i in range(len(self.sizes))
            ]
        else:
            position = torch.zeros(1, dtype=torch.int64, device=input_ids.device)
            past = [None] * len(self.sizes)
        present: dict[int, tuple[torch.Tensor, ...]] = {}

        def attend(i: int, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            out, present[i] = attention_step(layer, x, past[i], position)
            return out

        (logits,) = self.model(input_ids, offset=position, self_attention=attend)
        tensors = [t for i in range(len(self.sizes)) for t in present[i]]
        return (logits, position + input_ids.shape[-1], *tensors)


def check_decodable(model_name: str, variant: Any, decoders: Sequence[str]) -> None:
    """Refuse a decode export the model or variant cannot serve, naming what can.

    Raises:
        AttnxError: a model other than ``lm``, or a variant without a decode capability.
    """
    if model_name not in DECODE_MODELS:
        raise AttnxError(
            f"--decode exports causal language models (--model {', '.join(DECODE_MODELS)}), "
            f"not '{model_name}'"
        )
    if variant.capabilities.decode is None:
        raise AttnxError(
            f"variant '{variant.name}' cannot decode token by token (no kv-cache or recurrent state); "
            f"variants that decode: {', '.join(decoders)}"
        )
