"""The conformance checks, in the order they run: each tests one promise a variant plugin makes.

A check returns the broken promises (empty: passed), one line each naming the op, the
call and the numbers; it raises :class:`Skip` when the promise does not apply (e.g.
causality for a variant that does not declare causal attention).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from attnx.testing.checks.causality import check_causality
from attnx.testing.checks.common import Broken, Skip
from attnx.testing.checks.contract import check_capabilities, check_contract
from attnx.testing.checks.decode import check_decode
from attnx.testing.checks.export import export_check
from attnx.testing.checks.fp16_convert import check_fp16_convert
from attnx.testing.checks.gradients import check_gradients
from attnx.testing.checks.onnx_body import check_onnx_body, check_onnx_schema
from attnx.testing.checks.plugin import check_plugin_kernel
from attnx.testing.checks.torch_op import check_fake_impl, check_fp16
from attnx.testing.subject import Subject

__all__ = ["CHECKS", "Broken", "Check", "Skip"]


@dataclasses.dataclass(frozen=True)
class Check:
    """One promise of the plugin contract and the function that tests it.

    ``heavy`` checks export a model (seconds each); the others replay tiny op calls.
    """

    name: str
    promise: str
    run: Callable[[Subject], list[str]]
    heavy: bool = False


CHECKS: tuple[Check, ...] = (
    Check(
        "contract",
        "the declaration and config follow the attnx contract (defaults validate, bad options "
        "raise AttnxError, the impl loads)",
        check_contract,
    ),
    Check(
        "capabilities",
        "the layer honours its capability flags (declared modes work with the right shapes, "
        "padded keys are ignored, undeclared modes are refused)",
        check_capabilities,
    ),
    Check(
        "fake-impl",
        "register_fake returns the eager output's shape and dtype, and the op mutates no input",
        check_fake_impl,
    ),
    Check(
        "onnx-schema",
        "the ONNX bodies agree with the op schema, cover every optional-input combination the "
        "layer uses, and their names clash with no other variant",
        check_onnx_schema,
    ),
    Check(
        "onnx-body", "the ONNX body computes what the torch op computes (ONNX Runtime, CPU)", check_onnx_body
    ),
    Check("causality", "causal mode never reads future tokens (torch and ONNX Runtime)", check_causality),
    Check("fp16", "fp16 inputs give finite fp16 outputs", check_fp16),
    Check(
        "gradients",
        "a trainable variant's ops pass gradcheck in float64 and every layer parameter gets a finite "
        "gradient; a variant that does not declare trainable refuses backward",
        check_gradients,
    ),
    Check(
        "plugin-kernel",
        "the op fits the TensorRT plugin slot: its output_shape rule gives the eager shape "
        "and the bare node run by attnx's CPU plugin kernels matches torch",
        check_plugin_kernel,
    ),
    Check(
        "decode",
        "a variant that declares decode steps like its full causal forward: a prompt, single tokens and a "
        "multi-token step, each from the state the last one returned, match it in torch and through the "
        "ONNX step graphs in ONNX Runtime, and every state tensor keeps its declared shape (only a KV "
        "cache grows with the position)",
        check_decode,
        heavy=True,
    ),
    Check(
        "export-function",
        "the model exports with the function lowering (one attnx node per call, bodies as "
        "local functions), matches torch in ORT and re-verifies from its manifest",
        export_check("function"),
        heavy=True,
    ),
    Check(
        "export-decomposed",
        "the model exports with the decomposed lowering (standard ops only) and matches torch in ORT",
        export_check("decomposed"),
        heavy=True,
    ),
    Check(
        "export-plugin",
        "the model exports with the plugin lowering (bare attnx nodes with plugin attributes) "
        "and matches torch through attnx's plugin path on CPU",
        export_check("plugin"),
        heavy=True,
    ),
    Check(
        "export-fp16",
        "unless the variant declares fp32 only, the model exports in fp16 (function lowering) and "
        "matches torch in fp16 in ORT at the variant's fp16 tolerance",
        export_check("function", "fp16"),
        heavy=True,
    ),
    Check(
        "fp16-convert",
        "unless the variant declares fp32 only, its fp32 export (function and decomposed lowerings) still "
        "loads and matches torch in fp16 once an fp16 converter (ONNX Runtime's, onnxconverter-common's) "
        "rewrote it: the bodies are dtype-generic",
        check_fp16_convert,
        heavy=True,
    ),
)
