"""Reformer architecture: reversible residual blocks, chunked feed-forward, their export."""

from __future__ import annotations

import onnx
import pytest
import torch

from attnx.exporter.assemble import assemble
from attnx.models.blocks import FeedForward
from attnx.registry import get_registry
from tests.models.cases import REGISTERED, VARIANT_OPTIONS, capabilities
from tests.models.exports import tiny_export

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64, "vocab_size": 50}


def naive_ffn(ffn: FeedForward, x: torch.Tensor) -> torch.Tensor:
    """relu(x_i W1^T + b1) W2^T + b2, one position at a time, in float64."""
    w1, b1 = ffn.up.weight.detach().double(), ffn.up.bias.detach().double()
    w2, b2 = ffn.down.weight.detach().double(), ffn.down.bias.detach().double()
    out = torch.empty(*x.shape[:-1], w2.shape[0], dtype=torch.float64)
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            out[b, i] = torch.relu(x[b, i].double() @ w1.T + b1) @ w2.T + b2
    return out


@pytest.mark.parametrize("chunks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(("batch", "n"), [(1, 1), (2, 2), (1, 3), (3, 5), (2, 8), (1, 33)])
def test_chunked_ffn_equals_the_position_wise_ffn(chunks, batch, n):
    torch.manual_seed(chunks * 100 + n)
    ffn = FeedForward(16, 24, chunks=chunks)
    x = torch.randn(batch, n, 16)
    with torch.no_grad():
        torch.testing.assert_close(ffn(x).double(), naive_ffn(ffn, x), atol=1e-5, rtol=1e-5)


def layer_inputs(seed: int, n: int = 11) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x1, x2 = torch.randn(2, 2, n, TINY["d_model"], generator=generator)
    mask = torch.arange(n) < torch.tensor([n, 6])[:, None]
    return x1, x2, mask


def test_reversible_layer_is_the_papers_formula():
    """y1 = x1 + Attention(LN(x2)), y2 = x2 + FFN(LN(y1)), written out against the layer's modules."""
    encoder = assemble("softmax", "encoder", {**TINY, "reversible": True, "ff_chunks": 3}).module
    layer = encoder.blocks[1]
    x1, x2, mask = layer_inputs(0)
    with torch.no_grad():
        y1 = x1 + layer.attention(layer.attn_norm(x2), key_padding_mask=mask)
        y2 = x2 + layer.ffn(layer.ffn_norm(y1))
        got = encoder.block(1, mask).reversible(x1, x2)
    torch.testing.assert_close(got, (y1, y2), atol=0, rtol=0)


@pytest.mark.parametrize("variant", [v for v in REGISTERED if capabilities(v).bidirectional])  # an encoder
def test_reversible_block_inverts_to_its_inputs(variant):
    encoder = assemble(
        variant, "encoder", {**TINY, **VARIANT_OPTIONS.get(variant, {}), "reversible": True}
    ).module
    x1, x2, mask = layer_inputs(1)
    block = encoder.block(0, mask)
    with torch.no_grad():
        y1, y2 = block.reversible(x1, x2)
        r1, r2 = block.inverse(y1, y2)
    assert (y1 - x1).abs().max() > 1e-2 and (y2 - x2).abs().max() > 1e-2
    torch.testing.assert_close((r1, r2), (x1, x2), atol=2e-6, rtol=0)


def test_reversible_block_inverts_in_float64_to_rounding():
    encoder = assemble("softmax", "encoder", {**TINY, "reversible": True, "ff_chunks": 2}).module.double()
    x1, x2, mask = layer_inputs(2)
    block = encoder.block(1, mask)
    with torch.no_grad():
        r1, r2 = block.inverse(*block.reversible(x1.double(), x2.double()))
    torch.testing.assert_close((r1, r2), (x1.double(), x2.double()), atol=1e-12, rtol=0)


def test_decoder_block_with_cross_attention_inverts():
    """Three half-residuals (self, cross, FFN) as in trax's EncoderDecoderBlock, memory held fixed."""
    model = assemble("softmax", "seq2seq", {**TINY, "reversible": True}).module
    x1, x2, mask = layer_inputs(3, n=7)
    memory = torch.randn(2, 9, TINY["d_model"])
    memory_mask = torch.arange(9) < torch.tensor([9, 2])[:, None]
    block = model.decoder.block(0, mask, memory, memory_mask)
    assert len(block.branches) == 3
    with torch.no_grad():
        torch.testing.assert_close(block.inverse(*block.reversible(x1, x2)), (x1, x2), atol=2e-6, rtol=0)


def test_whole_stack_reconstructs_the_embedding():
    """Run every layer reversibly, then invert them all: both streams return to the embedding."""
    encoder = assemble("softmax", "encoder", {**TINY, "n_layers": 3, "reversible": True}).module
    ids = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        x = encoder.embedding(ids)
        blocks = [encoder.block(i) for i in range(3)]
        y1, y2 = x, x
        for block in blocks:
            y1, y2 = block.reversible(y1, y2)
        (hidden,) = encoder(ids, None)
        torch.testing.assert_close(hidden, encoder.norm((y1 + y2) / 2), atol=0, rtol=0)
        for block in reversed(blocks):
            y1, y2 = block.inverse(y1, y2)
    torch.testing.assert_close((y1, y2), (x, x), atol=1e-5, rtol=0)


def test_reformer_uses_its_papers_architecture_unless_told_otherwise():
    if "reformer" not in REGISTERED:
        pytest.xfail("reformer variant is not registered")
    config = assemble("reformer", "lm", TINY).model_config
    assert (config.reversible, config.ff_chunks) == (
        True,
        get_registry().variant("reformer").model_defaults["ff_chunks"],
    )
    config = assemble("reformer", "lm", {**TINY, "reversible": False, "ff_chunks": 1}).model_config
    assert (config.reversible, config.ff_chunks) == (False, 1)
    assert not assemble("softmax", "lm", TINY).model_config.reversible


@pytest.fixture(scope="module")
def exported():
    """A softmax encoder with every structure option on: reversible, 3 FFN chunks, shared attention."""
    options = {"n_layers": 2, "reversible": True, "ff_chunks": 3, "share_layers": True}
    return tiny_export("softmax", "encoder", **options)


def test_reversible_chunked_shared_model_exports_with_dynamic_length(exported):
    assert exported.parity.passed and exported.parity.seq_lens == [1, 7, 33]
    config = exported.manifest.model_config
    assert (config["reversible"], config["ff_chunks"], config["share_layers"]) == (True, 3, True)


def test_onnx_graph_holds_the_chunks_and_one_attention(exported):
    """Each FFN is 3 chunk calls (3 Relu per layer); one attention's weights serve both layers."""
    model = onnx.load(str(exported.out / "model.onnx"))
    assert sum(node.op_type == "Relu" for node in model.graph.node) == 2 * 3
    attention_weights = [i for i in model.graph.initializer if "attention" in i.name]
    assert attention_weights and all(".blocks.0." in f".{i.name}" for i in attention_weights)
    assert sum(node.op_type == "SoftmaxAttention" for node in model.graph.node) == 2
