"""``attnx build``, the trt/ort-trt/ort-cuda verify backends and doctor's TensorRT report.

Without TensorRT (this CI): precise one-line errors, nothing written, skipped backends with
the reason; the whole build pipeline with TensorRT's calls replaced (a fake ``build_engine``
returning an inspector sample), and the ``trt`` runner against a stand-in ``tensorrt`` module.
With TensorRT and a GPU: real engines for every variant (``-m gpu``).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from attnx.api import verify
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import EngineSection, sha256_file
from attnx.models.spec import TensorSpec
from attnx.trt import GPU_EXTRA_HINT, cuda_missing, tensorrt_missing, tensorrt_version, version_tuple
from attnx.trt.build import ENGINE_FILE, BuildSettings, build, check_shapes, engine_problem, profile_shapes
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli
from tests.trt.conftest import VARIANTS

TRT_MISSING = tensorrt_missing()


@pytest.fixture
def softmax_out(plugin_export, tmp_path):
    """A private copy of the softmax plugin export (tests here write into OUT)."""
    return shutil.copytree(plugin_export("softmax"), tmp_path / "out")


def snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.skipif(TRT_MISSING is None, reason="tensorrt is importable: the gpu tests build real engines")
def test_build_without_tensorrt_names_the_fix_and_writes_nothing(softmax_out):
    before = snapshot(softmax_out)
    code, _, stderr = run_cli(["build", str(softmax_out), "--fp16"])
    assert_one_line_error(code, stderr, "attnx build needs TensorRT", TRT_MISSING, "pip install 'attnx[gpu]'")
    assert snapshot(softmax_out) == before and not (softmax_out / ENGINE_FILE).exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--min-seq", "64", "--opt-seq", "32"], ["--min-seq/--opt-seq/--max-seq", "(got 64, 32, 512)"]),
        (["--max-batch", "0", "--min-batch", "0", "--opt-batch", "0"], ["1 <= min <= opt <= max"]),
        (["--workspace", "lots"], ["--workspace 'lots' is not understood", "8GiB"]),
        (["--workspace", "0"], ["--workspace '0' is not understood"]),
    ],
)
def test_build_rejects_bad_settings_before_anything_else(softmax_out, args, fragments):
    before = snapshot(softmax_out)
    code, _, stderr = run_cli(["build", str(softmax_out), *args])
    assert_one_line_error(code, stderr, *fragments)
    assert snapshot(softmax_out) == before


def test_build_rejects_a_directory_that_is_not_an_export(tmp_path):
    code, _, stderr = run_cli(["build", str(tmp_path)])
    assert_one_line_error(code, stderr, "has no attnx.json", "attnx export")
    assert list(tmp_path.iterdir()) == []


def test_profile_follows_the_manifest_axes(softmax_out):
    export = ExportDir.open(softmax_out)
    shapes = profile_shapes(export, BuildSettings(batch=(1, 4, 16), seq=(2, 64, 1024)))
    expected = {"min": [1, 2], "opt": [4, 64], "max": [16, 1024]}
    assert shapes == {"input_ids": expected, "attention_mask": expected}
    export.manifest.inputs.append(TensorSpec("pixels", "float32", ("batch", 3, "height")))
    assert profile_shapes(export, BuildSettings())["pixels"] == {
        "min": [1, 3, 1],
        "opt": [2, 3, 128],
        "max": [8, 3, 512],
    }


def engine(model_sha256: str, profiles=(), needs_python: bool = False) -> EngineSection:
    mode = "jit" if needs_python else "aot"
    return EngineSection(model_sha256, "11.4", "a GPU", False, None, list(profiles), [], "strong", mode,
                         needs_python, {"fp32": 3}, {"PluginV3": 1}, [])  # fmt: skip


def test_engine_problems_are_precise(softmax_out):
    export = ExportDir.open(softmax_out)
    assert engine_problem(export) == f"out has no TensorRT engine: run `attnx build {softmax_out}`"
    (softmax_out / ENGINE_FILE).write_bytes(b"not really an engine")
    export = export.record_engine(ENGINE_FILE, engine(sha256_file(softmax_out / "model.onnx")))
    assert engine_problem(ExportDir.open(softmax_out)) is None
    (softmax_out / ENGINE_FILE).write_bytes(b"edited")
    with pytest.raises(AttnxError, match="engine.plan changed since it was written"):
        ExportDir.open(softmax_out)
    export.record_engine(ENGINE_FILE, engine("another model's hash"))
    assert "was built from another model.onnx" in engine_problem(ExportDir.open(softmax_out))


def test_ops_come_from_the_installed_plugins(softmax_out):
    export = ExportDir.open(softmax_out)
    assert [op.name for op in export.ops()] == ["SoftmaxAttention"]
    export.manifest.ops.append("attnx::NoSuchAttention")
    with pytest.raises(AttnxError, match="uses attnx::NoSuchAttention, which no installed plugin provides"):
        export.ops()


def test_feeds_outside_the_profile_are_refused():
    record = engine("", [{"input_ids": {"min": [1, 1], "opt": [2, 128], "max": [8, 512]}}])
    check_shapes(record, {"input_ids": np.zeros((8, 512))})
    with pytest.raises(AttnxError, match="size 513 on axis 1, outside the engine's profile \\[1, 512\\]"):
        check_shapes(record, {"input_ids": np.zeros((2, 513))})


def test_verify_skips_gpu_backends_with_the_reason(softmax_out):
    args = ["--backends", "ort-cpu,ort-cuda,ort-trt,trt", "--seq-lens", "3", "--json"]
    code, stdout, _ = run_cli(["verify", str(softmax_out), *args])
    data = json.loads(stdout)
    status = {b["backend"]: b for b in data["backends"]}
    assert code == 0 and status["ort-cpu"]["status"] == "passed"
    for name in ("ort-cuda", "ort-trt", "trt"):
        if status[name]["status"] == "skipped":
            assert status[name]["reason"]
    if TRT_MISSING:
        assert status["trt"]["reason"].startswith(TRT_MISSING) and "attnx[gpu]" in status["trt"]["reason"]
    elif cuda_missing() is None:
        assert status["trt"]["reason"] == f"out has no TensorRT engine: run `attnx build {softmax_out}`"


def test_ort_cuda_graph_of_a_plugin_model_is_the_function_lowering(softmax_out):
    """ort-cuda runs a plugin model with attnx's bodies attached; check that graph on the CPU provider."""
    import onnx
    import onnxruntime as ort
    import torch

    from attnx.parity.runners import CUDA, Graph, onnx_for_ort

    export = ExportDir.open(softmax_out)
    assembly = export.rebuild()
    model = onnx.load_from_string(onnx_for_ort(Graph.of_model(export), CUDA))
    assert [f.name for f in model.functions if f.domain == "attnx"] == ["SoftmaxAttention"]
    ids = np.random.default_rng(5).integers(0, 50, (2, 11))
    mask = np.ones((2, 11), dtype=bool)
    mask[0, 8:] = False
    session = ort.InferenceSession(model.SerializeToString())
    (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        (expected,) = assembly.module(torch.from_numpy(ids), torch.from_numpy(mask))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-3, atol=1e-4)


def test_ort_tensorrt_refusal_is_one_line_with_the_way_out():
    from attnx.parity.runners import _plugin_session_for_tensorrt

    def refuse():
        raise RuntimeError("[ONNXRuntimeError] : INVALID_GRAPH : No Op registered for SoftmaxAttention\nmore")

    with pytest.raises(AttnxError) as info:
        _plugin_session_for_tensorrt(refuse)
    message = str(info.value)
    assert "\n" not in message and "No Op registered for SoftmaxAttention" in message
    assert message.endswith("verify the engine with --backends trt")


def test_doctor_reports_tensorrt_and_a_plugin_per_op():
    code, stdout, _ = run_cli(["doctor", "--json"])
    data = json.loads(stdout)
    assert code == 0 and data["tensorrt"]["reason"] == TRT_MISSING
    assert set(data["trt_plugins"]) == set(VARIANTS)
    for variant, entries in data["trt_plugins"].items():
        assert entries and all(e["status"] == "ok" for e in entries), (variant, entries)
        assert all(e["plugin"].startswith("attnx::") and e["version"] == "1" for e in entries)
    assert data["trt_plugins"]["softmax"][0]["fields"] == {"causal": "int", "scale": "float"}
    code, stdout, _ = run_cli(["doctor"])
    assert "trt plugin   attnx::SoftmaxAttention (softmax): inputs q, k, v, key_padding_mask?" in stdout


# -- with TensorRT and a GPU ----------------------------------------------------------------------------


def gpu_reason() -> str | None:
    reason = tensorrt_missing()
    return f"{reason} ({GPU_EXTRA_HINT})" if reason else cuda_missing()


@pytest.mark.gpu
@pytest.mark.parametrize(("lowering", "plugins"), [("plugin", None), ("plugin", "jit"), ("function", None)])
@pytest.mark.parametrize("variant", VARIANTS)
def test_engine_matches_torch(variant, lowering, plugins, plugin_export, tmp_path):
    reason = gpu_reason()
    if reason:
        pytest.skip(reason)
    out = shutil.copytree(plugin_export(variant, lowering=lowering), tmp_path / "out")
    result = build(out, BuildSettings(seq=(1, 64, 256), plugins=plugins))
    manifest = ExportDir.open(out).manifest
    engine = manifest.engine
    assert result.engine.is_file() and manifest.files["engine"].sha256 == sha256_file(result.engine)
    assert sorted(engine.plugins) == (sorted(manifest.ops) if lowering == "plugin" else [])
    # tiny models (head size 16): every kernel fits, so the default is AOT and the engine needs no Python
    expected_mode = {("plugin", None): "aot", ("plugin", "jit"): "jit"}.get((lowering, plugins))
    assert (engine.plugin_mode, engine.needs_python) == (expected_mode, expected_mode == "jit")
    assert engine.precisions.get("fp32", 0) > 0 and not engine.fp16
    assert len(engine.plugin_layers) == (TINY["n_layers"] if lowering == "plugin" else 0)
    report = verify(out, backends=["trt"], seq_lens=[1, 7, 33, 129], write=False, seed=3)
    assert report.passed, report.to_dict()


@pytest.mark.gpu
def test_fp16_engine_and_ort_backends(plugin_export, tmp_path):
    reason = gpu_reason()
    if reason:
        pytest.skip(reason)
    fp32 = shutil.copytree(plugin_export("softmax"), tmp_path / "fp32")
    if version_tuple(str(tensorrt_version()))[0] >= 11:  # strongly typed: an fp16 engine is an fp16 export
        with pytest.raises(AttnxError, match="is an fp32 export and TensorRT 11"):
            build(fp32, BuildSettings(fp16=True))
        out = shutil.copytree(plugin_export("softmax", dtype="fp16"), tmp_path / "out")
    else:
        out = fp32
    build(out, BuildSettings(fp16=True, workspace=1 << 30))
    engine = ExportDir.open(out).manifest.engine
    assert engine.fp16 and engine.precisions.get("fp16", 0) > 0
    # no --atol: an fp16 engine of an fp32 export is judged at the fp16 tolerance, an fp16 export at its own
    report = verify(out, backends=["trt", "ort-cuda", "ort-trt"], seq_lens=[5, 40], write=False, seed=4)
    ran = [b for b in report.backends if b.status != "skipped"]
    assert ran and all(b.status == "passed" for b in ran), report.to_dict()
