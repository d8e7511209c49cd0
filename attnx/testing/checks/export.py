"""``export-*``: a tiny model exported with each lowering (and in fp16), its graph inspected, parity
checked: an encoder, or an lm for a variant that attends causally only."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

from attnx.api import export, verify
from attnx.domains import DOMAIN
from attnx.errors import first_line
from attnx.exporter.lowering import attnx_nodes
from attnx.testing.checks.common import Skip
from attnx.testing.subject import Subject

EXPORT_SEQ_LENS = (1, 7, 19)
EXPORT_MODEL_OPTIONS = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}


def export_check(lowering: str, dtype: str = "fp32") -> Callable[[Subject], list[str]]:
    def check(subject: Subject) -> list[str]:
        if dtype == "fp16" and not subject.variant.capabilities.fp16:
            raise Skip("the variant exports in fp32 only (Capabilities.fp16=False)")
        options = export_options(subject)
        with tempfile.TemporaryDirectory(prefix="attnx-conformance-") as tmp, subject.installed():
            out = Path(tmp) / lowering
            what = f"the {lowering} lowering" + (f" in {dtype}" if dtype != "fp32" else "")
            try:
                settings = {
                    "export.lowering": lowering,
                    "export.seed": subject.seed,
                    "export.dtype": dtype,
                    "verify.seq_lens": EXPORT_SEQ_LENS,
                }
                result = export(
                    subject.variant.name, out, model=export_model(subject), options={**options, **settings}
                )
            except Exception as exc:
                return [f"export with {what} failed: {type(exc).__name__}: {first_line(exc)}"]
            problems = _graph_problems(out / "model.onnx", lowering, subject)
            problems += parity_problems(result.parity, f"the model exported with {what}")
            if lowering == "function":  # a fresh rebuild from attnx.json + weights, as `attnx verify` does
                problems += parity_problems(
                    verify(out, seq_lens=EXPORT_SEQ_LENS, write=False),
                    "the model rebuilt from attnx.json (attnx verify)",
                )
        return problems

    check.__doc__ = (
        f"Export a tiny {dtype} model with the {lowering} lowering and compare it with torch in ORT (CPU)."
    )
    return check


def export_model(subject: Subject) -> str:
    """The tiny model the export checks build: an encoder, or an lm for a causal-only variant."""
    return "encoder" if subject.variant.capabilities.bidirectional else "lm"


def export_options(subject: Subject) -> dict[str, Any]:
    """Options of the tiny model the export checks build around the variant."""
    mask = {"model.attention_mask": subject.variant.capabilities.key_padding_mask}
    return {
        **{f"model.{k}": v for k, v in EXPORT_MODEL_OPTIONS.items()},
        **(mask if export_model(subject) == "encoder" else {}),
        **{f"variant.{k}": v for k, v in subject.options.items()},
    }


def _graph_problems(path: Path, lowering: str, subject: Subject) -> list[str]:
    model = onnx.load(str(path))
    nodes = attnx_nodes(model)
    functions = {(f.name, f.overload) for f in model.functions if f.domain == DOMAIN}
    declared = {op.name for op in subject.impl.ops}
    if lowering == "decomposed":
        leftovers = sorted({n.op_type for n in nodes} | {name for name, _ in functions})
        return [f"the decomposed model still holds attnx::{name}" for name in leftovers]
    if not nodes:
        return [
            f"the {lowering}-lowered model holds no attnx node: the op was traced through instead of kept "
            "(is it a torch.library.custom_op listed in VariantImpl.ops?)"
        ]
    problems = [
        f"the {lowering}-lowered model holds attnx::{n.op_type}, which VariantImpl.ops does not declare"
        for n in nodes
        if n.op_type not in declared
    ]
    if lowering == "function":
        problems += [
            f"attnx::{n.op_type} (overload '{n.overload}') has no function body in the model"
            for n in nodes
            if (n.op_type, n.overload) not in functions
        ]
    else:
        if functions:
            problems.append(
                "the plugin-lowered model carries attnx function bodies; TensorRT < 10.15 would use them"
            )
        problems += [
            f"attnx::{n.op_type} lacks the plugin_namespace attribute"
            for n in nodes
            if "plugin_namespace" not in {a.name for a in n.attribute}
        ]
    return problems


def parity_problems(report: Any, what: str) -> list[str]:
    if report is None or not report.ran:
        return [f"{what}: parity was not checked (no backend ran)"]
    return [
        f"{what} differs from torch on {backend.backend} at seq len {c.seq_len} ({c.output}): max abs err "
        f"{c.max_abs:.3g} (atol {report.atol:g}, rtol {report.rtol:g})"
        for backend in report.ran
        for c in backend.comparisons
        if not c.passed
    ]
