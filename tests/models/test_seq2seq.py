"""The ``seq2seq`` model: padding masks, distinct source/target lengths, the cross variant."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

from attnx.errors import AttnxError
from attnx.exporter.assemble import assemble
from attnx.exporter.directory import ExportDir
from attnx.exporter.manifest import MODEL_FILE
from tests.helpers import assert_unchanged
from tests.models.cases import (
    REGISTERED,
    SUPPORTED,
    VARIANT_OPTIONS,
    capabilities,
    causal_variants,
    cross_for,
)
from tests.models.exports import tiny_export

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "vocab_size": 50}
VOCAB = TINY["vocab_size"]
NAMES = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")


def batch(
    src_len: int, tgt_len: int, src_real: list[int], tgt_real: list[int], seed: int
) -> list[torch.Tensor]:
    """Right-padded source/target ids and masks (True = real token)."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(0, VOCAB, (len(src_real), src_len), generator=generator)
    tgt = torch.randint(0, VOCAB, (len(tgt_real), tgt_len), generator=generator)
    src_mask = torch.arange(src_len) < torch.tensor(src_real)[:, None]
    tgt_mask = torch.arange(tgt_len) < torch.tensor(tgt_real)[:, None]
    return [src, src_mask, tgt, tgt_mask]


def repad(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The same ids with every padded position replaced by a different token."""
    return torch.where(mask, ids, (ids + 1 + torch.arange(ids.shape[-1]) % (VOCAB - 1)) % VOCAB)


@pytest.mark.parametrize("variant", [v for v in causal_variants() if "seq2seq" in SUPPORTED[v]])
def test_padded_source_tokens_do_not_change_the_logits(variant):
    options = {**TINY, **VARIANT_OPTIONS.get(variant, {})}
    model = assemble(variant, "seq2seq", options, cross_variant=cross_for(variant), seed=2).module
    src, src_mask, tgt, tgt_mask = batch(19, 8, [19, 11, 1], [8, 5, 3], seed=4)
    with torch.no_grad():
        (base,) = model(src, src_mask, tgt, tgt_mask)
        (repadded,) = model(repad(src, src_mask), src_mask, tgt, tgt_mask)
        (unmasked,) = model(repad(src, src_mask), torch.ones_like(src_mask), tgt, tgt_mask)
    torch.testing.assert_close(repadded, base, atol=1e-6, rtol=0)
    assert (unmasked - base).abs().max() > 1e-3, "without the mask the padded tokens must matter"


def test_decoder_is_causal_and_padded_target_keys_are_ignored():
    model = assemble("softmax", "seq2seq", TINY, seed=2).module
    src, src_mask, tgt, tgt_mask = batch(9, 12, [9, 4], [12, 7], seed=5)
    changed = tgt.clone()
    changed[:, 6:] = (changed[:, 6:] + 3) % VOCAB
    with torch.no_grad():
        (base,) = model(src, src_mask, tgt, tgt_mask)
        (later,) = model(src, src_mask, changed, tgt_mask)
        (repadded,) = model(src, src_mask, repad(tgt, tgt_mask), tgt_mask)
    assert_unchanged(later[:, :6], base[:, :6])
    torch.testing.assert_close(repadded[1, :7], base[1, :7], atol=1e-6, rtol=0)


def test_inputs_have_distinct_source_and_target_axes():
    model = assemble("softmax", "seq2seq", TINY).module
    axes = {s.name: s.axes for s in model.input_specs()}
    assert list(axes) == list(NAMES)
    assert axes["input_ids"] == axes["attention_mask"] == ("batch", "src_seq")
    assert axes["decoder_input_ids"] == axes["decoder_attention_mask"] == ("batch", "tgt_seq")
    assert [(s.name, s.axes) for s in model.output_specs()] == [("logits", ("batch", "tgt_seq", VOCAB))]


def test_one_embedding_serves_source_target_and_output():
    model = assemble("softmax", "seq2seq", {**TINY, "n_decoder_layers": 3}).module
    assert [n for n, p in model.named_parameters() if p.shape[0] == VOCAB] == ["embedding.embed.weight"]
    assert (len(model.encoder.blocks), len(model.decoder.blocks)) == (2, 3)


@pytest.fixture(scope="module")
def exported():
    """The tiny seq2seq with linear (or softmax) cross-attention, its session and rebuilt torch module."""
    result = tiny_export("linear" if "linear" in causal_variants() else "softmax", "seq2seq")
    session = ort.InferenceSession(str(result.out / MODEL_FILE), providers=["CPUExecutionProvider"])
    return result, session, ExportDir.open(result.out).rebuild().module


@pytest.mark.parametrize(("src_len", "tgt_len"), [(1, 1), (13, 4), (3, 17), (40, 9)])
def test_onnx_matches_torch_with_different_source_and_target_lengths(exported, src_len, tgt_len):
    _, session, module = exported
    inputs = batch(
        src_len, tgt_len, [src_len, max(1, src_len // 2), 1], [tgt_len, 1, max(1, tgt_len - 2)], seed=6
    )
    with torch.no_grad():
        (expected,) = module(*inputs)
    (actual,) = session.run(None, {name: t.numpy() for name, t in zip(NAMES, inputs, strict=True)})
    np.testing.assert_allclose(actual, expected.numpy(), atol=1e-4, rtol=1e-3)
    src, src_mask, tgt, tgt_mask = inputs
    feed = {
        "input_ids": repad(src, src_mask),
        "attention_mask": src_mask,
        "decoder_input_ids": tgt,
        "decoder_attention_mask": tgt_mask,
    }
    (repadded,) = session.run(None, {name: t.numpy() for name, t in feed.items()})
    np.testing.assert_allclose(repadded, actual, atol=1e-5, rtol=1e-5)


def test_manifest_records_the_cross_variant_and_its_config(exported):
    """`attnx verify` rebuilds the cross-attention layers with the recorded variant and config."""
    result, _, module = exported
    manifest = result.manifest
    assert manifest.cross_variant == cross_for(manifest.variant)
    assert (
        manifest.cross_variant_config
        == assemble(
            "softmax", "seq2seq", TINY, cross_variant=manifest.cross_variant
        ).cross_variant_config.to_dict()
    )
    cross_layer = module.decoder.blocks[0].cross_attention
    assert type(cross_layer).__module__.startswith(f"attnx.plugins.{manifest.cross_variant}.")


NO_CROSS = [v for v in REGISTERED if not capabilities(v).cross]


@pytest.mark.parametrize(
    "variant",
    NO_CROSS
    or [
        pytest.param(
            "none", marks=pytest.mark.skip(reason="every registered variant supports cross-attention")
        )
    ],
)
def test_cross_variant_without_cross_capability_is_refused(variant):
    with pytest.raises(
        AttnxError, match=f"model 'seq2seq' needs cross-attention: variant '{variant}' does not"
    ):
        assemble("softmax", "seq2seq", TINY, cross_variant=variant)


def test_cross_variant_needs_a_model_with_cross_attention():
    with pytest.raises(AttnxError, match="model 'lm' has no cross-attention"):
        assemble("softmax", "lm", TINY, cross_variant="softmax")
    with pytest.raises(AttnxError, match="has no cross-attention"):
        assemble("softmax", "encoder", {**TINY, "cross.scale": 0.5})


def test_cross_options_reach_only_the_cross_variant():
    assembly = assemble("softmax", "seq2seq", {**TINY, "cross.scale": 0.5})
    assert assembly.cross_variant_config.scale == 0.5 and assembly.variant_config.scale is None
