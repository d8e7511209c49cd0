"""The heavy half of the ``fla`` adapter (imports flash-linear-attention and torch).

The walk hands every module to :func:`convert`:

* the library's layers attnx maps (:data:`attnx.adapters.fla.layers.LAYERS`) become attnx layers
  with the same parameters (:mod:`attnx.adapters.fla.layers`);
* the Triton modules around them in the library's models (``RMSNorm``, ``LayerNorm``, ``GatedMLP``,
  RWKV-6's feed-forward) become the same computations in torch (:mod:`attnx.adapters.fla.parts`);
* any other layer of ``fla.layers`` is refused in one line naming it and the layers attnx maps;
* a model whose config asks for what the walk cannot see (``attnres_block_size``: a fused kernel
  called from the blocks' forward) is refused by that option's name.

:func:`needs_adapter` flags every library class whose forward launches Triton kernels, so one
that is left unconverted anywhere is refused instead of failing in the tracer.
"""

from __future__ import annotations

from attnx.adapters.fla.cpu import enable

enable()  # before fla is imported: without CUDA its kernels run in Triton's interpreter (cpu.py)

import fla.layers  # noqa: E402
import fla.modules  # noqa: E402
from fla.models.rwkv6.modeling_rwkv6 import RWKV6FeedForward  # noqa: E402
from torch import nn  # noqa: E402

from attnx.adapter import AdapterImpl  # noqa: E402
from attnx.adapters.fla import layers, parts  # noqa: E402
from attnx.adapters.fla.load import load  # noqa: E402
from attnx.errors import AttnxError  # noqa: E402

# fla.modules classes whose forward runs a Triton kernel (the ones the library's models hold).
NATIVE_MODULES = tuple(
    getattr(fla.modules, name)
    for name in (
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
)
LIBRARY_LAYERS = tuple(getattr(fla.layers, name) for name in fla.layers.__all__)


def supported() -> str:
    return ", ".join(layers.LAYERS)


def convert(module: nn.Module) -> nn.Module | None:
    """The attnx replacement of one of the library's modules; None for anything else.

    Raises:
        AttnxError: a library layer attnx does not map, or an option it does not reproduce.
    """
    refuse_model_options(module)
    kind = type(module)
    if isinstance(module, LIBRARY_LAYERS):
        if kind.__name__ not in layers.LAYERS:
            raise AttnxError(
                f"flash-linear-attention layer {kind.__name__} is not exported by attnx; it maps "
                f"{supported()}"
            )
        return layers.LAYERS[kind.__name__](module)
    if isinstance(module, RWKV6FeedForward):
        return layers.RWKV6FeedForward(module)
    if isinstance(module, fla.modules.GatedMLP):
        return parts.SwiGLU(module)
    if type(module) in (fla.modules.RMSNorm, fla.modules.LayerNorm):
        return parts.Norm(module, rms=isinstance(module, fla.modules.RMSNorm))
    return None


def refuse_model_options(module: nn.Module) -> None:
    """A library model whose config uses a fused kernel that no module of the walk holds."""
    config = getattr(module, "config", None)
    if config is None or not type(module).__module__.startswith("fla."):
        return
    if getattr(config, "attnres_block_size", None) is not None:
        raise AttnxError(
            f"flash-linear-attention {type(module).__name__} with attnres_block_size (attention residuals, "
            "a fused kernel called from its blocks) is not exported by attnx"
        )


def needs_adapter(module: nn.Module) -> bool:
    """A library layer or module whose forward launches Triton kernels."""
    return isinstance(module, LIBRARY_LAYERS + NATIVE_MODULES + (RWKV6FeedForward,))


IMPL = AdapterImpl(convert=convert, needs_adapter=needs_adapter, load=load)
