"""A hybrid checkpoint stored in bfloat16 or float16 (as released checkpoints are) exports in float32:
verified against HF's forward on the same float32 weights."""

from __future__ import annotations

import pytest

from attnx.testing.hf_hybrid import _SHARED
from tests.helpers import run_cli


@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float16", marks=pytest.mark.slow)])
def test_a_half_precision_checkpoint_exports_in_float32(tmp_path, dtype):
    import torch
    import transformers

    config = transformers.AutoConfig.for_model("qwen3_5_text", **{**_SHARED, "tie_word_embeddings": True})
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForCausalLM(config).eval().to(getattr(torch, dtype))
    model.save_pretrained(tmp_path / "saved")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["export", "--from", f"hf:{tmp_path / 'saved'}", "-o", str(out), "--seq-lens", "9"]
    )
    assert code == 0, stderr
    assert "fp32" in stdout and "parity: PASSED" in stdout
