"""Shared by the variants' property tests: one dynamic-shape export, compared with torch on drawn shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from safetensors.torch import load_model

from attnx.exporter.assemble import assemble
from attnx.exporter.export import export
from attnx.exporter.manifest import MODEL_FILE, WEIGHTS_FILE
from attnx.variant import Tolerance


def export_encoder(
    variant: str, out: Path, options: dict[str, Any]
) -> tuple[torch.nn.Module, ort.InferenceSession]:
    """Export (function lowering, seed 3) and rebuild the torch model from the export's weights (seed 0)."""
    export(variant, out, options=options, lowering="function", verify=False, seed=3)
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
