"""What an export with a lowering target (``--target``, :mod:`attnx.targets`) needs, refuses and records.

The kernels a target body calls are read off its ``FunctionProto`` (and the library functions it
calls): every node in one of the target's domains. The installed runtime must have each of them
(:meth:`attnx.targets.LoweringTarget.kernels`); otherwise the export stops before any work, in one
line naming the kernel and the runtime release the op says has it (``TargetBodies.since``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import onnx

from attnx.errors import AttnxError
from attnx.exporter.lowering import function_protos
from attnx.exporter.manifest import TargetSection
from attnx.ops import AttentionOp
from attnx.targets import PORTABLE, TARGETS


def check_target(target: str, lowering: str, ops: Sequence[AttentionOp], known: bool = True) -> None:
    """Refuse, in one line, a target the export cannot be lowered to.

    Args:
        ops: the export's ops; ``known`` False: not known yet (a module before it is traced), so only
            the lowering is checked.

    Raises:
        AttnxError: a target with the plugin lowering, an export none of whose ops declares a body for
            it, or a body calling a kernel the installed runtime lacks.
    """
    if target == PORTABLE:
        return
    if lowering == "plugin":
        raise AttnxError(
            f"--target {target} picks ONNX bodies, and the plugin lowering has none (bare nodes for "
            f"TensorRT's plugins); export with --lowering function or decomposed, or with --target {PORTABLE}"
        )
    if not known:
        return
    declaring = [op for op in ops if target in op.targets]
    if not declaring:
        names = ", ".join(f"attnx::{op.name}" for op in ops) or "none"
        raise AttnxError(
            f"no op of this export declares a body for target '{target}' (its ops: {names}); "
            f"export with --target {PORTABLE}"
        )
    _check_kernels(target, declaring)


def _check_kernels(target: str, ops: Sequence[AttentionOp]) -> None:
    """Every kernel ``ops``' bodies for ``target`` call is one the installed runtime has."""
    runtime = TARGETS[target]
    name, installed = runtime.runtime, runtime.kernels()
    for op in ops:
        for domain, kind in kernels_needed(op, target):
            if (domain, kind) not in installed:
                since = op.targets[target].since
                has = f"{name} >= {since} has it" if since else f"a newer {name} may have it"
                raise AttnxError(
                    f"attnx::{op.name}'s {target} body calls {domain}::{kind}, which {name} "
                    f"{runtime.version()} lacks ({has}); upgrade {name} or export with --target {PORTABLE}"
                )


def kernels_needed(op: AttentionOp, target: str) -> list[tuple[str, str]]:
    """(domain, op type) of every kernel of ``target``'s domains that ``op``'s bodies for it call."""
    domains = TARGETS[target].domains
    found = [
        (node.domain, node.op_type)
        for body in op.targets[target].bodies
        for proto in function_protos(body)
        for node in _nodes(proto.node)
        if node.domain in domains
    ]
    return list(dict.fromkeys(found))


def _nodes(nodes: Sequence[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """``nodes`` and the nodes of their subgraphs (If/Loop branches)."""
    for node in nodes:
        yield node
        for attribute in node.attribute:
            for graph in [attribute.g, *attribute.graphs]:
                yield from _nodes(graph.node)


def target_section(target: str, ops: Sequence[AttentionOp], used: Sequence[str]) -> TargetSection | None:
    """The manifest's ``target`` section: the ops among ``used`` ("attnx::<Op>", every graph's) that
    ``target``'s bodies lowered; None for the portable target."""
    if target == PORTABLE:
        return None
    declaring = {f"attnx::{op.name}" for op in ops if target in op.targets}
    runtime = TARGETS[target]
    lowered = [name for name in used if name in declaring]
    return TargetSection(target, runtime.runtime, runtime.version(), lowered)
