"""The decoder layer list of a causal LM built as transformers builds them (its own models, and
flash-linear-attention's, which follow them): what the adapters converting such models name for
stamping (:attr:`attnx.adapter.AdapterImpl.layers`, :mod:`attnx.exporter.repeat`)."""

from __future__ import annotations

from torch import nn


def decoder_layers(model: nn.Module) -> tuple[nn.Module, str] | None:
    """(owner, attribute) of the ``nn.ModuleList`` of the ``num_hidden_layers`` layers that the config of
    ``model`` (or of its first submodule with a config: a wrapper's model) declares, its text config
    for a multimodal one; None when there is no such config or list."""
    config = next((m.config for m in model.modules() if hasattr(getattr(m, "config", None), "to_dict")), None)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    count = getattr(text, "num_hidden_layers", None)
    for owner in model.modules():
        for name, child in owner.named_children():
            if isinstance(child, nn.ModuleList) and len(child) == count:
                return owner, name
    return None
