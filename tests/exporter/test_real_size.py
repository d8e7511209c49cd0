"""The 0.8B Qwen3.5 text model (random weights, released shape) end to end: one command exports it with
its decode graphs and default verify (torch vs ONNX Runtime, every weight checked), on disk once; greedy
onnxruntime-genai and ``attnx generate`` equal HF ``generate`` for 32 tokens; ``attnx triton`` writes its
repository. Slow: 14 min and an 11.2 GB peak on a 2-core machine (measured 2026-11-28)."""

from __future__ import annotations

import json

import pytest

from attnx.testing import real_size
from tests.helpers import run_cli

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    directory = real_size.save("0.8b", tmp_path_factory.mktemp("qwen35") / "0.8b")
    out = directory.parent / "out"
    code, _, stderr = run_cli(["export", "--from", f"hf:{directory}", "--decode", "-o", str(out)])
    assert code == 0, stderr
    return directory, out


def test_the_export_is_verified_and_on_disk_once(exported):
    directory, out = exported
    report = json.loads((out / "parity.json").read_text())
    assert report["passed"]
    weights = (directory / "model.safetensors").stat().st_size
    on_disk = sum(p.stat().st_size for p in out.iterdir())
    assert on_disk <= 1.5 * weights, (on_disk, weights)


def test_genai_and_attnx_generate_equal_hf_generate(exported):
    import torch
    import transformers

    from attnx.decode.generate import generate
    from attnx.testing import hf_hybrid

    directory, out = exported
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(directory).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    expected, logits = hf_hybrid.hf_greedy(model, prompt, NEW_TOKENS)
    del model
    runs = {
        "genai": hf_hybrid.genai_greedy(out, prompt[0].tolist(), NEW_TOKENS)[0],
        "attnx generate": generate(out, prompt[0].tolist(), NEW_TOKENS).tokens,
    }
    for name, tokens in runs.items():
        agreed, tie = hf_hybrid.agreement(expected, logits, tokens, 1e-4)
        assert agreed == NEW_TOKENS or tie is not None, name


def test_triton_writes_a_repository_with_the_weights_beside_the_graph(exported, tmp_path):
    _, out = exported
    code, _, stderr = run_cli(["triton", str(out), "--repo", str(tmp_path / "models")])
    assert code == 0, stderr
    graphs = list((tmp_path / "models").rglob("model.onnx"))
    assert graphs and all((g.parent / "weights.safetensors").is_file() for g in graphs)
