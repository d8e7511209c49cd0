"""The heavy half of the ``hf_hybrid`` adapter (imports transformers and torch): the table of every
architecture's declaration (each imported when a model of its family is met), and the walk's
``convert``/``needs_adapter``/``lengths``."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping

from torch import nn

from attnx.adapter import AdapterImpl, Lengths
from attnx.adapters.hf.layers import decoder_layers
from attnx.adapters.hf_hybrid.architecture import Architecture

FAMILIES: dict[str, tuple[str, str]] = {
    "qwen3_next": ("qwen", "QWEN3_NEXT"),
    "qwen3_5": ("qwen", "QWEN3_5"),
    "qwen3_5_moe": ("qwen", "QWEN3_5_MOE"),
    "qwen4_exp": ("qwen4", "QWEN4_EXP"),
    "kimi_linear": ("kimi", "KIMI_LINEAR"),
    "minimax": ("minimax", "MINIMAX"),
    "lfm2": ("lfm2", "LFM2"),
    "lfm2_moe": ("lfm2", "LFM2_MOE"),
    "olmo_hybrid": ("olmo", "OLMO_HYBRID"),
    "bailing_hybrid": ("bailing", "BAILING_HYBRID"),
    "lara_mini": ("lara", "LARA_MINI"),
    "mamba2": ("mamba", "MAMBA2"),
    "bamba": ("mamba", "BAMBA"),
    "granitemoehybrid": ("mamba", "GRANITE_MOE_HYBRID"),
    "nemotron_h": ("mamba", "NEMOTRON_H"),
    "falcon_h1": ("mamba", "FALCON_H1"),
    "zamba2": ("mamba", "ZAMBA2"),
    "mamba": ("mamba", "MAMBA"),
    "falcon_mamba": ("mamba", "FALCON_MAMBA"),
    "jamba": ("mamba", "JAMBA"),
    "recurrent_gemma": ("rgemma", "RECURRENT_GEMMA"),
    "xlstm": ("xlstm", "XLSTM"),
    "rwkv": ("rwkv", "RWKV"),
}
"""model_type -> (module of this package, name) of its declaration. Each declaration's classes are those
of ``transformers.models.<model_type>.modeling_<model_type>`` (tests/adapters/hf_hybrid/test_load.py), so
a module is matched with its architecture by its classes' module, and only the families an export meets
are imported: importing every family imports every one of their modeling files."""

_MODELING = re.compile(r"transformers\.models\.(\w+)\.modeling_\1")


class _Declarations(Mapping[str, Architecture]):
    """:data:`FAMILIES`' declarations by model type, each imported when first asked for."""

    def __getitem__(self, model_type: str) -> Architecture:
        module, name = FAMILIES[model_type]
        return getattr(importlib.import_module(f"{__package__}.{module}"), name)

    def __contains__(self, model_type: object) -> bool:
        return model_type in FAMILIES

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


ARCHITECTURES: Mapping[str, Architecture] = _Declarations()


def architecture_of(module: nn.Module) -> Architecture | None:
    """The architecture whose modeling file defines ``module``'s class (or a class it derives from)."""
    for cls in type(module).__mro__:
        found = _MODELING.fullmatch(cls.__module__)
        if found and found.group(1) in FAMILIES:
            return ARCHITECTURES[found.group(1)]
    return None


def convert(module: nn.Module) -> nn.Module | None:
    """A whole hybrid model or one of its layers on attnx ops; None for anything else."""
    architecture = architecture_of(module)
    return architecture.convert(module) if architecture is not None else None


def needs_adapter(module: nn.Module) -> bool:
    """The linear layers (HF's chunked rule loops a traced number of chunks) and MoE experts (a
    data-dependent loop, or grouped_mm without an ONNX translation)."""
    architecture = architecture_of(module)
    return architecture is not None and isinstance(module, architecture.untraceable)


def lengths(module: nn.Module) -> Lengths | None:
    """A whole model takes up to its config's ``max_position_embeddings`` tokens (the rotary table's
    reach, and the context its genai config declares; Mamba2 has none: no limit), and no more than its
    architecture's ``longest`` (Qwen4-Exp's indexer budget); anything else: no limit of its own."""
    arch = architecture_of(module)
    if arch is None or not isinstance(module, arch.models):
        return None
    limit = Lengths(maximum=getattr(module.config, "max_position_embeddings", None))
    return limit if arch.longest is None else limit & Lengths(maximum=arch.longest(module.config))


IMPL = AdapterImpl(convert=convert, needs_adapter=needs_adapter, lengths=lengths, layers=decoder_layers)
