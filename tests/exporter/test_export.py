"""Export pipeline: three lowerings, ORT parity, dynamic axes, manifest, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from attnx.api import export, verify
from attnx.errors import AttnxError
from attnx.exporter import directory, source
from attnx.exporter.directory import ExportDir, record_file
from attnx.parity.runners import CPU, Graph, onnx_for_ort
from tests.conftest import TINY


@pytest.fixture(scope="module", params=["function", "decomposed", "plugin"])
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "out"
    result = export(
        "softmax", out, options={**TINY, "export.lowering": request.param, "verify.seq_lens": [1, 6, 33]}
    )
    return request.param, result


def test_every_lowering_exports_and_verifies(exported):
    lowering, result = exported
    assert result.parity.passed, result.parity.to_dict()
    assert {c.seq_len for c in result.parity.backends[0].comparisons} == {1, 6, 33}
    assert json.loads((result.out / "parity.json").read_text())["passed"] is True


def test_custom_node_is_present_or_absent_as_the_lowering_says(exported):
    lowering, result = exported
    model = onnx.load(str(result.out / "model.onnx"))
    nodes = [n for n in model.graph.node if n.domain == "attnx"]
    functions = {(f.domain, f.name) for f in model.functions}
    if lowering == "decomposed":
        assert nodes == [] and functions == set()
        assert {o.domain for o in model.opset_import} == {""}
    else:
        assert len(nodes) == TINY["n_layers"] and nodes[0].op_type == "SoftmaxAttention"
    if lowering == "function":
        assert ("attnx", "SoftmaxAttention") in functions
        onnx.checker.check_model(model, full_check=True)
    if lowering == "plugin":
        assert functions == set()
        attributes = {a.name: a for a in nodes[0].attribute}
        assert attributes["plugin_namespace"].s == b"attnx"
        assert attributes["plugin_version"].s == b"1"
        assert {"causal", "scale"} <= set(attributes)


def test_dynamic_axes_are_really_dynamic(exported):
    lowering, result = exported
    path = result.out / "model.onnx"
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param for d in dims] == ["batch", "seq"]
    if lowering == "plugin":  # bare nodes run through attnx's CPU kernels
        from attnx.ortkernels import session_options

        model = onnx_for_ort(Graph.of_model(ExportDir.open(result.out)), CPU)
        session = ort.InferenceSession(model, session_options(), providers=["CPUExecutionProvider"])
    else:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch, length in ((1, 5), (3, 40)):
        ids = np.random.default_rng(length).integers(0, TINY["vocab_size"], (batch, length))
        mask = np.ones((batch, length), dtype=bool)
        (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
        assert hidden.shape == (batch, length, TINY["d_model"])


def test_manifest_describes_the_export(exported):
    lowering, result = exported
    manifest = ExportDir.open(result.out).manifest
    data = json.loads((result.out / "attnx.json").read_text())
    assert manifest.variant == "softmax" and manifest.model == "encoder" and manifest.lowering == lowering
    assert manifest.model_config["d_model"] == TINY["d_model"] and manifest.seed == 0
    assert data["dynamic_axes"]["input_ids"] == {"0": "batch", "1": "seq"}
    assert data["versions"]["torch"].startswith("2.13")
    assert manifest.ops == ["attnx::SoftmaxAttention"]
    assert sorted(manifest.files) == ["model", "weights"]
    assert all(len(record.sha256) == 64 for record in manifest.files.values())


def test_verify_rebuilds_from_the_manifest(exported):
    _, result = exported
    report = verify(result.out, seq_lens=[4, 9], write=False)
    assert report.passed


def test_verify_refuses_a_swapped_model_and_its_parity_check_can_fail(exported, tmp_path):
    """A model.onnx of another seed is refused by its hash; recorded as the export's (an exporter bug
    would do that), it fails parity: the check can fail."""
    lowering, result = exported
    if lowering != "function":
        pytest.skip("one lowering is enough")
    other = export("softmax", tmp_path / "other", options={**TINY, "export.seed": 1, "verify.enabled": False})
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("attnx.json", "weights.safetensors"):
        (broken / name).write_bytes((result.out / name).read_bytes())
    (broken / "model.onnx").write_bytes((other.out / "model.onnx").read_bytes())
    with pytest.raises(AttnxError, match="model.onnx changed since it was written"):
        verify(broken, seq_lens=[5], write=False)
    manifest = ExportDir.open(result.out).manifest
    files = {**manifest.files, "model": record_file(broken, "model.onnx")}
    ExportDir(broken, manifest).write_manifest(dataclasses.replace(manifest, files=files))
    assert not verify(broken, seq_lens=[5], write=False).passed


def test_same_seed_gives_the_same_weights(tmp_path):
    a = export("softmax", tmp_path / "a", options={**TINY, "verify.enabled": False})
    b = export("softmax", tmp_path / "b", options={**TINY, "verify.enabled": False})
    assert a.manifest.files["weights"].sha256 == b.manifest.files["weights"].sha256


def test_existing_out_is_refused_without_force(exported):
    _, result = exported
    with pytest.raises(AttnxError, match="already exists; pass --force"):
        export("softmax", result.out, options=TINY)


def test_an_export_hashes_each_file_once(tmp_path, monkeypatch):
    """write() hashes what it wrote for the manifest and returns the export without reading every file again
    for its hash (gigabytes at real size); opening it later still compares the hashes."""
    hashed = []
    original = directory.sha256_file

    def counted(path):
        hashed.append(os.path.basename(path))
        return original(path)

    monkeypatch.setattr(directory, "sha256_file", counted)
    monkeypatch.setattr(directory, "sha256_plain", counted)
    result = export("softmax", tmp_path / "o", options={**TINY, "verify.enabled": False})
    assert sorted(hashed) == sorted(r.path for r in result.manifest.files.values())
    (result.out / "model.onnx").write_bytes(b"changed")
    with pytest.raises(AttnxError, match="model.onnx changed since it was written"):
        ExportDir.open(result.out)


def test_failed_export_leaves_nothing(tmp_path, monkeypatch):
    def explode(*args, **kwargs):
        raise RuntimeError("exporter crashed")

    monkeypatch.setattr(source, "to_onnx", explode)
    out = tmp_path / "sub" / "out"
    with pytest.raises(RuntimeError, match="exporter crashed"):
        export("softmax", out, options=TINY)
    assert not out.exists() and not (tmp_path / "sub").exists()


def test_force_replaces_an_earlier_export_atomically_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    options = {**TINY, "verify.enabled": False}
    with pytest.raises(AttnxError, match="holds no attnx.json, so it is not an earlier output"):
        export("softmax", out, force=True, options=options)
    assert [p.name for p in out.iterdir()] == ["stale.txt"]
    (out / "attnx.json").write_text("{}")
    export("softmax", out, force=True, options=options)
    assert not (out / "stale.txt").exists() and (out / "model.onnx").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes == dict.fromkeys(["attnx.json", "model.onnx", "weights.safetensors"], 0o666 & ~mask)


def test_third_party_plugin_exports_and_verifies(tmp_path, use_registry):
    use_registry(("sigmoid", "tests.third_party.sigmoid_plugin"))
    options = {**TINY, "attention_mask": False}
    result = export("sigmoid_test", tmp_path / "out", options={**options, "verify.seq_lens": [1, 7, 20]})
    assert result.parity.passed
    model = onnx.load(str(result.out / "model.onnx"))
    assert any(n.op_type == "SigmoidTestAttention" for n in model.graph.node)


def test_encoder_outputs_follow_the_mask():
    """Changing padded tokens does not change the real tokens' hidden states."""
    from attnx.exporter.assemble import assemble

    module = assemble("softmax", "encoder", TINY).module
    ids = torch.randint(0, 50, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[:, 6:] = False
    changed = ids.clone()
    changed[:, 6:] = (changed[:, 6:] + 1) % 50
    with torch.no_grad():
        (a,) = module(ids, mask)
        (b,) = module(changed, mask)
    torch.testing.assert_close(a[:, :6], b[:, :6])
