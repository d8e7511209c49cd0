"""``OUT/attnx.json``: everything needed to rebuild, verify and serve an export, as typed sections.

The manifest is read strictly (:meth:`Manifest.from_json`): an unknown schema version, a
missing or wrongly typed field, an unknown lowering, or a file entry that points outside OUT is
a one-line :class:`AttnxError`. Every file of the export is listed with its SHA-256, so a
replaced ``model.onnx`` (or decode graph, or weights file) is refused, not compared.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from attnx.adapter import Lengths
from attnx.config import expected_type, value_type
from attnx.domains import Lowering
from attnx.errors import AttnxError
from attnx.limits import MAX_SEED
from attnx.models.spec import TensorSpec
from attnx.state import CACHE_ROLES, GROWING, LayerKind, layer_kind

MANIFEST = "attnx.json"
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "weights.safetensors"
PARITY_FILE = "parity.json"
SCHEMA_VERSION = 3  # 3: per-layer decode state (roles, layer kinds), genai 0.18 state names, targets
_PACKAGES = ("attnx", "torch", "onnx", "onnxscript", "onnxruntime", "polygraphy", "tensorrt")
T = TypeVar("T")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclasses.dataclass
class FileRecord:
    """One file of the export: its name inside OUT and its SHA-256."""

    path: str
    sha256: str


@dataclasses.dataclass
class GraphIO:
    """The inputs and outputs of one graph."""

    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


@dataclasses.dataclass
class StatePair:
    """A state tensor a runtime carries between decode calls: ``output`` of one call is ``input`` of the
    next (``layer`` None and ``role`` "position": the position counter). ``role`` is the layer's
    declaration (:data:`attnx.state.ROLES`: "key"/"value" of a KV cache, "recurrent", "conv")."""

    input: str
    output: str
    layer: int | None
    name: str
    role: Literal["position", "key", "value", "recurrent", "conv"]
    axes: list[str | int]
    dtype: str
    doc: str = ""

    @property
    def grows(self) -> bool:
        """Whether it has a KV cache's growing axis (one entry per earlier token)."""
        return GROWING in self.axes


@dataclasses.dataclass
class ContextInput:
    """A decode input that stays as prefill made ("prefill output") or took ("prefill input") it."""

    input: str
    source: Literal["prefill output", "prefill input"]


@dataclasses.dataclass
class DecodeSection:
    """``prefill.onnx`` + ``decode.onnx`` (files "prefill" and "decode") and how to drive them.

    ``layers``: the kind of each layer's state, layer by layer ("kv-cache" or "recurrent"; a hybrid
    model mixes them); ``tokens``: the token input of both graphs; ``state``: the tensors fed back at
    each step, each with its layer and role; ``context``: inputs that stay fixed after prefill;
    ``loop``: the same in words, for a reader of the JSON.
    """

    layers: list[LayerKind]
    tokens: str
    prefill: GraphIO
    decode: GraphIO
    state: list[StatePair]
    context: list[ContextInput]
    dynamic_state_axes: list[str]
    loop: str = ""

    def check(self) -> None:
        """Check that the section describes a loop a runtime can drive.

        Every decode input must be the token input, a state input or a context input; each state
        output must come out of both graphs; each context input must be a prefill output or input.
        """
        names = {
            (graph, side): {s.name for s in getattr(getattr(self, graph), side)}
            for graph in ("prefill", "decode")
            for side in ("inputs", "outputs")
        }
        fed = {self.tokens} | {s.input for s in self.state} | {c.input for c in self.context}
        if self.tokens not in names["prefill", "inputs"]:
            raise _malformed(f"the token input {self.tokens!r} is not a prefill input")
        if fed != names["decode", "inputs"]:
            unfed, extra = sorted(names["decode", "inputs"] - fed), sorted(fed - names["decode", "inputs"])
            raise _malformed(
                f"decode inputs not fed by tokens/state/context: {unfed}; fed, not inputs: {extra}"
            )
        both = names["prefill", "outputs"] & names["decode", "outputs"]
        for output in ["logits", *(s.output for s in self.state)]:
            if output not in both:
                raise _malformed(f"{output!r} is not an output of both graphs")
        for context in self.context:
            side = "outputs" if context.source == "prefill output" else "inputs"
            if context.input not in names["prefill", side]:
                raise _malformed(f"context input {context.input!r} is not a {context.source!r}")
        self._check_layers()

    def _check_layers(self) -> None:
        """Each layer's kind follows from its tensors' roles, and only a KV cache grows."""
        for pair in self.state:
            if (pair.layer is None) != (pair.role == "position") or pair.grows != (pair.role in CACHE_ROLES):
                raise _malformed(f"state {pair.input!r} has role {pair.role!r} and axes {pair.axes}")
        by_layer = self.layer_state()
        if sorted(by_layer) != list(range(len(self.layers))):
            raise _malformed(
                f"'layers' lists {len(self.layers)} layers, the state has layers {sorted(by_layer)}"
            )
        for layer, pairs in by_layer.items():
            kind = layer_kind([p.role for p in pairs])
            if self.layers[layer] != kind:
                raise _malformed(f"layer {layer} is listed as {self.layers[layer]!r}, its state is {kind!r}")

    def layer_state(self) -> dict[int, list[StatePair]]:
        """The state tensors of each layer, in order (the position counter left out)."""
        found: dict[int, list[StatePair]] = {}
        for pair in self.state:
            if pair.layer is not None:
                found.setdefault(pair.layer, []).append(pair)
        return found

    def summary(self) -> str:
        """E.g. "recurrent state", "kv-cache state" or "hybrid state: 2 kv-cache + 2 recurrent layers"."""
        counts = {kind: self.layers.count(kind) for kind in sorted(set(self.layers))}
        if len(counts) == 1:
            return f"{self.layers[0]} state"
        return "hybrid state: " + " + ".join(f"{n} {kind}" for kind, n in counts.items()) + " layers"

    def feeds(self) -> dict[str, str]:
        """State output name -> the input it feeds at the next step."""
        return {s.output: s.input for s in self.state}

    @property
    def vocab_size(self) -> int:
        """Token ids are below this (the token input's ``high``)."""
        (tokens,) = [s for s in self.prefill.inputs if s.name == self.tokens]
        return int(tokens.high or 0)


def _malformed(why: str) -> AttnxError:
    return AttnxError(
        f"attnx.json's decode section is malformed: {why}; re-export with attnx export --decode"
    )


@dataclasses.dataclass
class PluginLayer:
    """A plugin layer of a built engine, as TensorRT's engine inspector reports it."""

    name: str
    plugin: str  # the plugin type the inspector names (its LayerType when it names none)
    precision: str  # data type of its output: "fp32", "fp16", ...
    tactic: str | None  # the tactic TensorRT chose (an AOT kernel's tactic number), when reported


@dataclasses.dataclass
class EngineSection:
    """``OUT/engine.plan`` as ``attnx build`` made it (file "engine").

    The precision fields are what the built engine holds (TensorRT's engine inspector), not what
    was asked for: ``precisions`` counts layers per output data type, ``fp16`` says whether any layer
    computes in fp16 (the parity check then applies the fp16 tolerance to an fp32 export's engine).
    ``typing`` is "strong" (TensorRT >= 11: the ONNX dtypes decide) or "weak" (TensorRT 10 flags).
    ``plugin_mode``: how the attnx plugins run, "aot" (Triton kernels compiled to PTX and serialised
    into the engine), "jit" (Python callbacks into the variant's torch op) or None (no plugins);
    ``needs_python``: loading the engine needs Python with attnx's plugins registered (JIT plugins).
    """

    model_sha256: str
    tensorrt: str
    device: str
    fp16: bool
    workspace: int | None
    profiles: list[dict[str, dict[str, list[int]]]]
    plugins: list[str]  # attnx plugin ids registered for the build
    typing: Literal["strong", "weak"]
    plugin_mode: Literal["aot", "jit"] | None
    needs_python: bool
    precisions: dict[str, int]
    layer_types: dict[str, int]
    plugin_layers: list[PluginLayer]


@dataclasses.dataclass
class TokenizerSection:
    """``tokenizer.json`` (file "tokenizer", a Hugging Face tokenizer; with "tokenizer_config") and the
    special token ids found in it (None: it names none)."""

    vocab_size: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None


@dataclasses.dataclass
class GenaiState:
    """One state tensor of ``genai.onnx``: genai feeds output ``present`` back as input ``past``.

    ``carries``: the decode graph's state inputs it holds, concatenated along the last axis when
    several (linear attention's S and Z in one ``recurrent``); empty: a placeholder genai requires
    that holds no attnx state (the ``conv`` of a recurrent layer without a convolution). ``part``:
    where the runtime splits its one carried tensor into several states (transformers.js's OLMo Hybrid
    conv: query, key, value), the [start, stop) of that tensor's axis 1 it holds; None: all of it.
    """

    layer: int
    role: Literal["key", "value", "recurrent", "conv"]
    past: str
    present: str
    carries: list[str]
    part: list[int] | None = None


@dataclasses.dataclass
class GenaiSection:
    """A runtime's decoder of an lm decode export: the decode graph under the runtime's input/output
    names, and every state tensor the runtime carries, layer by layer. Section ``genai``:
    onnxruntime-genai's ``genai.onnx`` (file "genai") described by ``genai_config.json`` (file
    "genai_config"); section ``transformers_js``: transformers.js's ``transformers-js.onnx`` (file
    "transformers_js") beside the model's Hugging Face ``config.json`` (file "hf_config")."""

    state: list[GenaiState]
    # the bodies of this graph's attnx ops when they are not the export's: genai.onnx takes ONNX Runtime's
    # kernels (target "ort") where its ops declare them, since only ONNX Runtime runs it
    target: TargetSection | None = None
    # genai.onnx's KV caches in one buffer that past and present share (search.past_present_share_buffer,
    # attnx.serve.kv_buffer); False: they grow by concatenation, as in decode.onnx
    shared_kv: bool = False


@dataclasses.dataclass
class ModuleSection:
    """Where the torch reference of an ``attnx.export_module`` export comes from: a user's
    ``nn.Module``, not a registered model (the manifest's ``model`` is then "module").

    ``program``: the manifest file key of its ``torch.export`` program after the adapters (torch.export's
    JSON form), ``tensors``: the file key of its parameters, buffers and constants (safetensors; None in
    an older attnx's export, whose program was a pickled archive, refused); ``attnx verify`` runs that
    program instead of rebuilding a model, so the user's code and the adapted library are not needed;
    ``variants``: the variants whose ``attnx::`` ops it
    calls, whose plugins are imported before the program is loaded; ``adapters``: those that converted
    part of it; ``module_class``: the class exported; ``entry``: "pkg.mod:factory" of
    ``attnx export --module`` (None from Python); ``notes``: what the adapter that loaded it had to
    fix (``attnx export --from``), e.g. LSH rotations drawn once; ``lengths``: the sequence lengths the
    adapted library modules accept (:class:`attnx.adapter.Lengths`; None: no limits), which the default
    verify lengths are fitted to.
    """

    module_class: str
    program: str
    variants: list[str]
    adapters: list[str]
    entry: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    tensors: str | None = None
    lengths: Lengths | None = None


@dataclasses.dataclass
class QuantizationSection:
    """Weight-only block quantisation (``attnx optimize --int4`` / ``--int8``, ONNX Runtime's
    ``MatMulNBits``): ``precision`` per layer kind ("attention", "recurrent", "mlp", "head": "int4",
    "int8" or "fp32"; the recurrent rules' decay and gate projections are always fp32), the weights' block
    size, symmetric (no zero points) or not, the kernel's ``accuracy_level`` (0: float compute, 4: int8
    activations) and the ``algorithm`` that chose the quantised values ("rtn": round to nearest, "hqq")."""

    precision: dict[str, str]
    block_size: int
    symmetric: bool
    accuracy_level: int
    algorithm: str


@dataclasses.dataclass
class OptimizedSection:
    """What ``attnx optimize`` did to the export it read (``source``: its path then; ``source_model``:
    the SHA-256 of its model.onnx).

    ``steps``: in the order applied, of "slim" (onnxslim), "fuse" (onnxscript's fusions for ONNX
    Runtime, which inline the op bodies: the manifest's lowering is then ``decomposed``), "int4" and "int8"
    (weight-only block quantisation, set out in ``quantization``), "dynamic-int8" (ONNX Runtime's dynamic
    int8 quantisation of weights and activations), "fp16" (ONNX Runtime's float16 converter, graph
    inputs and outputs kept float32); ``graphs``: the manifest file keys of the graphs transformed;
    ``error_bound``: the largest output error, relative to the largest output magnitude of the float32
    torch model, that the transformation is held to (the manifest's ``tolerance`` states it for
    ``attnx verify``); ``tools``: versions of the packages that transformed the graphs.
    """

    source: str
    source_model: str
    steps: list[str]
    graphs: list[str]
    error_bound: float
    tools: dict[str, str | None]
    quantization: QuantizationSection | None = None  # with "int4" or "int8"

    @property
    def quantized(self) -> bool:
        """Whether the graphs hold quantised weights ("int4", "int8" or "dynamic-int8")."""
        return not {"int4", "int8", "dynamic-int8"}.isdisjoint(self.steps)


@dataclasses.dataclass
class TargetSection:
    """The lowering target the export was made for (``attnx export --target``, :mod:`attnx.targets`; no
    section: ``portable``): ``runtime`` and its version at export, whose kernels the target's bodies call,
    and ``ops``, the ``attnx::`` ops lowered with those bodies (every other op has its portable body)."""

    name: str
    runtime: str
    runtime_version: str | None
    ops: list[str]


MODULE_MODEL = "module"  # the manifest's ``model`` of a module export


@dataclasses.dataclass
class Manifest:
    variant: str
    variant_config: dict[str, Any]
    model: str
    model_config: dict[str, Any]
    lowering: Lowering
    opset: int
    seed: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ops: list[str]  # every attnx op in any graph of the export, "attnx::<Name>"
    files: dict[str, FileRecord]  # "model", "weights" and optional "prefill", "decode", "engine", ...
    tolerance: dict[str, float]
    versions: dict[str, str | None] = dataclasses.field(default_factory=package_versions)
    schema_version: int = SCHEMA_VERSION
    dtype: Literal["fp32", "fp16"] = "fp32"  # weights and activations
    cross_variant: str | None = None  # seq2seq: the cross-attention variant
    cross_variant_config: dict[str, Any] | None = None
    recipe: str | None = None  # the recipe exported, if any
    ir_version: int | None = None  # the ONNX IR version every graph states (None: an older attnx's export)
    decode: DecodeSection | None = None
    engine: EngineSection | None = None
    tokenizer: TokenizerSection | None = None
    genai: GenaiSection | None = None
    transformers_js: GenaiSection | None = None  # the same, for transformers.js (transformers-js.onnx)
    module: ModuleSection | None = None  # the reference is a user's module, not model + model_config
    optimized: OptimizedSection | None = None  # written by `attnx optimize` from another export
    target: TargetSection | None = None  # the lowering target's runtime kernels (None: portable bodies)

    def _check_numbers(self, where: str) -> None:
        """Refuse numbers no export holds (a seed past int64, a negative axis, a NaN tolerance).

        Raises:
            AttnxError: naming the field and its range.
        """
        specs = [*self.inputs, *self.outputs]
        if self.decode is not None:
            specs += [*self.decode.prefill.inputs, *self.decode.prefill.outputs]
            specs += [*self.decode.decode.inputs, *self.decode.decode.outputs]
        checks = [("seed", self.seed, 0, MAX_SEED), ("opset", self.opset, 1, 1000)]
        checks += [(f"tolerance.{k}", v, 0, math.inf) for k, v in self.tolerance.items()]
        for spec in specs:
            checks += [(f"{spec.name}.high", spec.high, 1, MAX_SEED)] if spec.high is not None else []
            checks += [(f"{spec.name}.axes", a, 0, 2**31 - 1) for a in spec.axes if isinstance(a, int)]
            if spec.bounds is not None:
                low, high = spec.bounds if len(spec.bounds) == 2 else (math.nan, math.nan)
                where_bounds = f"{spec.name}.bounds"
                checks += [(where_bounds, low, -1e30, 1e30), (where_bounds, high, low, 1e30)]
        for name, value, low, high in checks:
            if not _in_range(value, low, high):
                raise AttnxError(f"{where}: {name} = {value!r:.40} must be in {low}..{high}; re-export")

    def to_json(self) -> str:
        data = _plain(self)
        data["dynamic_axes"] = {
            s.name: {str(i): a for i, a in enumerate(s.axes) if isinstance(a, str)}
            for s in [*self.inputs, *self.outputs]
        }
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """Parse and check a manifest.

        Raises:
            AttnxError: invalid JSON, another schema version, a missing or mistyped field, an
                unknown lowering, a file entry outside OUT, or an inconsistent decode section.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AttnxError(
                f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}); re-export"
            ) from None
        except RecursionError:
            raise AttnxError(f"{where} is nested too deeply to be an attnx manifest; re-export") from None
        if not isinstance(data, dict):
            raise AttnxError(f"{where} holds {value_type(data)}, not a manifest object; re-export")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise AttnxError(
                f"{where} has schema_version {version!r}; this attnx reads {SCHEMA_VERSION}: "
                "re-export with it"
            )
        data.pop("dynamic_axes", None)
        manifest = _typed(cls, data, where)
        manifest._check_numbers(where)
        for key, record in manifest.files.items():
            if Path(record.path).name != record.path or record.path.startswith("."):
                raise AttnxError(
                    f"{where}: file {key!r} is {record.path!r}, not a file name inside the export"
                )
        if manifest.decode is not None:
            manifest.decode.check()
        module = manifest.module
        for key in () if module is None else (module.program, module.tensors):
            if key is None:  # an older attnx's export: its program is a pickled archive
                raise AttnxError(
                    f"{where}: this module export's reference ({manifest.files[module.program].path}) is a "
                    "pickled torch.export archive, which attnx no longer loads (unpickling can run code): "
                    "re-export the module with this attnx"
                )
            if key not in manifest.files:
                raise AttnxError(
                    f"{where}: the module section's file {key!r} is not a listed file; re-export"
                )
        return manifest


def _in_range(value: Any, low: float, high: float) -> bool:
    return low <= value <= high  # NaN is in no range


def _plain(value: Any) -> Any:
    """Dataclasses (TensorSpec included) as JSON-ready dicts; TensorSpecs drop empty fields."""
    if isinstance(value, TensorSpec):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _typed(cls: type[T], data: Any, where: str) -> T:
    """``cls`` from JSON ``data``, every field type-checked (nested dataclasses and TensorSpecs too)."""
    if not isinstance(data, dict):
        raise AttnxError(f"{where} must be an object, not {value_type(data)}; re-export")
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        at = f"{where}: {field.name}"
        if field.name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise AttnxError(f"{where} lacks {field.name!r}; re-export with this attnx version")
            continue
        values[field.name] = _value(data[field.name], hints[field.name], at)
    return cls(**values)


def _value(value: Any, annotation: Any, where: str) -> Any:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner, *_) = [a for a in args if a is not type(None)]
        return _value(value, inner, where)
    if annotation is TensorSpec:
        checked = _typed(_TensorSpecJSON, value, where)
        bounds = None if checked.bounds is None else tuple(checked.bounds)
        return TensorSpec(checked.name, checked.dtype, tuple(checked.axes), checked.high, checked.doc, bounds)
    if dataclasses.is_dataclass(annotation):
        return _typed(annotation, value, where)
    if origin is list and args and (dataclasses.is_dataclass(args[0]) or args[0] is TensorSpec):
        if not isinstance(value, list):
            raise AttnxError(f"{where} must be an array, not {value_type(value)}; re-export")
        return [_value(item, args[0], f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict and args and dataclasses.is_dataclass(args[1]):
        if not isinstance(value, dict):
            raise AttnxError(f"{where} must be an object, not {value_type(value)}; re-export")
        return {k: _value(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if annotation is Any:
        return value
    wanted = expected_type(value, annotation)
    if wanted:
        raise AttnxError(f"{where} = {value!r:.60} must be {wanted}, not {value_type(value)}; re-export")
    return value


@dataclasses.dataclass
class _TensorSpecJSON:
    """How a TensorSpec is written in the manifest (axes as a JSON array)."""

    name: str
    dtype: str
    axes: list[str | int]
    high: int | None = None
    doc: str = ""
    bounds: list[float] | None = None
