"""``fake-impl`` and ``fp16``: the torch op's fake kernel, schema honesty and half precision."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

from attnx.errors import first_line
from attnx.testing.checks.common import declared_calls, half
from attnx.testing.subject import OpCall, Subject


def check_fake_impl(subject: Subject) -> list[str]:
    """register_fake agrees with eager on shape and dtype; the op mutates no input (opcheck test_schema)."""
    problems = []
    calls = declared_calls(subject)
    for call in calls:
        problem = fake_mismatch(call, call.bound(), call.output)
        if problem is None:  # the fp32 shapes agree; the dtype must follow fp16 inputs too
            halves = half(call)
            with contextlib.suppress(Exception):  # an op failing on fp16 is the fp16 check's finding
                problem = fake_mismatch(call, {**call.bound(), **halves}, call.run(halves))
        if problem:
            problems.append(f"{problem} ({call.describe()})")
    checked = set()
    for call in calls:
        if call.name in checked:
            continue
        checked.add(call.name)
        try:
            torch.library.opcheck(call.overload, call.args, call.kwargs, test_utils=("test_schema",))
        except Exception as exc:
            reason = str(exc).split(" failed with ", 1)[-1].removesuffix(" (scroll up for stack trace)")
            problems.append(
                f"{call.name} does not keep its schema's promises: {reason} (declare mutates_args)"
            )
    return problems


def fake_mismatch(call: OpCall, arguments: Mapping[str, Any], eager: Any) -> str | None:
    """What the fake impl gets wrong for these arguments (by name), or None."""
    dtypes = {str(v.dtype).removeprefix("torch.") for v in arguments.values() if isinstance(v, torch.Tensor)}
    try:
        with FakeTensorMode() as mode:
            fake = tree_map(
                lambda v: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v, dict(arguments)
            )
            output = call.overload(**fake)
    except Exception as exc:
        return f"fake impl of {call.name} raised {type(exc).__name__}: {exc}"
    fakes = output if isinstance(output, tuple) else (output,)
    eagers = eager if isinstance(eager, tuple) else (eager,)
    for fake_out, eager_out in zip(fakes, eagers, strict=True):
        if tuple(fake_out.shape) != tuple(eager_out.shape):
            return (
                f"fake impl of {call.name} returns shape {tuple(fake_out.shape)} but eager returns "
                f"{tuple(eager_out.shape)}"
            )
        if fake_out.dtype != eager_out.dtype:
            return (
                f"fake impl of {call.name} returns {fake_out.dtype} but eager returns {eager_out.dtype} "
                f"for {'/'.join(sorted(dtypes))} inputs"
            )
    return None


def check_fp16(subject: Subject) -> list[str]:
    """fp16 inputs give finite outputs, fp16 unless AttentionOp.output_types says otherwise (the ONNX
    schema binds inputs and outputs to one type T)."""
    problems = []
    for call in declared_calls(subject):
        try:
            output = call.run(half(call))
        except Exception as exc:
            problems.append(f"{call.name} raises for fp16 inputs: {first_line(exc)} ({call.describe()})")
            continue
        outputs = output if isinstance(output, tuple) else (output,)
        for name, value in zip(call.op.outputs, outputs, strict=True):
            what = "" if len(outputs) == 1 else f" output {name}"
            if name not in call.op.output_types and value.dtype != torch.float16:
                problems.append(
                    f"{call.name}{what} is {value.dtype} for fp16 inputs; the ONNX schema binds it to the "
                    f"inputs' type, fp16 ({call.describe()})"
                )
            elif not torch.isfinite(value).all():
                problems.append(
                    f"{call.name}{what} has non-finite values for fp16 inputs ({call.describe()})"
                )
    return problems
