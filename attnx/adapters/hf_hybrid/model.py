"""A whole Hugging Face hybrid model with its layers converted (what the adapter returns for it).

HF's own forward runs (embeddings, decoder layers, norms, rotary tables, routers, MLPs, the head),
called with what attnx's layers take:

* masks: HF builds a 4D causal mask for the attention layers and passes the 2D padding mask to the
  linear ones; its forward also takes a ready mapping layer type -> mask, which this wrapper passes
  with the 2D mask for every layer type (attnx's softmax op is causal itself and takes the 2D key
  padding mask; HF's ``create_recurrent_attention_mask`` gives the linear layers that same mask);
* positions: ``position_ids`` as given (generate passes cumsum(mask) - 1 for left padding), else
  0..n-1 as HF counts them, offset by ``past_length`` (the decode graphs' position of the first new
  token; HF counts its cache instead).

A model whose layers HF calls without the padding mask (RWKV's and xLSTM's: their models drop
``attention_mask``) has them hold it for the call (:class:`HandedPadding`), so HF's forward runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from attnx.errors import AttnxError


def convert_layers(model: nn.Module, layers: Mapping[type, Callable[[nn.Module], nn.Module]]) -> nn.Module:
    """``model`` (the walk's private copy) with every submodule of a class in ``layers`` replaced."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            make = layers.get(type(child))
            if make is not None:
                setattr(parent, name, make(child))
    return model


def adopt(module: nn.Module, layer: nn.Module) -> None:
    """Register HF ``layer``'s submodules, own parameters and own buffers on its attnx replacement
    ``module`` under the same names (shared, not copied), so the replacement loads and stores HF's weights."""
    for name, child in layer.named_children():
        module.add_module(name, child)
    for name, parameter in layer.named_parameters(recurse=False):
        module.register_parameter(name, parameter)
    for name, buffer in layer.named_buffers(recurse=False):
        module.register_buffer(name, buffer)


class HandedPadding:
    """A layer that HF calls as ``layer(hidden, state, use_cache) -> (out, state)`` without the 2D padding
    mask (RWKV's time and channel mixes, xLSTM's mLSTM: their models drop ``attention_mask``), mixed in
    before :class:`~attnx.adapters.hf_hybrid.mixer.PaddedMixer`: :class:`HybridModel` sets ``padding`` to
    the mask it was given for the duration of its call, and HF's call runs the layer with it. HF's state
    is refused: attnx decoding carries the layer's state."""

    padding: torch.Tensor | None = None

    def forward(
        self, hidden: torch.Tensor, state: Any = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, None]:
        """HF's call of the layer, with the handed padding mask and without HF's state."""
        if state is not None or use_cache:
            raise ValueError(
                f"an attnx {type(self).__name__} layer keeps its state through attnx decoding, not HF's state"
            )
        return super().forward(hidden, attention_mask=self.padding), None  # type: ignore[misc]


class HybridModel(nn.Module):
    """An HF hybrid causal LM (or its text model) with attnx layers, called as attnx exports it."""

    def __init__(self, model: nn.Module, layer_types: list[str] | None):
        """``layer_types``: the config's, keying the mask mapping the model takes; None: the model takes
        the 2D mask itself."""
        super().__init__()
        self.model = model
        self.layer_types = None if layer_types is None else sorted(set(layer_types))

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_length: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        if use_cache:
            raise AttnxError(
                "an exported Hugging Face hybrid takes the whole sequence (its decode state goes through "
                "attnx --decode): pass use_cache=False"
            )
        if position_ids is None:
            start = 0 if past_length is None else past_length
            position_ids = (torch.arange(input_ids.shape[1], device=input_ids.device) + start)[None]
        masks = attention_mask
        if self.layer_types is not None:
            masks = {kind: attention_mask for kind in self.layer_types}
        handed = [m for m in self.model.modules() if isinstance(m, HandedPadding)]
        for layer in handed:
            layer.padding = attention_mask
        try:
            return self.model(
                input_ids=input_ids,
                attention_mask=masks,
                position_ids=position_ids,
                use_cache=False,
                **kwargs,
            )
        finally:
            for layer in handed:
                layer.padding = None
