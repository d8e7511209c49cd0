"""``attnx export --from hf:DIR`` of hybrids, ONNX Runtime against HF's own forward (slow: whole exports)."""

from __future__ import annotations

import functools
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from transformers.models.kimi_linear import modeling_kimi_linear as kimi

from attnx.registry import get_registry
from attnx.testing import hf_hybrid
from tests.adapters.hf_hybrid.conftest import ARCHS
from tests.adapters.hf_hybrid.test_torch_parity import hf_logits, hf_reference
from tests.helpers import run_cli

TOLERANCE = get_registry().variant("softmax").tolerance
# odd, inside one chunk of the linear layers (64), either side of one chunk, across two
LENGTHS = (1, 7, 63, 65, 130)


# the attnx variant of each token mixer's kind (LFM2's convs, Nemotron-H's mlp and moe blocks: no attnx op)
VARIANT_OF = {
    "linear_attention": "gated_delta",
    "full_attention": "softmax",
    "indexed_attention": "softmax",
    "sliding_attention": "softmax",
}


def variants_of(config) -> list[str]:
    """The variants whose ops an export of a model with ``config`` holds, sorted (the manifest's; a hybrid
    layer holds both kinds)."""
    kinds = {k for t in hf_hybrid.layer_types(config) for k in (VARIANT_OF if t == "hybrid" else (t,))}
    return sorted({VARIANT_OF[kind] for kind in kinds if kind in VARIANT_OF})


def full_attention_copy(arch: str, path):
    """``arch``'s recipe with every layer full attention (MoE kept), random weights, and the tokenizer."""
    recipe = hf_hybrid.RECIPES[arch]
    options = {
        **recipe["options"],
        "layer_types": ["full_attention"] * recipe["options"]["num_hidden_layers"],
    }
    torch.manual_seed(0)
    model = getattr(transformers, recipe["class"])(getattr(transformers, recipe["config"])(**options)).eval()
    model.save_pretrained(path)
    hf_hybrid.train_tokenizer().save_pretrained(path)
    return model


def ort_matches_hf_on_left_padded_batches(model, onnx_path, lengths) -> None:
    """model.onnx on generate-style batches (second row left-padded, positions cumsum(mask) - 1) equals
    HF's forward at every position (where HF's padded forward lets the padding leak, RecurrentGemma's and
    xLSTM's: HF's forward of each row alone, at the real positions)."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for n in lengths:
        torch.manual_seed(n)
        ids = torch.randint(0, model.config.vocab_size, (2, n))
        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, : n // 3] = 0
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        with torch.no_grad():
            expected, keep = hf_reference(model, functools.partial(hf_logits, model), ids, mask)
        feed = {
            "input_ids": ids.numpy(),
            "attention_mask": mask.bool().numpy(),
            "position_ids": positions.numpy(),
        }
        (actual,) = session.run(["logits"], feed)
        np.testing.assert_allclose(
            actual[keep.numpy()], expected[keep].numpy(), atol=TOLERANCE.atol, rtol=TOLERANCE.rtol
        )


@pytest.mark.slow
def test_qwen3_next_attention_and_moe_export_and_match_hf(tmp_path):
    """Qwen3-Next's gated attention, MoE (dense experts) and HF's own code in ONNX Runtime equal HF's
    forward: the export's own parity run (right padding, random positions), generate-style batches, and
    a bare ``attnx verify`` in a fresh process; the saved tokenizer travels with the export."""
    model = full_attention_copy("qwen3_next", tmp_path / "saved")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["export", "--from", f"hf:{tmp_path / 'saved'}", "-o", str(out)])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout
    manifest = json.loads((out / "attnx.json").read_text())
    assert [s["name"] for s in manifest["inputs"]] == ["input_ids", "attention_mask", "position_ids"]
    assert manifest["module"]["adapters"] == ["hf_hybrid"]
    assert manifest["tokenizer"]["vocab_size"] == hf_hybrid.VOCAB_SIZE
    assert (out / "tokenizer.json").is_file()
    ort_matches_hf_on_left_padded_batches(model, out / "model.onnx", (1, 7, 65, 130))
    code, stdout, stderr = run_cli(["verify", str(out)])
    assert code == 0, stderr


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(hf_hybrid.RECIPES))
def test_each_architecture_with_its_layers_doubled_is_stamped_and_verifies(tmp_path, arch):
    """The recipe's layer pattern twice (random weights): the export converts a prefix of its layers and
    stamps the rest (attnx.exporter.repeat), and its own parity against HF's forward passes, decode
    graphs included."""
    from attnx.exporter.module import build_module, from_source

    hf_hybrid.build(arch, **hf_hybrid.doubled(arch)).eval().save_pretrained(tmp_path / "saved")
    stack = build_module(from_source(f"hf:{tmp_path / 'saved'}")).layer_stack()
    assert stack is not None and stack.prefix < len(stack.layers), "nothing would be stamped"
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["export", "--from", f"hf:{tmp_path / 'saved'}", "--decode", "-o", str(out)]
    )
    assert code == 0, stderr
    assert "parity: PASSED" in stdout


@pytest.mark.slow
@pytest.mark.parametrize("target", ["portable", "ort"])
@pytest.mark.parametrize("arch", ARCHS)
def test_trained_hybrid_exports_and_matches_hf(trained, saved_dir, tmp_path, arch, target):
    """The trained hybrid (linear + full attention layers) exported with one command, on standard ONNX
    ops or ONNX Runtime's own kernels (``--target ort``): its own parity run passes, ONNX Runtime equals
    HF's forward on generate-style left-padded batches at lengths inside and across the linear layers'
    chunks, and a bare ``attnx verify`` passes in the default lengths."""
    out = tmp_path / "out"
    command = ["export", "--from", f"hf:{saved_dir(arch)}", "--target", target, "-o", str(out)]
    code, stdout, stderr = run_cli(command)
    assert code == 0, stderr
    assert "parity: PASSED" in stdout
    manifest = json.loads((out / "attnx.json").read_text())
    assert manifest["module"]["variants"] == variants_of(trained(arch).config)
    ort_matches_hf_on_left_padded_batches(trained(arch), out / "model.onnx", LENGTHS)
    code, stdout, stderr = run_cli(["verify", str(out)])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout


@pytest.mark.slow
def test_kimi_router_correction_bias_exports_and_matches_hf(tmp_path):
    """Kimi Linear's DeepSeek-V3 router (HF's own code in the graph: sigmoid scores, grouped top-k) with a
    non-zero ``e_score_correction_bias`` (zero in a trained fixture: training leaves the buffer alone),
    which moves the choice of groups and experts but not the weights: ONNX Runtime equals HF's forward."""
    recipe = hf_hybrid.RECIPES["kimi_linear"]
    torch.manual_seed(0)
    model = transformers.KimiLinearForCausalLM(transformers.KimiLinearConfig(**recipe["options"])).eval()
    routers = [m for m in model.modules() if isinstance(m, kimi.KimiLinearTopkRouter)]
    assert routers
    for router in routers:
        router.e_score_correction_bias.normal_(0.0, 0.5)
    saved = tmp_path / "saved"
    model.save_pretrained(saved)
    hf_hybrid.train_tokenizer().save_pretrained(saved)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["export", "--from", f"hf:{saved}", "-o", str(out)])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout
    ort_matches_hf_on_left_padded_batches(model, out / "model.onnx", (7, 65))
