"""Verify proves the whole graph: any single edited weight element of a consistently re-hashed export
fails, wherever random inputs would not look (one element of one embedding row)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from attnx.exporter.directory import ExportDir
from attnx.exporter.files import check_safetensors
from attnx.parity.weights import Reference, check_graph, check_weights, graph_tensors
from tests.helpers import run_cli
from tests.security.conftest import rehash

GRAPHS = {"lm": ["model", "prefill", "decode", "genai"], "module": ["model"]}


def parameter_tensors(export: ExportDir, key: str, tensors: dict) -> list[str]:
    """The initializers of graph ``key`` that hold one of the model's tensors."""
    reference = Reference(tensors)
    model = onnx.load(str(export.file(key)))
    return [
        t.name
        for t in model.graph.initializer
        if numpy_helper.to_array(t).dtype.kind == "f" and reference.exact(numpy_helper.to_array(t))
    ]


@pytest.fixture(scope="module")
def loaded(made) -> dict:
    """Per kind: the export, its model's tensors, whether it is attnx's own model, and per graph the
    initializers that hold model tensors."""
    found = {}
    for kind, keys in GRAPHS.items():
        export = ExportDir.open(made(kind))
        assembly = export.rebuild()
        tensors, own = assembly.tensors(), assembly.every_tensor_exported
        arrays = {name: t.detach().numpy() for name, t in tensors.items()}
        found[kind] = (export, arrays, own, {key: parameter_tensors(export, key, arrays) for key in keys})
    return found


def test_an_untouched_export_matches_every_weight(loaded):
    for export, tensors, own, _ in loaded.values():
        checks = check_weights(export, tensors, own)
        assert all(c.passed for c in checks), [m.describe() for c in checks for m in c.mismatches]
        assert all(c.matched for c in checks)


def test_stored_weights_are_matched_by_hashing_blocks_not_reading_them(loaded, monkeypatch):
    """weights.safetensors is matched by hashing each tensor a block at a time (at 2B the tied embedding is
    2 GB): with blocks of 5 bytes, splitting elements, every stored tensor still matches, and none is read
    whole."""
    from attnx.parity.weights import FileTensor

    monkeypatch.setattr(FileTensor, "BLOCK", 5)
    monkeypatch.setattr(FileTensor, "read", lambda self: pytest.fail(f"{self.name} was read whole"))
    export, tensors, own, _ = loaded["module"]
    (stored,) = [c for c in check_weights(export, tensors, own) if c.graph == "weights.safetensors"]
    _, header = check_safetensors(export.file("weights"))
    assert stored.passed and stored.matched == len(header.keys() - {"__metadata__"})


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_single_edited_weight_element_is_named(loaded, data):
    kind = data.draw(st.sampled_from(sorted(GRAPHS)), "kind")
    export, tensors, own, candidates = loaded[kind]
    key = data.draw(st.sampled_from(sorted(candidates)), "graph")
    name = data.draw(st.sampled_from(candidates[key]), "tensor")
    model = onnx.load(str(export.file(key)))
    (initializer,) = [t for t in model.graph.initializer if t.name == name]
    array = numpy_helper.to_array(initializer).copy()
    flat = array.reshape(-1)
    index = data.draw(st.integers(0, flat.size - 1), "element")
    ulps = data.draw(st.integers(1, 2**20) | st.sampled_from([1, 2, 3]), "ulps")
    sign = data.draw(st.sampled_from([-1, 1]), "sign")
    value = flat[index]
    for _ in range(ulps if ulps <= 3 else 1):  # a few ulps exactly, or a random small multiple of one
        value = np.nextafter(value, sign * np.inf, dtype=array.dtype)
    if ulps > 3:
        value = value + sign * np.spacing(value) * ulps
    flat[index] = value
    assert flat[index] != numpy_helper.to_array(initializer).reshape(-1)[index]
    initializer.CopyFrom(numpy_helper.from_array(array, name))
    label = export.manifest.files[key].path
    check = check_graph(label, graph_tensors(model, export.path), Reference(tensors), own and key == "model")
    assert [m.tensor for m in check.mismatches] == [name], [m.describe() for m in check.mismatches]
    assert check.mismatches[0].elements == 1


def test_an_edited_embedding_row_fails_attnx_verify(copy, workdir):
    """The issue's case end to end: +1.0 on one element of one embedding row, hashes rewritten."""
    out = copy("lm")
    model = onnx.load(str(out / "decode.onnx"))
    (embedding,) = [t for t in model.graph.initializer if t.name.endswith("embed.weight")]
    array = numpy_helper.to_array(embedding).copy()
    array[41, 5] += 1.0  # a token random parity inputs rarely draw
    embedding.CopyFrom(numpy_helper.from_array(array, embedding.name))
    onnx.save(model, str(out / "decode.onnx"))
    rehash(out)
    code, stdout, stderr = run_cli(["verify", "e", "--seed", "0", "--json"])
    report = json.loads(stdout)
    assert code == 1, stderr
    (check,) = [c for c in report["weights"] if c["graph"] == "decode.onnx"]
    (mismatch,) = check["mismatches"]
    assert mismatch["tensor"] == embedding.name and mismatch["index"] == [41, 5]
    code, stdout, _ = run_cli(["verify", "e", "--seed", "0"])
    assert code == 1 and f"decode.onnx tensor {embedding.name} differs" in stdout


def test_a_stored_weight_that_is_none_of_the_models_fails(copy, workdir):
    """weights.safetensors edited (hash rewritten): a module export's stored weights must be its program's."""
    from safetensors.numpy import load_file, save_file

    out = copy("module")
    weights = load_file(str(out / "weights.safetensors"))
    name = sorted(weights)[0]
    weights[name] = weights[name].copy()
    weights[name].reshape(-1)[0] += 0.5
    save_file(weights, str(out / "weights.safetensors"))
    rehash(out)
    code, stdout, _ = run_cli(["verify", "e", "--seed", "0"])
    assert code == 1
    assert f"weights.safetensors tensor {name} differs" in stdout


def test_a_stored_tensor_the_model_lacks_is_named(copy, workdir):
    """A tensor added to weights.safetensors (hash rewritten) that is none of the model's is named itself,
    wherever it sorts among the stored tensors (they are read one at a time)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    out = copy("module")
    weights = load_file(str(out / "weights.safetensors"))
    weights["aaa_planted"] = np.random.default_rng(0).standard_normal(37).astype(np.float32)
    save_file(weights, str(out / "weights.safetensors"))
    rehash(out)
    code, stdout, _ = run_cli(["verify", "e", "--seed", "0"])
    assert code == 1
    assert "weights.safetensors tensor aaa_planted is none of the model's tensors" in stdout


def test_quantised_and_fp16_graphs_match_to_their_rounding(made, tmp_path):
    """Optimised exports: block-quantised weights (int4, int8) dequantised within a step, dynamic int8
    within half a step, fp16 to fp16 rounding, slimmed graphs (folded constants) exactly."""
    pytest.importorskip("onnxruntime.quantization")
    for flag in ("--int4", "--int8", "--dynamic-int8", "--fp16", "--slim"):
        target = tmp_path / flag.strip("-")
        code, stdout, stderr = run_cli(["optimize", str(made("lm")), "-o", str(target), flag, "--seed", "0"])
        assert code in (0, 1), stderr
        report = json.loads((target / "parity.json").read_text())
        mismatches = [m for c in report["weights"] for m in c["mismatches"]]
        assert mismatches == [], mismatches
        assert Path(target / "attnx.json").is_file()


@pytest.mark.parametrize("bits", [4, 8])
def test_an_edited_block_of_a_quantised_weight_is_a_mismatch(bits):
    """A ``MatMulNBits`` weight (packed blocks, scales, no zero points: symmetric) stands for the model's
    weight dequantised; one value moved by a few steps is named, with where it is."""
    from attnx.parity.weights import Reference, check_graph

    rng = np.random.default_rng(bits)
    weight = rng.standard_normal((8, 64)).astype(np.float32)  # torch's (out, in): the graph's (64, 8).T
    blocks = weight.reshape(8, 2, 32)
    top = (1 << (bits - 1)) - 1
    scales = np.abs(blocks).max(-1) / top
    levels = (np.round(blocks / scales[..., None]) + (1 << (bits - 1))).astype(np.uint8)
    packed = levels[..., 0::2] | (levels[..., 1::2] << 4) if bits == 4 else levels
    found = {f"w_Q{bits}": packed, "w_scales": scales.astype(np.float32)}
    reference = Reference({"proj.weight": weight})
    lengths = {f"w_Q{bits}": 64}
    assert check_graph("model.onnx", found.items(), reference, True, lengths).passed
    edited = levels.copy()
    edited[3, 1, 5] = (int(edited[3, 1, 5]) + 3) % (1 << bits)
    found[f"w_Q{bits}"] = edited[..., 0::2] | (edited[..., 1::2] << 4) if bits == 4 else edited
    check = check_graph("model.onnx", found.items(), reference, True, lengths)
    assert [(m.parameter, m.index) for m in check.mismatches] == [("proj.weight (transposed)", [37, 3])]


def test_a_parameter_the_exporter_folds_counts_by_its_image_and_an_edited_image_does_not():
    """A decay's -exp(A_log) is folded into one constant: that image stands for A_log, exactly."""
    from attnx.parity.weights import Reference, check_graph

    a_log = np.log(np.array([1.5, 2.0, 7.0, 11.0], np.float32))
    image = (-np.exp(a_log.astype(np.float64))).astype(np.float32).reshape(4, 1, 1)
    reference = Reference({"A_log": a_log})
    assert check_graph("model.onnx", {"neg": image}.items(), reference, complete=True).passed
    edited = image.copy()
    edited[2] *= 1.001
    check = check_graph("model.onnx", {"neg": edited}.items(), reference, complete=True)
    assert [m.tensor for m in check.mismatches] == ["A_log"]


def test_a_neutral_parameter_may_be_folded_away_and_any_other_may_not():
    """An all-ones norm weight (x * 1) or all-zeros bias (x + 0) that a graph tool removed is no mismatch
    (onnxslim removes them from an untrained gated export); a missing random weight still is."""
    from attnx.parity.weights import Reference, check_graph

    weights = {
        "norm.weight": np.ones(16, np.float32),
        "norm.bias": np.zeros(16, np.float32),
        "proj.weight": np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32),
    }
    found = {"w": weights["proj.weight"]}.items()
    check = check_graph("model.onnx", found, Reference(weights), complete=True)
    assert check.passed and check.matched == 1
    almost = {**weights, "norm.weight": np.full(16, 1.0, np.float32) + np.eye(16, dtype=np.float32)[0]}
    check = check_graph("model.onnx", {"w": weights["proj.weight"]}.items(), Reference(almost), complete=True)
    assert [m.describe() for m in check.mismatches] == ["model.onnx holds no copy of the model's norm.weight"]
