"""``gradients``: a trainable variant's gradients are right; a non-trainable one refuses backward.

Trainable (``Capabilities.trainable``): every recorded op call, replayed in float64, passes
``torch.autograd.gradcheck``'s fast-mode test (the backward's w^T J u against a central difference,
for a random unit cotangent w and direction u), run here one input at a time so that a finding names
the input (torch's own fast mode recomputes the full Jacobian to word a failure: minutes at the kit's
sizes); and ``backward`` through each case's layer gives every parameter a finite gradient.
Not trainable: ``backward`` through the layer raises (torch's "no autograd formula" error for an
op without a backward), so nobody trains on unchecked gradients.
"""

from __future__ import annotations

import torch

from attnx.errors import first_line
from attnx.testing.checks.common import declared_calls, forwards
from attnx.testing.subject import Forward, OpCall, Subject

# Central differences in float64 at this step are exact to ~1e-10 of the gradient; a wrong backward (a
# dropped term, a wrong factor) is off by a sizeable fraction of it.
STEP = 1e-6
RTOL = 1e-5
ATOL = 1e-8


def check_gradients(subject: Subject) -> list[str]:
    """Trainable: gradcheck of every op call in float64 and finite layer gradients; else backward raises."""
    if not subject.variant.capabilities.trainable:
        return [problem for fw in forwards(subject) if (problem := _trains_silently(subject, fw))]
    problems = [problem for call in declared_calls(subject) if (problem := _op_gradient_problem(call))]
    return problems + [problem for fw in forwards(subject) for problem in _layer_problems(fw)]


def _op_gradient_problem(call: OpCall) -> str | None:
    """Fast-mode gradcheck input by input: w^T J u from the backward against a central difference, for a
    random unit cotangent w and direction u, in float64."""
    floats = {
        name: value.detach().double().requires_grad_()
        for name, value in call.bound().items()
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    }

    def run(values: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        output = call.run(values)
        return output if isinstance(output, tuple) else (output,)

    try:
        outputs = run(floats)
    except Exception as exc:
        return f"{call.name} raises for float64 inputs: {first_line(exc)} ({call.describe()})"
    dtypes = {str(o.dtype).removeprefix("torch.") for o in outputs}
    if dtypes != {"float64"}:
        return (
            f"{call.name} returns {'/'.join(sorted(dtypes))} for float64 inputs; gradcheck needs float64 "
            f"end to end (compute in attnx.ops.at_least_float32(x), not x.float()) ({call.describe()})"
        )
    generator = torch.Generator().manual_seed(0)
    cotangents = [_unit(o.shape, generator) for o in outputs]
    try:
        grads = torch.autograd.grad(outputs, list(floats.values()), cotangents, allow_unused=True)
    except Exception as exc:
        return f"backward of {call.name} raises {first_line(exc, with_type=True)} ({call.describe()})"
    for (name, value), grad in zip(floats.items(), grads, strict=True):
        direction = _unit(value.shape, generator)
        backward = 0.0 if grad is None else float((grad * direction).sum())
        with torch.no_grad():
            ahead, behind = (run({**floats, name: value + side * STEP * direction}) for side in (1, -1))
        difference = sum(
            float(((a - b) * w).sum()) for a, b, w in zip(ahead, behind, cotangents, strict=True)
        )
        numeric = difference / (2 * STEP)
        scale = max(abs(numeric), 0.0 if grad is None else float(grad.norm()))
        if abs(backward - numeric) > RTOL * scale + ATOL:
            return (
                f"{call.name} has wrong gradients with respect to {name}: along a random direction the "
                f"backward gives {backward:.6g}, a central difference {numeric:.6g} ({call.describe()})"
            )
    return None


def _unit(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    direction = torch.randn(shape, generator=generator, dtype=torch.float64)
    return direction / direction.norm().clamp_min(1e-30)


def _backward(fw: Forward) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor | None]]]:
    """Gradients of a fixed random projection of the layer's output: d/dx and d/d(each parameter)."""
    x = fw.x.clone().requires_grad_()
    output = fw.module(x, context=fw.context, key_padding_mask=fw.mask)
    weight = torch.randn(output.shape, generator=torch.Generator().manual_seed(7))
    parameters = list(fw.module.named_parameters())
    grads = torch.autograd.grad((output * weight).sum(), [x, *(p for _, p in parameters)], allow_unused=True)
    return grads[0], [(name, grad) for (name, _), grad in zip(parameters, grads[1:], strict=True)]


def _layer_problems(fw: Forward) -> list[str]:
    try:
        x_grad, parameter_grads = _backward(fw)
    except Exception as exc:
        return [
            f"backward through the {fw.case.label} layer raises {first_line(exc, with_type=True)}; "
            "a trainable variant's ops need a backward (attnx.ops.trainable_op)"
        ]
    problems = []
    if x_grad is None or not torch.isfinite(x_grad).all():
        problems.append(f"the {fw.case.label} layer's input gets a missing or non-finite gradient")
    for name, grad in parameter_grads:
        if grad is None:
            problems.append(
                f"parameter {name} of the {fw.case.label} layer gets no gradient (detached or unused)"
            )
        elif not torch.isfinite(grad).all():
            problems.append(f"parameter {name} of the {fw.case.label} layer gets a non-finite gradient")
    return problems


def _trains_silently(subject: Subject, fw: Forward) -> str | None:
    try:
        _backward(fw)
    except Exception:
        return None  # refused, as a variant that is not trainable must
    return (
        f"variant '{subject.variant.name}' does not declare trainable, but backward through its "
        f"{fw.case.label} layer returns gradients nobody checked; declare Capabilities(trainable=True) "
        "so the kit gradchecks them, or leave the op without a backward"
    )
