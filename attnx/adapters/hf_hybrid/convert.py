"""The heavy half of the ``hf_hybrid`` adapter (imports transformers and torch): the table of every
architecture's declaration (each imported when a model of its family is met), and the walk's
``convert``/``needs_adapter``/``lengths``."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from types import ModuleType

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

KERNEL_PACKAGES = ("fla", "causal_conv1d", "mamba_ssm")
"""The GPU-kernel packages transformers binds in place of a modeling file's torch functions when that file
is imported (``use_kernel_func_from_hub_with_fallback``). attnx calls the torch functions
(:meth:`Architecture.use_torch_fallbacks`), so a family's modeling files are imported without them:
flash-linear-attention alone takes about 3 s to import."""


class _Unimportable(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import`` of ``names`` (installed packages, not yet imported) fail with ImportError. Their
    specs still resolve, so transformers' availability checks see them as installed, as they are."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = set(names)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: object) -> ModuleType:
        raise ImportError(f"{spec.name} is not imported while attnx imports a modeling file")  # type: ignore[attr-defined]

    def exec_module(self, module: ModuleType) -> None:  # pragma: no cover - create_module raises first
        raise ImportError(module.__name__)


@contextlib.contextmanager
def without_kernel_packages() -> Iterator[None]:
    """Within the block, :data:`KERNEL_PACKAGES` that are installed but not yet imported cannot be imported
    (transformers then binds the torch functions attnx calls anyway); already imported ones are left alone."""
    names = [p for p in KERNEL_PACKAGES if p not in sys.modules and importlib.util.find_spec(p) is not None]
    finder = _Unimportable(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


class _Declarations(Mapping[str, Architecture]):
    """:data:`FAMILIES`' declarations by model type, each imported when first asked for."""

    def __getitem__(self, model_type: str) -> Architecture:
        module, name = FAMILIES[model_type]
        with without_kernel_packages():
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
