"""The heavy half of the ``fast_transformers`` adapter (imports the library and torch).

What the library computes (fast_transformers 0.4, ``attention/linear_attention.py`` and
``causal_linear_attention.py``), and how attnx reproduces it:

* features phi = ``elu(x) + 1`` (``elu_feature_map``, the default); any other feature map is
  refused (random-feature maps redraw their projection at every forward);
* out_i = phi(q_i) . S / (phi(q_i) . Z + eps) with S, Z summed over all keys (``LinearAttention``)
  or keys j <= i (``CausalLinearAttention``): eps is added to the denominator, as in attnx's
  ``linear`` variant, whose ``eps`` option takes the layer's;
* masks: ``key_lengths`` (a ``LengthMask``) zeroes the features of padded keys, i.e. attnx's key
  padding mask; queries are never masked; ``attn_mask`` must be all ones (``FullMask``) for
  ``LinearAttention`` and lower-triangular (``TriangularCausalMask``) for the causal layer, which the
  library checks and so does the adapted layer;
* the projections and the head split are ``AttentionLayer``'s own: only its ``inner_attention``
  is replaced, so the layer's forward (and parameter names) stay the library's;
* decoding: the ``AttentionLayer`` becomes a :class:`SteppingAttentionLayer` (the same object, its
  class a subclass adding :class:`attnx.state.DecodableLayer`'s ``decode_state``/``step`` on the
  library's own projections), so a causal model decodes through its own forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from fast_transformers.attention import AttentionLayer, CausalLinearAttention, LinearAttention
from fast_transformers.feature_maps.base import ActivationFunctionFeatureMap
from torch import nn

from attnx.adapter import AdapterImpl
from attnx.attention import Stepping, merge_heads, split_heads
from attnx.errors import AttnxError
from attnx.registry import get_registry
from attnx.state import StateTensor
from attnx.variant import AttentionSpec

# Library attention classes whose forward runs a C++ kernel torch.export cannot see (the causal
# product, hashing, clustering, local products): they must be converted to export at all.
NATIVE_KERNELS = (
    "CausalLinearAttention",
    "ClusteredAttention",
    "ImprovedClusteredAttention",
    "ImprovedClusteredCausalAttention",
    "LocalAttention",
    "ReformerAttention",
)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
_PROBE = torch.linspace(-30.0, 30.0, 6001)


class LinearKernel(nn.Module):
    """A library ``(Causal)LinearAttention`` computed by attnx's ``linear`` variant.

    ``forward`` takes the library's arguments (per-head ``(N, L, H, E)`` queries, keys and values,
    ``attn_mask``, ``query_lengths``, ``key_lengths``) and returns what the library returns; the
    :class:`SteppingAttentionLayer` around it decodes with its ``kernel``'s ``attend_step``.
    """

    def __init__(self, attention: nn.Module, heads: int | None, d_keys: int, d_values: int) -> None:
        super().__init__()
        check_feature_map(attention)
        self.causal = isinstance(attention, CausalLinearAttention)
        self.heads, self.d_keys, self.d_values = heads, d_keys, d_values
        variant = get_registry().variant("linear")
        config = variant.make_config({"eps": float(attention.eps)})
        spec = AttentionSpec(d_keys * (heads or 1), heads or 1, causal=self.causal)
        with torch.device("meta"):  # the variant layer's own projections are never used
            kernel = variant.load().build(config, spec)
        for name in PROJECTIONS:
            delattr(kernel, name)
        self.kernel = kernel

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attn_mask: Any,
        query_lengths: Any,
        key_lengths: Any,
    ) -> torch.Tensor:
        self._check_mask(attn_mask)
        q, k, v = (t.transpose(1, 2) for t in (queries, keys, values))
        out = self.kernel.attend(q, k, v, key_lengths.bool_matrix)
        return out.transpose(1, 2).contiguous()

    def _check_mask(self, attn_mask: Any) -> None:
        """The library's own checks, as one-line errors."""
        if self.causal and not attn_mask.lower_triangular:
            raise AttnxError(
                "fast-transformers CausalLinearAttention takes only a lower-triangular attn_mask; "
                "pass TriangularCausalMask(L)"
            )
        if not self.causal and not attn_mask.all_ones:
            raise AttnxError(
                "fast-transformers LinearAttention takes no attention mask; pass FullMask(L) (all ones) "
                "and padding as length_mask"
            )

    def decode_state(self) -> list[StateTensor]:
        if not self.causal:
            raise AttnxError(
                "fast-transformers LinearAttention is not causal: it cannot decode token by token"
            )
        if self.heads is None or self.d_keys != self.d_values:
            raise AttnxError(
                "a fast-transformers CausalLinearAttention decodes inside an AttentionLayer with "
                f"d_keys == d_values (got d_keys={self.d_keys}, d_values={self.d_values})"
            )
        return self.kernel.decode_state()


class SteppingAttentionLayer(Stepping, AttentionLayer):
    """The library's ``AttentionLayer`` around a :class:`LinearKernel`, unchanged, that also steps
    (:class:`attnx.state.DecodableLayer`): while ``stepping`` is set (a decode graph of the module),
    its forward on a causal self-attention's input ``queries`` is :meth:`step`."""

    def forward(  # the library's signature
        self,
        queries: torch.Tensor,
        keys: Any,
        values: Any,
        attn_mask: Any,
        query_lengths: Any,
        key_lengths: Any,
    ) -> torch.Tensor:
        if self.stepping is None:
            return super().forward(queries, keys, values, attn_mask, query_lengths, key_lengths)
        self.inner_attention._check_mask(attn_mask)
        return self.stepped(queries)

    def decode_state(self) -> list[StateTensor]:
        return self.inner_attention.decode_state()

    def step(
        self, x: torch.Tensor, state: tuple[torch.Tensor, ...] | None, position: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The library's projections around the kernel's recurrent step (state S, Z)."""
        projections = (self.query_projection, self.key_projection, self.value_projection)
        q, k, v = (split_heads(project(x), self.n_heads) for project in projections)
        out, state = self.inner_attention.kernel.attend_step(q, k, v, state, position)
        return self.out_projection(merge_heads(out)), state


def check_feature_map(attention: nn.Module) -> None:
    """Refuse a feature map other than the library's default elu(x) + 1 (checked on a probe grid).

    Raises:
        AttnxError: naming the feature map and what attnx computes.
    """
    feature_map = attention.feature_map
    same = type(feature_map) is ActivationFunctionFeatureMap
    if same:
        with torch.no_grad():
            same = torch.equal(feature_map(_PROBE), F.elu(_PROBE) + 1)
    if not same:
        raise AttnxError(
            f"fast-transformers {type(attention).__name__} with feature map {type(feature_map).__name__}: "
            "attnx's linear variant computes phi(x) = elu(x) + 1 (the library's default elu_feature_map) "
            "only; random-feature maps redraw at every forward and cannot be exported"
        )


def convert(module: nn.Module) -> nn.Module | None:
    """The library's linear attention layers with attnx ops; None for anything else.

    ``AttentionLayer`` keeps its forward and projections (it is the walk's private copy, so its
    ``inner_attention`` is replaced in place, and its class becomes :class:`SteppingAttentionLayer`,
    which keeps the object, its parameter names and its forward); a bare (Causal)LinearAttention is
    wrapped alone (it decodes only inside an ``AttentionLayer``).
    """
    if isinstance(module, AttentionLayer) and isinstance(
        module.inner_attention, LinearAttention | CausalLinearAttention
    ):
        heads = module.n_heads
        d_keys = module.query_projection.out_features // heads
        d_values = module.value_projection.out_features // heads
        module.inner_attention = LinearKernel(module.inner_attention, heads, d_keys, d_values)
        module.__class__ = SteppingAttentionLayer
        return module
    if isinstance(module, LinearAttention | CausalLinearAttention):
        dims = module.feature_map.query_dims
        return LinearKernel(module, None, dims, dims)
    return None


def needs_adapter(module: nn.Module) -> bool:
    """A library attention class that runs a C++ kernel (see :data:`NATIVE_KERNELS`)."""
    kind = type(module)
    return kind.__module__.startswith("fast_transformers.") and kind.__name__ in NATIVE_KERNELS


IMPL = AdapterImpl(convert=convert, needs_adapter=needs_adapter)
