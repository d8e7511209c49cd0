"""Declarative description of a model architecture and of its input/output tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from attnx.config import Config, make_config
from attnx.cost import Attend, Part, Shape
from attnx.variant import load_object

if TYPE_CHECKING:
    from torch import nn


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One model input or output.

    Attributes:
        name: ONNX graph name.
        dtype: numpy dtype name ("int64", "bool", "float32"). A model declares its float
            tensors (activations) as "float32"; an fp16 export makes them "float16"
            (:func:`in_dtype`).
        axes: per dimension, a symbolic name (dynamic, e.g. "batch") or a fixed int.
        high: for integer inputs, values are drawn from [0, high).
        doc: what the tensor means, for the manifest.
        bounds: for float inputs, (low, high): values are drawn uniformly between them instead of from a
            normal distribution (a module's input whose example has one sign, e.g. a log-decay <= 0).
    """

    name: str
    dtype: str
    axes: tuple[str | int, ...]
    high: int | None = None
    doc: str = ""
    bounds: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None and v != ""}


# export dtype (recipe ``[export] dtype``) -> numpy name of the model's activations
ACTIVATION_DTYPES = {"fp32": "float32", "fp16": "float16"}


def in_dtype(specs: list[TensorSpec], dtype: str) -> list[TensorSpec]:
    """``specs`` of a model exported in ``dtype`` ("fp32"/"fp16"): its float32 tensors take that dtype."""
    activation = ACTIVATION_DTYPES[dtype]
    return [dataclasses.replace(s, dtype=activation) if s.dtype == "float32" else s for s in specs]


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A model architecture a plugin provides.

    ``impl`` ("module:attribute") names ``build(config, attention) -> nn.Module``, where
    ``attention(spec, role)`` returns the attention layer for an
    :class:`attnx.variant.AttentionSpec`; ``role`` is "self" or "cross". The built
    module exposes ``input_specs()`` and ``output_specs()`` (lists of TensorSpec) and
    a forward taking the inputs in that order.

    ``cost(config, shape, attend) -> Part`` is the FLOPs and working memory of one forward
    (:mod:`attnx.cost`; None: ``attnx bench`` has no estimate for it). ``weights(config) -> int`` is a
    lower bound of its parameter count read from the config alone, so the memory preflight refuses a
    model that cannot fit before building it, even on torch's meta device (None: no early check).
    ``generates``: the model
    has a causal stack that produces tokens one by one (what ``--decode`` exports), so variants'
    ``decoder_defaults`` apply to it.
    """

    name: str
    summary: str
    config: type[Config]
    impl: str
    uses_cross_attention: bool = False
    cost: Callable[[Any, Shape, Attend], Part] | None = None
    generates: bool = False
    weights: Callable[[Any], int] | None = None

    def make_config(self, options: dict[str, Any] | None = None) -> Config:
        return make_config(self.config, options, what=f"{self.name} option")

    def build(self, config: Config, attention: Any) -> nn.Module:
        return load_object(self.impl, f"model '{self.name}'")(config, attention)
