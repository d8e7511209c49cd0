"""attnx optimize: int8 / fp16 / slimmed exports of tiny language models, verified against float32 torch."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from attnx.api import export, verify
from attnx.errors import AttnxError
from attnx.exporter.directory import ExportDir
from attnx.optimizer.accuracy import AccuracyReport, OutputError
from attnx.optimizer.optimize import ERROR_BOUNDS, optimize
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli
from tests.models.cases import decoders, one_per_kind

# one decoder per kind of state (a KV cache; a recurrent state, float32 step ops) in the decode graphs in the
# default run, every other decoder (the gated rules' conv carry and float32 state too) in the slow run
VARIANTS = one_per_kind(decoders())
# Measured misses of int8's 10% bound (the report and the decode graphs pass; the full forward at 32 tokens
# does not): the gated rules' per-head RMSNorm divides a near-zero output by its own size, so the int8
# projections' error of such an output reaches the logits whole (docs/variants/retention.md, Tolerance).
INT8_OVER_BOUND = {
    name: f"{name}: int8 logits of the tiny lm off by over 10% at 32 tokens (gated_delta: 0.71 of 6.2)"
    for name in ("retention", "gated_delta")
}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """``source(variant)``: a verified tiny lm export with decode graphs, made once per variant."""
    made = {}

    def get(variant):
        if variant not in made:
            out = tmp_path_factory.mktemp(f"src-{variant}") / "out"
            options = {**TINY, "export.decode": True, "export.seed": 2, "verify.seq_lens": [1, 6]}
            export(variant, out, model="lm", options=options)
            made[variant] = out
        return made[variant]

    return get


def graph_ops(path):
    model = onnx.load(str(path))
    return {n.op_type for n in model.graph.node}, model


def relative_error(optimised, source_dir, tokens):
    """The optimised model.onnx against the torch model rebuilt from the source export (independently of
    attnx's report): max |a - b| / max |b|."""
    session = ort.InferenceSession(str(optimised / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input_ids": tokens})
    with torch.no_grad():
        expected = ExportDir.open(source_dir).rebuild().module(torch.from_numpy(tokens))[0].numpy()
    return float(np.abs(logits - expected).max() / np.abs(expected).max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("step", ["int8", "fp16"])
def test_optimised_lm_is_a_verified_export_with_an_accuracy_report(source, tmp_path, variant, step):
    src = source(variant)
    out = tmp_path / "opt"
    result = optimize(src, out, **{step: True}, seed=5)
    if step == "int8" and variant in INT8_OVER_BOUND and not result.passed:
        pytest.xfail(INT8_OVER_BOUND[variant])
    assert result.passed, (result.report.to_dict(), result.parity.to_dict())
    backends = {b.backend for b in result.parity.ran}
    assert {"ort-cpu", "ort-cpu decode"} <= backends  # the decode graphs were transformed and checked
    report = json.loads((out / "accuracy.json").read_text())
    assert report["passed"] and report["steps"] == [step]
    assert report["top1"] >= 0.95 and report["tokens"] > 300
    assert 0 < report["rel_error"] <= ERROR_BOUNDS[step]

    opened = ExportDir.open(out)
    section = opened.manifest.optimized
    assert section.steps == [step] and section.source == str(src)
    assert section.error_bound == ERROR_BOUNDS[step]
    assert set(section.graphs) == {"model", "prefill", "decode", "genai"}
    assert opened.manifest.tolerance["rtol"] == ERROR_BOUNDS[step]
    for key in section.graphs:
        ops, model = graph_ops(opened.file(key))
        assert model.ir_version == opened.manifest.ir_version == ExportDir.open(src).manifest.ir_version
        if step == "int8":
            assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops, key
        else:
            halves = [i for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
            assert halves, key
        floats = {v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]}
        assert onnx.TensorProto.FLOAT16 not in floats  # the interface stays float32

    tokens = np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, 11))
    assert 0 < relative_error(out, src, tokens) <= ERROR_BOUNDS[step]
    assert verify(out, seq_lens=[1, 9], write=False).passed  # a fresh check at the recorded tolerance


# gated_delta (slow): its untrained norm weight is all ones, which onnxslim folds away (x * 1); the weight
# check takes that (attnx.parity.weights)
@pytest.mark.parametrize("variant", ["softmax", pytest.param("gated_delta", marks=pytest.mark.slow)])
def test_slim_keeps_float32_accuracy_and_bench_runs_the_result(source, tmp_path, variant):
    out = tmp_path / "slim"
    result = optimize(source(variant), out, slim=True, seed=1)
    assert result.passed, (result.report.to_dict(), result.parity.weight_mismatches)
    assert result.report.rel_error <= ERROR_BOUNDS["slim"]
    code, stdout, stderr = run_cli(
        ["bench", str(out), "--backends", "ort-cpu", "--seq-lens", "8", "--repeat", "1", "--batch", "1"]
    )
    assert code == 0, stderr
    assert "ort-cpu" in stdout


def test_fuse_inlines_the_bodies_and_keeps_float32_accuracy(source, tmp_path):
    """``--fuse`` (onnxscript's fusions for ONNX Runtime) on every graph of a decode export: the bodies
    inlined (a decomposed export), within the exact bound, the decode and genai graphs checked too
    (tests/optimizer/test_fuse.py fuses a Hugging Face hybrid's norms)."""
    out = tmp_path / "fused"
    result = optimize(source("softmax"), out, fuse=True, seed=1)
    assert result.passed and result.report.rel_error <= ERROR_BOUNDS["fuse"]
    assert {b.backend for b in result.parity.ran} >= {"ort-cpu", "ort-cpu decode", "ort-cpu genai"}
    opened = ExportDir.open(out)
    assert opened.manifest.lowering == "decomposed" and opened.manifest.optimized.steps == ["fuse"]
    for key in opened.manifest.optimized.graphs:
        ops, model = graph_ops(opened.file(key))
        assert not model.functions and "SoftmaxAttention" not in ops, key


def test_fusions_that_fail_are_one_line_and_write_nothing(source, tmp_path, monkeypatch):
    from onnxscript.rewriter import ort_fusions

    def broken(model):
        raise ValueError("no rule for this graph\nsecond line")

    monkeypatch.setattr(ort_fusions, "optimize_for_ort", broken)
    out = tmp_path / "fused"
    with pytest.raises(
        AttnxError, match=r"^model.onnx: onnxscript's fusions failed \(no rule for this graph\)"
    ):
        optimize(source("softmax"), out, fuse=True, seed=1)
    code, _, stderr = run_cli(["optimize", str(source("softmax")), "-o", str(out), "--fuse"])
    assert_one_line_error(code, stderr, "onnxscript's fusions failed", "optimize without --fuse")
    assert not out.exists()


def test_slim_keeps_an_ort_target_export_on_its_kernels(tmp_path):
    """onnxslim's folding once retyped a float Constant of softmax's GroupQueryAttention body (its
    ``scale == 0`` test) to double, which ONNX Runtime refused to load."""
    options = {**TINY, "export.decode": True, "export.target": "ort", "verify.seq_lens": [1, 6]}
    export("softmax", tmp_path / "src", model="lm", options=options)
    result = optimize(tmp_path / "src", tmp_path / "slim", slim=True, seed=1)
    assert result.passed and result.report.rel_error <= ERROR_BOUNDS["slim"]
    assert "GroupQueryAttention" in (tmp_path / "slim" / "model.onnx").read_bytes().decode("latin-1")


def test_a_step_whose_graph_does_not_load_is_one_line_and_writes_nothing(source, tmp_path, monkeypatch):
    import onnxslim

    def broken(model):
        model.graph.node[0].op_type = "NoSuchOp"
        return model

    monkeypatch.setattr(onnxslim, "slim", broken)
    out = tmp_path / "slim"
    with pytest.raises(
        AttnxError, match=r"model.onnx after --slim \(onnxslim\) does not load in ONNX Runtime"
    ):
        optimize(source("softmax"), out, slim=True, seed=1)
    assert not out.exists() and not list(tmp_path.iterdir())
    code, _, stderr = run_cli(["optimize", str(source("softmax")), "-o", str(out), "--slim"])
    assert_one_line_error(
        code, stderr, "model.onnx after --slim (onnxslim) does not load", "optimize without"
    )
    assert not list(tmp_path.iterdir())


def test_cli_prints_the_report_and_a_missed_limit_exits_1(source, tmp_path):
    out = tmp_path / "int8"
    args = ["optimize", str(source("softmax")), "-o", str(out), "--int8", "--seed", "3", "--quiet"]
    code, stdout, stderr = run_cli(args)
    assert code == 0, stderr
    assert f"wrote {out} (int8; error bound 0.1)" in stdout
    assert "logits: max abs err" in stdout and "next-token top-1 agreement:" in stdout
    assert "parity: PASSED on ort-cpu, torch decode, ort-cpu decode" in stdout

    code, stdout, _ = run_cli([*args, "--force", "--max-rel-error", "1e-9", "--min-top1", "0.5"])
    assert code == 1
    assert "FAILED: relative output error" in stdout and "exceeds --max-rel-error 1e-09" in stdout
    assert not json.loads((out / "accuracy.json").read_text())["passed"]  # written, and says so


def test_top1_limit():
    report = AccuracyReport(["int8"], 0.05, 8, 0, [OutputError("logits", 0.1, 10.0)], top1=0.9, tokens=100)
    assert report.passed
    report.min_top1 = 0.95
    assert report.failures() == ["top-1 agreement 90.0% is below --min-top1 0.95"]
    report.outputs[0].max_abs = 1.0  # relative error 0.1 > the bound
    assert "relative output error 0.1 exceeds the transformation's bound 0.05" in report.failures()


BAD = [
    ([], "nothing to do: choose at least one of --int8, --fp16, --slim, --fuse"),
    (["--int8", "--fp16"], "choose --int8 or --fp16, not both"),
    (["--int8", "--min-top1", "1.5"], "--min-top1 is a fraction in 0..1 (got 1.5)"),
    (["--int8", "--max-rel-error", "-1"], "--max-rel-error must be >= 0"),
]


@pytest.mark.parametrize(("flags", "message"), BAD, ids=[m.split(":")[0][:30] for _, m in BAD])
def test_bad_flags_are_one_line(source, tmp_path, flags, message):
    out = tmp_path / "o"
    code, _, stderr = run_cli(["optimize", str(source("softmax")), "-o", str(out), *flags])
    assert_one_line_error(code, stderr, message)
    assert not out.exists()


def test_bad_directories_are_one_line(source, tmp_path):
    src = source("softmax")
    code, _, stderr = run_cli(["optimize", str(tmp_path / "missing"), "-o", str(tmp_path / "o"), "--int8"])
    assert_one_line_error(code, stderr, "is not a directory; pass the OUT directory of an `attnx export`")
    code, _, stderr = run_cli(["optimize", str(src), "-o", str(src), "--int8", "--force"])
    assert_one_line_error(code, stderr, "is the export being optimised")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for force in ([], ["--force"]):
        code, _, stderr = run_cli(["optimize", str(src), "-o", str(existing), "--int8", *force])
        assert_one_line_error(code, stderr, str(existing))
    assert (existing / "notes.txt").read_text() == "mine"  # --force replaces only an attnx export


@pytest.mark.slow
@pytest.mark.parametrize("step", ["int8", "fp16"])
def test_the_trained_digits_lm_keeps_its_next_tokens(tmp_path, step):
    """Trained weights (the shipped digits-lm recipe), decode graphs included: within the step's bound,
    and the next token agrees at >= 95% of positions (measured: int8 99.1%, fp16 100%)."""
    export(None, tmp_path / "digits", recipe="digits-lm", options={"verify.enabled": False})
    result = optimize(tmp_path / "digits", tmp_path / step, **{step: True}, seed=0, min_top1=0.95)
    assert result.passed, (result.report.to_dict(), result.parity.to_dict())
    assert result.report.rel_error <= ERROR_BOUNDS[step]
