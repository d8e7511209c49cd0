"""The heavy half of the ``fla`` adapter (imports torch; flash-linear-attention only when a model holds it).

The walk hands every module to :func:`convert`:

* the library's layers attnx maps (:data:`attnx.adapters.fla.layers.LAYERS`) become attnx layers
  with the same parameters (:mod:`attnx.adapters.fla.layers`);
* the Triton modules around them in the library's models (``RMSNorm``, ``LayerNorm``, ``GatedMLP``,
  RWKV-6's and RWKV-7's feed-forwards) become the same computations in torch
  (:mod:`attnx.adapters.fla.parts`);
* any other layer of ``fla.layers`` is refused in one line naming it and the layers attnx maps;
* a model whose config asks for what the walk cannot see (``attnres_block_size``: a fused kernel
  called from the blocks' forward) is refused by that option's name.

:func:`needs_adapter` flags every library class whose forward launches Triton kernels, so one
that is left unconverted anywhere is refused instead of failing in the tracer.

A module none of whose classes comes from the ``fla`` package is passed over by a string test, so
exporting other models neither imports the library (tens of seconds) nor touches Triton's settings.
Converting one of the library's modules switches on the CPU route (:func:`attnx.adapters.fla.cpu.enable`)
where its own forward, the export's parity reference, must run on a CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import torch
from torch import nn

from attnx.adapter import AdapterImpl
from attnx.adapters.fla import cpu, layers, parts
from attnx.adapters.fla.load import load
from attnx.adapters.hf.layers import decoder_layers
from attnx.errors import AttnxError

# fla.modules classes whose forward runs a Triton kernel (the ones the library's models hold).
NATIVE_MODULES = (
    "RMSNorm",
    "LayerNorm",
    "GroupNorm",
    "FusedRMSNormGated",
    "FusedLayerNormGated",
    "ShortConvolution",
    "GatedMLP",
    "RotaryEmbedding",
    "L2Norm",
    "TokenShift",
    "LongConvolution",
    "ImplicitLongConvolution",
)


@dataclasses.dataclass(frozen=True)
class Library:
    """The library's classes the adapter recognises."""

    layers: tuple[type, ...]  # every layer of fla.layers
    native: tuple[type, ...]  # fla.modules classes that launch Triton kernels
    modules: Any  # fla.modules
    feed_forwards: tuple[type, ...]  # fla.models' RWKV-6 and RWKV-7 feed-forwards (layers.FEED_FORWARDS)


@functools.cache
def library() -> Library:
    """Import the library's classes (first called for a module that comes from it)."""
    import fla.layers
    import fla.modules
    from fla.models.rwkv6.modeling_rwkv6 import RWKV6FeedForward
    from fla.models.rwkv7.modeling_rwkv7 import RWKV7FeedForward

    return Library(
        layers=tuple(getattr(fla.layers, name) for name in fla.layers.__all__),
        native=tuple(getattr(fla.modules, name) for name in NATIVE_MODULES),
        modules=fla.modules,
        feed_forwards=(RWKV6FeedForward, RWKV7FeedForward),
    )


def from_library(module: nn.Module) -> bool:
    """Whether the module's class (or one it derives from) is defined in the ``fla`` package."""
    return any(cls.__module__.partition(".")[0] == "fla" for cls in type(module).__mro__)


def supported() -> str:
    return ", ".join(layers.LAYERS)


def convert(module: nn.Module) -> nn.Module | None:
    """The attnx replacement of one of the library's modules, on the module's device; None for
    anything else.

    Raises:
        AttnxError: a library layer attnx does not map, or an option it does not reproduce.
    """
    if not from_library(module):
        return None
    cpu.enable()  # the library's forward (the parity reference) runs in Triton's interpreter without CUDA
    refuse_model_options(module)
    replacement = _replacement(module)
    return None if replacement is None else replacement.to(_device(module))


def _device(module: nn.Module) -> torch.device:
    """Where the module's weights are (its first parameter or buffer); the CPU for a module without."""
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return torch.device("cpu") if tensor is None else tensor.device


def _replacement(module: nn.Module) -> nn.Module | None:
    """The replacement of a library module, its own tensors (rotary frequencies, decays) made on the CPU."""
    lib, kind = library(), type(module)
    if isinstance(module, lib.layers):
        if kind.__name__ not in layers.LAYERS:
            raise AttnxError(
                f"flash-linear-attention layer {kind.__name__} is not exported by attnx; it maps "
                f"{supported()}"
            )
        return layers.LAYERS[kind.__name__](module)
    if isinstance(module, lib.feed_forwards):
        return layers.FEED_FORWARDS[kind.__name__](module)
    if isinstance(module, lib.modules.GatedMLP):
        return parts.SwiGLU(module)
    if kind in (lib.modules.RMSNorm, lib.modules.LayerNorm):
        return parts.Norm(module, rms=kind is lib.modules.RMSNorm)
    return None


def refuse_model_options(module: nn.Module) -> None:
    """A library model whose config uses a fused kernel that no module of the walk holds."""
    config = getattr(module, "config", None)
    if config is None:
        return
    if getattr(config, "attnres_block_size", None) is not None:
        raise AttnxError(
            f"flash-linear-attention {type(module).__name__} with attnres_block_size (attention residuals, "
            "a fused kernel called from its blocks) is not exported by attnx"
        )


def needs_adapter(module: nn.Module) -> bool:
    """A library layer or module whose forward launches Triton kernels."""
    if not from_library(module):
        return False
    lib = library()
    return isinstance(module, (*lib.layers, *lib.native, *lib.feed_forwards))


IMPL = AdapterImpl(convert=convert, needs_adapter=needs_adapter, load=load, layers=decoder_layers)
