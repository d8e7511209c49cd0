"""Shared by the variants' export tests: the form of each lowering, and the property test (torch against
ONNX Runtime on drawn shapes, on one dynamic-shape export per test module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_model

from attnx.api import ExportResult, export
from attnx.exporter.assemble import assemble
from attnx.exporter.manifest import MODEL_FILE, WEIGHTS_FILE
from attnx.variant import Tolerance, Variant

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "vocab_size": 50}


def export_in_lowering(
    variant: str,
    out: Path,
    options: dict[str, Any],
    lowering: str,
    op_type: str,
    n_nodes: int = 1,
    **settings: Any,
) -> tuple[ExportResult, onnx.ModelProto, list[onnx.NodeProto]]:
    """Export with ``lowering`` (``settings``: ``seq_lens`` verified at, export ``seed``), its parity
    verified, and check its form.

    Decomposed: only standard-domain nodes and opsets, no local functions. Otherwise ``n_nodes`` nodes
    ``attnx::<op_type>``, plugin attributes exactly when plugin-lowered, local functions exactly when
    function-lowered. Returns the result, the model and its attnx nodes.
    """
    names = {"seq_lens": "verify.seq_lens", "seed": "export.seed"}
    given = {names[key]: value for key, value in settings.items()}
    result = export(variant, out, options={**options, **given, "export.lowering": lowering})
    assert result.parity is not None and result.parity.passed, result.parity
    model = onnx.load(str(out / MODEL_FILE))
    nodes = [node for node in model.graph.node if node.domain == "attnx"]
    if lowering == "decomposed":
        assert result.attnx_nodes == 0 and not nodes and not model.functions
        assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
        assert {node.domain for node in model.graph.node} <= {"", "ai.onnx"}
        return result, model, nodes
    assert result.attnx_nodes == n_nodes and [node.op_type for node in nodes] == [op_type] * n_nodes
    attributes = {a.name for node in nodes for a in node.attribute}
    assert ({"plugin_namespace", "plugin_version"} <= attributes) == (lowering == "plugin")
    assert bool(model.functions) == (lowering == "function")
    return result, model, nodes


def export_encoder(
    variant: str, out: Path, options: dict[str, Any]
) -> tuple[torch.nn.Module, ort.InferenceSession]:
    """Export (function lowering, seed 3) and rebuild the torch model from the export's weights (seed 0)."""
    export(
        variant,
        out,
        options={**options, "export.lowering": "function", "verify.enabled": False, "export.seed": 3},
    )
    module = assemble(variant, "encoder", options, seed=0).module
    load_model(module, str(out / WEIGHTS_FILE), strict=True)
    return module.eval(), ort.InferenceSession(str(out / MODEL_FILE), providers=["CPUExecutionProvider"])


def assert_encoder_matches_ort(
    exported: tuple[torch.nn.Module, ort.InferenceSession],
    batch: int,
    n: int,
    seed: int,
    vocab_size: int,
    tolerance: Tolerance,
    keep_first_token: bool = False,
) -> None:
    """Random ids and padding mask of shape (batch, n): torch and ORT hidden states agree."""
    module, session = exported
    rng = np.random.default_rng(seed)
    input_ids = rng.integers(0, vocab_size, size=(batch, n))
    mask = rng.random((batch, n)) > 0.3
    if keep_first_token:
        mask[:, 0] = True
    with torch.no_grad():
        (expected,) = module(torch.from_numpy(input_ids), torch.from_numpy(mask))
    (actual,) = session.run(None, {"input_ids": input_ids, "attention_mask": mask})
    np.testing.assert_allclose(actual, expected.numpy(), atol=tolerance.atol, rtol=tolerance.rtol)


def encoder_fixture(variant: str, options: dict[str, Any]) -> Any:
    """The module-scoped fixture ``exported``: :func:`export_encoder` once per test module.

    In a test module: ``exported = encoder_fixture("linear", TINY)``.
    """

    @pytest.fixture(scope="module", name="exported")
    def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, ort.InferenceSession]:
        return export_encoder(variant, tmp_path_factory.mktemp(variant) / "out", options)

    return exported


def encoder_property_test(variant: Variant, max_n: int = 100, keep_first_token: bool = False) -> Any:
    """A hypothesis test on the ``exported`` fixture: 15 draws of (batch 1-3, n 1-max_n, seed), torch and
    ORT within the variant's tolerance (:func:`assert_encoder_matches_ort`).

    In a test module: ``test_property_torch_matches_onnxruntime = encoder_property_test(VARIANT)``.
    """

    @settings(max_examples=15, deadline=None)
    @given(batch=st.integers(1, 3), n=st.integers(1, max_n), seed=st.integers(0, 2**16))
    def test_property_torch_matches_onnxruntime(exported: Any, batch: int, n: int, seed: int) -> None:
        vocab_size = TINY["vocab_size"]
        assert_encoder_matches_ort(exported, batch, n, seed, vocab_size, variant.tolerance, keep_first_token)

    return test_property_torch_matches_onnxruntime
