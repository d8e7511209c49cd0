"""``attnx build`` end to end with TensorRT's calls replaced, and the ``trt`` runner's plugin registration.

``build_engine`` (the only function that calls TensorRT) is replaced by a fake that records the
request, plays TensorRT calling the AOT implementations, and returns an engine-inspector sample;
the TensorRT version, the machine checks and the registration are replaced likewise. What is
tested is everything around them: the precision decision per version, the AOT/JIT choice and its
progress line, the refusals (nothing written), and what the manifest records.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import onnx
import pytest
from onnx import helper

from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir, record_file
from attnx.exporter.manifest import MANIFEST, EngineSection, Manifest
from attnx.parity.runners import BackendSkipped, Graph, trt_runner
from attnx.trt import build as build_module
from attnx.trt import qdp
from attnx.trt.build import ENGINE_FILE, BuildSettings, build
from attnx.trt.engine import BuiltEngine
from tests.helpers import assert_one_line_error, run_cli
from tests.trt import stub_tensorrt as stub

DATA = Path(__file__).parent / "data"


@dataclasses.dataclass
class FakeTensorRT:
    """Stands in for TensorRT ``version`` on a GPU: records registrations and build requests."""

    version: str = "11.4.0.106"
    sample: str = "engine_info_trt11.json"
    calls_aot: bool = True  # play TensorRT calling aot_impl for every AOT plugin
    failure: AttnxError | None = None  # raised inside a plugin callback during the build
    blocker: str | None = None  # why the Triton kernels cannot serve the graph (kernel_blocker)
    registered: list[tuple[list[str], bool]] = dataclasses.field(default_factory=list)
    requests: list = dataclasses.field(default_factory=list)

    def register_plugins(self, ops, aot_kernels=False):
        ids = [f"attnx::{op.name}" for op in ops]
        self.registered.append((ids, aot_kernels))
        return ids

    def build_engine(self, request):
        self.requests.append(request)
        if self.failure is not None:
            qdp.CALLBACKS.errors.append(self.failure)
            raise AttnxError(f"TensorRT could not build an engine from {request.model} (see its log above)")
        if request.plugins == "aot" and self.calls_aot:
            for ids, _ in self.registered:
                qdp.CALLBACKS.aot_calls.update(ids)
        return BuiltEngine(b"serialized engine", json.loads((DATA / self.sample).read_text()), "Fake GPU")


@pytest.fixture
def fake_trt(monkeypatch):
    fake = FakeTensorRT()
    monkeypatch.setattr(build_module, "require_tensorrt", lambda what: None)
    monkeypatch.setattr(build_module, "tensorrt_version", lambda: fake.version)
    monkeypatch.setattr(build_module, "tensorrt_aot_missing", lambda: None)
    monkeypatch.setattr(build_module, "triton_missing", lambda: None)
    monkeypatch.setattr(build_module, "kernel_blocker", lambda model, ops: fake.blocker)
    monkeypatch.setattr(build_module, "register_plugins", fake.register_plugins)
    monkeypatch.setattr(build_module, "build_engine", fake.build_engine)
    monkeypatch.setattr(build_module, "CALLBACKS", qdp.CallbackLog())
    monkeypatch.setattr(qdp, "CALLBACKS", build_module.CALLBACKS)
    return fake


@pytest.fixture
def softmax_out(plugin_export, tmp_path):
    return shutil.copytree(plugin_export("softmax"), tmp_path / "out")


def snapshot(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_aot_build_records_what_the_engine_holds(fake_trt, softmax_out):
    lines = []
    result = build(softmax_out, BuildSettings(workspace=1 << 30), progress=lines.append)
    assert fake_trt.registered == [(["attnx::SoftmaxAttention"], True)]
    (request,) = fake_trt.requests
    assert request.plugins == "aot" and request.precision.typing == "strong"
    assert not request.precision.fp16_flag
    assert request.model == softmax_out / "model.onnx" and request.workspace == 1 << 30
    assert (softmax_out / ENGINE_FILE).read_bytes() == b"serialized engine"
    record = ExportDir.open(softmax_out).manifest.engine
    assert record == result.record
    assert (record.typing, record.plugin_mode, record.needs_python) == ("strong", "aot", False)
    assert record.precisions == {"fp32": 5, "bool": 1} and not record.fp16
    assert record.plugins == ["attnx::SoftmaxAttention"] and record.device == "Fake GPU"
    assert [p.plugin for p in record.plugin_layers] == ["attnx::SoftmaxAttention", "PluginV3"]
    assert record.tensorrt == "11.4.0.106" and record.workspace == 1 << 30
    assert lines[0] == "TensorRT 11.4.0.106: strongly typed: the engine computes in the export's fp32"
    assert lines[1].startswith("plugins: AOT") and "(every plugin op has a Triton kernel)" in lines[1]
    assert lines[2] == "engine: 6 layers (5 fp32, 1 bool), 2 plugin layer(s); loads without Python"


def test_only_the_ops_of_model_onnx_are_plugins(fake_trt, softmax_out):
    """The manifest's ops also name the decode graphs' ops (step ops have no kernel): they do not count."""
    export = ExportDir.open(softmax_out)
    ops = [*export.manifest.ops, "attnx::LinearAttentionStep"]
    export.write_manifest(dataclasses.replace(export.manifest, ops=ops))
    record = build(softmax_out).record
    assert record.plugins == ["attnx::SoftmaxAttention"]
    assert (record.plugin_mode, record.needs_python) == ("aot", False)


def test_jit_build_needs_python(fake_trt, softmax_out):
    lines = []
    record = build(softmax_out, BuildSettings(plugins="jit"), progress=lines.append).record
    assert fake_trt.registered == [(["attnx::SoftmaxAttention"], False)]
    assert (record.plugin_mode, record.needs_python) == ("jit", True)
    assert lines[1].startswith("plugins: JIT") and "(--jit)" in lines[1] and "needs Python" in lines[1]


def test_without_triton_the_build_falls_back_to_jit_and_says_why(fake_trt, softmax_out, monkeypatch):
    monkeypatch.setattr(build_module, "triton_missing", lambda: "triton is not installed")
    lines = []
    assert build(softmax_out, progress=lines.append).record.plugin_mode == "jit"
    assert "(triton is not installed)" in lines[1]


def test_a_kernel_that_does_not_fit_makes_the_build_jit(fake_trt, softmax_out):
    fake_trt.blocker = "attnx::SoftmaxAttention's Triton kernel needs 52 KiB of shared memory"
    lines = []
    assert build(softmax_out, progress=lines.append).record.plugin_mode == "jit"
    assert f"({fake_trt.blocker})" in lines[1]
    with pytest.raises(AttnxError, match="^--aot: attnx::SoftmaxAttention's Triton kernel needs 52 KiB"):
        build(softmax_out, BuildSettings(plugins="aot"))


def test_aot_is_not_trusted_unless_tensorrt_called_the_aot_implementation(fake_trt, softmax_out):
    fake_trt.calls_aot = False
    record = build(softmax_out).record
    assert (record.plugin_mode, record.needs_python) == ("aot", True)


def test_tensorrt_10_builds_weakly_typed_with_the_fp16_flag(fake_trt, softmax_out):
    fake_trt.version, fake_trt.sample = "10.14.1.48", "engine_info_trt10.json"
    record = build(softmax_out, BuildSettings(fp16=True)).record
    (request,) = fake_trt.requests
    assert request.precision.typing == "weak" and request.precision.fp16_flag
    assert record.typing == "weak" and record.fp16 and record.precisions["fp16"] == 3


@pytest.mark.parametrize(
    ("args", "setup", "fragments"),
    [
        (["--fp16"], None, ["--fp16:", "is an fp32 export and TensorRT 11", "attnx export --dtype fp16",
                            "attnx optimize"]),
        (["--aot"], "no triton", ["--aot: triton is not installed; build with --jit"]),
        ([], "callback error", ["attnx::SoftmaxAttention: every tactic of its Triton kernel needs"]),
        ([], "old tensorrt", ["TensorRT 10.7 is too old for attnx build"]),
    ],
)  # fmt: skip
def test_refusals_are_one_line_and_write_nothing(fake_trt, softmax_out, monkeypatch, args, setup, fragments):
    if setup == "no triton":
        monkeypatch.setattr(build_module, "triton_missing", lambda: "triton is not installed")
    elif setup == "callback error":
        fake_trt.failure = AttnxError("attnx::SoftmaxAttention: every tactic of its Triton kernel needs more")
    elif setup == "old tensorrt":
        fake_trt.version = "10.7.0"
    before = snapshot(softmax_out)
    code, _, stderr = run_cli(["build", str(softmax_out), *args])
    assert_one_line_error(code, stderr, *fragments)
    assert snapshot(softmax_out) == before


def test_cli_reports_the_engine(fake_trt, softmax_out):
    code, stdout, _ = run_cli(["build", str(softmax_out), "--json"])
    data = json.loads(stdout)
    assert code == 0 and data["engine"] == str(softmax_out / ENGINE_FILE)
    assert data["plugin_mode"] == "aot" and data["needs_python"] is False and data["typing"] == "strong"
    code, stdout, _ = run_cli(["build", str(softmax_out), "--jit", "-q"])
    assert code == 0 and "strongly typed, fp32, JIT plugins, needs Python to load, Fake GPU" in stdout


def test_an_opset_above_the_parsers_limit_is_refused_before_tensorrt(softmax_out):
    export = ExportDir.open(softmax_out)
    export.write_manifest(dataclasses.replace(export.manifest, opset=26))
    code, _, stderr = run_cli(["build", str(softmax_out)])
    assert_one_line_error(code, stderr, "uses ONNX opset 26; TensorRT 11.5 parses opsets <= 25")


@pytest.fixture
def attention_out(plugin_export, tmp_path):
    """A softmax export whose graph uses the standard Attention op (opset 23) and no attnx plugin node,
    as the Attention lowering makes it (here: a decomposed export with one Attention node added)."""
    out = shutil.copytree(plugin_export("softmax", lowering="decomposed"), tmp_path / "attn")
    model = onnx.load(str(out / "model.onnx"))
    model.graph.node.append(helper.make_node("Attention", ["q", "k", "v"], ["sdpa"], name="sdpa"))
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = 23
    onnx.save(model, str(out / "model.onnx"))
    manifest = Manifest.from_json((out / MANIFEST).read_text(), "attnx.json")
    files = {**manifest.files, "model": record_file(out, "model.onnx")}
    ExportDir(out, manifest).write_manifest(dataclasses.replace(manifest, opset=23, files=files))
    return out


def test_an_attention_export_builds_without_plugins(fake_trt, attention_out):
    model = onnx.load(str(attention_out / "model.onnx"))
    assert not [n for n in model.graph.node if n.domain == "attnx"]
    lines = []
    record = build(attention_out, progress=lines.append).record
    assert fake_trt.registered == [] and fake_trt.requests[0].plugins is None
    assert (record.plugin_mode, record.needs_python, record.plugins) == (None, False, [])
    assert lines[1] == ("plugins: none (no attnx plugin nodes in the graph); 1 standard Attention node(s) "
                        "-> TensorRT IAttention; the engine loads without Python")  # fmt: skip


def test_an_attention_export_needs_tensorrt_10_14(fake_trt, attention_out):
    fake_trt.version = "10.13.3.9"
    with pytest.raises(AttnxError, match=r"IAttention needs >= 10.14"):
        build(attention_out)
    assert not (attention_out / ENGINE_FILE).exists()


# -- the trt runner: plugins are registered only for engines that need Python -----------------------


def recorded(out: Path, mode: str | None) -> ExportDir:
    """``out`` with a (fake) engine recorded whose plugins run ``mode`` ("jit" needs Python)."""
    (out / ENGINE_FILE).write_bytes(b"serialized engine")
    export = ExportDir.open(out)
    model = export.manifest.files["model"].sha256
    section = EngineSection(model, "11.4.0.106", "Fake GPU", False, None, [], [], "strong", mode,
                            mode == "jit", {"fp32": 2}, {"PluginV3": 1}, [])  # fmt: skip
    return export.record_engine(ENGINE_FILE, section)


@pytest.fixture
def trtp_stub(monkeypatch):
    plugins = stub.PluginStub()
    stub.install(monkeypatch, plugins)
    monkeypatch.setattr(qdp, "_REGISTERED", {})
    return plugins


@pytest.mark.parametrize("mode", ["aot", "jit"])
def test_trt_runner_registers_python_plugins_only_for_jit_engines(trtp_stub, softmax_out, mode):
    runner = trt_runner(Graph.of_model(recorded(softmax_out, mode)), None)
    assert runner.name == "trt"
    registered = [plugin for kind, plugin, _ in trtp_stub.calls if kind == "register"]
    assert registered == (["attnx::SoftmaxAttention"] if mode == "jit" else [])
    assert not [call for call in trtp_stub.calls if call[0] == "aot_impl"]  # loading compiles nothing


def test_trt_runner_loads_an_attention_engine_without_registering(trtp_stub, attention_out):
    trt_runner(Graph.of_model(recorded(attention_out, None)), None)
    assert trtp_stub.calls == []


def test_trt_runner_without_an_engine_is_skipped_with_the_fix(softmax_out):
    with pytest.raises(BackendSkipped, match="has no TensorRT engine: run `attnx build"):
        trt_runner(Graph.of_model(ExportDir.open(softmax_out)), None)
