"""Layer-wise attention sharing (``share_layers``, Fastformer §3.3 / ALBERT)."""

from __future__ import annotations

import pytest
import torch

from attnx.exporter.assemble import assemble
from tests.models.cases import REGISTERED

TINY = {"d_model": 32, "n_heads": 2, "n_layers": 3, "d_ff": 64, "vocab_size": 50}


def attention_keys(state: dict, prefix: str = "blocks") -> set[str]:
    return {k.split(".attention.")[0] for k in state if ".attention." in k and k.startswith(prefix)}


def test_state_dict_holds_one_attention():
    shared = assemble("softmax", "encoder", {**TINY, "share_layers": True}).module
    plain = assemble("softmax", "encoder", TINY).module
    assert attention_keys(shared.state_dict()) == {"blocks.0"}
    assert attention_keys(plain.state_dict()) == {"blocks.0", "blocks.1", "blocks.2"}
    per_attention = sum(p.numel() for p in plain.blocks[0].attention.parameters())
    count = [sum(p.numel() for p in m.parameters()) for m in (plain, shared)]
    assert count[0] - count[1] == 2 * per_attention


def test_shared_model_equals_every_layer_using_layer_0s_attention():
    """Independent check: an unshared model given layer 0's attention weights in every layer."""
    shared = assemble("softmax", "encoder", {**TINY, "share_layers": True}, seed=5).module
    plain = assemble("softmax", "encoder", TINY, seed=9).module
    state = dict(shared.state_dict())
    for i in (1, 2):
        for name, tensor in shared.blocks[0].attention.state_dict().items():
            state[f"blocks.{i}.attention.{name}"] = tensor
    plain.load_state_dict(state, strict=True)
    ids = torch.randint(0, 50, (2, 12))
    mask = torch.arange(12) < torch.tensor([12, 5])[:, None]
    with torch.no_grad():
        torch.testing.assert_close(shared(ids, mask), plain(ids, mask), atol=0, rtol=0)


def test_seq2seq_shares_self_and_cross_attention_separately():
    model = assemble("softmax", "seq2seq", {**TINY, "share_layers": True}).module
    state = model.state_dict()
    assert attention_keys(state, "decoder") == {"decoder.blocks.0"}
    assert {k.split(".cross_attention.")[0] for k in state if ".cross_attention." in k} == {
        "decoder.blocks.0"
    }
    assert model.decoder.blocks[0].attention is not model.decoder.blocks[0].cross_attention


def test_fastformer_shares_layers_unless_told_otherwise():
    if "fastformer" not in REGISTERED:
        pytest.xfail("fastformer variant is not registered")
    assert assemble("fastformer", "encoder", TINY).model_config.share_layers
    assert not assemble("fastformer", "encoder", {**TINY, "share_layers": False}).model_config.share_layers
    assert not assemble("softmax", "encoder", TINY).model_config.share_layers
