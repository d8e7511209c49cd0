"""Write ``prefill.onnx`` and ``decode.onnx`` next to an export's ``model.onnx``.

:data:`DECODE_GRAPHS` is the exporter's :class:`attnx.exporter.export.GraphExtension` for
``[export] decode = true`` (``attnx export --decode``). The decode graph goes through the same path
as ``model.onnx`` (:func:`attnx.exporter.trace.to_onnx`, then the lowering); the stateful
``attnx::*Step`` ops come from the variants' ``VariantImpl.decode_ops``. A language model's prefill
is its decode graph from the empty state (no past tokens, zero sums: what decode computes from it is
what prefill does), made by a few adapter nodes (:func:`prefill_of`) instead of a second trace: a
trace costs as much as ``model.onnx``'s conversion. A seq2seq prefill runs the encoder and makes the
cross-attention cache, which decode does not, so it is traced. Only the ``function`` and
``decomposed`` lowerings are offered: TensorRT plugins and the ORT plugin kernels have a single
output, and a step op has three.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from attnx.decode.model import DecodeLayout, StepModel, check_decodable
from attnx.decode.module import ModuleStepModel, module_layout, stepping_layers
from attnx.errors import AttnxError
from attnx.exporter.assemble import Assembly, every_op
from attnx.exporter.export import ExportJob, ExtraGraphs
from attnx.exporter.inputs import random_feed
from attnx.exporter.layout import PREFIX, Layout, value, without_output_copies
from attnx.exporter.lowering import check, lower
from attnx.exporter.manifest import DecodeSection
from attnx.exporter.module import ModuleAssembly
from attnx.exporter.repeat import LayerStack, NotStampable, Rename, Stamping
from attnx.exporter.store import WeightStore
from attnx.exporter.trace import attnx_ops, save_onnx, to_onnx
from attnx.models.spec import TensorSpec
from attnx.ops import AttentionOp
from attnx.recipes import ExportSettings
from attnx.registry import get_registry
from attnx.state import GROWING

PREFILL_FILE, DECODE_FILE = "prefill.onnx", "decode.onnx"
DECODE_LOWERINGS = ("function", "decomposed")


@dataclasses.dataclass
class _Graph:
    """What :func:`attnx.exporter.trace.to_onnx` reads from an assembly."""

    module: nn.Module
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ops: list[AttentionOp]


def decoders() -> list[str]:
    """Names of the registered variants that decode."""
    return sorted(name for name, v in get_registry().variants.items() if v.capabilities.decode)


def layout_of(assembly: Assembly | ModuleAssembly) -> DecodeLayout:
    """The decode layout of a built model or of an adapted module (each layer's declared state)."""
    if isinstance(assembly, ModuleAssembly):
        return module_layout(assembly)
    return DecodeLayout.of(assembly.module)


def step_model(assembly: Assembly | ModuleAssembly, layout: DecodeLayout, with_past: bool) -> nn.Module:
    """The torch prefill (``with_past`` False) or decode graph of a built model or an adapted module."""
    if isinstance(assembly, ModuleAssembly):
        return ModuleStepModel(assembly, layout, with_past)
    return StepModel(assembly.module, layout, with_past)


def run_prefill_once(prefill: StepModel, specs: list[TensorSpec]) -> None:
    """Run prefill in torch on one token (and a one-token source): a layer that cannot decode raises
    its one-line AttnxError here, where torch.export would wrap it in a long report."""
    feed = random_feed(specs, {"batch": 1, "seq": 1, "src_seq": 1}, np.random.default_rng(0))
    with torch.inference_mode():
        prefill(*(torch.from_numpy(feed[s.name]) for s in specs))


class DecodeGraphs:
    """The decode extension of an export (manifest section ``decode``)."""

    name = "decode"

    def wanted(self, job: ExportJob) -> bool:
        return job.settings.decode

    def check(self, job: ExportJob) -> None:
        """Refuse, before any work, a decode export that cannot be made (one line naming what can); a
        module's layers are checked when its graphs are made."""
        job.source.check_layers(lambda model, variant: check_decodable(model, variant, decoders()))
        if job.settings.lowering not in DECODE_LOWERINGS:
            raise AttnxError(
                f"--decode exports use the {' or '.join(DECODE_LOWERINGS)} lowering, not "
                f"'{job.settings.lowering}' (step ops have several outputs, which the attnx TensorRT/ORT "
                "plugins do not carry)"
            )

    def traces(self, assembly: Assembly | ModuleAssembly) -> int:
        """The decode graph's trace, and a seq2seq prefill's (an lm's is made from decode)."""
        return 1 if prefill_is_decode(layout_of(assembly).describe()) else 2

    def export(
        self,
        assembly: Assembly | ModuleAssembly,
        directory: Path,
        settings: ExportSettings,
        store: WeightStore | None,
    ) -> ExtraGraphs:
        """Export, lower, check and save the two graphs into ``directory`` (their weights in ``store``'s
        file when given)."""
        layout = layout_of(assembly)
        run_prefill_once(step_model(assembly, layout, False), layout.inputs(False))
        ops = every_op(assembly)
        section = layout.describe()
        traced = [("decode", DECODE_FILE, True)]
        if not prefill_is_decode(section):
            traced.insert(0, ("prefill", PREFILL_FILE, False))
        graphs, used = {}, []
        for key, name, with_past in traced:
            proto = stamped_step_graph(assembly, layout, with_past, ops, settings.opset, store)
            if proto is None:
                graph = _Graph(
                    step_model(assembly, layout, with_past),
                    layout.inputs(with_past),
                    layout.outputs(with_past),
                    ops,
                )
                proto = to_onnx(graph, settings.opset, graph.inputs, graph.outputs, store=store)
            used += [op for op in attnx_ops(proto) if op not in used]
            proto = without_output_copies(lower(proto, ops, settings.lowering, settings.target))
            check(proto)
            graphs[key] = (name, proto)
        if prefill_is_decode(section):
            graphs = {"prefill": (PREFILL_FILE, prefill_of(graphs["decode"][1], section)), **graphs}
        for name, proto in graphs.values():
            save_onnx(proto, directory / name)
        return ExtraGraphs({key: name for key, (name, _) in graphs.items()}, used, section)


def stamped_step_graph(
    assembly: Assembly | ModuleAssembly,
    layout: DecodeLayout,
    with_past: bool,
    ops: list[AttentionOp],
    opset: int,
    store: WeightStore | None,
) -> onnx.ModelProto | None:
    """A module's prefill or decode graph converted with its layer stack's prefix, the later layers
    stamped (:mod:`attnx.exporter.repeat`) with their own state; None for a module without a stack worth
    it, or whose prefix does not trace or stamp."""
    stack = assembly.layer_stack() if isinstance(assembly, ModuleAssembly) else None
    if stack is None:
        return None
    adapted = assembly.adapted
    whole = stepping_layers(adapted)
    try:
        with stack.traced_prefix():
            prefix = module_layout(assembly)
            graph = _Graph(
                step_model(assembly, prefix, with_past),
                prefix.inputs(with_past),
                prefix.outputs(with_past),
                ops,
            )
            rename = state_names(stack, whole, stepping_layers(adapted))
            stamping = Stamping(
                stack, graph.module, layout.inputs(with_past), layout.outputs(with_past), rename
            )
            return to_onnx(graph, opset, graph.inputs, graph.outputs, store=store, stamping=stamping)
    except (NotStampable, AttnxError):  # the whole module converts, or says why, as before
        return None


_STATE = re.compile(r"(past|present)\.(\d+)\.(.+)")


def state_names(stack: LayerStack, whole: Sequence[nn.Module], prefix: Sequence[nn.Module]) -> Rename:
    """The state inputs' and outputs' renaming of a stamped decode graph: a stamped layer's stepping
    layers take the numbers they have in the whole module (``whole``), in the order its prototype's have
    them in the prefix (``prefix``); the position and every other name is shared.

    Raises:
        NotStampable: a stepping layer outside the stack.
    """
    owner = {id(m): i for i, layer in enumerate(stack.layers) for m in layer.modules()}

    def numbers(layers: Sequence[nn.Module]) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        for number, layer in enumerate(layers):
            if id(layer) not in owner:
                raise NotStampable(f"stepping layer {number} is outside the layer stack")
            found.setdefault(owner[id(layer)], []).append(number)
        return found

    in_whole, in_prefix = numbers(whole), numbers(prefix)

    def rename(layer: int, prototype: int, name: str) -> str | None:
        state = _STATE.fullmatch(name)
        if state is None:
            return None
        side, number, tensor = state.groups()
        return f"{side}.{in_whole[layer][in_prefix[prototype].index(int(number))]}.{tensor}"

    return rename


def prefill_is_decode(section: DecodeSection) -> bool:
    """Whether an export's prefill graph is its decode graph from the empty state (:func:`prefill_of`): a
    language model's, whose decode takes no context from prefill."""
    return not section.context


def prefill_of(decode: onnx.ModelProto, section: DecodeSection) -> onnx.ModelProto:
    """A language model's prefill graph: ``decode`` fed the empty state (``past_length`` 0, every
    ``past.*`` zeros with no past tokens), its outputs the prefill's of ``section`` (the manifest's).
    The decode graph's nodes and weights are kept as they are."""
    adapter = Layout(decode)
    adapter.keep(section.tokens)
    batch = adapter.node("Shape", [section.tokens], f"{PREFIX}batch", start=0, end=1)
    for pair in section.state:
        if pair.role == "position":
            adapter.node("Identity", [adapter.constant("empty_length", [0])], adapter.feed(pair.input))
            continue
        sizes = [
            batch if a == "batch" else adapter.constant(f"{pair.input}/{i}", [0 if a == GROWING else a])
            for i, a in enumerate(pair.axes)
        ]
        shape = adapter.node("Concat", sizes, f"{PREFIX}{pair.input}/shape", axis=0)
        zero = numpy_helper.from_array(np.zeros(1, dtype=pair.dtype))
        adapter.node("ConstantOfShape", [shape], adapter.feed(pair.input), value=zero)
    adapter.outputs += [value(spec.name, spec.dtype, spec.axes) for spec in section.prefill.outputs]
    return adapter.build(decode.graph.name)


DECODE_GRAPHS = DecodeGraphs()
