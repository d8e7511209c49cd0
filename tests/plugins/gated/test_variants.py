"""``retention`` and ``gated_delta`` through the CLI and the exporter: bad options refused in one line with
nothing written, and ``--target ort`` (ONNX Runtime's com.microsoft::LinearAttention) verified against
torch and against the portable standard-op body on the same inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from attnx.api import export
from attnx.exporter.directory import ExportDir
from attnx.targets import TARGETS
from tests.conftest import TINY
from tests.helpers import assert_one_line_error, run_cli

# grouped value heads, lengths across chunks of 4; retention with a decay per key dimension from x
OPTIONS = {
    "gated_delta": {"variant.value_heads": 4, "variant.chunk_size": 4},
    "retention": {"variant.decay": "key", "variant.value_heads": 4, "variant.chunk_size": 4},
}


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--variant", "retention", "--set", "decay=fixed", "--set", "gammas=1.5"],
         ["retention option gammas=(1.5,) must be decay factors in (0, 1]", "a log-decay <= 0"]),
        (["--variant", "gated_delta", "--set", "value_heads=3"],
         ["gated_delta option value_heads=3 must be a multiple of key_heads=4",
          "change value_heads or key_heads"]),
        (["--variant", "gated_delta", "--set", "conv_kernel=0"],
         ["gated_delta option conv_kernel=0 must be >= 2", "short_conv=false"]),
        (["--variant", "retention", "--set", "chunk_size=0"],
         ["retention option chunk_size=0 must be in 1..32768"]),
        (["--variant", "retention", "--set", "decay=fixed", "--set", "gammas=0.5,0.9,0.7"],
         ["retention option gammas has 3 values for 4 value heads", "one per value head"]),
    ],
)  # fmt: skip
def test_bad_options_are_one_line_and_write_nothing(tmp_path, args, fragments):
    out = tmp_path / "out"
    code, _, stderr = run_cli(["export", "--model", "lm", *args, "-o", str(out), "--set", "d_model=32"])
    assert_one_line_error(code, stderr, *fragments)
    assert not out.exists()


def test_target_ort_without_the_kernel_is_refused(monkeypatch, tmp_path):
    """An onnxruntime without com.microsoft::LinearAttention (older than 1.32) cannot run the ort bodies."""
    ort_target = TARGETS["ort"]
    older = frozenset(k for k in ort_target.kernels() if k[1] != "LinearAttention")
    monkeypatch.setitem(TARGETS, "ort", dataclasses.replace(ort_target, installed=lambda: older))
    out = tmp_path / "out"
    args = ["export", "--model", "lm", "--variant", "gated_delta", "--target", "ort", "-o", str(out)]
    code, _, stderr = run_cli([*args, "--set", "d_model=32"])
    assert_one_line_error(
        code,
        stderr,
        "attnx::GatedDeltaRule's ort body calls com.microsoft::LinearAttention",
        "(onnxruntime >= 1.32 has it); upgrade onnxruntime or export with --target portable",
    )
    assert not out.exists()


def logits(path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(["logits"], {"input_ids": ids})[0]


@pytest.mark.parametrize("variant", ["gated_delta", pytest.param("retention", marks=pytest.mark.slow)])
def test_ort_target_matches_torch_and_the_portable_body(tmp_path, variant):
    settings = {**TINY, **OPTIONS[variant], "export.seed": 3, "verify.seq_lens": [19]}
    native = export(variant, tmp_path / "ort", model="lm", options={**settings, "export.target": "ort"})
    assert native.parity.passed, native.parity.to_dict()  # against the torch model
    proto = onnx.load(str(tmp_path / "ort" / "model.onnx"))
    kernels = [n.op_type for f in proto.functions for n in f.node if n.domain == "com.microsoft"]
    assert set(kernels) == {"LinearAttention"}  # ONNX Runtime's kernel, the only com.microsoft op
    section = ExportDir.open(tmp_path / "ort").manifest.target
    assert (section.name, section.ops) == ("ort", ["attnx::GatedDeltaRule"])

    export(variant, tmp_path / "portable", model="lm", options={**settings, "verify.enabled": False})
    portable = onnx.load(str(tmp_path / "portable" / "model.onnx"))
    assert not [n for f in portable.functions for n in f.node if n.domain == "com.microsoft"]
    ids = np.random.default_rng(5).integers(0, 50, size=(2, 23))  # 23 tokens: 5 chunks of 4, the last short
    np.testing.assert_allclose(logits(tmp_path / "ort", ids), logits(tmp_path / "portable", ids), atol=2e-5)
