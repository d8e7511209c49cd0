"""``onnx-schema`` and ``onnx-body``: the ONNX bodies against the op's schema and its maths."""

from __future__ import annotations

from collections.abc import Iterable

from attnx.domains import DOMAIN
from attnx.errors import first_line
from attnx.exporter.lowering import function_protos
from attnx.exporter.opsets import DEFAULT_OPSET, OPSETS, onnxruntime_loads
from attnx.exporter.targets import kernels_needed
from attnx.ops import AttentionOp, body_opset
from attnx.targets import PORTABLE, TARGETS
from attnx.testing.checks.common import declared_calls, mismatch
from attnx.testing.onnx_op import OpSession
from attnx.testing.subject import Subject


def check_onnx_schema(subject: Subject) -> list[str]:
    """Bodies agree with the schema derived from the torch op; names clash with no other variant."""
    problems = []
    for op in subject.impl.ops:
        problems += schema_problems(op)
    for call in declared_calls(subject):
        present = [name for name in call.op.input_names if call.bound().get(name) is not None]
        if call.op.body_for(present, portable=True) is None:
            problems.append(
                f"the {call.case.label} layer calls {call.name} with inputs ({', '.join(present)}) but "
                f"no body of {call.op.name} takes exactly those; add one to AttentionOp.bodies"
            )
    problems += _name_clashes(subject)
    return list(dict.fromkeys(problems))


def schema_problems(op: AttentionOp) -> list[str]:
    """What is wrong between ``op``'s torch schema, its ONNX schema and its bodies."""
    try:
        inputs, attributes = op.input_names, set(op.attribute_names)
        op.schema()
    except Exception as exc:
        return [f"op {op.name}: no ONNX schema can be derived from the torch op: {exc}"]
    optional = {a.name for a in op.arguments if a.is_tensor and a.optional}
    problems = [
        f"op {op.name}: input_types names {name}, which is not a tensor input"
        for name in op.input_types
        if name not in inputs
    ]
    if not op.bodies:
        return [*problems, f"op {op.name} has no ONNX body"]
    seen: dict[tuple[tuple[str, ...], int], str] = {}
    lowest = min(op.body_opsets())
    portable = {tuple(p.name for p in b.function_ir.inputs) for b in op.bodies if body_opset(b) == lowest}
    for index, body in enumerate(op.bodies):
        names = tuple(p.name for p in body.function_ir.inputs)
        attrs = {a.name for a in body.function_ir.attrs}
        where = f"body {body.name} of {op.name}"
        if body.opset.domain != DOMAIN:
            problems.append(f"{where} is in domain '{body.opset.domain}'; bodies must use attnx.ops.OPSET")
        if index == 0 and list(names) != inputs:
            problems.append(
                f"{where} takes inputs ({', '.join(names)}) but the first body must take every schema "
                f"input ({', '.join(inputs)}), in order"
            )
        elif not _is_subsequence(names, inputs):
            problems.append(
                f"{where} takes inputs ({', '.join(names)}), which are not schema inputs "
                f"({', '.join(inputs)}) in order"
            )
        elif set(inputs) - set(names) - optional:
            missing = ", ".join(sorted(set(inputs) - set(names) - optional))
            problems.append(f"{where} omits required input(s) {missing}")
        if attrs != attributes:
            problems.append(
                f"{where} has attributes ({', '.join(sorted(attrs))}) but the torch op has "
                f"({', '.join(sorted(attributes))})"
            )
        opset = body_opset(body)
        if (names, opset) in seen:
            problems.append(
                f"{where} and {seen[names, opset]} take the same inputs at opset {opset}; only one would "
                "ever be used"
            )
        elif names not in portable:
            problems.append(
                f"{where} (opset {opset}) takes inputs ({', '.join(names)}) that no body at the lowest opset "
                f"({lowest}) takes; add one, for lower opsets and the decomposed lowering"
            )
        seen.setdefault((names, opset), body.name)
    return problems


def _is_subsequence(names: Iterable[str], inputs: list[str]) -> bool:
    remaining = iter(inputs)
    return all(name in remaining for name in names)


def lowerings(op: AttentionOp) -> list[tuple[str, int]]:
    """(target, opset) of each body set of ``op`` ONNX Runtime can run here: the portable bodies at each
    opset they are written for, each target's at its lowest, when the installed runtime has its kernels."""
    import onnxruntime

    loads = [o for o in OPSETS if onnxruntime_loads(o, onnxruntime.__version__)]
    opsets = dict.fromkeys(max(o, DEFAULT_OPSET) for o in op.body_opsets())
    found = [(PORTABLE, o) for o in opsets if o in loads]
    for target, declared in op.targets.items():
        opset = max(DEFAULT_OPSET, min(body_opset(body) for body in declared.bodies))
        if opset in loads and set(kernels_needed(op, target)) <= TARGETS[target].kernels():
            found.append((target, opset))
    return found


def _name_clashes(subject: Subject) -> list[str]:
    """Op types and library functions must be unique among the variants registered with this one."""
    mine, problems = subject.variant.name, []
    seen: dict[tuple[str, str], tuple[str, object]] = {}
    others = [(name, v) for name, v in sorted(subject.registry.variants.items()) if name != mine]
    for owner, variant in [(mine, subject.variant), *others]:
        try:
            ops = subject.impl.ops if owner == mine else variant.load().ops
        except Exception:
            continue  # another plugin's load failure is that plugin's problem (attnx list reports it)
        for op in ops:
            definitions: list[tuple[tuple[str, str], object]] = [
                ((DOMAIN, op.name), op.overload._schema.name)
            ]
            definitions += [
                ((p.domain, p.name), p.SerializeToString())
                for body in [*op.bodies, *(b for declared in op.targets.values() for b in declared.bodies)]
                for p in function_protos(body)[1:]
            ]
            for key, content in definitions:
                first_owner, first_content = seen.setdefault(key, (owner, content))
                if first_content != content and mine in (owner, first_owner):
                    what = "op" if key[0] == DOMAIN else "ONNX library function"
                    problems.append(
                        f"{what} {key[0]}::{key[1]} is defined by variant '{first_owner}' and differently "
                        f"by '{owner}'; prefix the name with the variant's CamelCase name"
                    )
    return problems


def check_onnx_body(subject: Subject) -> list[str]:
    """Each recorded call gives the same output through its ONNX body in ONNX Runtime (CPU), at each opset
    the op has bodies for (those the installed ONNX Runtime loads), and through its bodies for each
    lowering target whose kernels the installed runtime has."""
    tol, problems = subject.variant.tolerance, []
    for call in declared_calls(subject):
        for target, opset in lowerings(call.op):
            on = "" if target == PORTABLE else f", target {target}"
            at = f"ONNX body of attnx::{call.op.name} (opset {opset}{on})"
            try:
                outputs = OpSession(call.op, call, opset=opset, target=target).run(call.bound())
            except Exception as exc:
                problems.append(f"the {at} does not load: {first_line(exc)} ({call.describe()})")
                continue
            for name, got, expected in zip(call.op.outputs, outputs, call.outputs, strict=True):
                problem = mismatch(got, expected.float(), tol.atol, tol.rtol)
                if problem:
                    what = "" if len(outputs) == 1 else f" (output {name})"
                    problems.append(
                        f"{at} differs from the torch op {call.name}{what}: {problem} ({call.describe()})"
                    )
    return problems
