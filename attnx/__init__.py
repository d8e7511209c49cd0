"""attnx: export efficient-attention Transformers to ONNX and TensorRT, and prove parity.

Public API (heavy parts import lazily, so ``import attnx`` stays cheap)::

    import attnx
    result = attnx.export("linear", "out", model="encoder", options={"export.lowering": "function"})
    report = attnx.verify("out")
"""

from __future__ import annotations

from typing import Any

from attnx.errors import AttnxError
from attnx.hookspecs import hookimpl
from attnx.variant import AttentionSpec, Capabilities, Tolerance, Variant

__version__ = "0.1.0"
__all__ = [
    "AttentionSpec",
    "AttnxError",
    "Capabilities",
    "Tolerance",
    "Variant",
    "__version__",
    "bench",
    "export",
    "export_module",
    "generate",
    "get_registry",
    "hookimpl",
    "optimize",
    "save_checkpoint",
    "triton",
    "verify",
]

_LAZY = {
    "export": ("attnx.api", "export"),
    "export_module": ("attnx.api", "export_module"),
    "verify": ("attnx.api", "verify"),
    "optimize": ("attnx.optimizer.optimize", "optimize"),
    "generate": ("attnx.decode.generate", "generate"),
    "bench": ("attnx.bench", "bench"),
    "get_registry": ("attnx.registry", "get_registry"),
    "save_checkpoint": ("attnx.checkpoint", "save_checkpoint"),
    "triton": ("attnx.api", "triton"),
}


_SUBMODULES = ("nn",)  # attnx.nn.Attention(...) after a plain `import attnx`


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        return getattr(importlib.import_module(module_name), attribute)
    if name in _SUBMODULES:
        return importlib.import_module(f"attnx.{name}")
    raise AttributeError(f"module 'attnx' has no attribute '{name}'")
