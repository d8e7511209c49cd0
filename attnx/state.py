"""What a decodable attention layer carries from one generation step to the next (no torch).

A layer that decodes implements, next to its ``forward``:

* ``decode_state() -> list[StateTensor]``: its state tensors, per layer;
* ``attend_step(q, k, v, state, position) -> (out, next_state)``: per-head attention of
  the new tokens (q, k, v are (batch, heads, n_new, d)) that continues from ``state``
  (None: nothing before) at ``position`` (int64 (1,): how many tokens came before).

A seq2seq cross-attention layer needs nothing: its keys and values (``k_proj``/``v_proj``
of the encoder output) are computed once in prefill and ``attend(q, k, v, source_mask)``
reads them at every step. Only a layer whose cross-attention depends on where the
queries sit in the target (cosFormer's re-weighting) adds
``attend_cross_step(q, k, v, key_padding_mask, position) -> out``, for target queries
from ``position`` on; it may raise :class:`attnx.errors.AttnxError` to refuse decoding.

A layer with a call convention of its own (an adapter's replacement for a third-party
layer, :mod:`attnx.adapter`) cannot be driven through ``attend_step``: it implements
:class:`SteppingAttention` instead, and the decode graphs of an ``attnx.export_module`` export
run the module's own forward on the new tokens while each such layer holds a :class:`Step`.

Two kinds of state exist (:attr:`attnx.variant.Capabilities.decode`):

* ``kv-cache`` (softmax): every earlier key and value; the axis named :data:`GROWING`
  grows by one per token, so each step reads O(position) numbers;
* ``recurrent`` (linear, cosFormer): fixed-size sums ("Transformers are RNNs" §3.4),
  S = sum_j phi(k_j) v_j^T and Z = sum_j phi(k_j); a step costs the same at any position.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

GROWING = "past_seq"  # the axis of a kv-cache that holds one entry per earlier token


@dataclasses.dataclass(frozen=True)
class StateTensor:
    """One state tensor of one layer.

    Attributes:
        name: per-layer name ("key", "kv_sum"); graph names are ``past.<layer>.<name>``
            (decode input) and ``present.<layer>.<name>`` (prefill/decode output).
        axes: per dimension an int or "batch" / :data:`GROWING`.
        dtype: numpy dtype name, or None for the activations' dtype (float32, or float16 in
            an fp16 export), as a kv-cache has.
        doc: what it holds.
    """

    name: str
    axes: tuple[str | int, ...]
    dtype: str | None = None
    doc: str = ""

    @property
    def grows(self) -> bool:
        return GROWING in self.axes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def recurrent_state(heads: int, features: int, d_value: int, what: str) -> list[StateTensor]:
    """The (S, Z) pair of kernelised linear attention with ``features`` = dim of phi; float32 in
    any export (the step ops accumulate in float32, so an fp16 model's sums cannot overflow)."""
    return [
        StateTensor(
            "kv_sum", ("batch", heads, features, d_value), "float32", doc=f"S = sum_j {what}(k_j) v_j^T"
        ),
        StateTensor("k_sum", ("batch", heads, features), "float32", doc=f"Z = sum_j {what}(k_j)"),
    ]


@runtime_checkable
class DecodableAttention(Protocol):
    """An attention layer that decodes token by token (its variant declares ``Capabilities.decode``)."""

    def decode_state(self) -> list[StateTensor]:
        """The layer's state tensors."""

    def attend_step(
        self, q: Any, k: Any, v: Any, state: tuple[Any, ...] | None, position: Any
    ) -> tuple[Any, tuple[Any, ...]]:
        """Per-head attention of new tokens after ``state`` (None: none) at ``position``: (out, state)."""


@runtime_checkable
class PositionalCrossAttention(Protocol):
    """A cross-attention layer whose output depends on where its queries sit in the target (cosFormer)."""

    def attend_cross_step(self, q: Any, k: Any, v: Any, key_padding_mask: Any, position: Any) -> Any:
        """Cross-attention of target queries from ``position`` on over cached keys/values."""


@dataclasses.dataclass
class Step:
    """One decode call of a :class:`SteppingAttention` layer: the state before the new tokens (None:
    nothing before), the position of the first new token (int64 (1,)), and the state after them,
    which the layer sets."""

    past: tuple[Any, ...] | None
    position: Any
    present: tuple[Any, ...] | None = None


@runtime_checkable
class SteppingAttention(Protocol):
    """An attention layer that decodes through its own forward (whatever its signature): while
    ``stepping`` holds a :class:`Step`, the forward attends the new tokens it is given after
    ``stepping.past`` and stores the state after them in ``stepping.present``; while it is None, the
    forward is the ordinary full one. The decode machinery sets and clears ``stepping``."""

    stepping: Step | None

    def decode_state(self) -> list[StateTensor]:
        """The layer's state tensors."""
