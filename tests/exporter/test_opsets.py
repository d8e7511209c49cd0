"""The opset/IR policy: every graph states its opset's IR version, softmax exports on the standard
Attention op from opset 23 (decode included), and opsets nothing can serve are one-line errors."""

from __future__ import annotations

import types

import onnx
import onnxruntime as ort
import pytest

from attnx.api import export
from attnx.errors import AttnxError
from attnx.exporter.opsets import (
    DEFAULT_OPSET,
    IR_VERSIONS,
    MIN_ONNXRUNTIME,
    OPSETS,
    check_onnxruntime,
    check_opset,
)
from attnx.trt.graph import attention_nodes
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli

# Measured (attnx.exporter.opsets): the newest IR version and ai.onnx opset each ONNX Runtime release loads.
ORT_LOADS = {"1.22": (10, 22), "1.23": (11, 23), "1.24": (13, 25), "1.25": (13, 26), "1.32": (14, 28)}


def test_every_opset_loads_in_the_onnxruntime_the_policy_names_for_it():
    """Each opset's stated IR version and the opset itself load in its minimum ONNX Runtime (and so in
    every newer one), the default in the oldest supported release (pyproject: onnxruntime>=1.22)."""
    assert MIN_ONNXRUNTIME[DEFAULT_OPSET] == min(ORT_LOADS)
    for opset in OPSETS:
        ir, newest = ORT_LOADS[MIN_ONNXRUNTIME[opset]]
        assert IR_VERSIONS[opset] <= ir and opset <= newest, opset
        assert IR_VERSIONS[opset] >= 10  # function overloads (attnx's bodies) need IR 10


def graphs(out):
    return {p.name: onnx.load(str(p), load_external_data=False) for p in sorted(out.glob("*.onnx"))}


# the default run: the function lowering at the oldest and the newest opset, decomposed (no Attention node
# at any opset) at 24, where the function lowering has one; -m slow: both lowerings at every opset
IR_OPSETS = (18, 22, 24, 25, 27)
IR_DEFAULT = (18, 27)
IR_CASES = [
    pytest.param(
        opset, "function", id=f"function-{opset}", marks=[pytest.mark.slow] * (opset not in IR_DEFAULT)
    )
    for opset in IR_OPSETS
] + [
    pytest.param(opset, "decomposed", id=f"decomposed-{opset}", marks=[pytest.mark.slow] * (opset != 24))
    for opset in IR_OPSETS
]


@pytest.mark.parametrize(("opset", "lowering"), IR_CASES)
def test_export_states_the_ir_version_of_its_opset(tmp_path, opset, lowering):
    options = {**TINY, "export.opset": opset, "export.lowering": lowering, "verify.enabled": False}
    result = export("softmax", tmp_path / "out", options=options)
    assert result.manifest.opset == opset and result.manifest.ir_version == IR_VERSIONS[opset]
    for name, model in graphs(result.out).items():
        assert model.ir_version == IR_VERSIONS[opset], name
        assert bool(attention_nodes(model)) == (lowering == "function" and opset >= 23), name
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_softmax_lm_at_opset_23_runs_and_decodes_on_the_attention_op(tmp_path):
    """Every graph (model, prefill, decode with its kv-cache) holds Attention nodes, states IR 11, and the
    export verifies against torch in ONNX Runtime, the decode steps and onnxruntime-genai's layout included;
    decode.onnx feeds its cache to Attention's past_key/past_value."""
    options = {**TINY, "export.opset": 23, "export.decode": True, "verify.seq_lens": [1, 6]}
    result = export("softmax", tmp_path / "out", model="lm", options=options)
    assert result.parity is not None and result.parity.passed, result.parity.to_dict()
    assert {b.backend for b in result.parity.backends} >= {"ort-cpu", "ort-cpu decode", "ort-cpu genai"}
    found = graphs(result.out)
    assert {"model.onnx", "prefill.onnx", "decode.onnx"} <= set(found)
    for name, model in found.items():
        assert model.ir_version == IR_VERSIONS[23] == result.manifest.ir_version, name
        assert attention_nodes(model), name
    cached = [n for n in attention_nodes(found["decode.onnx"]) if len(n.input) > 4 and n.input[4]]
    assert cached and all(len(n.output) >= 3 for n in cached)  # past_key/past_value in, present out


def test_a_lowering_that_cannot_use_the_opset_is_one_line():
    newer = types.SimpleNamespace(name="Newer", body_opsets=lambda: [23, 24])
    check_opset(23, "function", [newer])
    check_opset(18, "plugin", [newer])  # a plugin node has no body
    with pytest.raises(AttnxError) as caught:
        check_opset(22, "decomposed", [newer])
    message = str(caught.value)
    assert "\n" not in message
    assert "the decomposed lowering of attnx::Newer needs opset >= 23" in message
    assert "--opset 23..27" in message


def test_an_onnxruntime_too_old_for_the_opset_is_one_line():
    check_onnxruntime(23, "1.23.0")
    expected = r"opset 24 needs onnxruntime >= 1\.24 to load \(installed: 1\.23\.2\)"
    with pytest.raises(AttnxError, match=expected):
        check_onnxruntime(24, "1.23.2")


@pytest.mark.parametrize("opset", [17, 28])
def test_cli_refuses_an_opset_outside_the_policy(tmp_path, opset):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--variant", "softmax", "-o", str(out), "--opset", str(opset)])
    assert_one_line_error(code, stderr, f"opset {opset} is not supported (choose 18..27")
    assert not (tmp_path / "out").exists()
