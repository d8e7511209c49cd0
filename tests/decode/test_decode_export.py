"""Decode exports: prefill.onnx + decode.onnx on ONNX Runtime reproduce the torch full forward."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from attnx.decode.parity import STEPS
from attnx.decode.runtime import open_stepper
from attnx.exporter.assemble import assemble
from attnx.exporter.directory import ExportDir, record_file
from attnx.exporter.manifest import ContextInput
from tests.decode.conftest import DECODERS, EXPORT_SEQ_LENS, lm_options
from tests.helpers import assert_one_line_error, run_cli
from tests.models.cases import REGISTERED, capabilities, decoders


def sessions(out):
    return [
        ort.InferenceSession(str(out / name), providers=["CPUExecutionProvider"])
        for name in ("prefill.onnx", "decode.onnx")
    ]


def run(session, feed):
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


@pytest.mark.parametrize("variant", DECODERS)
def test_export_writes_verified_prefill_and_decode(decode_export, variant):
    out, stdout = decode_export(variant)
    assert {"model.onnx", "prefill.onnx", "decode.onnx", "attnx.json"} <= {p.name for p in out.iterdir()}
    kind = capabilities(variant).decode
    tensors = 1 + len(
        assemble(variant, "lm", lm_options(variant), seed=0).module.blocks[0].attention.decode_state()
    )
    assert f"wrote {out}/prefill.onnx and {out}/decode.onnx ({kind} state, {tensors} tensors" in stdout
    assert "parity: PASSED on ort-cpu, torch decode, ort-cpu decode" in stdout
    manifest = ExportDir.open(out).manifest
    assert manifest.decode.layers == [kind]
    assert manifest.files["prefill"].path == "prefill.onnx" and manifest.files["decode"].path == "decode.onnx"
    parity = json.loads((out / "parity.json").read_text())
    backends = {b["backend"]: b for b in parity["backends"]}
    assert parity["passed"]
    for name in ("torch decode", "ort-cpu decode"):
        rows = backends[name]["comparisons"]
        assert len(rows) == len(EXPORT_SEQ_LENS) * (1 + STEPS) and all(r["passed"] for r in rows)
        assert [r["output"] for r in rows[:2]] == ["prefill logits", f"logits @ {EXPORT_SEQ_LENS[0]}"]


@pytest.mark.parametrize("variant", DECODERS)
def test_ort_steps_match_the_torch_full_forward_at_every_position(decode_export, variant):
    """Drives ORT directly from the manifest's state map; the reference is the torch model's full forward."""
    out, _ = decode_export(variant)
    export = ExportDir.open(out)
    manifest, module = export.manifest, export.rebuild().module
    feeds = manifest.decode.feeds()
    prefill, decode = sessions(out)
    tol = manifest.tolerance
    for batch, prompt, total in [(1, 1, 8), (2, 3, 9), (1, 9, 12)]:
        ids = np.random.default_rng(prompt).integers(0, 50, size=(batch, total))
        with torch.inference_mode():
            expected = module(torch.from_numpy(ids))[0].numpy()
        outputs = run(prefill, {"input_ids": ids[:, :prompt]})
        np.testing.assert_allclose(
            outputs["logits"], expected[:, :prompt], atol=tol["atol"], rtol=tol["rtol"]
        )
        for t in range(prompt, total):
            state = {feeds[k]: v for k, v in outputs.items() if k in feeds}
            outputs = run(decode, {"input_ids": ids[:, t : t + 1], **state})
            np.testing.assert_allclose(
                outputs["logits"][:, 0], expected[:, t], atol=tol["atol"], rtol=tol["rtol"]
            )
            assert outputs["present_length"].tolist() == [t + 1]


def graph_shapes(values):
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


@pytest.mark.parametrize("variant", decoders("recurrent"))
def test_recurrent_state_is_static_except_batch(decode_export, variant):
    """Every dim of a recurrent state but batch is static in the graph, as the layer declares it."""
    out, _ = decode_export(variant)
    graph = onnx.load(str(out / "decode.onnx")).graph
    inputs, outputs = graph_shapes(graph.input), graph_shapes(graph.output)
    layer = assemble(variant, "lm", lm_options(variant), seed=0).module.blocks[0].attention
    for tensor in layer.decode_state():
        assert inputs[f"past.0.{tensor.name}"] == list(tensor.axes)
    for name, dims in inputs.items():
        if name.startswith("past."):
            assert dims[0] == "batch" and all(isinstance(x, int) and x > 0 for x in dims[1:]), (name, dims)
            assert outputs[name.replace("past.", "present.")] == dims
    assert inputs["past_length"] == [1] and inputs["input_ids"] == ["batch", "seq"]


@pytest.mark.parametrize("variant", decoders("kv-cache"))
def test_kv_cache_grows_with_the_past(decode_export, variant):
    out, _ = decode_export(variant)
    graph = onnx.load(str(out / "decode.onnx")).graph
    inputs, outputs = graph_shapes(graph.input), graph_shapes(graph.output)
    assert inputs["past.0.key"] == ["batch", 2, "past_seq", 16]
    assert outputs["present.0.value"] == ["batch", 2, "present_seq", 16]
    prefill, decode = sessions(out)
    state = run(prefill, {"input_ids": np.ones((1, 5), dtype=np.int64)})
    assert state["present.0.key"].shape == (1, 2, 5, 16)


@pytest.mark.parametrize("variant", DECODERS)
def test_manifest_maps_every_output_to_the_next_input(decode_export, variant):
    out, _ = decode_export(variant)
    entry = ExportDir.open(out).manifest.decode
    decode_inputs = {s.name for s in entry.decode.inputs}
    decode_outputs = {s.name for s in entry.decode.outputs}
    pairs = set(entry.feeds().items())
    assert {i for _, i in pairs} == decode_inputs - {"input_ids"}
    assert {o for o, _ in pairs} == decode_outputs - {"logits"}
    assert {o for o, _ in pairs} <= {s.name for s in entry.prefill.outputs}
    graph = onnx.load(str(out / "decode.onnx")).graph
    assert [v.name for v in graph.input] == [s.name for s in entry.decode.inputs]


def test_verify_reruns_decode_parity_and_catches_a_broken_decode_graph(decode_export, tmp_path):
    out, _ = decode_export("linear")
    # --no-write: the export is the session's, and other tests read its parity.json
    argv = ["verify", str(out), "--seq-lens", "3", "--json", "--seed", "4", "--no-write"]
    code, stdout, stderr = run_cli(argv)
    report = json.loads(stdout)
    assert code == 0, stderr
    assert {b["backend"]: b["status"] for b in report["backends"]}["ort-cpu decode"] == "passed"
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    model = onnx.load(str(broken / "decode.onnx"))
    weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the embedding
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.01, weight.name))
    onnx.save(model, str(broken / "decode.onnx"))
    code, _, stderr = run_cli(["verify", str(broken), "--seq-lens", "3", "--seed", "4"])
    assert_one_line_error(code, stderr, "decode.onnx changed since it was written")
    # an exporter bug would write a wrong graph with its own hash: the parity check catches that
    export = ExportDir.open(out)
    files = {**export.manifest.files, "decode": record_file(broken, "decode.onnx")}
    ExportDir(broken, export.manifest).write_manifest(dataclasses.replace(export.manifest, files=files))
    code, stdout, _ = run_cli(["verify", str(broken), "--seq-lens", "3", "--json", "--seed", "4"])
    statuses = {b["backend"]: b["status"] for b in json.loads(stdout)["backends"]}
    assert code == 1
    assert statuses == {  # genai.onnx is a graph of its own, written from the unbroken decode graph
        "ort-cpu": "passed",
        "torch decode": "passed",
        "ort-cpu decode": "failed",
        "ort-cpu genai": "passed",
    }


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        *(
            (["--variant", v], [f"variant '{v}' cannot decode", ", ".join(DECODERS)])
            for v in REGISTERED
            if not capabilities(v).decode
        ),
        (["--variant", "linear", "--lowering", "plugin"], ["function or decomposed lowering"]),
        (
            ["--variant", "linear", "--model", "encoder"],
            ["--decode exports models that generate", "lm, seq2seq"],
        ),
    ],
)
def test_export_refuses_what_cannot_decode(tmp_path, args, fragments):
    out = tmp_path / "out"
    model = [] if "--model" in args else ["--model", "lm"]
    code, _, stderr = run_cli(["export", *model, *args, "--decode", "-o", str(out), "--set", "d_model=32"])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    variant=st.sampled_from(DECODERS),
    batch=st.integers(1, 3),
    prompt=st.integers(1, 40),
    steps=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_property_ort_decode_matches_the_full_forward(decode_export, variant, batch, prompt, steps, seed):
    out, _ = decode_export(variant)
    ids = np.random.default_rng(seed).integers(0, 50, size=(batch, prompt + steps))
    with open_stepper(ExportDir.open(out)) as stepper:
        logits, state = stepper.prefill(ids[:, :prompt])
        rows = [logits]
        for t in range(prompt, prompt + steps):
            logits, state = stepper.decode(ids[:, t : t + 1], state)
            rows.append(logits)
    expected = full_forward(out, ids)
    np.testing.assert_allclose(np.concatenate(rows, 1), expected, atol=1e-4, rtol=1e-3)


@functools.cache
def rebuilt(out):
    return ExportDir.open(out).rebuild().module


def full_forward(out, ids):
    with torch.inference_mode():
        return rebuilt(out)(torch.from_numpy(ids))[0].numpy()


def test_seq2seq_decode_export_carries_cached_cross_keys_values_as_context(decode_export):
    out, stdout = decode_export("cosformer", "seq2seq")
    assert "parity: PASSED on ort-cpu, torch decode, ort-cpu decode" in stdout
    export = ExportDir.open(out)
    entry = export.manifest.decode
    assert entry.tokens == "decoder_input_ids"
    assert entry.context == [
        ContextInput("cross.0.key", "prefill output"),
        ContextInput("cross.0.value", "prefill output"),
        ContextInput("cross.1.key", "prefill output"),
        ContextInput("cross.1.value", "prefill output"),
        ContextInput("attention_mask", "prefill input"),
    ]
    module = export.rebuild().module
    prefill, decode = sessions(out)
    rng = np.random.default_rng(0)
    source, mask = rng.integers(0, 50, size=(2, 7)), np.arange(7) < np.array([[7], [3]])
    target = rng.integers(0, 50, size=(2, 6))
    with torch.inference_mode():
        args = [torch.from_numpy(a) for a in (source, mask, target, np.ones(target.shape, dtype=bool))]
        expected = module(*args)[0].numpy()
    outputs = run(prefill, {"input_ids": source, "attention_mask": mask, "decoder_input_ids": target[:, :2]})
    assert "encoder_hidden_states" not in outputs
    context = {c.input: outputs.get(c.input, mask) for c in entry.context}
    feeds = entry.feeds()
    for t in range(2, 6):
        state = {feeds[k]: v for k, v in outputs.items() if k in feeds}
        outputs = run(decode, {"decoder_input_ids": target[:, t : t + 1], **context, **state})
        np.testing.assert_allclose(outputs["logits"][:, 0], expected[:, t], atol=1e-4, rtol=1e-3)
