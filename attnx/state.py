"""What a decodable layer carries from one generation step to the next, and how it steps (no torch).

A layer that decodes implements, next to its ``forward`` (:class:`DecodableLayer`):

* ``decode_state() -> list[StateTensor]``: the tensors it carries, each with its shape rule and
  its :data:`Role`;
* ``step(x, state, position) -> (y, state)``: the layer's output for new tokens ``x`` (batch,
  n_new, d_model; the normalised hidden input of the layer, what its ``forward`` takes) that
  continue from ``state`` (a tuple in ``decode_state()`` order; None: nothing before) at
  ``position`` (int64 (1,): how many tokens came before), and the state after them.

The step is the layer's own: it computes whatever it needs from ``x`` (projections, gates, a
short convolution over its carried inputs, an output gate and norm). :class:`attnx.attention.
MultiHeadAttention` gives the default step, q/k/v projections around the variant's
``attend_step(q, k, v, state, position)``; a layer that needs more overrides ``step``.

Two callers drive a step. attnx's own models (:mod:`attnx.decode.model`) call ``step`` in place of
the layer's call. A user's module (``attnx.export_module``) runs its own forward on the new tokens
while each of its decodable layers holds a :class:`Step` in ``stepping``; the layer's ``forward``
then returns ``step(x, past, position)`` and stores the state in ``stepping.present``
(:meth:`attnx.attention.Stepping.stepped` does it), so a layer steps one way whoever calls it.

A seq2seq cross-attention layer needs nothing: its keys and values (``k_proj``/``v_proj`` of the
encoder output) are computed once in prefill and ``attend(q, k, v, source_mask)`` reads them at
every step. Only a layer whose cross-attention depends on where the queries sit in the target
(cosFormer's re-weighting) adds ``attend_cross_step(q, k, v, key_padding_mask, position) -> out``.

Every state tensor has a role, from which serving layouts derive names and packing without knowing
the variant (:data:`ROLES`):

* ``key`` / ``value``: a KV cache (softmax): every earlier key or value; the axis named
  :data:`GROWING` grows by one per token, so a step reads O(position) numbers;
* ``recurrent``: a fixed-size state ("Transformers are RNNs" §3.4: S = sum_j phi(k_j) v_j^T and
  Z = sum_j phi(k_j); the gated/delta rules' S (batch, value heads, d_k, d_v));
* ``conv``: the carry of a short causal depthwise convolution, (batch, channels, kernel - 1).

A layer's kind follows from its roles (:func:`layer_kind`): "kv-cache" or "recurrent"; a model may
mix layers of both kinds (hybrid models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from attnx.errors import AttnxError

GROWING = "past_seq"  # the axis of a kv-cache that holds one entry per earlier token
Role = Literal["key", "value", "recurrent", "conv"]
ROLES: tuple[str, ...] = get_args(Role)
CACHE_ROLES = ("key", "value")  # the roles whose tensors grow along GROWING
LayerKind = Literal["kv-cache", "recurrent"]


@dataclasses.dataclass(frozen=True)
class StateTensor:
    """One state tensor of one layer.

    Attributes:
        name: per-layer name ("key", "kv_sum", "recurrent", "conv"); graph names are
            ``past.<layer>.<name>`` (decode input) and ``present.<layer>.<name>`` (prefill/decode output).
        axes: per dimension an int or "batch" / :data:`GROWING`.
        dtype: numpy dtype name, or None for the activations' dtype (float32, or float16 in an fp16
            export), as a kv-cache and a convolution carry have.
        doc: what it holds.
        role: what serving layouts make of it (:data:`ROLES`); ``key``/``value`` and only they grow.

    Raises:
        AttnxError: an unknown role, a growing axis on a fixed-size role or none on a cache role, or a
            ``conv`` carry that is not (batch, channels, kernel - 1).
    """

    name: str
    axes: tuple[str | int, ...]
    dtype: str | None = None
    doc: str = ""
    role: Role = "recurrent"

    def __post_init__(self) -> None:
        what = f"state tensor '{self.name}'"
        if self.role not in ROLES:
            raise AttnxError(f"{what} has role {self.role!r}; choose one of {', '.join(ROLES)}")
        if self.grows != (self.role in CACHE_ROLES):
            raise AttnxError(
                f"{what} (role {self.role}) must {'' if self.role in CACHE_ROLES else 'not '}have the "
                f"growing axis '{GROWING}': only a KV cache's key and value grow"
            )
        conv = (
            len(self.axes) == 3 and self.axes[0] == "batch" and all(isinstance(a, int) for a in self.axes[1:])
        )
        if self.role == "conv" and not conv:
            raise AttnxError(
                f"{what} (role conv) must have axes ('batch', channels, kernel - 1), not {self.axes}"
            )

    @property
    def grows(self) -> bool:
        return GROWING in self.axes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def layer_kind(roles: Sequence[str]) -> LayerKind:
    """A layer's kind from its state tensors' roles: "kv-cache" if it caches keys/values, else "recurrent"."""
    return "kv-cache" if any(role in CACHE_ROLES for role in roles) else "recurrent"


def kv_cache(heads: int, head_dim: int) -> list[StateTensor]:
    """A KV cache: keys and values of every earlier token, (batch, heads, past_seq, head_dim), in the
    activations' dtype (widening it would copy the whole cache at every step)."""
    axes = ("batch", heads, GROWING, head_dim)
    return [
        StateTensor("key", axes, doc="keys of earlier tokens", role="key"),
        StateTensor("value", axes, doc="values of earlier tokens", role="value"),
    ]


def recurrent_state(heads: int, features: int, d_value: int, what: str) -> list[StateTensor]:
    """The (S, Z) pair of kernelised linear attention with ``features`` = dim of phi; float32 in
    any export (the step ops accumulate in float32, so an fp16 model's sums cannot overflow)."""
    return [
        StateTensor(
            "kv_sum", ("batch", heads, features, d_value), "float32", doc=f"S = sum_j {what}(k_j) v_j^T"
        ),
        StateTensor("k_sum", ("batch", heads, features), "float32", doc=f"Z = sum_j {what}(k_j)"),
    ]


def conv_state(channels: int, kernel: int) -> StateTensor:
    """The carry of a short causal depthwise convolution of width ``kernel`` over ``channels``: the
    last ``kernel - 1`` inputs, (batch, channels, kernel - 1), in the activations' dtype."""
    doc = f"the last {kernel - 1} inputs of the causal depthwise convolution (kernel {kernel})"
    return StateTensor("conv", ("batch", channels, kernel - 1), doc=doc, role="conv")


@runtime_checkable
class DecodableLayer(Protocol):
    """A layer that decodes token by token (its variant declares ``Capabilities.decode``)."""

    def decode_state(self) -> list[StateTensor]:
        """The layer's state tensors."""

    def step(self, x: Any, state: tuple[Any, ...] | None, position: Any) -> tuple[Any, tuple[Any, ...]]:
        """The output for new tokens ``x`` after ``state`` (None: none) at ``position``; the next state."""


@runtime_checkable
class PositionalCrossAttention(Protocol):
    """A cross-attention layer whose output depends on where its queries sit in the target (cosFormer)."""

    def attend_cross_step(self, q: Any, k: Any, v: Any, key_padding_mask: Any, position: Any) -> Any:
        """Cross-attention of target queries from ``position`` on over cached keys/values."""


@dataclasses.dataclass
class Step:
    """One decode call of a layer inside a module's own forward: the state before the new tokens (None:
    nothing before), the position of the first new token (int64 (1,)), and the state after them,
    which the layer sets."""

    past: tuple[Any, ...] | None
    position: Any
    present: tuple[Any, ...] | None = None
