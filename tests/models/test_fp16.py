"""fp16 exports: every variant x model exports in half precision and matches torch in fp16, and
the ONNX model stays close to the float32 model it was rounded from (the independent check:
the float32 path is itself tested against the naive references)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file

from attnx.api import export, verify
from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.exporter.directory import ExportDir
from attnx.exporter.inputs import random_feed
from attnx.exporter.trace import to_onnx
from attnx.models.spec import TensorSpec
from attnx.ortkernels import kernel_view, session_options
from attnx.registry import get_registry
from attnx.variant import FP16_TOLERANCE
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli
from tests.models.cases import CASES, capabilities, covering, decoders, one_per_kind
from tests.models.exports import tiny_export
from tests.plugins.op_harness import run_natively

FP16 = {"export.dtype": "fp16"}
HALF_CASES = [(v, m) for v, m in CASES if capabilities(v).fp16]
FP32_ONLY = sorted({v for v, _ in CASES if not capabilities(v).fp16})


def run_onnx(path, feed, options=None):
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def run_native_fp16(path, feed):
    """The graph evaluated op by op in numpy float16 (onnx.reference), as fp16 GPU kernels compute it:
    ONNX Runtime's CPU provider runs most fp16 ops in float32 inside and would hide an fp16 overflow."""
    return run_natively(onnx.load(str(path)), feed)


def float32_outputs(out, feed):
    """The exported weights, upcast, in the float32 model: what the fp16 export approximates."""
    export = ExportDir.open(out)
    module = export.rebuild().module.float()
    args = [torch.from_numpy(feed[s.name]) for s in export.manifest.inputs]
    with torch.inference_mode():
        return [t.numpy() for t in module(*args)]


def assert_close_to_float32(actual, expected, tolerance=FP16_TOLERANCE):
    """Within the fp16 tolerance of the float32 model (Polygraphy's rule: atol or rtol per element)."""
    diff = np.abs(actual.astype(np.float64) - expected)
    bad = (diff > tolerance.atol) & (diff > tolerance.rtol * np.abs(expected))
    assert not bad.any(), f"{bad.sum()} elements off, max abs {diff.max():.3g}"


@pytest.mark.parametrize(("variant", "model"), covering(HALF_CASES))
def test_fp16_export_matches_torch_fp16_and_the_float32_model(variant, model):
    result = tiny_export(variant, model, **FP16)
    assert result.parity.passed, [c for b in result.parity.ran for c in b.comparisons if not c.passed]
    assert result.manifest.dtype == "fp16" and result.parity.dtype == "fp16"
    tolerance = get_registry().variant(variant).fp16_tolerance  # FP16_TOLERANCE unless the variant says why
    assert result.parity.atol == tolerance.atol
    assert result.parity.fp32_drift and all(d.max_abs < tolerance.atol for d in result.parity.fp32_drift)
    weights = load_file(result.out / "weights.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float16}
    proto = onnx.load(str(result.out / "model.onnx"), load_external_data=False)
    floats = [v for v in proto.graph.output if v.type.tensor_type.elem_type != onnx.TensorProto.INT64]
    assert {v.type.tensor_type.elem_type for v in floats} == {onnx.TensorProto.FLOAT16}
    assert {s.dtype for s in result.manifest.outputs} == {"float16"}

    specs = result.manifest.inputs
    feed = random_feed(specs, {"batch": 3, "seq": 11, "src_seq": 9, "tgt_seq": 13}, np.random.default_rng(7))
    expected = float32_outputs(result.out, feed)
    assert verify(result.out, seq_lens=[4], write=False).passed  # rebuilt in fp16 from the manifest
    for run in (run_onnx, run_native_fp16):
        for actual, reference in zip(run(str(result.out / "model.onnx"), feed), expected, strict=True):
            assert actual.dtype == np.float16 and np.isfinite(actual).all()
            assert_close_to_float32(actual, reference, tolerance)


PLUGIN_CASES = [
    pytest.param(v, m, marks=[] if i == 0 else [pytest.mark.slow])  # the first case in the default run
    for i, (v, m) in enumerate((v, m) for v, m in HALF_CASES if m != "seq2seq")
]


@pytest.mark.parametrize(("variant", "model"), PLUGIN_CASES)
def test_fp16_plugin_lowering_runs_through_the_cpu_kernels(variant, model):
    """PyOps have no float16: the kernel view casts each attnx node's float inputs up and its output back."""
    result = tiny_export(variant, model, lowering="plugin", **FP16)
    assert result.parity.passed
    view = kernel_view(onnx.load(str(result.out / "model.onnx")), get_registry().variant(variant).load().ops)
    nodes = list(view.graph.node)
    attnx = [i for i, n in enumerate(nodes) if n.domain == "attnx"]
    assert attnx
    for i in attnx:
        assert nodes[i + 1].op_type == "Cast" and nodes[i + 1].output[0] in {
            n for other in nodes for n in other.input
        } | {o.name for o in view.graph.output}
        assert nodes[i - 1].op_type == "Cast"
    feed = random_feed(result.manifest.inputs, {"batch": 2, "seq": 9}, np.random.default_rng(3))
    (actual, *_) = run_onnx(view.SerializeToString(), feed, session_options())
    assert actual.dtype == np.float16
    assert_close_to_float32(actual, float32_outputs(result.out, feed)[0])


@pytest.mark.parametrize("variant", [p for p in one_per_kind(decoders()) if capabilities(p.values[0]).fp16])
def test_fp16_decode_export(tmp_path, variant):
    """Each state tensor has the dtype its layer declares: a kv-cache follows the activations (fp16); the
    linear/cosFormer sums declare float32 (no fp16 overflow)."""
    layer = assemble(variant, "lm", TINY, seed=0).module.blocks[0].attention
    state_dtypes = {t.dtype or "float16" for t in layer.decode_state()}
    result = export(
        variant,
        tmp_path / "out",
        model="lm",
        options={**TINY, "export.dtype": "fp16", "export.decode": True, "verify.seq_lens": [1, 6]},
    )
    assert result.parity.passed
    ran = {b.backend for b in result.parity.ran}
    assert ran == {"ort-cpu", "torch decode", "ort-cpu decode", "ort-cpu genai"}
    entry = result.manifest.decode
    assert {s.dtype for s in entry.state if s.layer is not None} == state_dtypes
    assert [s.dtype for s in entry.decode.outputs if s.name == "logits"] == ["float16"]
    decode = onnx.load(str(tmp_path / "out" / "decode.onnx"))
    declared = {s.name: s.dtype for s in entry.decode.inputs}
    for value in decode.graph.input:
        elem = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        assert elem == np.dtype(declared[value.name]), value.name


def test_fp16_export_of_a_float32_checkpoint_rounds_its_weights(tmp_path):
    options = dict(TINY)
    source = assemble("linear", "lm", options, seed=5)
    from attnx.checkpoint import save_checkpoint

    save_checkpoint(source, tmp_path / "w.safetensors")
    export(
        "linear",
        tmp_path / "out",
        model="lm",
        checkpoint=tmp_path / "w.safetensors",
        save_checkpoint=tmp_path / "copy.safetensors",
        options={**options, "export.dtype": "fp16", "verify.enabled": False},
    )
    exported = load_file(tmp_path / "out" / "weights.safetensors")
    saved = load_file(tmp_path / "copy.safetensors")
    for name, tensor in source.module.state_dict().items():
        assert torch.equal(exported[name], tensor.half()), name
        assert torch.equal(saved[name], exported[name]), name


def test_recipe_dtype_fp16_through_the_cli(tmp_path):
    recipe = tmp_path / "half.toml"
    recipe.write_text(
        '[model]\nname = "encoder"\nd_model = 32\nn_heads = 2\nn_layers = 1\nd_ff = 64\nvocab_size = 50\n'
        '[variant]\nname = "cosformer"\n[export]\ndtype = "fp16"\n[verify]\nseq_lens = [1, 5]\n'
    )
    code, stdout, stderr = run_cli(["export", "--recipe", str(recipe), "-o", str(tmp_path / "out")])
    assert code == 0, stderr
    assert "cosformer attention, fp16," in stdout and "parity: PASSED" in stdout
    assert "fp16 vs float32 torch on the same weights (informational): max abs" in stdout
    code, stdout, _ = run_cli(["verify", str(tmp_path / "out"), "--seq-lens", "3"])
    assert code == 0 and "fp16 vs float32 torch" in stdout


class UpcastingModel(torch.nn.Module):
    """Declares its output as an activation (float16 in fp16) but upcasts it: the manifest would lie."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.scale).float()


def test_a_graph_dtype_that_differs_from_the_declared_one_is_refused():
    class Graph:
        module = UpcastingModel()
        inputs = [TensorSpec("x", "float16", ("batch", 4))]
        outputs = [TensorSpec("y", "float16", ("batch", 4))]
        ops: list = []

    with pytest.raises(AttnxError, match="graph tensor 'y' is float32 but the model declares float16"):
        to_onnx(Graph(), 18)


@pytest.mark.parametrize("variant", FP32_ONLY or ["reformer"])
def test_a_variant_without_fp16_is_refused_before_anything_is_written(tmp_path, variant):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--variant", variant, "--dtype", "fp16", "-o", str(out)])
    assert_one_line_error(code, stderr, f"variant '{variant}' cannot be exported in fp16", "fp32 only")
    assert not out.exists()


def test_every_variant_declares_an_fp16_tolerance_no_tighter_than_fp32():
    for variant in get_registry().variants.values():
        assert variant.tolerance_for("fp16").atol >= variant.tolerance_for("fp32").atol
        assert variant.tolerance_for("fp32") == variant.tolerance


def test_an_fp16_engine_of_an_fp32_export_is_judged_at_the_fp16_tolerance():
    """`attnx build --fp16` on an fp32 export: the trt backend gets the fp16 tolerance, nothing else."""
    from types import SimpleNamespace

    from attnx.parity.check import engine_tolerance

    assembly = assemble("linear", "seq2seq", TINY, cross_variant="softmax")

    def export(fp16_engine: bool | None, dtype: str) -> SimpleNamespace:
        engine = None if fp16_engine is None else SimpleNamespace(fp16=fp16_engine)
        return SimpleNamespace(manifest=SimpleNamespace(engine=engine, dtype=dtype))

    assert engine_tolerance(export(True, "fp32"), assembly) == FP16_TOLERANCE
    assert engine_tolerance(export(False, "fp32"), assembly) is None
    assert engine_tolerance(export(None, "fp32"), assembly) is None
    assert engine_tolerance(export(True, "fp16"), assembly) is None
