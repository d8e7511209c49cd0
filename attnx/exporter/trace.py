"""torch to ONNX: the example inputs of a trace, the torch.onnx (dynamo) export with attnx ops as bare
``attnx::`` nodes, the checks of the graph's inputs and outputs against their specs, and saving a graph
(external data past protobuf's 2 GiB).

Every graph attnx writes (model.onnx, the decode graphs, the optimizer's and the serving layer's) goes
through :func:`export_onnx` and :func:`save_onnx`; the lowering runs after, on the returned proto.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from attnx.domains import DOMAIN
from attnx.errors import AttnxError, unknown_choice
from attnx.exporter.assemble import Assembly
from attnx.exporter.inputs import random_feed
from attnx.exporter.lowering import attnx_nodes
from attnx.exporter.module import quiet_torch, unwrap_interrupt
from attnx.exporter.repeat import Stamping, stamp
from attnx.exporter.signature import dynamic_shapes
from attnx.exporter.store import WeightStore
from attnx.models.spec import TensorSpec
from attnx.recipes import ExportSettings

EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # protobuf caps a file at 2 GiB


def attnx_ops(proto: onnx.ModelProto) -> list[str]:
    """The distinct ``attnx::`` ops of a graph, in order of first use."""
    return list(dict.fromkeys(f"{DOMAIN}::{node.op_type}" for node in attnx_nodes(proto)))


def example_sizes(specs: Sequence[TensorSpec]) -> dict[str, int]:
    """Distinct, non-trivial example lengths per symbolic axis (size 1 would be specialised)."""
    sizes: dict[str, int] = {}
    lengths = iter((17, 19, 23, 29, 31))
    for spec in specs:
        for axis in spec.axes:
            if isinstance(axis, str) and axis not in sizes:
                sizes[axis] = 2 if axis == "batch" else next(lengths)
    return sizes


def export_shapes(
    assembly: Assembly, settings: ExportSettings
) -> tuple[list[TensorSpec], list[TensorSpec], dict[str, int]]:
    """Inputs and outputs with the axes ``settings`` fixes made static, and the example sizes.

    Raises:
        AttnxError: an axis the model does not have, or a dynamic axis of example length 1.
    """
    inputs, outputs = assembly.inputs, assembly.outputs
    sizes = example_sizes(inputs)
    axes = list(sizes)
    given = dict(settings.example_lengths or {})
    named = {"example_lengths": list(given), "dynamic_axes": list(settings.dynamic_axes or ())}
    for setting, names in named.items():
        for axis in names:
            if axis not in sizes:
                what = f"axis in export setting {setting} of model {assembly.model.name}"
                raise unknown_choice(what, axis, axes)
    sizes.update(given)
    dynamic = set(axes if settings.dynamic_axes is None else settings.dynamic_axes)
    for axis in sorted(dynamic):
        if sizes[axis] < 2:
            where = f"export setting example_lengths.{axis}={sizes[axis]}: " if axis in given else ""
            raise AttnxError(
                f"{where}example length of dynamic axis '{axis}' must be >= 2 (1 would be specialised)"
            )

    def fix(spec: TensorSpec) -> TensorSpec:
        fixed = tuple(sizes[a] if isinstance(a, str) and a not in dynamic else a for a in spec.axes)
        return dataclasses.replace(spec, axes=fixed)

    return [fix(s) for s in inputs], [fix(s) for s in outputs], sizes


def to_onnx(
    assembly: Assembly,
    opset: int,
    inputs: Sequence[TensorSpec] | None = None,
    outputs: Sequence[TensorSpec] | None = None,
    sizes: Mapping[str, int] | None = None,
    store: WeightStore | None = None,
    stamping: Stamping | None = None,
) -> onnx.ModelProto:
    """torch.onnx dynamo export; named axes are dynamic, attnx ops become bare ``attnx::`` nodes.

    ``inputs``/``outputs`` default to the model's specs (every symbolic axis dynamic) and
    ``sizes`` (example length per axis) to :func:`example_sizes`; ``store`` and ``stamping``: see
    :func:`export_onnx`.
    """
    specs = list(inputs or assembly.inputs)
    outputs = list(outputs or assembly.outputs)
    feed = random_feed(specs, sizes or example_sizes(specs), np.random.default_rng(0))
    args = tuple(torch.from_numpy(feed[s.name]) for s in specs)
    return export_onnx(
        assembly.module,
        args,
        assembly.ops,
        opset,
        specs,
        outputs,
        dynamic_shapes(specs),
        store=store,
        stamping=stamping,
    )


def export_onnx(
    model: Any,
    args: tuple[Any, ...],
    ops: Sequence[Any],
    opset: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    dynamic_shapes: Any = None,
    store: WeightStore | None = None,
    stamping: Stamping | None = None,
) -> onnx.ModelProto:
    """torch.onnx (dynamo) of a module called with ``args``, or of an ``ExportedProgram`` (``args`` and
    ``dynamic_shapes`` unused), with ``ops`` as bare ``attnx::`` nodes; checks the graph's dtypes
    against the specs and names their dynamic axes.

    With a ``store`` (shared weights, :mod:`attnx.exporter.store`) every initializer that is one of the
    store's tensors is external data in the store's file, so the returned proto holds no weight: a
    real-size model's graph stays far below protobuf's 2 GiB, and no step copies its weights.

    With a ``stamping`` the module holds only its stack's prefix layers (``inputs``/``outputs`` are
    that graph's) and the later layers are stamped in before the optimizer runs
    (:mod:`attnx.exporter.repeat`); the whole graph's specs are the stamping's.

    Raises:
        NotStampable: a ``stamping`` the traced graph does not fit (the caller converts the whole module).
    """
    table = {op.overload: op.translation() for op in ops}
    with quiet_torch(), unwrap_interrupt(), untranslated_ops(), torchlib_registry_built_once():
        program = torch.onnx.export(
            model,
            args,
            dynamo=True,
            input_names=[s.name for s in inputs],
            output_names=[s.name for s in outputs],
            dynamic_shapes=dynamic_shapes,
            custom_translation_table=table,
            opset_version=opset,
            optimize=False,
            verbose=False,
        )
        if stamping is not None:
            stamp(program.model, stamping)
            inputs, outputs = stamping.inputs, stamping.outputs
        optimize(program.model, store)
    if store is not None:
        store.externalize(program.model)
    proto = program.model_proto
    for value, spec in _declared(proto, [*inputs, *outputs]):
        _check_dtype(value, spec)
        _name_dynamic_axes(value, spec)
    return proto


@contextlib.contextmanager
def torchlib_registry_built_once() -> Iterator[None]:
    """torch.onnx builds its table of ATen translations from torchlib at every export (most of a second
    each, four times per decode export); within this context each export gets a copy of the table built
    once per opset, to which it adds its own custom translations as before.

    torch 2.13 (pinned) names the table ``ONNXRegistry``; without it, torch.onnx builds its own.
    """
    from torch.onnx._internal.exporter import _registration

    table = getattr(_registration, "ONNXRegistry", None)
    original = vars(table).get("from_torchlib") if table is not None else None
    if not isinstance(original, classmethod):
        yield
        return

    def copy(cls: type, opset_version: int) -> Any:  # torch.onnx passes the opset it exports at
        made = cls()
        made.__dict__.update(vars(_torchlib_table(original.__get__(None, table), opset_version)))
        made.functions = {target: list(entries) for target, entries in made.functions.items()}
        return made

    table.from_torchlib = classmethod(copy)
    try:
        yield
    finally:
        table.from_torchlib = original


@functools.cache
def _torchlib_table(build: Any, opset: int) -> Any:
    """torch.onnx's translation table for ``opset``, built once (:func:`torchlib_registry_built_once`)."""
    return build(opset_version=opset)


@contextlib.contextmanager
def untranslated_ops() -> Iterator[None]:
    """torch.onnx failing on an op it has no ONNX translation for is one line naming the op.

    Raises:
        AttnxError: naming the op and where its translation comes from.
    """
    try:
        yield
    except Exception as exc:
        cause: BaseException | None = exc
        while cause is not None:
            missing = _NO_FUNCTION.search(str(cause))
            if missing:
                op = missing.group(1) or missing.group(2)
                raise AttnxError(
                    f"torch.onnx has no ONNX translation for {op}; an attnx op exports through its variant's "
                    "AttentionOp (an op no installed variant declares cannot be exported)"
                ) from None
            cause = cause.__cause__ or cause.__context__
        raise


_NO_FUNCTION = re.compile(r"No ONNX function found for (?:<OpOverload\(op='([^']+)'|([^\s<>]+))")


def optimize(model: Any, store: WeightStore | None) -> None:
    """What torch.onnx's ``optimize=True`` runs (onnxscript's optimizer, then its ONNX fusions) on the ONNX
    IR ``model``, in place, without the rule of :func:`without_slice_pairs`; with a ``store`` its constant
    folding leaves the stored tensors as they are."""
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions

    with without_slice_pairs():
        onnxscript.optimizer.optimize_ir(
            model, should_fold=store.keeps_weights if store else lambda node: None
        )
    onnxscript.rewriter.onnx_fusions.fuse(model)


@contextlib.contextmanager
def without_slice_pairs() -> Iterator[None]:
    """onnxscript's optimizer without its ``SlicesSplit`` rule (two Slices of one tensor's halves become a
    Split), for this context.

    It is the rewriter's one two-node pattern, matched by trying every Slice against every other one: on
    the 0.8B Qwen3.5's graphs (5,000-6,500 nodes) it took most of the optimizer's time (15 of 20 s for
    model.onnx, 37 of 42 s for the decode graph's first pass), for a Split where ONNX Runtime runs two
    Slices as fast. onnxscript 0.7 keeps its default rules in ``onnxscript.rewriter._DEFAULT_REWRITE_RULES``;
    without that name the optimizer runs them all.
    """
    import onnxscript.rewriter
    from onnxscript.rewriter.rules.common import slice_split_rule

    rules = getattr(onnxscript.rewriter, "_DEFAULT_REWRITE_RULES", None)
    if not isinstance(rules, tuple):
        yield
        return
    onnxscript.rewriter._DEFAULT_REWRITE_RULES = tuple(rule for rule in rules if rule is not slice_split_rule)
    try:
        yield
    finally:
        onnxscript.rewriter._DEFAULT_REWRITE_RULES = rules


def _declared(proto: onnx.ModelProto, specs: Sequence[TensorSpec]) -> Iterator[tuple[Any, TensorSpec]]:
    """Each graph input/output that ``specs`` declare, with its spec."""
    by_name = {s.name: s for s in specs}
    for value in [*proto.graph.input, *proto.graph.output]:
        if value.name in by_name:
            yield value, by_name[value.name]


def _check_dtype(value: Any, spec: TensorSpec) -> None:
    """A graph input/output has the dtype the manifest will declare.

    Raises:
        AttnxError: a model whose forward returns another dtype than its specs declare
            (e.g. float32 logits from an fp16 model, after an explicit upcast).
    """
    actual = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    if actual != np.dtype(spec.dtype):
        raise AttnxError(
            f"graph tensor '{value.name}' is {actual} but the model declares {spec.dtype}; "
            "a model computes in its export dtype and declares activations as float32 (TensorSpec)"
        )


def _name_dynamic_axes(value: Any, spec: TensorSpec) -> None:
    """Give a graph input/output the manifest's axis names (batch, seq) instead of s0, s1."""
    for dim, axis in zip(value.type.tensor_type.shape.dim, spec.axes, strict=False):
        if isinstance(axis, str):
            dim.ClearField("dim_value")
            dim.dim_param = axis


def save_onnx(proto: onnx.ModelProto, path: Path) -> None:
    """Save ``proto`` at ``path``, its tensors in ``<name>.data`` beside it when it passes 2 GiB."""
    large = proto.ByteSize() > EXTERNAL_DATA_THRESHOLD
    onnx.save_model(
        proto, str(path), save_as_external_data=large, location=f"{path.name}.data" if large else None
    )
