"""attnx layers for your own PyTorch models: any registered attention variant as an ``nn.Module``.

::

    import attnx.nn

    attention = attnx.nn.Attention("linear", d_model=256, n_heads=4, causal=True, eps=1e-6)
    y = attention(x)                                    # x (batch, n, 256) -> (batch, n, 256)
    y = attention(x, key_padding_mask=mask)             # mask (batch, n) bool, True = real token

    model = attnx.nn.Model("lm", "cosformer", d_model=256, n_layers=4, seed=0)   # a whole architecture

A layer's forward is ``forward(x, context=None, key_padding_mask=None)``: queries from ``x``,
keys and values from ``context`` (cross-attention, built with ``cross=True``) or ``x``. Its
attention runs through the variant's ``attnx::`` op, so the model exports with one attnx node
per call, and trains (every built-in variant declares ``Capabilities.trainable``). The
building blocks attnx's own models use are here too. See docs/training.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from attnx.cost import require_memory
from attnx.errors import AttnxError, unknown_choice
from attnx.models.blocks import FeedForward, SinusoidalPositions, TokenEmbedding
from attnx.models.factory import construct
from attnx.registry import Registry, get_registry
from attnx.variant import AttentionSpec

__all__ = ["Attention", "FeedForward", "Model", "SinusoidalPositions", "TokenEmbedding"]


def Attention(
    variant: str,
    d_model: int,
    n_heads: int,
    *,
    causal: bool = False,
    cross: bool = False,
    registry: Registry | None = None,
    **options: Any,
) -> nn.Module:
    """The attention layer of ``variant`` (a registered name) with ``options`` (its config's fields).

    A factory, named like a class because it stands for one: the layer it returns is the variant's
    own module class (``LinearAttentionLayer``, ...), the one attnx's models hold, so its state dict
    has the same names. It is in train mode and initialised from torch's global RNG like any
    ``nn.Module``: seed with ``torch.manual_seed``.

    Args:
        d_model: model width; n_heads must divide it.
        causal: query i sees keys up to i (bottom-right aligned when fewer queries than keys).
        cross: queries from ``x``, keys and values from the ``context`` argument.
        registry: where to look the variant up (default: the installed plugins).

    Raises:
        AttnxError: an unknown variant or option (with the closest name), a bad option value, or a
            mode the variant does not support; one line each.
    """
    registry = registry or get_registry()
    found = registry.variant(variant)
    fields = [f.name for f in dataclasses.fields(found.config)]
    for key in options:
        if key not in fields:
            raise unknown_choice(f"{found.name} option", key, fields)
    for name, size in (("d_model", d_model), ("n_heads", n_heads)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise AttnxError(f"attnx.nn.Attention: {name}={size!r} must be an integer >= 1")
    for name, flag in (("causal", causal), ("cross", cross)):
        if not isinstance(flag, bool):
            raise AttnxError(f"attnx.nn.Attention: {name}={flag!r} must be True or False")
    spec = AttentionSpec(d_model, n_heads, causal=causal, cross=cross)
    found.check_spec(spec)
    config, impl = found.make_config(options), found.load()
    what, fix = f"attnx.nn.Attention({variant!r}, d_model={d_model})", "choose a smaller d_model"
    try:
        with torch.device("meta"):  # sizes first: weights that cannot fit are refused, not allocated
            planned = impl.build(config, spec)
    except (RuntimeError, OverflowError) as exc:  # torch's own size arithmetic overflows int64
        if "overflow" not in str(exc).lower():
            raise
        raise AttnxError(f"{what} has weights too large to address; {fix}") from None
    size = sum(t.numel() * t.element_size() for t in [*planned.parameters(), *planned.buffers()])
    require_memory(size, what, fix)
    return impl.build(config, spec).train()


def Model(
    model: str,
    variant: str = "softmax",
    *,
    cross_variant: str | None = None,
    seed: int = 0,
    registry: Registry | None = None,
    **options: Any,
) -> nn.Module:
    """``model`` ("encoder", "lm", "seq2seq", or a plugin's) around ``variant`` attention, in train mode.

    Built exactly as ``attnx export`` builds it: the same names, options and seed give the same
    initial weights (drawn under ``torch.manual_seed(seed)`` in a forked RNG, the global RNG is
    untouched), and the variant's paper architecture applies unless given (docs/models.md). So
    ``attnx.export(variant, out, model=model, options=options, checkpoint=...)`` exports the
    trained weights. Inputs and outputs are ``module.input_specs()``/``output_specs()``.

    Args:
        cross_variant: variant of the cross-attention layers (seq2seq only; default softmax).
        options: model and variant options (``d_model=256``, ``eps=1e-6``); a key both have is
            written ``**{"model.x": ..., "variant.x": ...}``.

    Raises:
        AttnxError: unknown names or options (with the closest valid one), a bad value, or a variant
            that cannot serve the model (e.g. a causal ``lm`` around a bidirectional-only variant).
    """
    built = construct(registry or get_registry(), variant, model, options, seed, cross_variant=cross_variant)
    return built.module.train()
