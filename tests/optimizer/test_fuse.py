"""``attnx optimize --fuse``: ONNX Runtime's fused kernels in a Hugging Face hybrid's graphs (a Qwen3.5
export with ``--target ort`` and decode graphs), checked against HF's own forward (slow: an export and its
optimisation; the default run fuses attnx's tiny lm in test_optimize.py)."""

from __future__ import annotations

import json

import onnx
import pytest
from onnx import helper

from attnx.exporter.directory import ExportDir
from attnx.exporter.lowering import check
from tests.helpers import run_cli

transformers = pytest.importorskip("transformers")

from attnx.testing import hf_hybrid  # noqa: E402
from tests.adapters.hf_hybrid.test_export import ort_matches_hf_on_left_padded_batches  # noqa: E402

# what onnxscript's fusions make of HF's RMSNorm, alone and after a residual add (the recipe's rotary is
# Qwen3.5's interleaved multimodal one, which they leave as it is; a plain one becomes RotaryEmbedding)
FUSED_KERNELS = {("", "SimplifiedLayerNormalization"), ("com.microsoft", "SkipSimplifiedLayerNormalization")}


@pytest.fixture(scope="module")
def fused(tmp_path_factory):
    """(the saved Qwen3.5 directory, OUT of its export, OUT2 of ``attnx optimize OUT --fuse``, stderr)."""
    hf_hybrid.pure_torch_gated_delta()
    saved = hf_hybrid.make("qwen3_5", steps=0)
    root = tmp_path_factory.mktemp("fuse")
    code, _, stderr = run_cli(
        [
            "export",
            "--from",
            f"hf:{saved}",
            "--decode",
            "--target",
            "ort",
            "--no-verify",
            "-o",
            str(root / "src"),
        ]
    )
    assert code == 0, stderr
    code, stdout, stderr = run_cli(["optimize", str(root / "src"), "-o", str(root / "fused"), "--fuse"])
    assert code == 0, stdout + stderr
    assert "parity: PASSED on ort-cpu, ort-cpu decode, ort-cpu genai" in stdout
    return saved, root / "src", root / "fused", stderr


def kernels(model: onnx.ModelProto) -> set[tuple[str, str]]:
    return {(node.domain, node.op_type) for node in model.graph.node}


@pytest.mark.slow
def test_every_graph_runs_the_fused_kernels_and_keeps_the_target_kernels(fused):
    """model, prefill, decode and genai graphs: the fused norms and rotary, the ``--target ort`` bodies'
    kernels still there, every op body inlined (the manifest says decomposed), the accuracy report within
    the 1e-4 bound, each transformed graph's fusions named on stderr, and the graphs made from it."""
    _, src, out, stderr = fused
    export = ExportDir.open(out)
    assert export.manifest.optimized.steps == ["fuse"]
    assert export.manifest.lowering == "decomposed" and ExportDir.open(src).manifest.lowering == "function"
    assert set(export.manifest.optimized.graphs) == {"model", "prefill", "decode", "genai"}
    for key in export.manifest.optimized.graphs:
        model = onnx.load(str(export.file(key)), load_external_data=False)
        made = kernels(model)
        assert made >= FUSED_KERNELS | {("com.microsoft", "LinearAttention")}, key
        assert not model.functions and not any(domain.startswith("attnx") for domain, _ in made), key
    accuracy = json.loads((out / "accuracy.json").read_text())
    assert accuracy["passed"] and accuracy["rel_error"] <= 1e-4 and accuracy["text"]["top1"] == 1.0
    for graph in ("model.onnx", "decode.onnx"):
        assert f"{graph}: made " in stderr and "skip_rms_normalization" in stderr
        assert "l2_normalization" in stderr  # the gated layers' q/k norms (attnx/optimizer/l2norm.py)
    for graph in ("prefill.onnx", "genai.onnx"):  # the fused decode graph from the empty state, genai's names
        assert f"{graph}: made from the new decode.onnx" in stderr


@pytest.mark.slow
def test_fused_model_follows_hf_forward_on_left_padded_batches(fused):
    """Independently of attnx's report: HF's own forward of the saved model against the fused model.onnx,
    at lengths inside and across the linear layers' 64-token chunks."""
    saved, _, out, _ = fused
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(saved).eval()
    ort_matches_hf_on_left_padded_batches(model, out / "model.onnx", (7, 65))


@pytest.mark.slow
def test_generate_on_the_fused_export_draws_what_the_source_draws(fused):
    _, src, out, _ = fused
    drawn = []
    for export in (src, out):
        code, stdout, stderr = run_cli(
            ["generate", str(export), "--prompt-ids", "3,9,4", "-n", "24", "--json"]
        )
        assert code == 0, stderr
        drawn.append(json.loads(stdout)["tokens"])
    assert len(drawn[0]) == 24 and drawn[0] == drawn[1]


def test_the_checker_takes_onnxruntime_default_domain_kernels_and_still_refuses_unknown_ops():
    """``SimplifiedLayerNormalization`` is ONNX Runtime's, in the default domain, which onnx's checker
    has no schema for; an op neither defines is still refused."""

    def one_node(op_type: str) -> onnx.ModelProto:
        node = helper.make_node(op_type, ["x", "w"], ["y"], axis=-1, epsilon=1e-6)
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 4]) for n in ("x",)],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
            [helper.make_tensor("w", onnx.TensorProto.FLOAT, [4], [1.0] * 4)],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)

    model = one_node("SimplifiedLayerNormalization")
    before = model.SerializeToString()
    check(model)
    assert model.SerializeToString() == before  # the check leaves the model as it was
    with pytest.raises(onnx.checker.ValidationError, match="NotAnOp"):
        check(one_node("NotAnOp"))
