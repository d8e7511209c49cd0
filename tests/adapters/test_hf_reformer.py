"""The ``hf_reformer`` adapter against Hugging Face transformers' own Reformer forward.

Tiny random models are built here and saved with ``save_pretrained`` into tmp_path (no hub).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

import attnx
from attnx.registry import get_registry
from tests.helpers import assert_one_line_error, run_cli

transformers = pytest.importorskip("transformers")
from transformers.models.reformer import modeling_reformer as hf  # noqa: E402

from attnx.adapters.hf_reformer.convert import convert  # noqa: E402

HEADS, HEAD_DIM = 2, 8
TOLERANCE = get_registry().variant("reformer").tolerance


def reformer_config(**overrides) -> transformers.ReformerConfig:
    """A tiny Reformer: LSH chunks of 16 and local chunks of 32 (so inputs are padded to 32), axial
    positions up to 1024."""
    options = dict(
        vocab_size=40,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        attention_head_size=HEAD_DIM,
        feed_forward_size=32,
        attn_layers=["lsh", "local"],
        lsh_attn_chunk_length=16,
        local_attn_chunk_length=32,
        num_hashes=2,
        num_buckets=4,
        hash_seed=3,
        axial_pos_shape=(16, 64),
        axial_pos_embds_dim=(8, 8),
        max_position_embeddings=1024,
        pad_token_id=0,
        num_labels=3,
    )
    options.update(overrides)
    return transformers.ReformerConfig(**options)


def saved(path: Path, cls: type, config: transformers.ReformerConfig) -> Path:
    """A random ``cls`` model (weights of scale 0.3, so attention is far from uniform) saved to ``path``."""
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return path


def close(actual: torch.Tensor | np.ndarray, expected: torch.Tensor) -> float:
    """Max abs error, after asserting the reformer variant's tolerance."""
    actual = torch.as_tensor(np.asarray(actual))
    torch.testing.assert_close(actual, expected, atol=TOLERANCE.atol, rtol=TOLERANCE.rtol)
    return (actual - expected).abs().max().item()


# --- the attention layers alone ------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [5, 16, 48])
@pytest.mark.parametrize("num_hashes,after", [(1, 0), (3, 1)])
def test_layers_match_hf_layers(causal, length, num_hashes, after):
    """Each adapted layer equals HF's (hash_seed set) on real tokens, with and without a padding mask;
    lengths: shorter than a chunk (HF's full attention), one chunk, three chunks."""
    config = reformer_config(
        is_decoder=causal,
        num_hashes=num_hashes,
        lsh_num_chunks_after=after,
        local_num_chunks_after=after,
        local_attn_chunk_length=16,
    )
    torch.manual_seed(1)
    x = torch.randn(2, length, HEADS * HEAD_DIM) * 3
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, length - length // 3 :] = 0
    for layer in (hf.LSHSelfAttention(config, layer_idx=0), hf.LocalSelfAttention(config, layer_idx=0)):
        layer.eval()
        adapted = convert(layer)
        with torch.no_grad():
            for attention_mask in (None, mask):
                expected = layer(x, attention_mask=attention_mask).hidden_states
                actual = adapted(x, attention_mask=attention_mask).hidden_states
                real = slice(None) if attention_mask is None else attention_mask.bool()
                close(actual[real], expected[real])


def test_a_layer_without_hash_seed_is_refused_in_python():
    layer = hf.LSHSelfAttention(reformer_config(hash_seed=None)).eval()
    with pytest.raises(attnx.AttnxError, match="hash_seed"):
        convert(layer)


def test_a_float16_model_is_refused():
    layer = hf.LocalSelfAttention(reformer_config()).eval().half()
    with pytest.raises(attnx.AttnxError, match="float32"):
        convert(layer)


def test_a_factorised_num_buckets_is_refused():
    layer = hf.LSHSelfAttention(reformer_config(num_buckets=[2, 4])).eval()
    with pytest.raises(attnx.AttnxError, match="num_buckets"):
        convert(layer)


# --- whole models through `attnx export --from hf:DIR` -------------------------------------------


def ort_vs_hf(out: Path, model: torch.nn.Module, lengths: list[int]) -> dict[int, float]:
    """Max abs error of model.onnx against the HF model's own forward (logits), batch of 2 with the
    second row padded by attention_mask, at each length."""
    session = ort.InferenceSession(str(out / "model.onnx"))
    errors = {}
    torch.manual_seed(2)
    for length in lengths:
        ids = torch.randint(1, 40, (2, length))
        mask = torch.ones(2, length, dtype=torch.bool)
        mask[1, length - length // 4 :] = False
        with torch.no_grad():
            expected = model(input_ids=ids, attention_mask=mask).logits
        (actual,) = session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        errors[length] = close(actual, expected)
    return errors


def test_causal_lm_exports_with_one_command_and_matches_hf(tmp_path):
    # A chunked feed-forward: HF's own forward then refuses lengths <= 16 that are not multiples of 8.
    config = reformer_config(is_decoder=True, chunk_size_feed_forward=8)
    directory = saved(tmp_path / "lm", transformers.ReformerModelWithLMHead, config)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["export", "--from", f"hf:{directory}", "-o", str(out), "--seq-lens", "17,129"]
    )
    assert code == 0, stderr
    assert "through adapter hf_reformer" in stdout and "parity: PASSED" in stdout
    assert "note:" not in stdout  # hash_seed was set: nothing drawn
    model = transformers.ReformerModelWithLMHead.from_pretrained(directory).eval()
    errors = ort_vs_hf(out, model, [64, 129, 512])
    print("LM max abs error vs HF", errors)


@pytest.mark.slow  # a classifier export plus a verify in a fresh process: ~45 s on 2 cores
def test_classifier_without_hash_seed_exports_and_says_so(tmp_path):
    config = reformer_config(hash_seed=None, lsh_num_chunks_after=1, local_num_chunks_after=1)
    directory = saved(tmp_path / "cls", transformers.ReformerForSequenceClassification, config)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(
        ["export", "--from", f"hf:{directory}", "-o", str(out), "--seq-lens", "64"]
    )
    assert code == 0, stderr
    assert "note: config.hash_seed is unset" in stdout and "hash_seed=0" in stdout
    notes = json.loads((out / "attnx.json").read_text())["module"]["notes"]
    assert len(notes) == 1 and "hash_seed=0" in notes[0]
    # HF's own forward with the seed the export drew: the rotations are the ones it saved.
    seeded = transformers.ReformerConfig.from_pretrained(directory)
    seeded.hash_seed = 0
    model = transformers.ReformerForSequenceClassification.from_pretrained(directory, config=seeded).eval()
    errors = ort_vs_hf(out, model, [64, 129, 512])
    print("classifier max abs error vs HF", errors)
    verify = subprocess.run(
        [sys.executable, "-m", "attnx", "verify", str(out), "--seq-lens", "33"],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stderr
    assert "parity: PASSED" in verify.stdout


# --- bad input ------------------------------------------------------------------------------------


def test_bad_directories_are_refused_in_one_line(tmp_path):
    directory = saved(tmp_path / "lm", transformers.ReformerModelWithLMHead, reformer_config(is_decoder=True))
    other = tmp_path / "bert"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bert"}))
    masked = tmp_path / "masked"
    masked.mkdir()
    (masked / "config.json").write_text(
        json.dumps({"model_type": "reformer", "architectures": ["ReformerForMaskedLM"]})
    )
    (masked / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
    factorised = saved(
        tmp_path / "factorised", transformers.ReformerModel, reformer_config(num_buckets=[2, 2])
    )
    mismatched = tmp_path / "mismatched"
    mismatched.mkdir()
    (mismatched / "model.safetensors").write_bytes((directory / "model.safetensors").read_bytes())
    config = json.loads((directory / "config.json").read_text())
    (mismatched / "config.json").write_text(
        json.dumps({**config, "attn_layers": ["lsh", "local", "lsh"], "num_hidden_layers": 3})
    )
    cases = [
        (tmp_path / "missing", "no config.json"),
        (factorised, "num_buckets=[2, 2]"),
        (other, "'bert' model"),
        (masked, "ReformerForMaskedLM"),
        (mismatched, "do not match its config.json"),
    ]
    for source, fragment in cases:
        out = tmp_path / "out"
        code, _, stderr = run_cli(["export", "--from", f"hf:{source}", "-o", str(out)])
        assert_one_line_error(code, stderr, fragment)
        assert not out.exists()


def parity_lengths(out: Path) -> list[int]:
    """The lengths the export's last parity check ran at."""
    return json.loads((out / "parity.json").read_text())["seq_lens"]


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        # axial positions of 8 x 8: inputs padded to multiples of 32 (the chunks' lcm) up to 64
        ({"max_position_embeddings": 64, "axial_pos_shape": (8, 8)}, [1, 7, 32, 64]),
        # a position table of 48 rows: 33..48 tokens would be padded to 64, past the table
        pytest.param(
            {"max_position_embeddings": 48, "axial_pos_embds": False}, [1, 7, 32], marks=pytest.mark.slow
        ),
    ],
    ids=["axial-64", "table-48"],
)
def test_a_model_with_small_limits_exports_and_verifies_with_no_flags(tmp_path, limits, expected):
    """The default lengths (1, 7, 32, 129) fitted to what HF's own forward takes (issue: 129 was refused)."""
    config = reformer_config(is_decoder=True, **limits)
    directory = saved(tmp_path / "lm", transformers.ReformerModelWithLMHead, config)
    out = tmp_path / "out"
    code, stdout, stderr = run_cli(["export", "--from", f"hf:{directory}", "-o", str(out)])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout and parity_lengths(out) == expected
    code, stdout, stderr = run_cli(["verify", str(out)])
    assert code == 0 and "parity: PASSED" in stdout, stderr
    assert parity_lengths(out) == expected


def chunked_feed_forward(tmp_path: Path) -> Path:
    """A Reformer LM whose feed-forward HF chunks by 4 tokens (it takes only multiples of 4), saved."""
    config = reformer_config(is_decoder=True, chunk_size_feed_forward=4)
    return saved(tmp_path / "lm", transformers.ReformerModelWithLMHead, config)


@pytest.mark.slow  # traces a Reformer before its forward refuses; one-line refusals: test_bad_input.py
def test_lengths_the_hf_model_refuses_are_one_line_and_named(tmp_path):
    """Lengths given that HF's own forward refuses are named with the fix."""
    directory, out = chunked_feed_forward(tmp_path), tmp_path / "out"
    code, _, stderr = run_cli(["export", "--from", f"hf:{directory}", "-o", str(out), "--seq-lens", "1,7"])
    assert_one_line_error(
        code, stderr, "own forward refuses the parity inputs (input_ids (2, 1)", "--seq-lens"
    )
    assert not out.exists()
    code, _, stderr = run_cli(["export", "--from", f"hf:{directory}", "-o", str(out), "--decode"])
    assert_one_line_error(code, stderr, "ReformerModelWithLMHead has no attention layer that decodes")
    assert not out.exists()


@pytest.mark.slow
def test_default_lengths_become_multiples_of_the_feed_forward_chunk(tmp_path):
    directory, out = chunked_feed_forward(tmp_path), tmp_path / "out"
    code, stdout, stderr = run_cli(["export", "--from", f"hf:{directory}", "-o", str(out)])
    assert code == 0, stderr
    assert "parity: PASSED" in stdout and parity_lengths(out) == [4, 8, 32, 132]


def test_hf_model_without_hash_seed_from_python_is_refused(tmp_path):
    model = transformers.ReformerModel(reformer_config(hash_seed=None)).eval()
    example = {"input_ids": torch.randint(0, 40, (2, 32))}
    with pytest.raises(attnx.AttnxError, match="hash_seed"):
        attnx.export_module(model, example, tmp_path / "out")
    assert not (tmp_path / "out").exists()
