"""The gated / delta-rule variants decode: long runs of ONNX Runtime steps equal the torch full forward,
their state is named as onnxruntime-genai 0.18 names a linear-attention layer's, and generation runs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from attnx.decode.generate import generate
from attnx.exporter.directory import ExportDir
from tests.helpers import run_cli

GATED = ("gated_delta", "retention")


def ort_steps(out, ids: np.ndarray, prompt: int) -> np.ndarray:
    """Logits of ``ids`` from prefill.onnx on ids[:, :prompt], then one decode.onnx call per later token,
    feeding each step's state back as the manifest maps it."""
    feeds = ExportDir.open(out).manifest.decode.feeds()
    prefill, decode = (
        ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        for name in ("prefill.onnx", "decode.onnx")
    )
    names = [o.name for o in prefill.get_outputs()]
    outputs = dict(zip(names, prefill.run(names, {"input_ids": ids[:, :prompt]}), strict=True))
    rows = [outputs["logits"]]
    names = [o.name for o in decode.get_outputs()]
    for t in range(prompt, ids.shape[1]):
        state = {feeds[k]: v for k, v in outputs.items() if k in feeds}
        outputs = dict(zip(names, decode.run(names, {"input_ids": ids[:, t : t + 1], **state}), strict=True))
        rows.append(outputs["logits"])
    return np.concatenate(rows, axis=1)


@pytest.mark.parametrize(
    ("variant", "steps"),
    [
        ("gated_delta", 200),
        pytest.param("retention", 200, marks=pytest.mark.slow),
        pytest.param("gated_delta", 2000, marks=pytest.mark.slow),
        pytest.param("retention", 2000, marks=pytest.mark.slow),
    ],
)
def test_ort_decode_steps_equal_the_full_forward(decode_export, variant, steps):
    """Prefill 3 tokens, then ``steps`` one-token decode calls: every position's logits equal the torch
    model's full forward over the whole sequence (the chunked op), at the export's tolerance."""
    out, _ = decode_export(variant)
    export = ExportDir.open(out)
    module, tol = export.rebuild().module, export.manifest.tolerance
    ids = np.random.default_rng(steps).integers(0, 50, size=(2, 3 + steps))
    with torch.inference_mode():
        expected = module(torch.from_numpy(ids))[0].numpy()
    np.testing.assert_allclose(ort_steps(out, ids, 3), expected, atol=tol["atol"], rtol=tol["rtol"])


@pytest.mark.parametrize("variant", [GATED[0], pytest.param(GATED[1], marks=pytest.mark.slow)])
def test_state_is_named_as_genai_names_it(decode_export, variant):
    """past.{i}.conv (batch, channels, kernel - 1) and past.{i}.recurrent (batch, Hv, Dk, Dv), present.{i}.*
    out, in the decode and genai graphs, and genai_config's past/present conv and recurrent names."""
    out, _ = decode_export(variant)
    layer = ExportDir.open(out).rebuild().module.blocks[0].attention
    declared = {f"past.0.{t.name}": list(t.axes) for t in layer.decode_state()}
    assert ("past.0.conv" in declared) == (variant == "gated_delta")  # only gated_delta convolves by default
    assert declared["past.0.recurrent"] == ["batch", *layer.heads[1:], *layer.dims]
    for name in ("decode.onnx", "genai.onnx"):
        graph = onnx.load(str(out / name)).graph
        inputs = {
            v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input
        }
        assert {k: inputs[k] for k in declared} == declared, name
        assert {o.name for o in graph.output} >= {k.replace("past.", "present.") for k in declared}, name
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["inputs"]["past_recurrent_names"] == "past.%d.recurrent"
    assert decoder["outputs"]["present_recurrent_names"] == "present.%d.recurrent"
    if variant == "gated_delta":
        assert decoder["inputs"]["past_conv_names"] == "past.%d.conv"
        assert decoder["outputs"]["present_conv_names"] == "present.%d.conv"


def test_a_decode_step_convolves_tap_by_tap(decode_export):
    """The short convolution is the kernel's taps as products in a decode step, where ONNX Runtime's
    grouped Conv costs more than the products (attnx.shortconv); an lm's prefill is the decode graph from
    the empty state (attnx.decode.export.prefill_of), its nodes and a few adapters."""
    out, _ = decode_export("gated_delta")
    ops = {
        name: {node.op_type for node in onnx.load(str(out / name)).graph.node}
        for name in ("prefill.onnx", "decode.onnx", "genai.onnx")
    }
    assert "Conv" not in ops["prefill.onnx"] | ops["decode.onnx"] | ops["genai.onnx"]
    assert ops["prefill.onnx"] >= ops["decode.onnx"] | {"ConstantOfShape"}


def test_generate_runs_and_agrees_across_backends(decode_export):
    out, _ = decode_export("gated_delta")
    tokens = generate(out, [3, 1, 4], 16, backend="ort-cpu").tokens
    assert len(tokens) == 16 and tokens == generate(out, [3, 1, 4], 16, backend="torch").tokens
    code, stdout, stderr = run_cli(["generate", str(out), "--prompt-ids", "3,1,4", "-n", "16", "--json"])
    assert code == 0, stderr
    assert json.loads(stdout)["tokens"] == tokens
