"""Decoding a module export (``attnx.export_module(..., options={"export.decode": True})``).

A user's module is not an attnx model: attnx cannot hook its embedding or its layers' calls. Its
decodable layers (:class:`attnx.state.DecodableLayer` with a ``stepping`` slot: attnx's own layers,
adapters' layers) step instead: the prefill and decode graphs run the module's own forward on the
new tokens while each such layer holds a :class:`attnx.state.Step` with its state, and the layer's
forward returns its own ``step`` (:class:`attnx.attention.Stepping`), so everything around attention
(embeddings, feed-forward blocks, norms, the head) is the module's own code.

The module must be a causal language model: token ids (batch, seq) int64 as its first input and
the logits (batch, seq, vocab) as its first output. Its other inputs must be ones its forward can
omit (a parameter with a default, or one its ``**kwargs`` take), each a (batch, seq) bool padding
mask or int64 position ids (a Hugging Face model's ``attention_mask`` and ``position_ids``): the
decode graphs take token ids only and call the forward without them, and decode parity compares with
the full forward given what they stand for when omitted (:func:`full_inputs`: every token real,
positions 0..n-1). A module that adds absolute positions must take a keyword argument ``past_length``
(int64 (1,), the position of its first token; 0 in a full forward) and offset them by it; decode
parity (every decoded position against the full forward) catches a module that does not.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from attnx.decode.model import PAST_LENGTH, POSITION, TOKENS, DecodeLayout, StateSlot, layer_slots
from attnx.errors import AttnxError
from attnx.exporter.module import ModuleAssembly
from attnx.exporter.signature import fixed_arity, flatten_outputs
from attnx.models.spec import TensorSpec
from attnx.parity.runners import BackendSkipped
from attnx.state import DecodableLayer, Step

# What an omitted (batch, seq) input stands for, by dtype: a padding mask of real tokens only, or
# the positions 0..n-1 of every row.
OMITTED = {"bool": "every token real", "int64": "positions 0..n-1"}


def stepping_layers(model: nn.Module) -> list[nn.Module]:
    """The module's outermost decodable layers that a forward can drive (a ``stepping`` slot), in
    module order (their state is ``past.<i>.*``); a decodable layer's own children are its business."""
    if isinstance(model, DecodableLayer) and hasattr(model, "stepping"):
        return [model]
    found = [layer for child in model.children() for layer in stepping_layers(child)]
    return list({id(layer): layer for layer in found}.values())  # a shared layer is one layer


def module_layout(assembly: ModuleAssembly) -> DecodeLayout:
    """The state slots and graph specs of a module export's decode graphs.

    Raises:
        AttnxError: a module that is not a causal LM over token ids, or has no stepping layer (or one
            that refuses to decode).
    """
    kind = assembly.section.module_class
    inputs, logits = assembly.inputs, assembly.outputs[0]
    if inputs[0].dtype != "int64" or len(inputs[0].axes) != 2:
        raise AttnxError(
            "a decode export of a module takes token ids (an int64 (batch, seq) input) first; "
            f"{kind} takes {inputs[0].name} ({inputs[0].dtype}) first; export it without --decode"
        )
    if len(logits.axes) != 3 or not isinstance(logits.axes[-1], int) or not logits.dtype.startswith("float"):
        raise AttnxError(
            f"a decode export of a module returns the logits (batch, seq, vocab) first; {kind}'s first "
            f"output '{logits.name}' is {logits.dtype} {logits.axes}; export it without --decode"
        )
    adapted = _adapted(assembly)
    _check_omittable(adapted, inputs[1:], kind)
    layers = stepping_layers(adapted)
    if not layers:
        raise AttnxError(
            f"{kind} has no attention layer that decodes (attnx.state.DecodableLayer with a stepping slot, "
            "as attnx's and adapters' layers are); see docs/importing.md"
        )
    slots = [StateSlot(None, POSITION), *layer_slots(layers)]
    return DecodeLayout("lm", logits.axes[-1], 0, tuple(slots), logits.dtype)


def _check_omittable(model: nn.Module, inputs: Sequence[TensorSpec], kind: str) -> None:
    """Refuse inputs beside the token ids that the decode graphs cannot omit (see the module docstring).

    Raises:
        AttnxError: an input that is not a (batch, seq) bool mask or int64 positions, or that the
            forward requires.
    """
    parameters = inspect.signature(model.forward).parameters
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    for spec in inputs:
        parameter = parameters.get(spec.name)
        # an input the forward takes among its **kwargs (a library model passing them on) may be left out
        optional = any_keyword if parameter is None else parameter.default is not inspect.Parameter.empty
        if spec.dtype not in OMITTED or spec.axes != ("batch", "seq") or not optional:
            raise AttnxError(
                f"a decode export of a module takes token ids only, and {kind} also takes {spec.name} "
                f"({spec.dtype} {spec.axes}{'' if optional else ', required'}); its decode graphs can omit "
                "only optional (batch, seq) padding masks (bool) and position ids (int64); export it "
                "without --decode"
            )


def full_inputs(inputs: Sequence[TensorSpec], ids: np.ndarray) -> list[torch.Tensor]:
    """The full forward's inputs for token ids ``ids`` (batch, seq): the ids, and for each omitted input
    what its omission stands for (:data:`OMITTED`)."""
    batch, n = ids.shape
    made = [torch.from_numpy(ids)]
    for spec in inputs[1:]:
        if spec.dtype == "bool":
            made.append(torch.ones(batch, n, dtype=torch.bool))
        else:
            made.append(torch.arange(n).expand(batch, n).contiguous())
    return made


def _adapted(assembly: ModuleAssembly) -> nn.Module:
    if assembly.adapted is None:
        raise BackendSkipped(
            "a module export stores its full forward only (reference.json), not a torch step model; its "
            "decode graphs are checked against that forward"
        )
    return assembly.adapted


class ModuleStepModel(nn.Module):
    """The adapted module's forward with state in and out: prefill (``with_past`` False) or decode."""

    def __init__(self, assembly: ModuleAssembly, layout: DecodeLayout, with_past: bool) -> None:
        super().__init__()
        self.model, self.layout, self.with_past = _adapted(assembly), layout, with_past
        self.token, self.keywords, self.constants = (
            assembly.inputs[0].name,
            assembly.keywords,
            assembly.constants,
        )
        self.layers = stepping_layers(self.model)
        self.positions = PAST_LENGTH in inspect.signature(self.model.forward).parameters
        self.names = [s.name for s in layout.inputs(with_past)]
        fixed_arity(self, self.step, len(self.names))

    def step(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = dict(zip(self.names, inputs, strict=True))
        tokens = given[TOKENS]
        position = given[PAST_LENGTH] if self.with_past else torch.zeros(1, dtype=torch.int64)
        steps = []
        for i, layer in enumerate(self.layers):
            past = (
                tuple(given[s.input] for s in self.layout.layer_slots if s.layer == i)
                if self.with_past
                else None
            )
            layer.stepping = Step(past, position)
            steps.append(layer.stepping)
        extra = {PAST_LENGTH: position} if self.positions else {}
        try:
            result = (
                self.model(**{self.token: tokens}, **self.constants, **extra)
                if self.keywords
                else self.model(tokens, **extra)
            )
        finally:
            for layer in self.layers:
                layer.stepping = None
        missing = [type(self.layers[i]).__name__ for i, s in enumerate(steps) if s.present is None]
        if missing:
            raise AttnxError(f"decoding layer {missing[0]} was not called by the module's forward")
        state = [t for s in steps for t in s.present]
        return (flatten_outputs(result)[0][1], position + tokens.shape[-1], *state)
