"""The heavy half of the ``hf_hybrid`` adapter (imports transformers and torch): every architecture's
declaration, the walk's ``convert``/``needs_adapter``/``lengths``, and ``--from hf:DIR`` loading."""

from __future__ import annotations

from torch import nn

from attnx.adapter import AdapterImpl, Lengths
from attnx.adapters.hf_hybrid.architecture import Architecture
from attnx.adapters.hf_hybrid.bailing import BAILING_HYBRID
from attnx.adapters.hf_hybrid.kimi import KIMI_LINEAR
from attnx.adapters.hf_hybrid.lara import LARA_MINI
from attnx.adapters.hf_hybrid.lfm2 import LFM2, LFM2_MOE
from attnx.adapters.hf_hybrid.mamba import (
    BAMBA,
    FALCON_H1,
    FALCON_MAMBA,
    GRANITE_MOE_HYBRID,
    JAMBA,
    MAMBA,
    MAMBA2,
    NEMOTRON_H,
    ZAMBA2,
)
from attnx.adapters.hf_hybrid.minimax import MINIMAX
from attnx.adapters.hf_hybrid.olmo import OLMO_HYBRID
from attnx.adapters.hf_hybrid.qwen import QWEN3_5, QWEN3_5_MOE, QWEN3_NEXT
from attnx.adapters.hf_hybrid.qwen4 import QWEN4_EXP
from attnx.adapters.hf_hybrid.rgemma import RECURRENT_GEMMA
from attnx.adapters.hf_hybrid.rwkv import RWKV
from attnx.adapters.hf_hybrid.xlstm import XLSTM

ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        QWEN3_NEXT,
        QWEN3_5,
        QWEN3_5_MOE,
        QWEN4_EXP,
        KIMI_LINEAR,
        MINIMAX,
        LFM2,
        LFM2_MOE,
        OLMO_HYBRID,
        BAILING_HYBRID,
        LARA_MINI,
    )
    + (MAMBA2, BAMBA, GRANITE_MOE_HYBRID, NEMOTRON_H, FALCON_H1, ZAMBA2, MAMBA, FALCON_MAMBA, JAMBA)
    + (RECURRENT_GEMMA, XLSTM, RWKV)
}


def convert(module: nn.Module) -> nn.Module | None:
    """A whole hybrid model or one of its layers on attnx ops; None for anything else."""
    for architecture in ARCHITECTURES.values():
        replacement = architecture.convert(module)
        if replacement is not None:
            return replacement
    return None


def needs_adapter(module: nn.Module) -> bool:
    """The linear layers (HF's chunked rule loops a traced number of chunks) and MoE experts (a
    data-dependent loop, or grouped_mm without an ONNX translation)."""
    return any(isinstance(module, a.untraceable) for a in ARCHITECTURES.values())


def lengths(module: nn.Module) -> Lengths | None:
    """A whole model takes up to its config's ``max_position_embeddings`` tokens (the rotary table's
    reach, and the context its genai config declares; Mamba2 has none: no limit), and no more than its
    architecture's ``longest`` (Qwen4-Exp's indexer budget); anything else: no limit of its own."""
    arch = next((a for a in ARCHITECTURES.values() if isinstance(module, a.models)), None)
    if arch is None:
        return None
    limit = Lengths(maximum=getattr(module.config, "max_position_embeddings", None))
    return limit if arch.longest is None else limit & Lengths(maximum=arch.longest(module.config))


IMPL = AdapterImpl(convert=convert, needs_adapter=needs_adapter, lengths=lengths)
