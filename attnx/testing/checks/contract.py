"""``contract`` and ``capabilities``: the declaration, the config, and what the built layer does."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Mapping
from typing import Any

import torch

from attnx.config import Config
from attnx.errors import AttnxError
from attnx.ops import AttentionOp
from attnx.testing.checks.common import mismatch
from attnx.testing.subject import BATCH, D_MODEL, Case, Forward, Subject

VARIANT_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
OP_NAME = re.compile(r"^[A-Z][A-Za-z0-9]*$")


def check_contract(subject: Subject) -> list[str]:
    """Declaration, config (defaults, manifest round trip, rejections) and the impl object."""
    variant, problems = subject.variant, []
    if not VARIANT_NAME.match(variant.name):
        problems.append(
            f"variant name '{variant.name}' must be lower-case letters, digits, '_' or '-', "
            "starting with a letter"
        )
    problems += [
        f"Variant.{field} is empty" for field in ("summary", "paper") if not getattr(variant, field).strip()
    ]
    if not (variant.tolerance.atol > 0 and variant.tolerance.rtol >= 0):
        problems.append(f"tolerance {variant.tolerance} must have atol > 0 and rtol >= 0")
    config_type = variant.config
    if not (
        isinstance(config_type, type)
        and issubclass(config_type, Config)
        and dataclasses.is_dataclass(config_type)
    ):
        return [
            *problems,
            f"Variant.config must be a dataclass subclassing attnx.config.Config, not {config_type!r}",
        ]
    try:
        default = variant.make_config({})
    except Exception as exc:
        return [*problems, f"the default config does not validate: {type(exc).__name__}: {exc}"]
    try:  # attnx verify rebuilds the config from attnx.json
        again = variant.make_config(json.loads(json.dumps(default.to_dict())))
        if again != default:
            problems.append(
                f"the config does not survive the manifest (JSON) round trip: {default} -> {again}"
            )
    except Exception as exc:
        problems.append(
            f"the config does not survive the manifest (JSON) round trip: {type(exc).__name__}: {exc}"
        )
    probes: dict[str, dict[str, Any]] = {"an unknown option": {"no_such_option": 1}}
    for name, annotation in typing.get_type_hints(config_type).items():
        base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        if base[0] in (int, float, bool):
            probes[f"option {name}='not-a-value' (declared {base[0].__name__})"] = {name: "not-a-value"}
    probes.update({f"bad option {key}={value!r}": {key: value} for key, value in subject.bad_options.items()})
    problems += filter(None, (_expect_rejected(subject, options, what) for what, options in probes.items()))
    fields = {f.name for f in dataclasses.fields(config_type)}
    for model in subject.registry.models.values():
        clash = sorted(fields & {f.name for f in dataclasses.fields(model.config)})
        if clash:
            problems.append(
                f"option(s) {', '.join(clash)} also exist in model '{model.name}'; rename them "
                "(--set would be ambiguous)"
            )
    try:
        impl = subject.impl
    except Exception as exc:
        return [*problems, f"impl '{variant.impl}' cannot be loaded: {type(exc).__name__}: {exc}"]
    if not impl.ops:
        problems.append("VariantImpl.ops is empty: the export would hold no attnx node")
    for op in impl.ops:
        if not isinstance(op, AttentionOp):
            problems.append(f"VariantImpl.ops holds {op!r}, not an attnx.ops.AttentionOp")
        elif not OP_NAME.match(op.name):
            problems.append(
                f"op name '{op.name}' must be CamelCase (it is the ONNX op type and TensorRT plugin name)"
            )
    return problems


def check_capabilities(subject: Subject) -> list[str]:
    """Declared modes build and run with the right shapes; padded keys are ignored; others are refused."""
    caps, problems = subject.variant.capabilities, []
    for flag in ("bidirectional", "causal", "cross"):
        if getattr(caps, flag):
            continue
        try:
            subject.build(Case(flag, **{flag: True} if flag != "bidirectional" else {}))
            problems.append(
                f"building a {flag} layer is not refused although the variant does not declare {flag}"
            )
        except AttnxError:
            pass
    declared = {op.name for op in subject.impl.ops}
    called = set()
    for fw in subject.forwards:
        label = fw.case.label
        if fw.error is not None:
            problems.append(fw.error)
            continue
        expected = (BATCH, fw.case.n_queries, D_MODEL)
        if tuple(fw.output.shape) != expected or fw.output.dtype != torch.float32:
            problems.append(
                f"the {label} layer returns {tuple(fw.output.shape)} {fw.output.dtype}, expected "
                f"{expected} torch.float32"
            )
            continue
        if not torch.isfinite(fw.output).all():
            problems.append(f"the {label} layer returns non-finite values")
        if not fw.calls:
            problems.append(f"the {label} layer calls no custom op: nothing would become an attnx node")
        for call in fw.calls:
            if call.op is None:
                problems.append(
                    f"the {label} layer calls {call.name}, which VariantImpl.ops does not declare "
                    "(the exporter has no translation for it)"
                )
            else:
                called.add(call.op.name)
                outside = call.op.preconditions and call.op.preconditions(call.bound())
                if outside:
                    problems.append(f"the {label} layer calls {call.name} outside its domain: {outside}")
        if fw.mask is not None:
            problems += _padding_leaks(subject, fw)
    problems += [
        f"VariantImpl.ops declares {name} but no layer calls it"
        for name in sorted(declared - called - set(subject.impl.conditional_ops))
    ]
    return problems


def _padding_leaks(subject: Subject, fw: Forward) -> list[str]:
    """Changing padded tokens must not change the outputs of real query tokens."""
    tol = subject.variant.tolerance
    generator = torch.Generator().manual_seed(subject.seed + 7)
    padded = ~fw.mask[..., None]
    source = fw.context if fw.case.cross else fw.x
    changed = torch.where(padded, torch.randn(source.shape, generator=generator) * 3, source)
    out = fw.rerun(context=changed) if fw.case.cross else fw.rerun(x=changed)
    real = torch.ones(fw.output.shape[:2], dtype=torch.bool) if fw.case.cross else fw.mask
    problem = mismatch(out[real], fw.output[real], tol.atol, tol.rtol)
    if problem:
        return [
            f"the {fw.case.label} layer's outputs for real tokens change when padded keys change "
            f"(key_padding_mask ignored?): {problem}"
        ]
    return []


def _expect_rejected(subject: Subject, options: Mapping[str, Any], what: str) -> str | None:
    try:
        subject.variant.make_config(options)
    except AttnxError as exc:
        if "\n" in str(exc).strip():
            return f"{what} is rejected with a multi-line AttnxError; the CLI prints one line"
        return None
    except Exception as exc:
        return (
            f"{what} raises {type(exc).__name__} ({exc}) instead of AttnxError; the CLI would print a "
            "traceback (use attnx.config.require in validate())"
        )
    return f"{what} is accepted; {subject.variant.config.__name__}.validate() must raise AttnxError"
