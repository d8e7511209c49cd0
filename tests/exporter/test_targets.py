"""Lowering targets (``--target``): an op's bodies for ONNX Runtime's own kernels, declared on the op.

The test plugin's op (tests/third_party/target_plugin.py) declares an ``ort`` body on
``com.microsoft::LinearAttention`` beside its portable body; a second one needs a kernel no
onnxruntime has.
"""

from __future__ import annotations

import json

import onnx
import pytest

from attnx.api import export, verify
from attnx.exporter.directory import ExportDir
from attnx.exporter.targets import kernels_needed
from attnx.targets import TARGETS
from attnx.testing.checks.onnx_body import lowerings
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli
from tests.third_party.target_plugin import OPS

LM = {**TINY, "verify.seq_lens": [1, 7, 19]}


@pytest.fixture
def targets(use_registry):
    return use_registry(("target", "tests.third_party.target_plugin"))


def microsoft_nodes(proto: onnx.ModelProto) -> list[str]:
    graphs = [proto.graph, *proto.functions]
    return [n.op_type for g in graphs for n in g.node if n.domain == "com.microsoft"]


@pytest.mark.parametrize("lowering", ["function", "decomposed"])
def test_the_ort_body_exports_verifies_and_is_recorded(targets, tmp_path, lowering):
    result = export("target_running", tmp_path / "out", model="lm", options={
        **LM, "export.target": "ort", "export.lowering": lowering})  # fmt: skip
    assert result.parity.passed, result.parity.to_dict()
    proto = onnx.load(str(tmp_path / "out" / "model.onnx"))
    assert microsoft_nodes(proto) == ["LinearAttention"]  # one layer, ONNX Runtime's kernel
    if lowering == "decomposed":
        assert not [n for n in proto.graph.node if n.domain.startswith("attnx")] and not proto.functions
    section = ExportDir.open(tmp_path / "out").manifest.target
    assert (section.name, section.runtime, section.ops) == (
        "ort",
        "onnxruntime",
        ["attnx::TargetRunningAttention"],
    )
    assert section.runtime_version == TARGETS["ort"].version()
    assert verify(tmp_path / "out", seq_lens=[3, 11], write=False).passed  # rebuilt from the manifest


def test_portable_is_the_default_byte_for_byte(targets, tmp_path):
    outs = [tmp_path / "default", tmp_path / "portable"]
    export("target_running", outs[0], model="lm", options={**TINY, "verify.enabled": False})
    export(
        "target_running",
        outs[1],
        model="lm",
        options={**TINY, "verify.enabled": False, "export.target": "portable"},
    )
    assert (outs[0] / "model.onnx").read_bytes() == (outs[1] / "model.onnx").read_bytes()
    assert not microsoft_nodes(onnx.load(str(outs[0] / "model.onnx")))
    assert (
        "target" not in json.loads((outs[0] / "attnx.json").read_text())
        or ExportDir.open(outs[0]).manifest.target is None
    )


def test_the_kernels_a_body_needs_are_read_off_its_function():
    assert kernels_needed(OPS["running"], "ort") == [("com.microsoft", "LinearAttention")]
    assert kernels_needed(OPS["missing"], "ort") == [("com.microsoft", "LinearAttentionV9")]
    assert ("com.microsoft", "LinearAttention") in TARGETS["ort"].kernels()
    # the conformance kit's onnx-body check runs the ort body where the kernels exist, and only there
    assert ("ort", 18) in lowerings(OPS["running"]) and ("ort", 18) not in lowerings(OPS["missing"])


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (
            ["--variant", "target_missing", "--target", "ort"],
            ["attnx::TargetMissingAttention's ort body calls com.microsoft::LinearAttentionV9",
             f"which onnxruntime {TARGETS['ort'].version()} lacks (onnxruntime >= 9.9 has it)",
             "--target portable"],
        ),
        (["--variant", "target_running", "--target", "ort", "--lowering", "plugin"],
         ["plugin lowering has none"]),
        (
            ["--variant", "cosformer", "--target", "ort"],
            ["no op of this export declares a body for target 'ort'", "attnx::CosformerAttention"],
        ),
        (["--variant", "target_running", "--target", "gpu"], ["target='gpu' must be one of portable, ort"]),
    ],
)  # fmt: skip
def test_a_target_the_export_cannot_use_is_refused_in_one_line(targets, tmp_path, args, fragments):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--model", "lm", *args, "-o", str(out), "--set", "d_model=32"])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists()


def test_the_cli_says_which_ops_run_on_the_targets_kernels_and_list_names_the_targets(targets, tmp_path):
    args = ["export", "--variant", "target_running", "--model", "lm", "--target", "ort", "--no-verify"]
    code, stdout, stderr = run_cli([*args, "-o", str(tmp_path / "out"), "--set", "d_model=32"])
    assert code == 0, stderr
    assert "target ort: attnx::TargetRunningAttention on onnxruntime's own kernels" in stdout
    code, stdout, _ = run_cli(["list", "--json"])
    assert set(json.loads(stdout)["targets"]) == {"portable", "ort"}


def test_a_causal_only_variant_is_refused_for_an_encoder_naming_those_that_can(targets, tmp_path):
    """The gated and delta rules are causal only (Capabilities(bidirectional=False)), as the test op is."""
    from attnx.exporter.assemble import assemble
    from attnx.registry import get_registry
    from attnx.variant import describe

    caps = get_registry().variant("target_running").capabilities
    assert describe(caps) == "supports: causal, fp32 only"
    able = sorted(n for n, v in get_registry().variants.items() if v.capabilities.bidirectional)
    out = tmp_path / "out"
    args = ["export", "--variant", "target_running", "-o", str(out), "--set", "attention_mask=false"]
    code, _, stderr = run_cli(args)
    assert_one_line_error(
        code,
        stderr,
        "model 'encoder' needs bidirectional self-attention: variant 'target_running' does not support "
        "bidirectional attention",
        f"variants that can: {', '.join(able)}",
    )
    assert not out.exists()
    assert assemble("target_running", "lm", TINY).module is not None  # causal: an lm is fine
