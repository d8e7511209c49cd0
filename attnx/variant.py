"""The declarative description of an attention variant (importable without torch).

A plugin returns :class:`Variant` objects from ``attnx_register_variants``. Everything
needed to list, validate and choose a variant lives here; the torch/ONNX side
(:class:`attnx.ops.VariantImpl`) is loaded lazily from ``impl`` ("module:attribute"),
so ``attnx --help`` and ``attnx list`` never import torch.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from attnx.config import Config, make_config
from attnx.cost import AttentionCost, Shape
from attnx.errors import AttnxError

if TYPE_CHECKING:
    from attnx.ops import VariantImpl

DecodeMode = Literal["kv-cache", "recurrent"]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a variant's module supports; attnx refuses other uses before building.

    ``bidirectional``: every query attends every key (an encoder, a seq2seq's encoder). The gated and
    delta rules are causal only: such a variant declares ``bidirectional=False`` and serves ``lm``s.

    ``fp16``: the variant exports in half precision with parity against torch in fp16. A
    variant whose output is a discontinuous function of its inputs (reformer's LSH buckets)
    cannot promise that: fp16 rounding differences between backends change its decisions.

    ``trainable``: its ops have a backward (``attnx.ops.trainable_op``, or their own
    ``torch.library.register_autograd``) that computes the gradients in float64 too, so the
    conformance kit can ``gradcheck`` it. Off unless declared: an op without a registered
    backward makes ``loss.backward()`` raise, and a plugin must not claim gradients that no
    check has seen (the kit holds a non-trainable variant to that error, never silent gradients).
    """

    causal: bool = False
    cross: bool = False
    key_padding_mask: bool = True
    bidirectional: bool = True
    decode: DecodeMode | None = None
    fp16: bool = True
    trainable: bool = False


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Parity tolerances: an element passes when |a-b| <= atol or |a-b| <= rtol*|b| (b: torch's
    value; Polygraphy's element-wise check)."""

    atol: float
    rtol: float


# fp16 carries 11 significant bits: a model's outputs of magnitude ~8 are 1 ulp = 0.0078 apart, and
# torch and ONNX Runtime round each layer's GEMMs and norms separately.
FP16_TOLERANCE = Tolerance(atol=2e-2, rtol=1e-2)


@dataclasses.dataclass(frozen=True)
class TestOptions:
    """What the conformance kit and attnx's own test tables try a variant with.

    ``options``: variant options that make small test inputs exercise the variant's interesting
    paths (e.g. Reformer's chunk_size 4, so 11 tokens span several chunks); ``bad_options``:
    ``{option: value}`` pairs ``validate()`` must reject, each tried alone.
    """

    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    bad_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


CostModel = Callable[[Shape, Any], AttentionCost]


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What a model asks of an attention layer.

    ``layer`` / ``n_layers``: where the layer sits in its stack (0-based) and how many layers the stack
    has, for variants whose fixed parameters depend on depth (MiniMax-01's decay slopes).
    """

    d_model: int
    n_heads: int
    causal: bool = False
    cross: bool = False
    layer: int = 0
    n_layers: int = 1

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclasses.dataclass(frozen=True)
class Variant:
    """One attention variant, as a plugin declares it.

    Attributes:
        name: CLI name (``--variant``), lower-case.
        summary: one line for ``attnx list``.
        paper: citation, e.g. "Transformers are RNNs (arXiv 2006.16236)".
        config: the variant's options as a :class:`attnx.config.Config` dataclass.
        capabilities: what the module supports.
        tolerance: default fp32 parity tolerance ORT vs torch.
        impl: "module:attribute" of the :class:`attnx.ops.VariantImpl` (torch module
            builder, ONNX ops, TensorRT plugins), imported on first use.
        fp16_tolerance: default parity tolerance of an fp16 export (ORT fp16 vs torch fp16).
        cost: ``cost(shape, config) -> AttentionCost`` of one layer (:mod:`attnx.cost`): FLOPs for
            achieved-rate reports and a memory bound that lets ``attnx bench`` skip cases that
            cannot fit. None: the benchmark assumes quadratic memory and reports no FLOPs.
        model_defaults: model options the variant's paper pairs it with (Reformer: reversible
            residuals, chunked FFN), applied when the user does not set them.
        decoder_defaults: variant options applied, unless given, when the variant serves a
            model that generates (``lm``, ``seq2seq``): e.g. cosFormer's fixed M.
        position_limit_option: the option that bounds the positions a model can use (cosFormer's
            ``max_len``); generation and benchmarks respect it. None: no limit.
        testing: options for tests and the conformance kit.
    """

    name: str
    summary: str
    paper: str
    config: type[Config]
    capabilities: Capabilities
    tolerance: Tolerance
    impl: str
    fp16_tolerance: Tolerance = FP16_TOLERANCE
    cost: CostModel | None = None
    model_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    decoder_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    position_limit_option: str | None = None
    testing: TestOptions = dataclasses.field(default_factory=TestOptions)

    def position_limit(self, config: Config) -> int | None:
        """The largest position a model with this ``config`` handles (None: no limit)."""
        if self.position_limit_option is None:
            return None
        return getattr(config, self.position_limit_option) or None

    def tolerance_for(self, dtype: str) -> Tolerance:
        """The parity tolerance of an export in ``dtype`` ("fp32" or "fp16")."""
        return self.fp16_tolerance if dtype == "fp16" else self.tolerance

    def make_config(self, options: dict[str, Any] | None = None) -> Config:
        return make_config(self.config, options, what=f"{self.name} option")

    def load(self) -> VariantImpl:
        """Import and return the torch/ONNX implementation."""
        return load_object(self.impl, f"variant '{self.name}'")

    def check_spec(self, spec: AttentionSpec) -> None:
        """Refuse uses the variant does not support, with a one-line reason."""
        caps = self.capabilities
        if not (spec.causal or spec.cross or caps.bidirectional):
            raise AttnxError(
                f"variant '{self.name}' does not support bidirectional attention ({describe(caps)}); "
                "use it causal (causal=True)"
            )
        if spec.causal and not caps.causal:
            raise AttnxError(f"variant '{self.name}' does not support causal attention ({describe(caps)})")
        if spec.cross and not caps.cross:
            raise AttnxError(f"variant '{self.name}' does not support cross attention ({describe(caps)})")
        if spec.d_model % spec.n_heads:
            raise AttnxError(f"d_model={spec.d_model} must be divisible by n_heads={spec.n_heads}")


def describe(caps: Capabilities) -> str:
    """Human summary of capabilities, e.g. "supports: bidirectional, causal, cross"."""
    parts = [name for name in ("bidirectional", "causal", "cross") if getattr(caps, name)]
    if caps.key_padding_mask:
        parts.append("key padding mask")
    if caps.decode:
        parts.append(f"decode ({caps.decode})")
    parts.append("fp16" if caps.fp16 else "fp32 only")
    if caps.trainable:
        parts.append("trainable")
    return "supports: " + ", ".join(parts)


def load_object(path: str, what: str) -> Any:
    """Resolve "package.module:attribute"."""
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute) if attribute else module
    except AttributeError:
        raise AttnxError(f"{what}: '{module_name}' has no attribute '{attribute}'") from None
