"""``fast_transformers``: pytorch-fast-transformers' linear attention, exported as attnx's ``linear``.

``LinearAttention`` and ``CausalLinearAttention`` (inside the library's ``AttentionLayer``, as
``TransformerEncoderBuilder`` models hold them) become attnx ``LinearAttention`` ops with the
layer's own projections, head split, ``eps`` and masks; the causal layers decode with an O(1)
recurrent state. The library's own ONNX export of the causal layer is silently wrong (its C++
kernel writes into a tensor the tracer never sees): docs/importing.md.
"""

from __future__ import annotations

from attnx.adapter import Adapter
from attnx.hookspecs import hookimpl

ADAPTER = Adapter(
    name="fast_transformers",
    summary="pytorch-fast-transformers LinearAttention / CausalLinearAttention (elu+1) -> linear",
    library="pytorch-fast-transformers",
    impl="attnx.adapters.fast_transformers.convert:IMPL",
)


@hookimpl
def attnx_register_adapters() -> list[Adapter]:
    return [ADAPTER]
