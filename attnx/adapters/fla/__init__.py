"""``fla``: flash-linear-attention's layers and models, exported on attnx's gated / delta-rule op.

``LinearAttention``, ``GatedLinearAttention``, ``DeltaNet``, ``GatedDeltaNet``, ``GatedDeltaProduct``,
``HGRN2Attention``, ``MultiScaleRetention``, ``RWKV6Attention``, ``RWKV7Attention`` and ``Mamba2`` (in a
user's module, or in the library's causal LMs: ``attnx export --from fla:DIR`` for a ``save_pretrained``
directory) become attnx layers with the library's parameters, its gates and norms in torch and the
recurrence on ``attnx::gated_delta_rule`` (RWKV-7: ``attnx::generalized_delta_rule``); they decode with
an O(1) state. See docs/importing.md.
"""

from __future__ import annotations

from attnx.adapter import Adapter
from attnx.hookspecs import hookimpl

ADAPTER = Adapter(
    name="fla",
    summary="flash-linear-attention linear attention, GLA, (Gated) DeltaNet/DeltaProduct, HGRN2, RetNet, "
    "RWKV-6/7, Mamba2 -> gated ops",
    library="flash-linear-attention",
    impl="attnx.adapters.fla.convert:IMPL",
    sources=("fla",),
    extra="fla",
)


@hookimpl
def attnx_register_adapters() -> list[Adapter]:
    return [ADAPTER]
