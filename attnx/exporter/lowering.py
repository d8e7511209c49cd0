"""The three lowerings of ``attnx::<Op>`` nodes.

* ``function``: each op's onnxscript body is attached as a model-local function
  (a node omitting optional inputs uses an overload whose body has only those inputs); of the
  bodies for those inputs, the one written against the newest opset the model's allows (softmax:
  the standard ``Attention`` op from opset 23).
* ``decomposed``: the portable bodies (the oldest opset's: primitive ops) inlined, leaving standard
  ONNX ops only.
* ``plugin``: bare nodes with ``plugin_namespace``/``plugin_version`` attributes,
  which TensorRT uses to find the attnx plugin of the same name.

A lowering target other than ``portable`` (:mod:`attnx.targets`, ``--target``) takes the bodies an op
declares for that target's runtime kernels (``AttentionOp.targets``) in ``function`` and
``decomposed``; an op that declares none keeps its portable bodies. Where the target also has bodies
that take static dims of a node's inputs as attributes (:class:`attnx.ops.SiteBodies`: head counts a
kernel wants as attributes) and the model declares those dims, the node gets a function overload of its
own that calls such a body with them bound. Nothing here knows an op or a target by name.

Every lowered graph states the IR version of its opset (:mod:`attnx.exporter.opsets`).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import onnx
import onnx.inliner
from onnx import helper

from attnx.domains import DOMAIN, LIBRARY_DOMAIN, PLUGIN_NAMESPACE, PLUGIN_VERSION, Lowering
from attnx.errors import AttnxError
from attnx.exporter.opsets import model_opset, state_ir_version
from attnx.exporter.portable import for_graph_tools
from attnx.targets import PORTABLE, TARGETS

if TYPE_CHECKING:
    import onnxscript

    from attnx.ops import AttentionOp


def attnx_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == DOMAIN]


def lower(
    model: onnx.ModelProto, ops: Sequence[AttentionOp], mode: Lowering, target: str = PORTABLE
) -> onnx.ModelProto:
    """Apply lowering ``mode`` (validated where settings are read) with ``target``'s bodies where an op
    declares them to ``model`` in place and return it; graph tools can transform it
    (:mod:`attnx.exporter.portable`)."""
    if mode == "plugin":
        return state_ir_version(for_graph_tools(_mark_plugins(model)))
    attach_functions(model, ops, portable=mode == "decomposed", target=target)
    if mode == "decomposed":
        imports = {o.domain: o.version for f in model.functions for o in f.opset_import}
        model = onnx.inliner.inline_local_functions(model)
        _drop_opsets(model, {DOMAIN, LIBRARY_DOMAIN})
        _import_opsets(model, {d: v for d, v in imports.items() if d not in (DOMAIN, LIBRARY_DOMAIN)})
    return state_ir_version(for_graph_tools(model))


def check(model: onnx.ModelProto) -> None:
    """onnx's checker on a lowered model, with shape inference (``full_check``) unless the model or its
    functions import a lowering target's kernel domain (e.g. com.microsoft): onnx has no schemas for those
    kernels, so it cannot type their outputs and its inference would reject graphs the runtime runs.

    The checker sees a copy where needed: a target runtime's own kernels in the default domain (ONNX
    Runtime's ``SimplifiedLayerNormalization``, which ``attnx optimize --fuse`` makes) under a domain of
    their own, and weights kept as external data (shared weights) as graph inputs of their type and shape,
    so their data, which the checker would look for beside the working directory, is never read.
    """
    imported = {o.domain for o in model.opset_import} | {
        o.domain for f in model.functions for o in f.opset_import
    }
    kernels = {domain for target in TARGETS.values() for domain in target.domains}
    runtime_nodes = _runtime_kernel_nodes(model)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if not runtime_nodes and not external:
        onnx.checker.check_model(model, full_check=not imported & kernels)
        return
    checked = onnx.ModelProto()
    checked.CopyFrom(model)
    for index in runtime_nodes:
        checked.graph.node[index].domain = RUNTIME_KERNELS_DOMAIN
    if runtime_nodes:
        checked.opset_import.add(domain=RUNTIME_KERNELS_DOMAIN, version=1)
    if external:
        names = {t.name for t in external}
        kept = [t for t in checked.graph.initializer if t.name not in names]
        del checked.graph.initializer[:]
        checked.graph.initializer.extend(kept)
        inputs = [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in external]
        checked.graph.input.extend(inputs)
    onnx.checker.check_model(checked, full_check=not runtime_nodes and not imported & kernels)


RUNTIME_KERNELS_DOMAIN = "attnx.check.runtime-kernels"  # only in check()'s copy


def _runtime_kernel_nodes(model: onnx.ModelProto) -> list[int]:
    """Indices of the graph's default-domain nodes whose op onnx does not define (at any opset) and a
    target's runtime does (the runtimes are asked only when onnx lacks an op)."""
    unknown = [
        index
        for index, node in enumerate(model.graph.node)
        if not node.domain and not onnx.defs.has(node.op_type)
    ]
    if not unknown:
        return []
    runtime_ops = {
        op
        for target in TARGETS.values()
        if target.installed is not None
        for domain, op in target.installed()
        if not domain
    }
    return [index for index in unknown if model.graph.node[index].op_type in runtime_ops]


def _mark_plugins(model: onnx.ModelProto) -> onnx.ModelProto:
    for node in attnx_nodes(model):
        _set_attribute(node, helper.make_attribute("plugin_namespace", PLUGIN_NAMESPACE))
        _set_attribute(node, helper.make_attribute("plugin_version", PLUGIN_VERSION))
    return model


def attach_functions(
    model: onnx.ModelProto, ops: Sequence[AttentionOp], portable: bool = False, target: str = PORTABLE
) -> onnx.ModelProto:
    """Attach the body (and the library functions it calls) of every attnx node: the newest body the
    model's opset allows, or with ``portable`` the oldest, among ``target``'s bodies where the op declares
    that target (:meth:`attnx.ops.AttentionOp.body_for`)."""
    by_name = {op.name: op for op in ops}
    opset = model_opset(model)
    declared = declared_dims(model.graph) if target != PORTABLE else {}
    attached: dict[tuple[str, str, str], onnx.FunctionProto] = {
        (f.domain, f.name, f.overload): f for f in model.functions
    }
    for node in attnx_nodes(model):
        op = by_name.get(node.op_type)
        if op is None:
            raise AttnxError(f"no attnx op named '{node.op_type}' is registered by the model's variants")
        present = [name for name, value in zip(op.input_names, node.input, strict=False) if value]
        body = op.body_for(present, opset, portable, target)
        if body is None:
            where = f"AttentionOp.targets['{target}']" if target in op.targets else "AttentionOp.bodies"
            raise AttnxError(
                f"op attnx::{op.name} has no ONNX body for inputs ({', '.join(present)}) at opset {opset}; "
                f"the variant must provide one in {where}"
            )
        overload = "" if present == op.input_names else "_".join(present)
        sited = _sited(op, present, target, dict(zip(op.input_names, node.input, strict=False)), declared)
        if sited is None:
            main, *library = function_protos(body)
        else:  # an overload per bound dims: q_heads16_dk128_..., after the present inputs' where any
            bound = "_".join(f"{name}{value}" for name, value in sited[1].items())
            overload = f"{overload}_{bound}" if overload else bound
            main, *library = _sited_protos(op, *sited)
        node.overload = overload
        main.name, main.overload = op.name, overload
        for proto in (main, *library):
            _import_opset(proto, opset)
            attached.setdefault((proto.domain, proto.name, proto.overload), proto)
    del model.functions[:]
    model.functions.extend(attached.values())
    if not any(o.domain == LIBRARY_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(LIBRARY_DOMAIN, 1))
    return model


def declared_dims(graph: onnx.GraphProto) -> dict[str, list[int | None]]:
    """Each value's dims as the graph declares them (inputs, outputs, value_info): an int where static."""
    declared = {}
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            declared[value.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    return declared


def _sited(
    op: AttentionOp,
    present: Sequence[str],
    target: str,
    inputs: dict[str, str],
    declared: dict[str, list[int | None]],
) -> tuple[onnxscript.OnnxFunction, dict[str, int]] | None:
    """The target's site body for a node with ``present`` inputs (name -> value) and the dims it binds,
    where the model declares every one of them; else None."""
    sited = op.targets[target].sited if target in op.targets else None
    body = sited.body_for(present) if sited is not None else None
    if sited is None or body is None:
        return None
    values = {}
    for attribute, (name, axis) in sited.dims.items():
        dims = declared.get(inputs.get(name, ""), [])
        if axis >= len(dims) or not dims[axis]:
            return None
        values[attribute] = dims[axis]
    return body, values


def _sited_protos(
    op: AttentionOp, body: onnxscript.OnnxFunction, values: dict[str, int]
) -> list[onnx.FunctionProto]:
    """The op's function for one call site: a call of site body ``body`` (a library function here) with
    the op's attributes passed on and ``values`` bound; then the library functions."""
    site, *library = function_protos(body)
    site.domain = LIBRARY_DOMAIN
    call = helper.make_node(site.name, list(site.input), list(site.output), domain=LIBRARY_DOMAIN)
    attributes = [a for a in op.arguments if not a.is_tensor]
    call.attribute.extend(helper.make_attribute_ref(a.name, a.onnx_type) for a in attributes)
    call.attribute.extend(helper.make_attribute(name, value) for name, value in values.items())
    main = helper.make_function(
        DOMAIN,
        op.name,
        list(site.input),
        list(site.output),
        [call],
        [helper.make_opsetid(LIBRARY_DOMAIN, 1)],
        attributes=[a.name for a in attributes],
    )
    return [main, site, *library]


def retarget(model: onnx.ModelProto, ops: Sequence[AttentionOp], target: str) -> onnx.ModelProto:
    """A function-lowered ``model`` with ``target``'s bodies attached in place of its attnx nodes' bodies
    (the same nodes; an op that declares no body for ``target`` keeps its portable ones), in place.
    A graph without attnx nodes (bodies inlined) is returned as it is."""
    if not attnx_nodes(model):
        return model
    kept = [f for f in model.functions if f.domain not in (DOMAIN, LIBRARY_DOMAIN)]
    del model.functions[:]
    model.functions.extend(kept)
    return attach_functions(model, ops, target=target)


def strip_plugin_attributes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove the TensorRT plugin attributes (to run a plugin-lowered model as functions)."""
    for node in attnx_nodes(model):
        kept = [a for a in node.attribute if a.name not in ("plugin_namespace", "plugin_version")]
        del node.attribute[:]
        node.attribute.extend(kept)
    return model


def _import_opset(proto: onnx.FunctionProto, version: int) -> None:
    """Bodies are written against an opset <= the model's; they must import the model's opset version."""
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version


def _set_attribute(node: onnx.NodeProto, attribute: onnx.AttributeProto) -> None:
    for existing in node.attribute:
        if existing.name == attribute.name:
            existing.CopyFrom(attribute)
            return
    node.attribute.append(attribute)


def _import_opsets(model: onnx.ModelProto, imports: dict[str, int]) -> None:
    """Import the domains the inlined bodies used (a target's runtime ops) that the model does not."""
    have = {o.domain for o in model.opset_import} | {"ai.onnx"}
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in imports.items() if d not in have)


def _drop_opsets(model: onnx.ModelProto, domains: set[str]) -> None:
    kept = [o for o in model.opset_import if o.domain not in domains]
    del model.opset_import[:]
    model.opset_import.extend(kept)


def order_if_outputs(function: onnx.FunctionProto) -> None:
    """Give each multi-value ``If`` of ``function`` its outputs in one order: onnxscript orders them, and
    numbers their names, by a set of names (so by PYTHONHASHSEED), and a body's bytes must not depend on it.
    The outputs are sorted by their variable names, renumbered with the same numbers in order, the
    branches' outputs permuted with them and every use renamed."""
    renames: dict[str, str] = {}
    for node in function.node:
        if node.op_type != "If" or len(node.output) < 2:
            continue
        names = list(node.output)
        order = sorted(range(len(names)), key=lambda i: _NUMBERED.fullmatch(names[i]).group(1))
        numbers = sorted((_NUMBERED.fullmatch(n).group(2) for n in names), key=lambda x: (len(x), x))
        for slot, (i, number) in enumerate(zip(order, numbers, strict=True)):
            renames[names[i]] = _NUMBERED.fullmatch(names[i]).group(1) + number
            node.output[slot] = renames[names[i]]
        for attribute in node.attribute:
            values = [copy.deepcopy(attribute.g.output[i]) for i in order]
            del attribute.g.output[:]
            attribute.g.output.extend(values)
    if renames:
        _rename_uses(function.node, renames)
        function.output[:] = [renames.get(name, name) for name in function.output]


_NUMBERED = re.compile(r"(.*?)(_\d+|)")


def _rename_uses(nodes: Sequence[onnx.NodeProto], renames: dict[str, str]) -> None:
    for node in nodes:
        node.input[:] = [renames.get(name, name) for name in node.input]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_uses(attribute.g.node, renames)
                for value in attribute.g.output:
                    value.name = renames.get(value.name, value.name)


def function_protos(body: onnxscript.OnnxFunction) -> list[onnx.FunctionProto]:
    """``body`` and every library function it calls, transitively, as FunctionProtos.

    Each proto imports the domain of every function it calls, also from inside an ``If``
    branch (onnxscript imports only the domains of its top-level nodes), and declares its values'
    types without a shape: onnxscript writes a bare ``FLOAT`` annotation as a rank-0 shape, which a tool
    that inlines the functions (onnx_ir's inliner) would then hold every input and output to.
    """
    seen: dict[tuple[str, str], onnx.FunctionProto] = {}

    def visit(fn: onnxscript.OnnxFunction) -> None:
        proto = fn.to_function_proto()
        order_if_outputs(proto)
        for value in proto.value_info:
            if value.type.HasField("tensor_type"):
                value.type.tensor_type.ClearField("shape")
        key = (proto.domain, proto.name)
        if key in seen:
            return
        seen[key] = proto
        callees = fn.function_ir.get_called_functions().values()
        imported = {o.domain for o in proto.opset_import}
        for callee in callees:
            if callee.opset.domain not in imported:
                proto.opset_import.add(domain=callee.opset.domain, version=callee.opset.version)
                imported.add(callee.opset.domain)
        for callee in callees:
            visit(callee)

    visit(body)
    return list(seen.values())
